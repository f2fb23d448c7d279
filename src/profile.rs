//! Per-stage GPU profiling (`PROFILE=1` / `--profile`): timestamp queries between the stages
//! of a forward step, accumulated per phase (prefill, decode) with the work each stage does,
//! so the table can say how fast each stage moved bytes and flops and what bounds it.
//!
//! Timestamps are written inside the compute pass where the adapter allows it
//! (TIMESTAMP_QUERY_INSIDE_PASSES); elsewhere every stage gets a pass of its own, timed at its
//! beginning and end. With profiling off the recorder writes no timestamp and opens one pass.

use serde::{Deserialize, Serialize};

use crate::error::{KilnError, Result};
use crate::gpu::GpuContext;

/// The stages of a forward step, in execution order. Fused stages are named as fused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Embed,
    AttnNorm,
    Qkv,
    AttnNormQkv,
    QkNorm,
    Rope,
    KvWrite,
    Attention,
    AttnOut,
    FfnNorm,
    FfnGateUp,
    FfnNormGateUp,
    FfnAct,
    FfnDown,
    FfnActDown,
    OutputNorm,
    LmHead,
    OutputNormLmHead,
    Sample,
    /// Log-softmax and the target's negative log-likelihood (perplexity, eval).
    Score,
}

impl Stage {
    pub const ALL: [Stage; 20] = [
        Stage::Embed,
        Stage::AttnNorm,
        Stage::Qkv,
        Stage::AttnNormQkv,
        Stage::QkNorm,
        Stage::Rope,
        Stage::KvWrite,
        Stage::Attention,
        Stage::AttnOut,
        Stage::FfnNorm,
        Stage::FfnGateUp,
        Stage::FfnNormGateUp,
        Stage::FfnAct,
        Stage::FfnDown,
        Stage::FfnActDown,
        Stage::OutputNorm,
        Stage::LmHead,
        Stage::OutputNormLmHead,
        Stage::Sample,
        Stage::Score,
    ];

    /// Position of a stage name in execution order (unknown names last).
    pub fn order_of(name: &str) -> usize {
        Stage::ALL.iter().position(|s| s.name() == name).unwrap_or(Stage::ALL.len())
    }

    pub fn name(self) -> &'static str {
        match self {
            Stage::Embed => "embed",
            Stage::AttnNorm => "attn_norm",
            Stage::Qkv => "qkv",
            Stage::AttnNormQkv => "attn_norm+qkv",
            Stage::QkNorm => "qk_norm",
            Stage::Rope => "rope",
            Stage::KvWrite => "rope_k+kv_write",
            Stage::Attention => "attention",
            Stage::AttnOut => "attn_out+add",
            Stage::FfnNorm => "ffn_norm",
            Stage::FfnGateUp => "ffn_gate_up",
            Stage::FfnNormGateUp => "ffn_norm+ffn_gate_up",
            Stage::FfnAct => "ffn_act",
            Stage::FfnDown => "ffn_down+add",
            Stage::FfnActDown => "ffn_act+ffn_down+add",
            Stage::OutputNorm => "output_norm",
            Stage::LmHead => "lm_head",
            Stage::OutputNormLmHead => "output_norm+lm_head",
            Stage::Sample => "sample",
            Stage::Score => "score",
        }
    }
}

/// What one call of a stage does: the kernel chosen, its shape, and the bytes and flops it
/// must move and compute at the least (weights and activations read once).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageWork {
    pub kernel: String,
    pub shape: String,
    pub bytes: f64,
    pub flops: f64,
}

impl StageWork {
    /// Several kernels run as one stage (Q, K and V; gate and up): their sums, one kernel
    /// name (the formats listed once each) and the output widths joined with '+'.
    pub fn combine(parts: Vec<StageWork>) -> StageWork {
        let mut out = StageWork::default();
        let mut kernels: Vec<String> = Vec::new();
        let mut shapes: Vec<String> = Vec::new();
        for p in parts {
            if !kernels.contains(&p.kernel) {
                kernels.push(p.kernel);
            }
            shapes.push(p.shape);
            out.bytes += p.bytes;
            out.flops += p.flops;
        }
        out.kernel = kernels.join(", ");
        // "1x2048·2048", "1x2048·256" -> "1x2048·2048+256"
        let mut widths = Vec::new();
        let mut head = String::new();
        for s in &shapes {
            match s.split_once('·') {
                Some((h, w)) => {
                    head = h.to_string();
                    widths.push(w.to_string());
                }
                None => widths.push(s.clone()),
            }
        }
        out.shape = if head.is_empty() { widths.join("+") } else { format!("{head}·{}", widths.join("+")) };
        out
    }

