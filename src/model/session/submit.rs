//! How steps run: one command buffer and one submit per step, its readback, and decoding
//! with the steps chained on the GPU (the next step is submitted before the host reads the
//! last token).

use crate::error::{KilnError, Result};
use crate::gpu::grid;
use crate::kernels::norm::RmsNormParams;
use crate::kernels::KernelKey;
use crate::model::sizes::pad4;
use crate::profile::{Recorder, Stage, StageWork};

use crate::kernels::matmul::StepState;

use super::{Output, Session, StepTiming};

impl Session {
    /// The next step's tokens and position, for the kernels that read them from the GPU.
    pub(super) fn write_step_state(&self, m: u32) {
        let state = StepState { n_tokens: m, pos0: self.pos, kv_len: self.pos + m, _pad: 0 };
        self.ctx.queue.write_buffer(&self.step_state, 0, bytemuck::bytes_of(&state));
    }

    /// One forward step: one command buffer, one submit, one readback (when `read`).
    pub(super) fn step(&mut self, tokens: &[u32], out: Output, read: bool) -> Result<Vec<f32>> {
        let t0 = std::time::Instant::now();
        let ctx = self.ctx.clone();
        let m = tokens.len() as u32;
        let (n_embd, rms_eps, v) = (self.cfg.n_embd, self.cfg.rms_eps, self.cfg.n_vocab);
        let mut prof = self.prof.take();
        let se = pad4(n_embd);
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
        self.write_step_state(m);
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        let read_bytes;
        {
            let mut rec = Recorder::new(&mut enc, "step", prof.as_mut().map(|p| p.slot(0, m)));
            if let Some(stage) = self.skip {
                rec.skip_stage(&ctx.device, stage);
            }
            let recorded = (|| -> Result<u64> {
                self.record_step(&mut rec, m, false)?;
                if out == Output::AllLogits {
                    rec.stage(Stage::OutputNorm, || {
                        StageWork::other("rms_norm", format!("{m}x{n_embd}"), 8.0 * (m * n_embd) as f64, 0.0)
                    });
                    self.out_norm_all
                        .set(&*ctx, &RmsNormParams { n: n_embd, x_stride: se, y_stride: se, eps: rms_eps });
                    self.out_norm_all.record_with(
                        rec.pass(),
                        &*ctx.pipeline(&KernelKey::RmsNorm { subgroups: ctx.caps.subgroups })?,
                        grid(m),
                    );
                    rec.stage(Stage::LmHead, || self.lm_head_all.work(&ctx, m));
                    self.lm_head_all.record(&ctx, rec.pass(), m, None)?;
                    let n = m as u64 * v as u64 * 4;
                    if read {
                        rec.encoder().copy_buffer_to_buffer(&self.logits, 0, &self.readback, 0, n);
                    }
                    return Ok(n);
                }
                if m > 1 {
                    // Only the last position goes through the output norm and the LM head.
                    let last = (m - 1) as u64 * se as u64 * 4;
                    rec.encoder().copy_buffer_to_buffer(&self.x, last, &self.x_last, 0, se as u64 * 4);
                }
                // One token: x is the last position and the head reads it in the same pass.
                let head = if m == 1 { &self.lm_head_x } else { &self.lm_head_last };
                self.record_head(&mut rec, head, out)?;
                let (src, n) = match out {
                    Output::Argmax | Output::Sampled => (&self.out_id, 4),
                    _ => (&self.logits, v as u64 * 4),
                };
                rec.encoder().copy_buffer_to_buffer(src, 0, &self.readback, 0, n);
                Ok(n)
            })();
            rec.finish();
            read_bytes = recorded?;
        }
        let t1 = std::time::Instant::now();
        ctx.queue.submit([enc.finish()]);
        let t2 = std::time::Instant::now();
        self.pos += m;
        let bytes = if read { self.read(read_bytes)? } else { Vec::new() };
        let t3 = std::time::Instant::now();
        let gpu = match prof.as_mut() {
            Some(p) => {
                let span = p.collect(&ctx, 0, None)?;
                let ph = p.profile.phase_mut(m == 1);
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
        self.timing = StepTiming {
            encode: (t1 - t0).as_secs_f64(),
            submit: (t2 - t1).as_secs_f64(),
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
            let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            return Ok(vec![id as f32]);
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    pub(super) fn read(&self, n: u64) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.readback.map_async(wgpu::MapMode::Read, 0..n.div_ceil(4) * 4, move |r| {
            let _ = tx.send(r);
        });
        self.ctx.wait_idle("a forward step")?;
        match rx.recv_timeout(self.ctx.poll_timeout) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(KilnError::Gpu { context: "reading results".into(), message: e.to_string() }),
            Err(_) => {
                return Err(KilnError::GpuTimeout {
                    what: "reading results".into(),
                    seconds: self.ctx.poll_timeout.as_secs(),
                })
            }
        }
        let data = self
            .readback
            .get_mapped_range(0..n.div_ceil(4) * 4)
            .map_err(|e| KilnError::Gpu { context: "reading results".into(), message: e.to_string() })?[..n as usize]
            .to_vec();
        self.readback.unmap();
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
    /// `set_sampling` configured it: step k+1 reads the token step k sampled straight from GPU
    /// memory and is submitted before the host reads token k, so the GPU never waits for the
    /// host. `first` is the token to feed; `on_token` gets each new token and returns false
    /// to stop. Returns the tokens generated (at most `max_new`).
    pub fn generate_chained(
        &mut self,
        first: u32,
        max_new: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let ctx = self.ctx.clone();
        let room = (self.opts.n_ctx - self.pos) as usize;
        let max_new = max_new.min(room);
        let mut out = Vec::new();
        if max_new == 0 {
            return Ok(out);
        }
        ctx.queue.write_buffer(&self.out_id, 0, bytemuck::bytes_of(&first));
        // Submission indices of the (at most two) steps in flight, by k % 2.
        let mut submitted: [Option<wgpu::SubmissionIndex>; 2] = [None, None];
        let submit = |s: &mut Session, k: usize| -> Result<wgpu::SubmissionIndex> {
            let t0 = std::time::Instant::now();
            s.write_step_state(1);
            let mut enc =
                ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("chained step") });
            let mut prof = s.prof.take();
            let recorded = {
                let mut rec = Recorder::new(&mut enc, "decode", prof.as_mut().map(|p| p.slot(k, 1)));
                if let Some(stage) = s.skip {
                    rec.skip_stage(&ctx.device, stage);
                }
                let r = s
                    .record_step(&mut rec, 1, true)
                    .and_then(|_| s.record_head(&mut rec, &s.lm_head_x, Output::Sampled));
                if r.is_ok() {
                    rec.encoder().copy_buffer_to_buffer(&s.out_id, 0, &s.chain_stage[k % 2], 0, 4);
                }
                rec.finish();
                r
            };
            let t1 = std::time::Instant::now();
            let idx = recorded.map(|_| ctx.queue.submit([enc.finish()]));
            let (encode, submit) = ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
            s.host.steps += 1;
            s.host.encode += encode;
            s.host.submit += submit;
            if let Some(p) = prof.as_mut() {
                p.profile.decode.cpu.encode += encode;
                p.profile.decode.cpu.submit += submit;
                p.profile.decode.submits += 1;
            }
            s.prof = prof;
            s.pos += 1;
            idx
        };
        submitted[0] = Some(submit(self, 0)?);
        for k in 0..max_new {
            if k + 1 < max_new {
                submitted[(k + 1) % 2] = Some(submit(self, k + 1)?);
            }
            let t_wait = std::time::Instant::now();
            let slot = &self.chain_stage[k % 2];
            let (tx, rx) = std::sync::mpsc::channel();
            slot.map_async(wgpu::MapMode::Read, 0..4, move |r| {
                let _ = tx.send(r);
            });
            let index = submitted[k % 2].take();
            let polled = ctx
                .device
                .poll(wgpu::PollType::Wait { submission_index: index.clone(), timeout: Some(ctx.poll_timeout) });
            // A lost device or failed submission explains a failed poll best.
            ctx.check_fault("a decode step")?;
            polled.map_err(|e| KilnError::Gpu { context: "a decode step".into(), message: e.to_string() })?;
            match rx.recv_timeout(ctx.poll_timeout) {
                Ok(Ok(())) => {}
                _ => {
                    return Err(KilnError::GpuTimeout {
                        what: "reading a sampled token".into(),
                        seconds: ctx.poll_timeout.as_secs(),
                    })
                }
            }
            let tok = {
                let view = slot
                    .get_mapped_range(0..4)
                    .map_err(|e| KilnError::Gpu { context: "reading a token".into(), message: e.to_string() })?;
                u32::from_le_bytes([view[0], view[1], view[2], view[3]])
            };
            slot.unmap();
            self.host.wait += t_wait.elapsed().as_secs_f64();
            if let Some(p) = self.prof.as_mut() {
                p.profile.decode.cpu.wait += t_wait.elapsed().as_secs_f64();
                p.profile.decode.readbacks += 1;
                self.timing.gpu = p.collect(&ctx, k, index)?;
            }
            out.push(tok);
            if !on_token(tok) {
                // The step already queued after this one ran on a token we do not want.
                if k + 1 < max_new {
                    ctx.wait_idle("a decode step")?;
                    self.pos -= 1;
                }
                break;
            }
        }
        Ok(out)
    }
}
