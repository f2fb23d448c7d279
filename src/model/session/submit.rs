//! How steps run: one command buffer and one submit per step, its readback, and decoding
//! with the steps chained on the GPU (the next step is submitted before the host reads the
//! last token). A sequence's step and a batched decode step (slots.rs) submit alike.

use crate::error::{KilnError, Result};
use crate::gpu::grid;
use crate::kernels::norm::RmsNormParams;
use crate::kernels::KernelKey;
use crate::model::sizes::pad4;
use crate::profile::{Recorder, Stage, StageWork};

use crate::kernels::matmul::{StepColumn, StepState};

use super::forward::StepShape;
use super::{Output, Picker, Session, StepTiming, CHAIN_MAX};

impl Session {
    /// The shape of a step of `m` tokens of `slot`'s sequence from its position, with the
    /// step buffer written for it: the header the kernels read, and where the sampler reads
    /// a slot other than 0 from the table, its first column.
    pub(super) fn write_step_state(&self, slot: usize, m: u32) -> StepShape {
        let (pos0, kv_base) = (self.pos[slot], slot as u32 * self.opts.n_ctx);
        let state = StepState { n_tokens: m, pos0, kv_len: pos0 + m, kv_base };
        let mut shape = StepShape::sequence(m, pos0, kv_base);
        if slot == 0 {
            self.ctx.queue.write_buffer(&self.step_state, 0, bytemuck::bytes_of(&state));
        } else {
            let last = pos0 + m - 1;
            let col = StepColumn { pos: last, kv_len: last + 1, kv_base, slot: slot as u32 };
            let mut bytes = bytemuck::bytes_of(&state).to_vec();
            bytes.extend_from_slice(bytemuck::bytes_of(&col));
            self.ctx.queue.write_buffer(&self.step_state, 0, &bytes);
            shape.table_sampler = true;
        }
        shape
    }

    /// One forward step of `tokens` of `slot`'s sequence: one command buffer, one submit,
    /// one readback (when `read`).
    pub(super) fn step(&mut self, slot: usize, tokens: &[u32], out: Output, read: bool) -> Result<Vec<f32>> {
        let shape = self.write_step_state(slot, tokens.len() as u32);
        let got = self.run_step(tokens, &shape, out, read)?;
        self.pos[slot] += shape.m;
        Ok(got)
    }