    pub fn other(kernel: &str, shape: String, bytes: f64, flops: f64) -> StageWork {
        StageWork { kernel: kernel.to_string(), shape, bytes, flops }
    }
}

/// The device's measured peaks (`kiln info --probe`), the yardstick of the profile.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Peak {
    /// Read bandwidth of one large dispatch, GB/s.
    pub read_gbs: f64,
    /// f32 FMA throughput, GFLOP/s.
    pub gflops: f64,
    /// Cost of one dispatch that depends on the previous one, µs.
    pub dispatch_us: f64,
    /// The same with a timestamp written after each dispatch: the least a profiled stage
    /// can take (0 where timestamps inside passes are not offered).
    #[serde(default)]
    pub timed_dispatch_us: f64,
    /// 16x16x16 f16 cooperative-matrix multiply-adds into f32, GFLOP/s: what the
    /// cooperative GEMM is measured against (0 where the adapter has none).
    #[serde(default)]
    pub mma_gflops: f64,
}

/// One stage's totals over a phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StageStat {
    pub stage: String,
    pub kernel: String,
    pub shape: String,
    pub calls: u64,
    pub total_ms: f64,
    pub bytes: f64,
    pub flops: f64,
    /// Dispatches recorded in the stage, summed over its calls.
    #[serde(default)]
    pub dispatches: u64,
}

impl StageStat {
    /// Names `kernel` too where it is not among the kernels named already: a stage whose
    /// layers run different kernels (prefill's attention norm: the first layer's own dispatch,
    /// the others' folded into the reduce before them) lists each once.
    fn add_kernel(&mut self, kernel: &str) {
        let have: Vec<&str> = self.kernel.split(", ").collect();
        let new: Vec<&str> = kernel.split(", ").filter(|k| !have.contains(k)).collect();
        if !new.is_empty() {
            self.kernel = [self.kernel.as_str()].into_iter().chain(new).collect::<Vec<_>>().join(", ");
        }
    }
}

/// Host-side seconds spent per phase.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuTimes {
    pub encode: f64,
    pub submit: f64,
    pub wait: f64,
    pub sample: f64,
    pub detokenize: f64,
}

/// Everything measured for one phase (prefill or decode).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PhaseProfile {
    pub steps: u64,
    pub tokens: u64,
    /// Sum over steps of (last timestamp - first timestamp), ms.
    pub span_ms: f64,
    pub stages: Vec<StageStat>,
    pub cpu: CpuTimes,
    pub submits: u64,
    pub readbacks: u64,
}

impl PhaseProfile {
    /// Sum of the stage times, ms.
    pub fn stage_ms(&self) -> f64 {
        self.stages.iter().map(|s| s.total_ms).sum()
    }

    fn add_step(&mut self, tokens: u32, span_ns: f64, stages: &[(Stage, StageWork, f64, u64)]) {
        self.steps += 1;
        self.tokens += tokens as u64;
        self.span_ms += span_ns * 1e-6;
        for (stage, work, ns, dispatches) in stages {
            let name = stage.name();
            let i = match self.stages.iter().position(|s| s.stage == name) {
                Some(i) => i,
                None => {
                    self.stages.push(StageStat {
                        stage: name.into(),
                        kernel: work.kernel.clone(),
                        shape: work.shape.clone(),
                        ..Default::default()
                    });
                    self.stages.len() - 1
                }
            };
            let s = &mut self.stages[i];
            s.add_kernel(&work.kernel);
            s.calls += 1;
            s.total_ms += ns * 1e-6;
            s.bytes += work.bytes;
            s.flops += work.flops;
            s.dispatches += dispatches;
        }
    }

