//! `kiln bench` in the manner of llama-bench: prompt processing (ppN) and generation (tgN)
//! throughput over repetitions, as records that carry everything needed to compare machines
//! later (adapter, driver, features, limits, kiln version and commit, date, every figure).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::engine::Model;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::model::{Output, SessionOptions};
use crate::profile::{Peak, PhaseProfile, Stage};

/// The adapter a record was measured on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AdapterRecord {
    pub name: String,
    pub vendor_id: u32,
    pub vendor: String,
    pub device_type: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    /// Features kiln uses on it (after KILN_DISABLE).
    pub features: Vec<String>,
    pub limits: BTreeMap<String, u64>,
}

impl AdapterRecord {
    pub fn of(ctx: &GpuContext) -> AdapterRecord {
        let i = &ctx.info;
        let c = &ctx.caps;
        let mut features = Vec::new();
        if c.f16 {
            features.push("shader-f16".to_string());
        }
        if c.subgroups {
            features.push(format!("subgroups({}..{})", c.subgroup_min, c.subgroup_max));
        }
        if c.timestamps {
            features.push("timestamp-query".into());
        }
        if c.timestamps_in_passes {
            features.push("timestamp-query-inside-passes".into());
        }
        if c.coopmat {
            features.push("cooperative-matrix".into());
        }
        if c.cm2 {
            features.push("cooperative-matrix-2".into());
        }
        if c.int8_dot {
            features.push("int8-dot-product".into());
        }
        if c.decode_merge {
            features.push("decode-merge".into());
        }
        if let Some(s) = c.q8_add_norm {
            features.push(format!("int8-residual-epilogue({}x{}x{})", s.wg, s.rows, s.groups));
        }
        let l = &ctx.limits;
        let limits = BTreeMap::from([
            ("max_buffer_size".to_string(), l.max_buffer_size),
            ("max_storage_buffer_binding_size".to_string(), l.max_storage_buffer_binding_size),
            ("max_compute_workgroup_storage_size".to_string(), l.max_compute_workgroup_storage_size as u64),
            ("max_compute_invocations_per_workgroup".to_string(), l.max_compute_invocations_per_workgroup as u64),
            ("subgroup_min_size".to_string(), c.subgroup_min as u64),
            ("subgroup_max_size".to_string(), c.subgroup_max as u64),
        ]);
        AdapterRecord {
            name: i.name.clone(),
            vendor_id: i.vendor,
            vendor: vendor_name(i.vendor).to_string(),
            device_type: format!("{:?}", i.device_type),
            backend: format!("{:?}", i.backend),
            driver: i.driver.clone(),
            driver_info: i.driver_info.clone(),
            features,
            limits,
        }
    }
}

/// PCI (or Khronos) vendor id → name.
pub fn vendor_name(id: u32) -> &'static str {
    match id {
        crate::gpu::context::NVIDIA_VENDOR => "NVIDIA",
        0x1002 | 0x1022 => "AMD",
        0x8086 => "Intel",
        0x106b => "Apple",
        0x13b5 => "ARM",
        0x5143 => "Qualcomm",
        0x10005 => "Mesa",
        0x1414 => "Microsoft",
        _ => "unknown",
    }
}

/// The model a record was measured on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelRecord {
    /// File name, or `preset:format (synthetic)`.
    pub name: String,
    /// The path of a file, or None for a synthetic model.
    pub path: Option<String>,
    /// `preset:format` of a synthetic model.
    pub synthetic: Option<String>,
    pub arch: String,
    pub size_bytes: u64,
    pub params: u64,
    /// Tensor count per ggml type.
    pub formats: BTreeMap<String, u64>,
}

impl ModelRecord {
    pub fn of(model: &Model, synthetic: Option<&str>) -> ModelRecord {
        let f = &model.file;
        let mut formats = BTreeMap::new();
        for t in &f.tensors {
            *formats.entry(t.type_name()).or_insert(0) += 1;
        }
        let name = match synthetic {
            Some(s) => format!("{s} (synthetic)"),
            None => f.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default(),
        };
        ModelRecord {
            name,
            path: synthetic.is_none().then(|| f.path.display().to_string()),
            synthetic: synthetic.map(String::from),
            arch: format!("{:?}", model.cfg.arch).to_lowercase(),
            size_bytes: f.tensors.iter().map(|t| t.bytes).sum(),
            params: f.tensors.iter().map(|t| t.n_elements()).sum(),
            formats,
        }
    }