    /// Runs one step whose step buffer is written: the ids, one command buffer, one submit,
    /// the readback (when `read`): the picked tokens (as f32) or the logits `out` asks for.
    pub(super) fn run_step(&mut self, ids: &[u32], shape: &StepShape, out: Output, read: bool) -> Result<Vec<f32>> {
        self.prerecorded = None;
        let t0 = std::time::Instant::now();
        let ctx = self.ctx.clone();
        let m = shape.m;
        let mut prof = self.prof.take();
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(ids));
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        let read_bytes;
        let early;
        {
            let mut rec =
                Recorder::new(&mut enc, "step", prof.as_mut().map(|p| p.slot(0, m, m == 1 || shape.batched.is_some())));
            if let Some(stage) = self.skip {
                rec.skip_stage(&ctx.device, stage);
            }
            // A prompt step's first layers run while the host records the rest.
            if m > 1 && shape.batched.is_none() {
                rec.submit_early(&ctx.device, &ctx.queue);
            }
            let recorded = self.record_forward(&mut rec, shape, out, read);
            early = rec.early_submit_secs();
            rec.finish();
            read_bytes = recorded;
        }
        let read_bytes = match read_bytes {
            Ok(n) => n,
            Err(e) => {
                self.prof = prof;
                return Err(e);
            }
        };
        let t1 = std::time::Instant::now();
        ctx.queue.submit([enc.finish()]);
        let t2 = std::time::Instant::now();
        if read && self.prerecords_after(shape, out) {
            self.prerecord_first_step(shape.pos0 + m);
        }
        let bytes = if read { self.read(read_bytes)? } else { Vec::new() };
        let t3 = std::time::Instant::now();
        let gpu = match prof.as_mut() {
            Some(p) => {
                let span = p.collect(&ctx, 0, None)?;
                let ph = p.profile.phase_mut(m == 1 || shape.batched.is_some());
                ph.cpu.encode += (t1 - t0).as_secs_f64();
                ph.cpu.submit += (t2 - t1).as_secs_f64();
                ph.cpu.wait += (t3 - t2).as_secs_f64();
                ph.submits += 1;
                ph.readbacks += read as u64;
                span
            }
            None => 0.0,
        };
        self.prof = prof;
        // The parts of the step submitted while it was recorded count as submitting.
        self.timing = StepTiming {
            encode: (t1 - t0).as_secs_f64() - early,
            submit: (t2 - t1).as_secs_f64() + early,
            wait: (t3 - t2).as_secs_f64(),
            gpu,
        };
        self.host.steps += 1;
        self.host.encode += self.timing.encode;
        self.host.submit += self.timing.submit;
        self.host.wait += self.timing.wait;
        if !read {
            return Ok(Vec::new());
        }
        if matches!(out, Output::Argmax | Output::Sampled) {
            let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            return Ok(ids.into_iter().map(|id| id as f32).collect());
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Records one forward step (its ids and the step buffer already written) up to its
    /// output: all logits, the last position's logits (each column's, batched), or the
    /// picked tokens, copied to the readback buffer when `read`. Returns the bytes to read
    /// back.
    pub(super) fn record_forward(
        &self,
        rec: &mut Recorder<'_>,
        shape: &StepShape,
        out: Output,
        read: bool,
    ) -> Result<u64> {
        let (n_embd, v) = (self.cfg.n_embd, self.cfg.n_vocab);
        let se = pad4(n_embd);
        let m = shape.m;
        self.record_step(rec, shape, false)?;
        if out == Output::AllLogits {
            self.record_all_logits(rec, m)?;
            let n = m as u64 * v as u64 * 4;
            if read {
                rec.encoder().copy_buffer_to_buffer(&self.logits, 0, &self.readback, 0, n);
            }
            return Ok(n);
        }
        // Rows through the head: each column of a batched step, else the last position.
        let rows = if shape.batched.is_some() { m } else { 1 };
        if m > 1 && rows == 1 {
            // Only the last position goes through the output norm and the LM head.
            let last = (m - 1) as u64 * se as u64 * 4;
            rec.encoder().copy_buffer_to_buffer(&self.x, last, &self.x_last, 0, se as u64 * 4);
        }
        // One token, or a batched step: x holds the rows and the head reads them in the same pass.
        let head = if m == rows { &self.lm_head_x } else { &self.lm_head_last };
        let picker = if shape.table_sampler { Picker::Table } else { Picker::Own };
        self.record_head(rec, head, rows, out, picker)?;
        let (src, n) = match out {
            Output::Argmax | Output::Sampled => (&self.out_id, rows as u64 * 4),
            _ => (&self.logits, rows as u64 * v as u64 * 4),
        };
        rec.encoder().copy_buffer_to_buffer(src, 0, &self.readback, 0, n);
        Ok(n)
    }

    /// Records the output norm and the LM head over all `m` positions of the step, into
    /// `logits` (evaluation and scoring).
    pub(super) fn record_all_logits(&self, rec: &mut Recorder<'_>, m: u32) -> Result<()> {
        let ctx = &self.ctx;
        let n_embd = self.cfg.n_embd;
        let se = pad4(n_embd);
        rec.stage(Stage::OutputNorm, || {
            StageWork::other("rms_norm", format!("{m}x{n_embd}"), 8.0 * (m * n_embd) as f64, 0.0)
        });
        self.out_norm_all.set(ctx, &RmsNormParams { n: n_embd, x_stride: se, y_stride: se, eps: self.cfg.rms_eps });
        self.out_norm_all.record_with(
            rec.pass(),
            &*ctx.pipeline(&KernelKey::RmsNorm { subgroups: ctx.caps.subgroups, halves: false })?,
            grid(m),
        );
        rec.stage(Stage::LmHead, || self.lm_head_all.work(ctx, m, false));
        self.lm_head_all.record(ctx, rec.pass(), m, false)
    }

    /// Builds the pipelines this session's steps use before the first step needs them, by
    /// recording (never submitting) prompt steps at the sizes the planner treats differently
    /// (each GEMV width up to 8 tokens, then every multiple of 16 up to the full batch: the
    /// GEMV's column groups, and the GEMM tiles, 16, 64 or 128 tokens tall, split along K or
    /// not by how many of them a matmul makes, which changes only where a multiple of 16
    /// tokens is passed; a split GEMM's epilogue and an unsplit one's are different
    /// pipelines), a chained decode step, and batched steps of every width up to one GEMV
    /// workgroup's and the widest, at a short context and the longest (decode attention's
    /// variants differ by length): a prompt's first token, or a server's first step of
    /// three sequences, or two prompts prefilled together, then costs its computation, not
    /// shader compilation. With
    /// a pipeline cache on disk, a second start compiles from it. The CLI calls this after
    /// opening a session. Not on CPU adapters: llvmpipe compiles a shader at its first
    /// dispatch, whatever was built before.
    pub fn build_pipelines(&mut self) -> Result<()> {
        let ctx = self.ctx.clone();
        if ctx.caps.cpu_adapter {
            return Ok(());
        }
        let room = self.opts.n_ctx - self.pos[0];
        let mut enc =
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("never submitted") });
        // A server's 128-token prompt took the 64x64 cooperative tile unsplit (its SwiGLU
        // epilogue), which none of the sizes 2-8, 16, 40 and the ubatch recorded here took: its
        // first request compiled it (H200, run 111: 220 ms to its first token).
        let mut sizes: Vec<u32> =
            (2..=8).chain((16..=self.opts.ubatch).step_by(16)).chain([self.opts.ubatch]).collect();
        sizes.retain(|&m| m <= room.min(self.opts.ubatch));
        sizes.sort_unstable();
        sizes.dedup();
        for &m in &sizes {
            let mut rec = Recorder::new(&mut enc, "warm-up", None);
            let r = self.record_forward(&mut rec, &StepShape::sequence(m, self.pos[0], 0), Output::Sampled, false);
            rec.finish();
            r?;
        }
        // Two prompts prefilled together at the same sizes (their Q/K/V epilogue and flash
        // attention differ; the head's rows are a batched step's, built below).
        if self.can_prefill_together() {
            for &m in sizes.iter().filter(|&&m| m > self.prefill_gemv_cols) {
                let half = m / 2;
                let chunks = [
                    crate::kernels::flash_attention::Chunk { m: half, pos0: 0, kv_base: 0 },
                    crate::kernels::flash_attention::Chunk { m: m - half, pos0: 0, kv_base: self.opts.n_ctx },
                ];
                let launch =
                    crate::kernels::flash_attention::launch_segments(self.kv, &self.shape, &chunks, &ctx.caps)?;
                let shape = StepShape { together: Some(launch.0), table_sampler: true, ..StepShape::sequence(m, 0, 0) };
                let mut rec = Recorder::new(&mut enc, "warm-up", None);
                let r = self.record_step(&mut rec, &shape, false);
                rec.finish();
                r?;
            }
        }
        if room > 0 {
            self.record_steps(&mut enc, &mut None, None, 1, 0, self.pos[0])?;
        }
        // The other kind of sampler (greedy or not) than the one configured now, which the
        // steps above took: both passes, or a greedy sampler's one.
        let (subgroups, tops, greedy) = (ctx.caps.subgroups, ctx.caps.sample_tops, !self.sample_greedy);
        for chained in [false, true] {
            ctx.pipeline(&KernelKey::Sample { subgroups, batched: false, prune: false, tops, chained, greedy })?;
        }
        ctx.pipeline(&KernelKey::Sample {
            subgroups,
            batched: false,
            prune: true,
            tops,
            chained: false,
            greedy: false,
        })?;
        // Decode attention's variant changes with the context (blocks of heads, cooperative
        // matrices and their tiles, the combine pass), only where a length crosses a multiple
        // of 64 positions: each one the session's contexts take, so that none compiles in the
        // middle of a generation.
        let q8_out = self.layers.iter().any(|l| l.wo_q8.is_some());
        let mut decode_keys = std::collections::HashSet::new();
        for kv_len in std::iter::once(1).chain((64..=self.shape.n_ctx).step_by(64)).chain([self.shape.n_ctx]) {
            let l = crate::kernels::attention::decode_launch(&ctx.caps, self.kv, &self.shape, kv_len, q8_out)?;
            let keys = [Some(l.key), l.combine.map(|_| l.combine_key)];
            for key in keys.into_iter().flatten().filter(|k| decode_keys.insert(*k)) {
                ctx.pipeline(&key)?;
            }
        }
        let wide = self.batch_cols as u32;
        if wide > 1 {
            let widths = (1..=wide.min(crate::plan::GEMV_GROUP_COLS)).chain([wide]);
            for (m, kv_len) in widths.flat_map(|m| [(m, 1), (m, self.opts.n_ctx)]) {
                let shape =
                    StepShape { m, pos0: 0, kv_base: 0, batched: Some(kv_len), table_sampler: true, together: None };
                let mut rec = Recorder::new(&mut enc, "warm-up", None);
                let r = self.record_forward(&mut rec, &shape, Output::Sampled, false);
                rec.finish();
                r?;
            }
        }
        // Scoring sessions (perplexity, eval): the LM head over every position and the NLL
        // kernel, so that the first chunk does not wait for them to compile.
        if self.scorer.is_some() {
            let m = self.opts.ubatch.min(room).max(1);
            let mut rec = Recorder::new(&mut enc, "warm-up", None);
            let r = self.record_all_logits(&mut rec, m);
            rec.finish();
            r?;
            ctx.pipeline(&KernelKey::Nll { subgroups: ctx.caps.subgroups })?;
        }
        drop(enc);
        ctx.save_pipeline_cache();
        Ok(())
    }

    pub(super) fn read(&self, n: u64) -> Result<Vec<u8>> {
        let mut data = self.ctx.read_mapped(&self.readback, n.div_ceil(4) * 4, None, "a forward step")?;
        data.truncate(n as usize);
        Ok(data)
    }

    /// Greedy decoding with the steps chained on the GPU (`generate_chained` with a greedy
    /// sampler and no penalties).
    pub fn generate_greedy_chained(
        &mut self,
        first: u32,
        max_new: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        self.set_sampling(
            &crate::sample::Sampler::new(crate::sample::SamplerConfig { temperature: 0.0, ..Default::default() }),
            &[],
        );
        self.generate_chained(first, max_new, on_token)
    }

    /// Decoding with the steps chained on the GPU, each token picked by the GPU sampler as
    /// `set_sampling` configured it: a step reads the token the step before sampled straight
    /// from GPU memory, so steps are recorded in groups of `steps_per_submit` per command
    /// buffer (one submit each), and the next group is submitted before the host reads the
    /// last one's tokens: the GPU never waits for the host. `first` is the token to feed;
    /// `on_token` gets each new token and returns false to stop (the steps already queued
    /// past it are dropped from the cache). Returns the tokens generated (at most `max_new`).
    pub fn generate_chained(
        &mut self,
        first: u32,
        max_new: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let ctx = self.ctx.clone();
        let room = (self.opts.n_ctx - self.pos[0]) as usize;
        let max_new = max_new.min(room);
        let mut out = Vec::new();
        if max_new == 0 {
            return Ok(out);
        }
        // One step per submit while profiling: the profiler times one step per slot.
        let per = if self.prof.is_some() { 1 } else { self.steps_per_submit };
        ctx.queue.write_buffer(&self.out_id, 0, bytemuck::bytes_of(&first));
        // Groups in flight: submission, readback slot, steps.
        let mut in_flight: std::collections::VecDeque<(wgpu::SubmissionIndex, usize, usize)> = Default::default();
        let mut submitted = 0usize;
        let mut group = 0usize;
        loop {
            // Keep two groups in flight: the next is recorded while the GPU runs the last.
            while in_flight.len() < 2 && submitted < max_new {
                // The first groups grow 1, 2, 4, ... steps up to `per`: the GPU starts after
                // one step's recording, not a whole group's (host record + submit ~0.4 ms a
                // step on an H200; a 4-step first group left the GPU idle for 1.6 ms of
                // tg128's 117, run 226).
                let n = per.min(1 << group.min(16)).min(max_new - submitted);
                let idx = match self.take_prerecorded(group) {
                    Some(first_step) => self.submit_prerecorded(first_step),
                    None => self.submit_steps(group % 2, n, submitted)?,
                };
                in_flight.push_back((idx, group % 2, n));
                submitted += n;
                group += 1;
            }
            let Some((index, slot, n)) = in_flight.pop_front() else { break };
            let t_wait = std::time::Instant::now();
            let bytes = ctx.read_mapped(&self.chain_stage[slot], n as u64 * 4, Some(index.clone()), "a decode step")?;
            let tokens: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            self.host.wait += t_wait.elapsed().as_secs_f64();
            if let Some(p) = self.prof.as_mut() {
                p.profile.decode.cpu.wait += t_wait.elapsed().as_secs_f64();
                p.profile.decode.readbacks += 1;
                self.timing.gpu =
                    p.collect(&ctx, submitted - in_flight.iter().map(|g| g.2).sum::<usize>() - n, Some(index))?;
            }
            for (i, &tok) in tokens.iter().enumerate() {
                out.push(tok);
                if !on_token(tok) {
                    // The steps queued after this one ran on tokens we do not want.
                    let wasted = (n - i - 1) + in_flight.iter().map(|g| g.2).sum::<usize>();
                    if wasted > 0 {
                        ctx.wait_idle("a decode step")?;
                        self.pos[0] -= wasted as u32;
                    }
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Records `n` chained decode steps (steps `k0..k0 + n` of a generation) into one command
    /// buffer and submits it; the steps leave their sampled tokens in `chain_stage[slot]`.
    fn submit_steps(&mut self, slot: usize, n: usize, k0: usize) -> Result<wgpu::SubmissionIndex> {
        let ctx = self.ctx.clone();
        let t0 = std::time::Instant::now();
        let mut enc =
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("chained steps") });
        let mut prof = self.prof.take();
        let recorded = self.record_steps(&mut enc, &mut prof, Some(slot), n, k0, self.pos[0]);
        let t1 = std::time::Instant::now();
        let idx = recorded.map(|_| ctx.queue.submit([enc.finish()]));
        let (encode, submit) = ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
        self.host.steps += n as u64;
        self.host.encode += encode;
        self.host.submit += submit;
        if let Some(p) = prof.as_mut() {
            p.profile.decode.cpu.encode += encode;
            p.profile.decode.cpu.submit += submit;
            p.profile.decode.submits += 1;
        }
        self.prof = prof;
        self.pos[0] += n as u32;
        idx
    }

    /// Whether a step of `shape` whose `out` is read back is a prompt that a chained generation
    /// usually follows (`prerecord_first_step`): slot 0's sequence, several tokens, one token
    /// picked, room for a decode step after it, and nothing that changes how steps record.
    fn prerecords_after(&self, shape: &StepShape, out: Output) -> bool {
        self.prerecord
            && shape.m > 1
            && shape.kv_base == 0
            && shape.batched.is_none()
            && shape.together.is_none()
            && matches!(out, Output::Argmax | Output::Sampled)
            && shape.pos0 + shape.m < self.opts.n_ctx
            && self.prof.is_none()
            && self.skip.is_none()
    }

    /// Records the first decode step after a prompt while the GPU runs the prompt, so that
    /// `generate_chained` submits it as soon as the prompt's token is known instead of first
    /// recording it. Its queue writes (the step state, its kernels' parameters) land with the
    /// next submit; any other step of this session drops it (`run_step`, `take_prerecorded`,
    /// `time_steps`, slots.rs, score.rs), since its writes would change what it reads. Why: after
    /// a long prompt the host takes longest over that step (H200, 4,096-token prompt: its
    /// recording and submit ~0.2-1.2 ms more than the steps after it, run 467), while the GPU
    /// waits; during the prompt the host only waits.
    fn prerecord_first_step(&mut self, pos: u32) {
        let ctx = self.ctx.clone();
        let t = std::time::Instant::now();
        let mut enc =
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("chained steps") });
        if self.record_steps(&mut enc, &mut None, Some(0), 1, 0, pos).is_ok() {
            let commands = enc.finish();
            self.prerecorded =
                Some(Prerecorded { pos, greedy: self.sample_greedy, commands, host_secs: t.elapsed().as_secs_f64() });
        }
    }

    /// The prerecorded first step where a chained generation's first group (`group` 0, always
    /// one step) is the step it recorded: the same position and kind of sampler, unprofiled.
    /// Taken whatever the group, so that no later group finds it.
    fn take_prerecorded(&mut self, group: usize) -> Option<Prerecorded> {
        let p = self.prerecorded.take()?;
        let fits = group == 0
            && p.pos == self.pos[0]
            && p.greedy == self.sample_greedy
            && self.prof.is_none()
            && self.skip.is_none();
        fits.then_some(p)
    }

    /// Submits a prerecorded first step as a chained group of one (readback slot 0).
    fn submit_prerecorded(&mut self, first_step: Prerecorded) -> wgpu::SubmissionIndex {
        let t = std::time::Instant::now();
        let idx = self.ctx.queue.submit([first_step.commands]);
        self.host.steps += 1;
        self.host.encode += first_step.host_secs;
        self.host.submit += t.elapsed().as_secs_f64();
        self.pos[0] += 1;
        idx
    }

    /// Records `n` decode steps of slot 0's sequence from position `pos` on: the step state the
    /// kernels read is written here for the first, and each step's sampler moves it on to the
    /// next position and appends its token to `chain_tokens` (the next step's embedding gather
    /// reads the token from `out_id`); with `slot`, the group's tokens are copied to
    /// `chain_stage[slot]` for the host after its last step. Does not move the session's position.
    fn record_steps(
        &self,
        enc: &mut wgpu::CommandEncoder,
        prof: &mut Option<crate::profile::Profiler>,
        slot: Option<usize>,
        n: usize,
        k0: usize,
        pos: u32,
    ) -> Result<()> {
        let ctx = &self.ctx;
        debug_assert!(n <= CHAIN_MAX && pos as usize + n <= self.opts.n_ctx as usize);
        // Queue writes land before the command buffer's commands and after those of the groups
        // submitted before it.
        let first = StepState { n_tokens: 1, pos0: pos, kv_len: pos + 1, kv_base: 0 };
        ctx.queue.write_buffer(&self.step_state, 0, bytemuck::bytes_of(&first));
        ctx.queue.write_buffer(&self.chain_tokens, 0, bytemuck::bytes_of(&0u32));
        for j in 0..n {
            let mut rec = Recorder::new(enc, "decode", prof.as_mut().map(|p| p.slot(k0 + j, 1, true)));
            if let Some(stage) = self.skip {
                rec.skip_stage(&ctx.device, stage);
            }
            let step = StepShape::sequence(1, pos + j as u32, 0);
            let recorded = self
                .record_step(&mut rec, &step, true)
                .and_then(|_| self.record_head(&mut rec, &self.lm_head_x, 1, Output::Sampled, Picker::Chained));
            rec.finish();
            recorded?;
        }
        if let Some(slot) = slot {
            enc.copy_buffer_to_buffer(&self.chain_tokens, 4, &self.chain_stage[slot], 0, n as u64 * 4);
        }
        Ok(())
    }
}

