//! Scoring a token sequence on the GPU (perplexity, eval): the forward pass with every
//! position's logits, then log-softmax and the negative log-likelihood of each next token in
//! one more dispatch. Only one float per scored token comes back, once per call, instead of
//! [tokens, n_vocab] logits.

use std::time::Instant;

use super::{Session, SessionOptions};
use crate::error::{KilnError, Result};
use crate::gpu::{Bound, GpuContext};
use crate::kernels::nll::{self, NllParams};
use crate::kernels::KernelKey;
use crate::profile::{Recorder, Stage, StageWork};

/// What scoring adds to a session that keeps all logits: the NLL kernel bound to them, the
/// targets it reads and the results it writes.
pub(super) struct Scorer {
    nll: Bound,
    /// The next token of each row of a step, [ubatch].
    targets: wgpu::Buffer,
    /// The results of one `score` call, [n_ctx].
    out: wgpu::Buffer,
    /// Where they are read back, [n_ctx].
    readback: wgpu::Buffer,
}

impl Scorer {
    /// None for a session without all logits (generation), which cannot score.
    pub(super) fn new(ctx: &GpuContext, logits: &wgpu::Buffer, opts: &SessionOptions) -> Result<Option<Scorer>> {
        if !opts.all_logits {
            return Ok(None);
        }
        let targets = ctx.storage(4 * opts.ubatch.max(1) as u64, "nll targets")?;
        let out = ctx.storage(4 * opts.n_ctx.max(1) as u64, "nll results")?;
        let readback = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("nll readback"),
            size: 4 * opts.n_ctx.max(1) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let key = KernelKey::Nll { subgroups: ctx.caps.subgroups };
        let nll = Bound::new::<NllParams>(ctx, &key, "score", &[logits, &targets, &out])?;
        Ok(Some(Scorer { nll, targets, out, readback }))
    }
}

impl Session {
    /// Feeds `tokens` at the current position and returns the negative log-likelihood
    /// (natural log) of each next token from position `targets_from` on: element k is
    /// -log p(tokens[targets_from + k + 1] | tokens[..=targets_from + k] and the context
    /// before them), `tokens.len() - 1 - targets_from` values (none when `targets_from` is
    /// past the next-to-last token). Needs a session opened with `all_logits`.
    pub fn score(&mut self, tokens: &[u32], targets_from: usize) -> Result<Vec<f32>> {
        if self.scorer.is_none() {
            return Err(KilnError::invalid("session", "scoring needs a session opened with all logits"));
        }
        if tokens.is_empty() {
            return Err(KilnError::invalid("input", "no tokens to evaluate"));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
            return Err(KilnError::invalid(
                "input",
                format!("token id {bad} is outside the vocabulary of {}", self.cfg.n_vocab),
            ));
        }
        if self.pos[0] as usize + tokens.len() > self.opts.n_ctx as usize {
            return Err(KilnError::invalid(
                "input",
                format!(
                    "the context is full: {} + {} tokens exceed {} (raise -c)",
                    self.pos[0],
                    tokens.len(),
                    self.opts.n_ctx
                ),
            ));
        }
        // Positions whose next token is scored.
        let scored = targets_from.min(tokens.len() - 1)..tokens.len() - 1;
        let ubatch = self.opts.ubatch.max(1) as usize;
        let n_steps = tokens.len().div_ceil(ubatch);
        for (s, chunk) in tokens.chunks(ubatch).enumerate() {
            let start = s * ubatch;
            // This step's scored positions, lo..hi, and each row's next token.
            let lo = scored.start.max(start);
            let hi = scored.end.min(start + chunk.len()).max(lo);
            let targets: Vec<u32> = (0..chunk.len()).map(|r| tokens.get(start + r + 1).copied().unwrap_or(0)).collect();
            let rows = (lo - start) as u32..(hi - start) as u32;
            let out0 = (lo - scored.start) as u32;
            // The results of every step are read once, after the last.
            let read = if s + 1 == n_steps { scored.len() as u32 } else { 0 };
            let got = self.score_step(chunk, &targets, rows, out0, read)?;
            if read > 0 {
                return Ok(got);
            }
        }
        Ok(Vec::new())
    }