    /// "q4_K:155 q6_K:23 f32:45", most common first.
    pub fn formats_label(&self) -> String {
        let mut v: Vec<_> = self.formats.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(" ")
    }
}

/// GPU memory kiln allocated for a test, in bytes (wgpu's count of buffer memory).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuMemory {
    pub weights: u64,
    pub kv_cache: u64,
    /// The session's other buffers: activations, attention scratch, logits.
    pub activations: u64,
    /// Prefill's resident f16 copies of the block-format layer weights (`plan::resident_f16_copies`;
    /// 0 where each GEMM's weights are decoded just before it).
    #[serde(default)]
    pub f16_copies: u64,
}

impl GpuMemory {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.activations + self.f16_copies
    }
}

/// One test (ppN, tgN or ppN+tgM, at a depth) on one model: every repetition's tokens per second.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchRecord {
    pub kiln_version: String,
    pub git_commit: String,
    /// UTC, ISO 8601.
    pub date: String,
    pub adapter: AdapterRecord,
    pub model: ModelRecord,
    /// "pp512", "tg128", "pp512+tg128", or with a depth "tg128 @ d4096" (llama-bench's names).
    pub test: String,
    pub n_prompt: u32,
    pub n_gen: u32,
    /// Tokens already in the KV cache when the test starts (llama-bench's -d).
    #[serde(default)]
    pub n_depth: u32,
    /// Sequences decoded together, one token of each per step (`kiln bench -np`, as
    /// llama-batched-bench's -npl); `avg_ts` is then their aggregate tokens per second.
    #[serde(default = "one")]
    pub n_parallel: u32,
    /// llama.cpp's -b: tokens per prompt-processing call (it caps the ubatch).
    #[serde(default)]
    pub n_batch: u32,
    pub ubatch: u32,
    pub n_ctx: u32,
    pub kv_type: String,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    /// The device's measured peaks, when profiling.
    pub peak: Option<Peak>,
    /// Per-stage profile of the test's phase, when profiling: from extra runs with
    /// timestamps, after the timed repetitions (which run without).
    pub profile: Option<PhaseProfile>,
    /// Tokens per second of the profiled runs: what the timestamps cost.
    pub profiled_ts: Option<f64>,
    /// GPU memory of the weights and the test's session.
    #[serde(default)]
    pub gpu_memory: Option<GpuMemory>,
    /// Seconds from the model file (or the synthetic image in memory) to weights on the GPU.
    #[serde(default)]
    pub load_secs: Option<f64>,
    /// Host time per step of the timed repetitions (no timestamps): recording, submitting,
    /// and waiting for the GPU, in microseconds.
    #[serde(default)]
    pub host_us_per_step: Option<HostUs>,
    /// How generation tests pick tokens: "greedy", or the sampler's settings.
    #[serde(default)]
    pub sampling: Option<String>,
    /// Generation tests with `--ablate`: what each stage costs the step.
    #[serde(default)]
    pub ablation: Option<Vec<StageCost>>,
    /// Generation tests on adapters with timestamps: decode steps recorded back to back in
    /// one command buffer, timed by two timestamps around them (the GPU's own pace, no host
    /// waits), and the host's record and submit time per step for them.
    #[serde(default)]
    pub back_to_back: Option<crate::model::BackToBack>,
    /// Time to first token of a short prompt on an empty cache, pipelines built (as
    /// `kiln run` after loading): submit of the prompt to its token on the host.
    #[serde(default)]
    pub ttft: Option<Ttft>,
    /// The `KILN_*` settings of the environment the test ran in (the measurement knobs, e.g.
    /// `KILN_GEMV_Q8_SWIGLU`), so that a record says which variant it measured; never the API
    /// key.
    #[serde(default)]
    pub kiln_env: std::collections::BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