/// A generation's first decode step recorded while the GPU ran the prompt before it
/// (`Session::prerecord_first_step`): its position, the kind of sampler it recorded (greedy
/// or not: their dispatches differ), its commands and the host seconds they took.
pub(super) struct Prerecorded {
    pos: u32,
    greedy: bool,
    commands: wgpu::CommandBuffer,
    host_secs: f64,
}

/// What decode steps cost when the host never waits between them (`time_back_to_back`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BackToBack {
    /// GPU microseconds per step: the span between a timestamp before the first step and
    /// one after the last, with none in between to slow the steps down.
    pub gpu_us: f64,
    /// Host microseconds per step to record the steps and to submit them (one submit per
    /// `CHAIN_MAX` steps).
    pub record_us: f64,
    pub submit_us: f64,
}

impl Session {
    /// Records `n` decode steps (at most the context's room) back to back and measures them
    /// (`BackToBack`): groups of up to `CHAIN_MAX` steps, each one command buffer and one
    /// submit timed on its own, so that every step of a `tg<n>` test is in the account (its
    /// later steps attend over more positions: Llama-7B's split their attention past 64). The
    /// steps are those `generate_chained` would run from here with the sampling `set_sampling`
    /// configured; the session's position is left as it was (their K/V rows are overwritten
    /// later). Needs TIMESTAMP_QUERY.
    pub fn time_back_to_back(&mut self, n: usize) -> Result<BackToBack> {
        let ctx = self.ctx.clone();
        if !ctx.caps.timestamps {
            return Err(KilnError::AdapterUnusable {
                adapter: ctx.info.name.clone(),
                reason: "GPU timing needs TIMESTAMP_QUERY, which this adapter does not offer".into(),
            });
        }
        let n = n.min((self.opts.n_ctx - self.pos[0]) as usize);
        if n == 0 {
            return Err(KilnError::invalid("back-to-back steps", "no room for a decode step in the context"));
        }
        let start = self.pos[0];
        let (mut gpu_ns, mut record, mut submit) = (0.0, 0.0, 0.0);
        let mut done = 0;
        while done < n {
            let group = (n - done).min(CHAIN_MAX);
            let timed = self.time_steps(group);
            // The next group goes on from this one's positions, whose K/V rows it wrote.
            self.pos[0] += group as u32;
            let (span_ns, rec, sub) = match timed {
                Ok(t) => t,
                Err(e) => {
                    self.pos[0] = start;
                    return Err(e);
                }
            };
            gpu_ns += span_ns;
            record += rec;
            submit += sub;
            done += group;
        }
        self.pos[0] = start;
        let per = |secs: f64| secs * 1e6 / n as f64;
        Ok(BackToBack { gpu_us: gpu_ns * 1e-3 / n as f64, record_us: per(record), submit_us: per(submit) })
    }