    /// Adds another phase's totals (several runs of the same test).
    pub fn merge(&mut self, o: &PhaseProfile) {
        self.steps += o.steps;
        self.tokens += o.tokens;
        self.span_ms += o.span_ms;
        self.submits += o.submits;
        self.readbacks += o.readbacks;
        let (a, b) = (&mut self.cpu, &o.cpu);
        a.encode += b.encode;
        a.submit += b.submit;
        a.wait += b.wait;
        a.sample += b.sample;
        a.detokenize += b.detokenize;
        for s in &o.stages {
            match self.stages.iter_mut().find(|x| x.stage == s.stage) {
                Some(x) => {
                    x.add_kernel(&s.kernel);
                    x.calls += s.calls;
                    x.total_ms += s.total_ms;
                    x.bytes += s.bytes;
                    x.flops += s.flops;
                    x.dispatches += s.dispatches;
                }
                None => self.stages.push(s.clone()),
            }
        }
    }

    /// The per-stage table, as markdown, with shares of `peak` where it was measured.
    pub fn table(&self, title: &str, peak: Option<&Peak>) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        if self.steps == 0 {
            return o;
        }
        let tokens = self.tokens.max(1) as f64;
        let step_ms = self.stage_ms();
        let _ = writeln!(
            o,
            "\n{title}: {} tokens in {} steps; GPU {:.3} ms per token (stages {:.3} ms, timestamp span {:.3} ms)\n",
            self.tokens,
            self.steps,
            self.span_ms / tokens,
            step_ms,
            self.span_ms
        );
        let _ = writeln!(
            o,
            "| stage | kernel | shape | calls | total ms | µs/token | share | GB/s | GFLOP/s | of peak: bound by | dispatches/token | floor µs/token | × floor |"
        );
        let _ = writeln!(o, "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|");
        // A stage's floor: its bytes at the probe's read bandwidth, plus one dependent
        // dispatch (the probe's) for each of its dispatches.
        let floor_us = |bytes: f64, dispatches: f64| match peak {
            Some(p) if p.read_gbs > 0.0 => Some(bytes / (p.read_gbs * 1e9) * 1e6 + dispatches * p.dispatch_us),
            _ => None,
        };
        for s in &self.stages {
            let secs = s.total_ms * 1e-3;
            let gbs = if secs > 0.0 { s.bytes / secs * 1e-9 } else { 0.0 };
            let gflops = if secs > 0.0 { s.flops / secs * 1e-9 } else { 0.0 };
            let of_peak = match peak {
                Some(p) if p.read_gbs > 0.0 && p.gflops > 0.0 => {
                    // The kernels on cooperative matrices (the GEMM, flash attention) against the
                    // matrix cores, everything else against f32 FMA.
                    let coop = s.kernel.contains("gemm_coop") || s.kernel.contains("flash_attention_coop");
                    let flops_peak = if coop && p.mma_gflops > 0.0 { p.mma_gflops } else { p.gflops };
                    let (bw, fl) = (gbs / p.read_gbs, gflops / flops_peak);
                    let per_call_us = s.total_ms * 1e3 / s.calls.max(1) as f64;
                    // What bounds the stage: near a peak, that peak; a call hardly longer than
                    // a dependent dispatch, dispatch overhead; far from everything, latency
                    // (too little work in flight to fill the device).
                    let bound = if bw >= 0.5 && bw >= fl {
                        "bandwidth"
                    } else if fl >= 0.5 {
                        "arithmetic"
                    } else if per_call_us < 2.0 * p.timed_dispatch_us.max(p.dispatch_us).max(0.1) {
                        "dispatch overhead"
                    } else if bw.max(fl) >= 0.3 {
                        if bw >= fl {
                            "bandwidth"
                        } else {
                            "arithmetic"
                        }
                    } else {
                        "latency"
                    };
                    format!("{:.0}% bw, {:.0}% flops: {bound}", bw * 100.0, fl * 100.0)
                }
                _ => "-".into(),
            };
            let us = s.total_ms * 1e3 / tokens;
            let floor = floor_us(s.bytes / tokens, s.dispatches as f64 / tokens);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {:.3} | {:.1} | {:.1}% | {:.1} | {:.1} | {} | {:.1} | {} | {} |",
                s.stage,
                s.kernel,
                s.shape,
                s.calls,
                s.total_ms,
                us,
                100.0 * s.total_ms / step_ms.max(1e-12),
                gbs,
                gflops,
                of_peak,
                s.dispatches as f64 / tokens,
                floor.map_or("-".into(), |f| format!("{f:.1}")),
                floor.map_or("-".into(), |f| format!("{:.1}", us / f.max(1e-9))),
            );
        }
        // The step as a whole: what it reads, how many dispatches it takes, and its floor.
        let dispatches: u64 = self.stages.iter().map(|s| s.dispatches).sum();
        let bytes: f64 = self.stages.iter().map(|s| s.bytes).sum();
        let floor = floor_us(bytes / tokens, dispatches as f64 / tokens);
        let _ = writeln!(
            o,
            "\nper token: {:.1} dispatches, {:.2} MB read; floor {} (bytes at peak bandwidth + dependent dispatches at the probe's cost); GPU {:.1} µs{}",
            dispatches as f64 / tokens,
            bytes / tokens * 1e-6,
            floor.map_or("-".into(), |f| format!("{f:.1} µs")),
            self.span_ms * 1e3 / tokens,
            floor.map_or(String::new(), |f| format!(" = {:.1}× the floor", self.span_ms * 1e3 / tokens / f.max(1e-9)))
        );
        let c = &self.cpu;
        let per = |x: f64| x * 1e6 / tokens;
        let _ = writeln!(
            o,
            "\nCPU per token: encode {:.1} µs, submit {:.1} µs, wait {:.1} µs, sample {:.1} µs, detokenize {:.1} µs; \
             {:.2} submits and {:.2} readbacks per step",
            per(c.encode),
            per(c.submit),
            per(c.wait),
            per(c.sample),
            per(c.detokenize),
            self.submits as f64 / self.steps as f64,
            self.readbacks as f64 / self.steps as f64
        );
        o
    }
}