/// Time to first token (`BenchRecord::ttft`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Ttft {
    pub prompt_tokens: u32,
    /// The first prompt after the session opened (the GPU idle until then), and the best of
    /// it and three more after the warm-up (`BenchOptions::warmup`).
    pub first_ms: f64,
    pub best_ms: f64,
}

/// What one stage costs a decode step, measured by leaving it out (`--ablate`): the step's
/// time with it minus without it, so its launch, its barrier and the wait it causes count.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageCost {
    pub stage: String,
    pub us_per_token: f64,
    /// The same, from steps recorded back to back (GPU time only; no host waits hide it).
    #[serde(default)]
    pub gpu_us_per_token: Option<f64>,
    /// `stage` names a kernel left out of every stage (`ABLATE_KERNELS`), not a stage.
    #[serde(default)]
    pub kernel: bool,
}

/// The decode stages `--ablate` leaves out one at a time, in step order. (Without the sampler,
/// chained steps also stop moving on: each group's steps run at its first position.)
pub const ABLATE_STAGES: [Stage; 8] = [
    Stage::Embed,
    Stage::AttnNormQkv,
    Stage::Attention,
    Stage::AttnOut,
    Stage::FfnNormGateUp,
    Stage::FfnDown,
    Stage::OutputNormLmHead,
    Stage::Sample,
];

/// Kernels `--ablate` then leaves out of every stage, one at a time: dispatches a fusion could
/// remove (the int8 GEMVs' activation quantization).
pub const ABLATE_KERNELS: [&str; 1] = ["quantize_q8"];

/// Host microseconds per step.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct HostUs {
    pub encode: f64,
    pub submit: f64,
    pub wait: f64,
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Now as "YYYY-MM-DDTHH:MM:SSZ" (civil-from-days, no time zone database needed).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// One test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Prompt processing of N tokens.
    Prompt(u32),
    /// Generation of N tokens.
    Gen(u32),
    /// A prompt of P tokens, then G generated (llama-bench's -pg).
    PromptGen(u32, u32),
}

impl Test {
    /// llama-bench's name: "pp512", "tg128", "pp512+tg128", with " @ d4096" at a depth.
    pub fn name(self, depth: u32) -> String {
        let base = match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n) => format!("tg{n}"),
            Test::PromptGen(p, g) => format!("pp{p}+tg{g}"),
        };
        if depth > 0 {
            format!("{base} @ d{depth}")
        } else {
            base
        }
    }

    /// (prompt tokens, generated tokens).
    pub fn sizes(self) -> (u32, u32) {
        match self {
            Test::Prompt(n) => (n, 0),
            Test::Gen(n) => (0, n),
            Test::PromptGen(p, g) => (p, g),
        }
    }

    /// Context positions the test needs after `depth` tokens (a generated token's own
    /// position included).
    fn positions(self, depth: u32) -> u32 {
        let (p, g) = self.sizes();
        depth + p + g + (g > 0 && p == 0) as u32
    }
}

/// How to run the tests on one model.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub tests: Vec<Test>,
    /// Depths to run every test at (0: an empty cache).
    pub depths: Vec<u32>,
    pub repetitions: u32,
    /// llama.cpp's -b, recorded; kiln's prompt processing runs in ubatches of `ubatch`.
    pub n_batch: u32,
    /// -ub; None: the planner's for the model and adapter (`sizes::planned_ubatch`), chosen
    /// when the model's tests start.
    pub ubatch: Option<u32>,
    pub f16_kv: bool,
    pub warmup: bool,
    pub profile: bool,
    pub peak: Option<Peak>,
    /// Generation tests sample with these settings (on the GPU) instead of greedy picks.
    pub sampling: Option<crate::sample::SamplerConfig>,
    /// Generation tests also run once without each decode stage (`ABLATE_STAGES`).
    pub ablate: bool,
    /// Generation tests also run with this many sequences decoded together (`bench_parallel`;
    /// 1: one sequence stepped as `kiln serve` steps it).
    pub parallel: Vec<u32>,
}