    /// `n` (at most `CHAIN_MAX`) decode steps from the session's position recorded into one
    /// command buffer between two timestamps and submitted: the GPU span in nanoseconds, and
    /// the host's seconds to record and to submit them.
    fn time_steps(&mut self, n: usize) -> Result<(f64, f64, f64)> {
        self.prerecorded = None;
        let ctx = self.ctx.clone();
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("back-to-back timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("back-to-back resolve"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let t0 = std::time::Instant::now();
        let mut enc =
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("back to back") });
        // Empty passes carry the two timestamps, so no step is timed differently from another.
        let mark = |enc: &mut wgpu::CommandEncoder, begin: Option<u32>, end: Option<u32>| {
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("timestamp"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &set,
                    beginning_of_pass_write_index: begin,
                    end_of_pass_write_index: end,
                }),
            });
        };
        mark(&mut enc, Some(0), None);
        self.record_steps(&mut enc, &mut None, None, n, 0, self.pos[0])?;
        mark(&mut enc, None, Some(1));
        enc.resolve_query_set(&set, 0..2, &resolve, 0);
        let t1 = std::time::Instant::now();
        ctx.queue.submit([enc.finish()]);
        let t2 = std::time::Instant::now();
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&resolve, 0, 16)?);
        let span_ns = ticks[1].saturating_sub(ticks[0]) as f64 * ctx.queue.get_timestamp_period() as f64;
        Ok((span_ns, (t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64()))
    }
}