/// A whole profile: prefill steps (more than one token) and decode steps (one token).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    pub prefill: PhaseProfile,
    pub decode: PhaseProfile,
}

impl Profile {
    pub fn phase_mut(&mut self, decode: bool) -> &mut PhaseProfile {
        if decode {
            &mut self.decode
        } else {
            &mut self.prefill
        }
    }

    pub fn merge(&mut self, o: &Profile) {
        self.prefill.merge(&o.prefill);
        self.decode.merge(&o.decode);
    }

    pub fn tables(&self, peak: Option<&Peak>) -> String {
        let mut s = self.prefill.table("prefill", peak);
        s.push_str(&self.decode.table("decode", peak));
        s
    }
}

/// Is `PROFILE` set to something other than 0/empty?
pub fn profile_env() -> bool {
    std::env::var("PROFILE").map(|v| !v.is_empty() && v != "0").unwrap_or(false)
}

/// Where the profiler writes its timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileMode {
    /// Inside one pass where the adapter allows it, else a pass per stage.
    Auto,
    /// Between dispatches of one pass (TIMESTAMP_QUERY_INSIDE_PASSES).
    InsidePasses,
    /// At the beginning and end of a pass of its own for each stage.
    PassPerStage,
}

struct Mark {
    stage: Stage,
    work: StageWork,
    begin: u32,
    end: u32,
    /// `dispatches_recorded()` when the stage began, then (once it ended) its dispatches.
    dispatches: u64,
    counted: bool,
}

/// One submission's timestamps: a query set, where it resolves, and where the host reads it.
pub struct ProfSlot {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    capacity: u32,
    inside: bool,
    used: u32,
    marks: Vec<Mark>,
    /// Query index that ends the open pass (inside mode), where the open stage also ends.
    pass_end: Option<u32>,
    tokens: u32,
    /// A decode step (one token, or one of each sequence of a batched step).
    decode: bool,
}

/// Timestamps for up to two submissions in flight, and the totals so far.
pub struct Profiler {
    slots: Vec<ProfSlot>,
    period_ns: f64,
    pub profile: Profile,
}

/// Most timestamps one step may write (wgpu allows 4096 queries per set).
const MAX_QUERIES: u32 = 4096;