impl BenchOptions {
    /// Tokens a prompt step takes (llama.cpp's 512 where the planner has not chosen yet).
    pub fn ubatch(&self) -> u32 {
        self.ubatch.unwrap_or(crate::plan::DEFAULT_UBATCH)
    }
}

/// The timed repetitions of one test (after a warm-up run, unless `opts.warmup` is off), the
/// host time per step over them, and with `opts.profile` the profile of extra runs (the timed
/// ones carry no timestamps): `run(session, timed)` runs the test once and returns its tokens
/// per second; `decode` picks the profile's phase.
struct Timed {
    samples: Vec<f64>,
    host_us_per_step: Option<HostUs>,
    profile: Option<PhaseProfile>,
    profiled_ts: Option<f64>,
}

fn time_test(
    s: &mut crate::model::Session,
    name: &str,
    opts: &BenchOptions,
    decode: bool,
    progress: &mut dyn FnMut(&str, Option<u32>),
    run: &dyn Fn(&mut crate::model::Session, bool) -> Result<f64>,
) -> Result<Timed> {
    if opts.warmup {
        progress(name, None);
        run(s, true)?;
    }
    let mut samples = Vec::new();
    s.take_host_times();
    for r in 0..opts.repetitions {
        progress(name, Some(r));
        samples.push(run(s, true)?);
    }
    let host = s.take_host_times();
    let per = |t: f64| t / host.steps.max(1) as f64 * 1e6;
    let host_us_per_step =
        (host.steps > 0).then(|| HostUs { encode: per(host.encode), submit: per(host.submit), wait: per(host.wait) });
    let (mut profile, mut profiled_ts) = (None, None);
    if opts.profile {
        s.enable_profiling()?;
        let mut ts = Vec::new();
        for _ in 0..opts.repetitions.min(3) {
            progress(name, None);
            ts.push(run(s, false)?);
        }
        profiled_ts = Some(mean_sd(&ts).0);
        profile = s.take_profile().map(|p| if decode { p.decode } else { p.prefill });
        s.disable_profiling();
    }
    Ok(Timed { samples, host_us_per_step, profile, profiled_ts })
}

/// A record of `timed` under `opts` (version, date, sizes, every repetition, the profile);
/// the caller adds what the test and the model are.
fn timed_record(opts: &BenchOptions, timed: Timed) -> BenchRecord {
    let (avg, sd) = mean_sd(&timed.samples);
    BenchRecord {
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("KILN_GIT_COMMIT").into(),
        date: utc_now(),
        n_batch: opts.n_batch,
        ubatch: opts.ubatch(),
        kv_type: if opts.f16_kv { "f16" } else { "f32" }.into(),
        samples_ts: timed.samples,
        avg_ts: avg,
        stddev_ts: sd,
        peak: opts.peak,
        profile: timed.profile,
        profiled_ts: timed.profiled_ts,
        host_us_per_step: timed.host_us_per_step,
        n_parallel: 1,
        kiln_env: kiln_env(),
        ..Default::default()
    }
}

/// The `KILN_*` variables set in this process's environment, but the API key.
pub fn kiln_env() -> std::collections::BTreeMap<String, String> {
    std::env::vars().filter(|(k, _)| k.starts_with("KILN_") && k != "KILN_API_KEY").collect()
}

/// How a generation test picks its tokens, for the record.
fn sampling_label(sampling: &Option<crate::sample::SamplerConfig>) -> String {
    match sampling {
        None => "greedy".into(),
        Some(c) => format!(
            "temp {} top-k {} top-p {} min-p {} repeat-penalty {}",
            c.temperature, c.top_k, c.top_p, c.min_p, c.repeat_penalty
        ),
    }
}