    /// One step of `score`, as `step` records it with all logits: the layers, then (when
    /// `rows` is not empty) the output norm, the LM head and the NLL of those rows into the
    /// results from `out0` on. Reads back the first `read` results (none when 0).
    fn score_step(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
        rows: std::ops::Range<u32>,
        out0: u32,
        read: u32,
    ) -> Result<Vec<f32>> {
        self.prerecorded = None;
        let t0 = Instant::now();
        let ctx = self.ctx.clone();
        let m = tokens.len() as u32;
        let v = self.cfg.n_vocab;
        let scorer = self.scorer.as_ref().ok_or_else(|| KilnError::invalid("session", "scoring needs all logits"))?;
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
        ctx.queue.write_buffer(&scorer.targets, 0, bytemuck::cast_slice(targets));
        let shape = self.write_step_state(0, m);
        let mut prof = self.prof.take();
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("score") });
        let recorded = {
            let mut rec = Recorder::new(&mut enc, "step", prof.as_mut().map(|p| p.slot(0, m, m == 1)));
            let recorded = (|| -> Result<()> {
                self.record_step(&mut rec, &shape, false)?;
                if !rows.is_empty() {
                    self.record_all_logits(&mut rec, m)?;
                    let n_rows = rows.end - rows.start;
                    rec.stage(Stage::Score, || {
                        StageWork::other("nll", format!("{n_rows}x{v}"), 4.0 * (n_rows * v) as f64, 0.0)
                    });
                    let p = NllParams { n: v, stride: v, row0: rows.start, n_rows, out0, _pad: [0; 3] };
                    scorer.nll.set(&ctx, &p);
                    scorer.nll.record_with(
                        rec.pass(),
                        &*ctx.pipeline(&KernelKey::Nll { subgroups: ctx.caps.subgroups })?,
                        nll::launch(&p),
                    );
                }
                if read > 0 {
                    rec.encoder().copy_buffer_to_buffer(&scorer.out, 0, &scorer.readback, 0, read as u64 * 4);
                }
                Ok(())
            })();
            rec.finish();
            recorded
        };
        if let Err(e) = recorded {
            self.prof = prof;
            return Err(e);
        }
        let t1 = Instant::now();
        ctx.queue.submit([enc.finish()]);
        let t2 = Instant::now();
        self.pos[0] += m;
        let scores = if read > 0 { read_scores(&ctx, &scorer.readback, read) } else { Ok(Vec::new()) };
        let t3 = Instant::now();
        let gpu = match prof.as_mut() {
            Some(p) => {
                let span = p.collect(&ctx, 0, None);
                let ph = p.profile.phase_mut(m == 1);
                ph.cpu.encode += (t1 - t0).as_secs_f64();
                ph.cpu.submit += (t2 - t1).as_secs_f64();
                ph.cpu.wait += (t3 - t2).as_secs_f64();
                ph.submits += 1;
                ph.readbacks += (read > 0) as u64;
                span
            }
            None => Ok(0.0),
        };
        self.prof = prof;
        self.timing.encode = (t1 - t0).as_secs_f64();
        self.timing.submit = (t2 - t1).as_secs_f64();
        self.timing.wait = (t3 - t2).as_secs_f64();
        self.timing.gpu = gpu?;
        scores
    }
}

/// Maps the first `n` results of `readback` (after the submit that copied them there).
fn read_scores(ctx: &GpuContext, readback: &wgpu::Buffer, n: u32) -> Result<Vec<f32>> {
    let bytes = n as u64 * 4;
    let (tx, rx) = std::sync::mpsc::channel();
    readback.map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
        let _ = tx.send(r);
    });
    ctx.wait_idle("scoring")?;
    match rx.recv_timeout(ctx.poll_timeout) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(KilnError::Gpu { context: "reading scores".into(), message: e.to_string() }),
        Err(_) => {
            return Err(KilnError::GpuTimeout { what: "reading scores".into(), seconds: ctx.poll_timeout.as_secs() })
        }
    }
    let scores = readback
        .get_mapped_range(0..bytes)
        .map(|view| bytemuck::pod_collect_to_vec(&view))
        .map_err(|e| KilnError::Gpu { context: "reading scores".into(), message: e.to_string() });
    readback.unmap();
    scores
}