impl Profiler {
    /// Needs TIMESTAMP_QUERY. `Auto` times inside one pass where the adapter allows it,
    /// unless `KILN_PROFILE_PASSES=1` asks for a pass per stage.
    pub fn new(ctx: &GpuContext, slots: usize, mode: ProfileMode) -> Result<Profiler> {
        if !ctx.caps.timestamps {
            return Err(KilnError::AdapterUnusable {
                adapter: ctx.info.name.clone(),
                reason: "profiling needs TIMESTAMP_QUERY, which this adapter does not offer".into(),
            });
        }
        let inside = match mode {
            ProfileMode::Auto => {
                ctx.caps.timestamps_in_passes
                    && std::env::var("KILN_PROFILE_PASSES").map(|v| v.is_empty() || v == "0").unwrap_or(true)
            }
            ProfileMode::InsidePasses => {
                if !ctx.caps.timestamps_in_passes {
                    return Err(KilnError::AdapterUnusable {
                        adapter: ctx.info.name.clone(),
                        reason: "this adapter cannot write timestamps inside passes".into(),
                    });
                }
                true
            }
            ProfileMode::PassPerStage => false,
        };
        let slots = (0..slots)
            .map(|_| {
                let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("kiln profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: MAX_QUERIES,
                });
                let size = MAX_QUERIES as u64 * 8;
                let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile resolve"),
                    size,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile staging"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                ProfSlot {
                    set,
                    resolve,
                    staging,
                    capacity: MAX_QUERIES,
                    inside,
                    used: 0,
                    marks: Vec::new(),
                    pass_end: None,
                    tokens: 0,
                    decode: false,
                }
            })
            .collect();
        Ok(Profiler { slots, period_ns: ctx.queue.get_timestamp_period() as f64, profile: Profile::default() })
    }

    pub fn inside_passes(&self) -> bool {
        self.slots.first().map(|s| s.inside).unwrap_or(false)
    }

    /// The slot for submission `k` (ring of two), emptied for a new step of `tokens` tokens;
    /// `decode`: its times go to the decode phase (one token, or a batched decode step).
    pub fn slot(&mut self, k: usize, tokens: u32, decode: bool) -> &mut ProfSlot {
        let n = self.slots.len();
        let s = &mut self.slots[k % n];
        s.used = 0;
        s.marks.clear();
        s.pass_end = None;
        s.tokens = tokens;
        s.decode = decode;
        s
    }

    /// After submission `k` completed: reads its timestamps and adds them to the profile.
    /// Returns the step's timestamp span in seconds.
    /// `index` is the submission to wait for (None: everything submitted).
    pub fn collect(&mut self, ctx: &GpuContext, k: usize, index: Option<wgpu::SubmissionIndex>) -> Result<f64> {
        let n = self.slots.len();
        let s = &mut self.slots[k % n];
        if s.used == 0 {
            return Ok(0.0);
        }
        let size = s.used as u64 * 8;
        let ticks: Vec<u64> =
            bytemuck::pod_collect_to_vec(&ctx.read_mapped(&s.staging, size, index, "reading timestamps")?);
        let ns = |q: u32| ticks[q as usize] as f64 * self.period_ns;
        let mut lo = f64::MAX;
        let mut hi = 0f64;
        let mut stages = Vec::with_capacity(s.marks.len());
        // A stage runs from where the previous one ended: with a pass per stage, the gap
        // between passes (their launch and barriers) is the cost of starting this stage.
        let mut prev_end: Option<f64> = None;
        for m in s.marks.drain(..) {
            if m.begin >= s.used || m.end >= s.used {
                continue; // a stage whose end was never written (query set full)
            }
            let (b, e) = (ns(m.begin), ns(m.end));
            let start = prev_end.map(|p| p.min(b)).unwrap_or(b);
            lo = lo.min(b);
            hi = hi.max(e);
            stages.push((m.stage, m.work, (e - start).max(0.0), if m.counted { m.dispatches } else { 0 }));
            prev_end = Some(e);
        }
        let span = (hi - lo).max(0.0);
        self.profile.phase_mut(s.decode).add_step(s.tokens, span, &stages);
        Ok(span * 1e-9)
    }
}

impl ProfSlot {
    fn next(&mut self) -> Option<u32> {
        if self.used >= self.capacity {
            return None;
        }
        self.used += 1;
        Some(self.used - 1)
    }

    /// Records the resolve of this step's timestamps and their copy to the host-readable buffer.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        if self.used > 0 {
            enc.resolve_query_set(&self.set, 0..self.used, &self.resolve, 0);
            enc.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, self.used as u64 * 8);
        }
    }
}