/// A session of `n_seq` sequences of `n_ctx` positions for the tests, its pipelines built; the
/// GPU memory it took beside the weights; and a fixed prompt of `n_ctx` tokens (ids spread
/// over the vocabulary, not the specials at 0..3).
fn bench_session(
    model: &Model,
    opts: &BenchOptions,
    n_ctx: u32,
    n_seq: u32,
) -> Result<(crate::model::Session, GpuMemory, Vec<u32>)> {
    let ctx = &model.ctx;
    let before = ctx.buffers_alive().bytes;
    let mut s = model.session(SessionOptions {
        n_ctx,
        ubatch: opts.ubatch(),
        f16_kv: opts.f16_kv,
        all_logits: false,
        n_seq,
    })?;
    let session_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
    s.build_pipelines()?;
    let kv_cache =
        n_seq as u64 * n_ctx as u64 * 2 * model.cfg.n_layer as u64 * model.cfg.kv_dim() as u64 * s.kv_bytes_per_elem();
    let f16_copies = s.resident_f16_bytes();
    let gpu_memory = GpuMemory {
        weights: model.weight_gpu_bytes,
        kv_cache,
        activations: session_bytes.saturating_sub(kv_cache + f16_copies),
        f16_copies,
    };
    let v = model.cfg.n_vocab as usize;
    let prompt: Vec<u32> = (0..n_ctx as usize).map(|i| (3 + (i * 7919) % (v - 3)) as u32).collect();
    Ok((s, gpu_memory, prompt))
}

/// Runs every test at every depth on `model`; `progress` hears (test, repetition or None for
/// warm-up), `on_record` gets each test's record as soon as it is done. `load_secs` is how
/// long the model took to load.
pub fn bench_model(
    model: &Model,
    synthetic: Option<&str>,
    load_secs: Option<f64>,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(&str, Option<u32>),
    on_record: &mut dyn FnMut(BenchRecord) -> Result<()>,
) -> Result<()> {
    let ctx: &Arc<GpuContext> = &model.ctx;
    let depths: &[u32] = if opts.depths.is_empty() { &[0] } else { &opts.depths };
    let n_ctx = opts.tests.iter().flat_map(|t| depths.iter().map(|&d| t.positions(d))).max().unwrap_or(1).max(1);
    let planned = BenchOptions {
        ubatch: Some(opts.ubatch.unwrap_or_else(|| {
            let (cfg, weights) = (&model.cfg, model.weight_gpu_bytes);
            crate::model::sizes::planned_ubatch(ctx, cfg, weights, n_ctx, opts.f16_kv, false, opts.n_batch)
        })),
        ..opts.clone()
    };
    let opts = &planned;
    let (mut s, gpu_memory, prompt) = bench_session(model, opts, n_ctx, 1)?;
    let adapter = AdapterRecord::of(ctx);
    let model_rec = ModelRecord::of(model, synthetic);
    // Time to first token of a 20-token prompt on an empty cache: the first after the session
    // opened (the GPU idle until then), and the best of it and three more once it is warm.
    let n = 20.min(n_ctx as usize);
    let prompt_ms = |s: &mut crate::model::Session| -> Result<f64> {
        s.reset();
        let t = Instant::now();
        s.forward(&prompt[..n], Output::Argmax)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    let first_ms = prompt_ms(&mut s)?;
    // A GPU that was idle runs its first short steps at low clocks (an H200: a 20-token
    // prompt in 33-56 ms, 10 ms warm): a third of a second of prefills brings them up before
    // anything is timed, as the earlier tests of a llama-bench run do for the later ones.
    if opts.warmup && !ctx.caps.cpu_adapter {
        let t = Instant::now();
        while t.elapsed().as_secs_f64() < 0.3 {
            s.reset();
            s.forward(&prompt[..(n_ctx as usize).min(opts.ubatch() as usize).max(1)], Output::Argmax)?;
        }
    }
    let mut warm = Vec::new();
    for _ in 0..3 {
        warm.push(prompt_ms(&mut s)?);
    }
    s.reset();
    // The best of all four: on a CPU adapter (no warm-up) the first is no slower than the rest,
    // and noise can put it ahead of them.
    let ttft = Ttft { prompt_tokens: n as u32, first_ms, best_ms: warm.iter().copied().fold(first_ms, f64::min) };
    for &depth in depths {
        for &test in &opts.tests {
            let name = test.name(depth);
            let d = depth as usize;
            // Tokens per second of one run; the cache is filled to the depth untimed.
            let run = |s: &mut crate::model::Session| -> Result<f64> {
                s.reset();
                if d > 0 {
                    s.forward(&prompt[..d], Output::Argmax)?;
                }
                let t = Instant::now();
                let tokens = match test {
                    Test::Prompt(n) => {
                        s.forward(&prompt[d..d + n as usize], Output::Argmax)?;
                        n as usize
                    }
                    Test::Gen(n) => match &opts.sampling {
                        Some(cfg) => {
                            s.set_sampling(&crate::sample::Sampler::new(*cfg), &prompt[..=d]);
                            s.generate_chained(prompt[d], n as usize, &mut |_| true)?.len()
                        }
                        None => s.generate_greedy_chained(prompt[d], n as usize, &mut |_| true)?.len(),
                    },
                    Test::PromptGen(p, g) => {
                        let first = s.forward(&prompt[d..d + p as usize], Output::Argmax)?[0] as u32;
                        p as usize + s.generate_greedy_chained(first, g as usize, &mut |_| true)?.len()
                    }
                };
                Ok(tokens as f64 / t.elapsed().as_secs_f64())
            };
            let timed = time_test(&mut s, &name, opts, matches!(test, Test::Gen(_)), progress, &|s, _| run(s))?;
            let avg = mean_sd(&timed.samples).0;
            // The GPU's pace: the test's steps back to back at its depth (submits of up to 64),
            // best of three.
            let steps = match test {
                Test::Gen(n) => n as usize,
                _ => 0,
            };
            let back_to_back = |s: &mut crate::model::Session| -> Result<crate::model::BackToBack> {
                s.reset();
                if d > 0 {
                    s.forward(&prompt[..d], Output::Argmax)?;
                }
                let greedy = crate::sample::SamplerConfig { temperature: 0.0, ..Default::default() };
                s.set_sampling(&crate::sample::Sampler::new(opts.sampling.unwrap_or(greedy)), &prompt[..=d]);
                let mut best: Option<crate::model::BackToBack> = None;
                for _ in 0..3 {
                    let b = s.time_back_to_back(steps)?;
                    if best.is_none_or(|x| b.gpu_us < x.gpu_us) {
                        best = Some(b);
                    }
                }
                Ok(best.expect("three measurements"))
            };
            let timed_gen = matches!(test, Test::Gen(_)) && ctx.caps.timestamps;
            let b2b = if timed_gen { Some(back_to_back(&mut s)?) } else { None };
            let mut ablation = None;
            if opts.ablate && matches!(test, Test::Gen(_)) {
                let mut costs = Vec::new();
                let parts = ABLATE_STAGES
                    .map(Some)
                    .into_iter()
                    .map(|st| (st, None))
                    .chain(ABLATE_KERNELS.map(|k| (None, Some(k))));
                for (stage, kernel) in parts {
                    s.skip_stage(stage);
                    crate::gpu::leave_out_kernel(kernel);
                    let part = stage.map(|st| st.name()).or(kernel).unwrap_or_default();
                    progress(&format!("{name} without {part}"), None);
                    let without = (0..2).map(|_| run(&mut s)).collect::<Result<Vec<_>>>();
                    let gpu_without = if timed_gen { Some(back_to_back(&mut s)) } else { None };
                    s.skip_stage(None);
                    crate::gpu::leave_out_kernel(None);
                    let without = mean_sd(&without?).0;
                    let gpu_without = gpu_without.transpose()?;
                    costs.push(StageCost {
                        stage: part.into(),
                        kernel: kernel.is_some(),
                        us_per_token: (1.0 / avg - 1.0 / without) * 1e6,
                        gpu_us_per_token: b2b.zip(gpu_without).map(|(with, without)| with.gpu_us - without.gpu_us),
                    });
                }
                ablation = Some(costs);
            }
            let (n_prompt, n_gen) = test.sizes();
            on_record(BenchRecord {
                adapter: adapter.clone(),
                model: model_rec.clone(),
                test: name,
                n_prompt,
                n_gen,
                n_depth: depth,
                n_ctx,
                gpu_memory: Some(gpu_memory),
                load_secs,
                ablation,
                back_to_back: b2b,
                ttft: Some(ttft),
                sampling: (!matches!(test, Test::Prompt(_))).then(|| sampling_label(&opts.sampling)),
                ..timed_record(opts, timed)
            })?;
        }
    }
    drop(s);
    bench_parallel(model, synthetic, load_secs, opts, progress, on_record)
}

/// The generation tests with several sequences decoded together (`BenchOptions::parallel`):
/// each sequence is filled to the depth (untimed), then every step feeds one token of each,
/// as `kiln serve` steps its slots; tokens per second count all sequences' tokens. With
/// `profile`, the batched steps' per-stage profile.
fn bench_parallel(
    model: &Model,
    synthetic: Option<&str>,
    load_secs: Option<f64>,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(&str, Option<u32>),
    on_record: &mut dyn FnMut(BenchRecord) -> Result<()>,
) -> Result<()> {
    let mut widths: Vec<u32> = opts.parallel.iter().copied().filter(|&n| n >= 1).collect();
    widths.sort_unstable();
    widths.dedup();
    let gens: Vec<u32> = opts.tests.iter().filter_map(|t| if let Test::Gen(n) = t { Some(*n) } else { None }).collect();
    let Some(&widest) = widths.iter().max() else { return Ok(()) };
    if gens.is_empty() {
        return Ok(());
    }
    let ctx: &Arc<GpuContext> = &model.ctx;
    let depths: &[u32] = if opts.depths.is_empty() { &[0] } else { &opts.depths };
    let n_ctx = gens.iter().flat_map(|&g| depths.iter().map(move |&d| d + g + 1)).max().unwrap_or(1);
    // At least two sequences: one alone is stepped as a server steps it (`x1`), on the
    // batched path, not the single-sequence one the plain tests take.
    let (mut s, gpu_memory, prompt) = bench_session(model, opts, n_ctx, widest.max(2))?;
    let greedy = crate::sample::SamplerConfig { temperature: 0.0, ..Default::default() };
    let sampler = crate::sample::Sampler::new(opts.sampling.unwrap_or(greedy));
    for &depth in depths {
        for &n_gen in &gens {
            for &np in &widths {
                let name = format!("{} x{np}", Test::Gen(n_gen).name(depth));
                let d = depth as usize;
                // Pipelined as `kiln serve` steps its slots (the next step submitted before the
                // last one is read) where one step carries them all; one by one when profiling
                // (the profiler times a step at a time).
                let run = |s: &mut crate::model::Session, pipelined: bool| -> Result<f64> {
                    s.reset();
                    let mut batch = Vec::with_capacity(np as usize);
                    for slot in 0..np as usize {
                        s.set_slot_sampling(slot, &sampler, &prompt[..=d])?;
                        if d > 0 {
                            s.forward_slot(slot, &prompt[..d], Output::Sampled)?;
                        }
                        // Each sequence its own first token, so the columns differ.
                        batch.push((slot, prompt[d + slot % 7]));
                    }
                    let t = Instant::now();
                    if pipelined && s.can_pipeline() && np as usize <= s.batch_columns() {
                        use crate::model::session::Feed;
                        let first: Vec<(usize, Feed)> = batch.iter().map(|&(slot, t)| (slot, Feed::Token(t))).collect();
                        let picked: Vec<(usize, Feed)> = batch.iter().map(|&(slot, _)| (slot, Feed::Picked)).collect();
                        s.submit_slots(&first)?;
                        for _ in 1..n_gen {
                            s.submit_slots(&picked)?;
                            s.finish_slots()?;
                        }
                        s.finish_slots()?;
                    } else {
                        for _ in 0..n_gen {
                            let picked = s.decode_slots(&batch)?;
                            for (b, p) in batch.iter_mut().zip(picked) {
                                b.1 = p;
                            }
                        }
                    }
                    Ok((np * n_gen) as f64 / t.elapsed().as_secs_f64())
                };
                let timed = time_test(&mut s, &name, opts, true, progress, &run)?;
                on_record(BenchRecord {
                    adapter: AdapterRecord::of(ctx),
                    model: ModelRecord::of(model, synthetic),
                    test: name,
                    n_gen,
                    n_depth: depth,
                    n_parallel: np,
                    n_ctx,
                    gpu_memory: Some(gpu_memory),
                    load_secs,
                    sampling: Some(sampling_label(&opts.sampling)),
                    ..timed_record(opts, timed)
                })?;
            }
        }
    }
    Ok(())
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn human_params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 * 1e-9)
    } else {
        format!("{:.2} M", n as f64 * 1e-6)
    }
}