/// Records a step's dispatches: one compute pass (or a pass per stage when profiling around
/// passes), with a timestamp at each stage boundary when profiling.
pub struct Recorder<'a> {
    enc: &'a mut wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    prof: Option<&'a mut ProfSlot>,
    label: &'static str,
    /// A stage left out of the step (`kiln bench --ablate`): its dispatches go to a pass of an
    /// encoder that is never submitted, so the host still records them but the GPU skips them.
    skip: Option<(Stage, wgpu::Device)>,
    skipping: bool,
    discard: Option<(wgpu::CommandEncoder, wgpu::ComputePass<'static>)>,
    /// Where `submit_so_far` submits (`submit_early`), else it does nothing.
    early: Option<(wgpu::Device, wgpu::Queue)>,
    /// Seconds `submit_so_far` spent finishing and submitting, for the host's account.
    early_secs: f64,
}

impl<'a> Recorder<'a> {
    pub fn new(enc: &'a mut wgpu::CommandEncoder, label: &'static str, prof: Option<&'a mut ProfSlot>) -> Self {
        Recorder {
            enc,
            pass: None,
            prof,
            label,
            skip: None,
            skipping: false,
            discard: None,
            early: None,
            early_secs: 0.0,
        }
    }

    /// Lets `submit_so_far` submit what was recorded before the step is whole (a step that
    /// the caller submits, unprofiled and with no stage left out).
    pub fn submit_early(&mut self, device: &wgpu::Device, queue: &wgpu::Queue) {
        if self.prof.is_none() && self.skip.is_none() {
            self.early = Some((device.clone(), queue.clone()));
        }
    }

    /// Where `submit_early` allowed it: submits the commands recorded so far and goes on in a
    /// fresh encoder, so that the GPU starts on a long step's first layers while the host
    /// records and submits the rest (H200: a 512-token prompt step spent ~0.85 ms recording
    /// and submitting before its first dispatch ran, ~10% of the step). The parameters
    /// written for those commands (`Bound::set`) go with this submit; each command has its
    /// own, so none is rewritten under one already submitted.
    pub fn submit_so_far(&mut self) {
        let Some((device, queue)) = &self.early else { return };
        let t = std::time::Instant::now();
        self.pass = None;
        let fresh = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(self.label) });
        let done = std::mem::replace(self.enc, fresh);
        queue.submit([done.finish()]);
        self.early_secs += t.elapsed().as_secs_f64();
    }

    /// Seconds spent submitting parts of the step so far (`submit_so_far`): the host's
    /// account counts them as submitting, not recording.
    pub fn early_submit_secs(&self) -> f64 {
        self.early_secs
    }

    /// Leaves `stage` out of what the GPU runs (its results are wrong; its time is the point).
    pub fn skip_stage(&mut self, device: &wgpu::Device, stage: Stage) {
        self.skip = Some((stage, device.clone()));
    }

    fn open(&mut self, stage_timed: Option<(u32, u32)>) {
        let writes = match (&self.prof, stage_timed) {
            (Some(p), Some((b, e))) => Some(wgpu::ComputePassTimestampWrites {
                query_set: &p.set,
                beginning_of_pass_write_index: Some(b),
                end_of_pass_write_index: Some(e),
            }),
            _ => None,
        };
        let pass = self
            .enc
            .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(self.label), timestamp_writes: writes })
            .forget_lifetime();
        self.pass = Some(pass);
    }

    /// The open pass (one is opened if none is).
    pub fn pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        if self.skipping {
            if let Some((_, device)) = &self.skip {
                let discard = self.discard.get_or_insert_with(|| {
                    let mut enc =
                        device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("left out") });
                    let pass = enc.begin_compute_pass(&Default::default()).forget_lifetime();
                    (enc, pass)
                });
                return &mut discard.1;
            }
        }
        if self.pass.is_none() {
            self.begin_inside_pass();
        }
        self.pass.as_mut().expect("a pass was just opened")
    }

    fn begin_inside_pass(&mut self) {
        // Inside mode: the pass's own end timestamp closes its last stage.
        let q = match self.prof.as_deref_mut() {
            Some(p) if p.inside => match (p.next(), p.next()) {
                (Some(b), Some(e)) => {
                    p.pass_end = Some(e);
                    Some((b, e))
                }
                _ => None,
            },
            _ => None,
        };
        self.open(q);
    }

    /// Starts `stage`; `work` describes it (evaluated only when profiling).
    pub fn stage(&mut self, stage: Stage, work: impl FnOnce() -> StageWork) {
        self.skipping = self.skip.as_ref().is_some_and(|(s, _)| *s == stage);
        let Some(p) = self.prof.as_deref_mut() else {
            return;
        };
        if p.inside {
            if self.pass.is_none() {
                self.begin_inside_pass();
            }
            let (Some(p), Some(pass)) = (self.prof.as_deref_mut(), self.pass.as_mut()) else {
                return;
            };
            let Some(q) = p.next() else {
                return;
            };
            pass.write_timestamp(&p.set, q);
            // The previous stage of this pass ends where this one begins.
            if let Some(last) = p.marks.last_mut() {
                if last.end == u32::MAX {
                    last.end = q;
                }
            }
            close_dispatch_count(&mut p.marks);
            p.marks.push(Mark {
                stage,
                work: work(),
                begin: q,
                end: u32::MAX,
                dispatches: crate::gpu::buffers::dispatches_recorded(),
                counted: false,
            });
        } else {
            self.pass = None;
            let (Some(b), Some(e)) = (p.next(), p.next()) else {
                return;
            };
            close_dispatch_count(&mut p.marks);
            p.marks.push(Mark {
                stage,
                work: work(),
                begin: b,
                end: e,
                dispatches: crate::gpu::buffers::dispatches_recorded(),
                counted: false,
            });
            self.open(Some((b, e)));
        }
    }

    /// Ends the open pass (commands outside passes may follow).
    pub fn end_pass(&mut self) {
        self.pass = None;
        if let Some(p) = self.prof.as_deref_mut() {
            if let Some(end) = p.pass_end.take() {
                if let Some(last) = p.marks.last_mut() {
                    if last.end == u32::MAX {
                        last.end = end;
                    }
                }
            }
        }
    }

    /// The encoder, with the pass ended.
    pub fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.end_pass();
        self.enc
    }

    /// Ends the pass and records the timestamps' resolve.
    pub fn finish(mut self) {
        self.end_pass();
        if let Some(p) = self.prof.as_deref_mut() {
            close_dispatch_count(&mut p.marks);
            p.resolve(self.enc);
        }
    }
}

/// The last stage ended: its dispatches are those recorded since it began.
fn close_dispatch_count(marks: &mut [Mark]) {
    if let Some(last) = marks.last_mut() {
        if !last.counted {
            last.dispatches = crate::gpu::buffers::dispatches_recorded().saturating_sub(last.dispatches);
            last.counted = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage whose calls ran different kernels names each once, in the order first seen.
    #[test]
    fn a_stage_names_every_kernel_its_calls_ran() {
        let mut s = StageStat { stage: "attn_norm".into(), kernel: "rms_norm".into(), ..Default::default() };
        s.add_kernel("reduce_norm");
        s.add_kernel("reduce_norm");
        s.add_kernel("rms_norm");
        assert_eq!(s.kernel, "rms_norm, reduce_norm");
        let mut q = StageStat { kernel: "gemm A, gemm B".into(), ..Default::default() };
        q.add_kernel("gemm A, gemm B");
        assert_eq!(q.kernel, "gemm A, gemm B");
    }

    /// Kernels on cooperative matrices (the GEMM, flash attention) are held to the matrix
    /// cores' rate, the rest to f32 FMA: flash attention at 58 TFLOP/s on an adapter of 54.5
    /// TFLOP/s f32 and 630 f16 matrix is 9% of its peak, not 107%.
    #[test]
    fn matrix_core_kernels_are_measured_against_the_matrix_peak() {
        let stage = |kernel: &str| StageStat {
            stage: "attention".into(),
            kernel: kernel.into(),
            shape: "32h x 512x512".into(),
            calls: 1,
            total_ms: 1.0,
            bytes: 1e6,
            flops: 58e12 * 1e-3,
            dispatches: 1,
        };
        let peak = Peak {
            read_gbs: 4500.0,
            gflops: 54_500.0,
            dispatch_us: 1.7,
            timed_dispatch_us: 6.4,
            mma_gflops: 630_000.0,
        };
        for (kernel, share) in [
            ("flash_attention_coop", "9% flops"),
            ("flash_attention", "106% flops"),
            ("gemm_coop[128x128x32,f16] Q4_K", "9% flops"),
        ] {
            let p =
                PhaseProfile { steps: 1, tokens: 512, span_ms: 1.0, stages: vec![stage(kernel)], ..Default::default() };
            let table = p.table("pp512", Some(&peak));
            assert!(table.contains(share), "{kernel}: {table}");
        }
    }
}