/// llama-bench's markdown table: the header (with a ubatch column when `show_ubatch`)...
pub fn markdown_header(show_ubatch: bool) -> String {
    let (ub, ub_align) = if show_ubatch { (" n_ubatch |", " ---: |") } else { ("", "") };
    format!(
        "| model | size | params | formats | backend | GPU |{ub} test | t/s |\n| --- | ---: | ---: | --- | --- | --- |{ub_align} ---: | ---: |\n"
    )
}

/// ...and one row per record, printed as its test finishes.
pub fn markdown_row(r: &BenchRecord, show_ubatch: bool) -> String {
    let ub = if show_ubatch { format!(" {} |", r.ubatch) } else { String::new() };
    format!(
        "| {} | {} | {} | {} | {} | {} |{ub} {} | {:.2} ± {:.2} |\n",
        r.model.name,
        human_bytes(r.model.size_bytes),
        human_params(r.model.params),
        r.model.formats_label(),
        r.adapter.backend,
        r.adapter.name,
        r.test,
        r.avg_ts,
        r.stddev_ts
    )
}

/// The whole markdown table.
pub fn markdown(records: &[BenchRecord]) -> String {
    let show_ubatch = records.iter().any(|r| Some(r.ubatch) != records.first().map(|f| f.ubatch));
    let mut o = markdown_header(show_ubatch);
    for r in records {
        o.push_str(&markdown_row(r, show_ubatch));
    }
    o
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV header line.
pub const CSV_HEADER: &str = "kiln_version,git_commit,date,adapter,vendor,device_type,backend,driver,driver_info,features,model,arch,size_bytes,params,formats,test,n_prompt,n_gen,ubatch,n_ctx,kv_type,samples_ts,avg_ts,stddev_ts,n_depth,n_batch,gpu_weights_bytes,gpu_kv_bytes,gpu_activations_bytes,load_secs,n_parallel,gpu_f16_copies_bytes\n";

/// One CSV line (repetitions joined with ';').
pub fn csv_row(r: &BenchRecord) -> String {
    let samples = r.samples_ts.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(";");
    let mem = r.gpu_memory.unwrap_or_default();
    let opt = |present: bool, v: u64| if present { v.to_string() } else { String::new() };
    let fields = [
        r.kiln_version.clone(),
        r.git_commit.clone(),
        r.date.clone(),
        r.adapter.name.clone(),
        r.adapter.vendor.clone(),
        r.adapter.device_type.clone(),
        r.adapter.backend.clone(),
        r.adapter.driver.clone(),
        r.adapter.driver_info.clone(),
        r.adapter.features.join(";"),
        r.model.name.clone(),
        r.model.arch.clone(),
        r.model.size_bytes.to_string(),
        r.model.params.to_string(),
        r.model.formats_label(),
        r.test.clone(),
        r.n_prompt.to_string(),
        r.n_gen.to_string(),
        r.ubatch.to_string(),
        r.n_ctx.to_string(),
        r.kv_type.clone(),
        samples,
        format!("{:.3}", r.avg_ts),
        format!("{:.3}", r.stddev_ts),
        r.n_depth.to_string(),
        r.n_batch.to_string(),
        opt(r.gpu_memory.is_some(), mem.weights),
        opt(r.gpu_memory.is_some(), mem.kv_cache),
        opt(r.gpu_memory.is_some(), mem.activations),
        r.load_secs.map(|s| format!("{s:.3}")).unwrap_or_default(),
        r.n_parallel.to_string(),
        opt(r.gpu_memory.is_some(), mem.f16_copies),
    ];
    let mut o = fields.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(",");
    o.push('\n');
    o
}

/// The header and one line per record.
pub fn csv(records: &[BenchRecord]) -> String {
    let mut o = String::from(CSV_HEADER);
    for r in records {
        o.push_str(&csv_row(r));
    }
    o
}
