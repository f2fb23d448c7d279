//! What a step computes: the layer sequence of the forward pass, read top to bottom, recorded
//! into the step's compute pass with a profile stage around each part. A step is one
//! sequence's tokens at consecutive positions of its cache region, or a batched decode step:
//! one token of each of several sequences, the GEMVs reading the weights once for all of them,
//! the Q/K/V epilogue and decode attention taking each column's position and region from the
//! step buffer's table (`StepShape`).

use crate::error::Result;
use crate::gpu::{grid, Bound};
use crate::kernels::argmax::ArgmaxParams;
use crate::kernels::attention;
use crate::kernels::elementwise::{EltOp, EltParams};
use crate::kernels::embed::EmbedParams;
use crate::kernels::flash_attention;
use crate::kernels::matmul::{BoundMatmul, LeftPartials, Prepared};
use crate::kernels::norm::{self, RmsNormParams};
use crate::kernels::rope::{RopeMode, RopeParams};
use crate::kernels::{KernelKey, WG_ELT};
use crate::model::sizes::pad4;
use crate::profile::{Recorder, Stage, StageWork};

use super::{FfnOps, Output, Picker, PrefillAttnOps, QkvOps, Session};

/// What one step works on; the host knows it, the kernels read it from the step buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepShape {
    /// Tokens of the step: one sequence's, or one per column of a batched step.
    pub m: u32,
    /// One sequence: the position of its first token, and its region's first cache row.
    pub pos0: u32,
    pub kv_base: u32,
    /// A batched decode step (each column its own sequence, `matmul::StepColumn`): the
    /// longest context a column attends over.
    pub batched: Option<u32>,
    /// The sampler takes each row's slot from the step's table (a batched step, or a
    /// sequence other than slot 0); else the session's own sampler (slot 0).
    pub table_sampler: bool,
    /// Several sequences' prompt chunks side by side (slots.rs, `prefill_slots`): the Q/K/V
    /// epilogue takes each row's position and region from the step's table, and flash
    /// attention, launched so, each chunk's from its table of chunks.
    pub together: Option<flash_attention::FlashLaunch>,
}

impl StepShape {
    /// `m` tokens of one sequence from position `pos0` of the region at row `kv_base`.
    pub fn sequence(m: u32, pos0: u32, kv_base: u32) -> StepShape {
        StepShape { m, pos0, kv_base, batched: None, table_sampler: false, together: None }
    }
    /// Positions the step's attention sees (the longest column's, batched).
    pub fn kv_len(&self) -> u32 {
        self.batched.unwrap_or(self.pos0 + self.m)
    }
}

impl Session {
    /// RoPE's and the K/V write's parameters for a step of m tokens. The kernels take the
    /// position and the cache region from the step state, so `pos0` and `dst_offset` stay 0
    /// here: the uniform is the same from step to step and is not written again.
    pub(super) fn rope_params(&self, m: u32, n_heads: u32, src_stride: u32) -> RopeParams {
        let c = &self.cfg;
        RopeParams {
            n_tokens: m,
            n_heads,
            head_dim: c.head_dim,
            n_rot: c.n_rot,
            pos0: 0,
            src_stride,
            dst_stride: c.kv_dim(),
            dst_offset: 0,
            freq_base: c.rope_base,
            freq_scale: c.rope_freq_scale,
            _pad: [0; 2],
        }
    }

    /// Runs the step's tokens (at most `ubatch`, or a batched step's columns) through the
    /// model at the positions `step` says.
    pub(super) fn record_step(&self, rec: &mut Recorder<'_>, step: &StepShape, ids_on_gpu: bool) -> Result<()> {
        let ctx = &*self.ctx;
        let (m, pos0, batched) = (step.m, step.pos0, step.batched.is_some());
        let c = &self.cfg;
        let (se, sf) = (pad4(c.n_embd), pad4(c.n_ff));
        let pipe = |k: &KernelKey| ctx.pipeline(k);
        let sub = ctx.caps.subgroups;
        let norm_pipe = pipe(&KernelKey::RmsNorm { subgroups: sub, halves: false })?;
        let norm = |b: &Bound, rows: u32, n: u32, stride: u32, pass: &mut wgpu::ComputePass<'_>| {
            b.set(ctx, &RmsNormParams { n, x_stride: stride, y_stride: stride, eps: c.rms_eps });
            b.record_with(pass, &norm_pipe, grid(rows));
        };
        // Prefill's norm before a matmul on the cooperative GEMM, where it writes that GEMM's f16
        // input itself (`Caps::prefill_f16_inputs`: the matmul then skips its to_half dispatch);
        // else the float norm. What the matmul finds prepared.
        let norm_f16_pipe = if ctx.caps.prefill_f16_inputs {
            Some(pipe(&KernelKey::RmsNorm { subgroups: sub, halves: true })?)
        } else {
            None
        };
        // The row stride of the halves a norm bound to write f16 (`f16_norm`) writes for the
        // matmuls after it, where it does: every one of them must read the same halves (the
        // f16 norm was bound to the first's), or the float rows are written; so are a batched
        // step's (their matmuls plan and take positions as batched steps do).
        let f16_stride = |f16_norm: Option<&Bound>, consumers: &[BoundMatmul]| {
            let target = consumers[0].half_buffer();
            let same = consumers.iter().all(|b| b.half_input(ctx, m).is_some_and(|(h, _)| Some(h) == target));
            let stride = consumers[0].half_input(ctx, m).map(|(_, s)| s);
            stride.filter(|_| f16_norm.is_some() && norm_f16_pipe.is_some() && same && !batched)
        };
        let norm_before = |f32_norm: &Bound, f16_norm: Option<&Bound>, consumers: &[BoundMatmul], pass: &mut _| {
            if let (Some(b), Some(p), Some(stride)) = (f16_norm, &norm_f16_pipe, f16_stride(f16_norm, consumers)) {
                b.set(ctx, &RmsNormParams { n: c.n_embd, x_stride: se, y_stride: stride, eps: c.rms_eps });
                b.record_with(pass, p, grid(m));
                return true;
            }
            norm(f32_norm, m, c.n_embd, se, pass);
            false
        };
        // A GEMM added to the residual stream whose split-K partials `left` its reduce to the
        // norm after it (`BoundMatmul::record_leaving_reduce`): the reduce and that norm into the
        // next matmul's halves (rows `stride` apart) in one dispatch (reduce_norm.wgsl).
        let reduce_norm_pipe = match norm_f16_pipe {
            Some(_) => Some(pipe(&KernelKey::ReduceNorm { subgroups: sub })?),
            None => None,
        };
        let reduce_norm =
            |b: &Bound, left: LeftPartials, stride: u32, pass: &mut wgpu::ComputePass<'_>| -> Result<()> {
                let (Some(p), true) = (&reduce_norm_pipe, left.rows == c.n_embd) else {
                    return Err(crate::error::KilnError::invalid(
                        "prefill",
                        format!("a split GEMM of {} rows left its reduce to a norm of {}", left.rows, c.n_embd),
                    ));
                };
                b.set(
                    ctx,
                    &norm::ReduceNormParams {
                        n: c.n_embd,
                        n_cols: m,
                        splits: left.splits,
                        y_stride: se,
                        h_stride: stride,
                        eps: c.rms_eps,
                        _pad: [0; 2],
                    },
                );
                b.record_with(pass, p, grid(m));
                Ok(())
            };

        // Bytes of activations (f32) and of the KV cache, for the profile's work estimates.
        let f = |n: u32| n as f64 * 4.0;
        let kv_elt = self.kv.bytes_per_elem() as f64;
        let norm_work = |rows: u32, n: u32| StageWork::other("rms_norm", format!("{rows}x{n}"), 2.0 * f(rows * n), 0.0);
        // The partials and Y read, Y and the halves written.
        let reduce_norm_work = |left: LeftPartials| {
            let bytes = f((left.splits + 2) * m * c.n_embd) + 2.0 * (m * c.n_embd) as f64;
            StageWork::other("reduce_norm", format!("{m}x{}, {} ranges", c.n_embd, left.splits), bytes, 0.0)
        };
        // A GEMM added to the residual stream, with the norm after it (stage `norm_stage`) folded
        // into its split-K reduce where `fold` (that norm's reduce_norm binding and its halves'
        // row stride) says both take it: whether the norm's halves were written.
        let add_then_norm = |rec: &mut Recorder<'_>,
                             mm: &BoundMatmul,
                             prepared: Prepared<'_>,
                             fold: Option<(&Bound, u32)>,
                             norm_stage: Stage|
         -> Result<bool> {
            let Some((b, stride)) = fold else {
                mm.record_after(ctx, rec.pass(), m, batched, prepared)?;
                return Ok(false);
            };
            let Some(left) = mm.record_leaving_reduce(ctx, rec.pass(), m, prepared)? else { return Ok(false) };
            rec.stage(norm_stage, || reduce_norm_work(left));
            reduce_norm(b, left, stride, rec.pass())?;
            Ok(true)
        };

        let token_embd = &self._weights.token_embd;
        let embed_pipe = pipe(&KernelKey::Embed { format: token_embd.format })?;
        rec.stage(Stage::Embed, || {
            let row = token_embd.format.gpu_row_bytes(c.n_embd as usize).unwrap_or(0) as f64;
            StageWork::other(
                &format!("embed {}", token_embd.format.name()),
                format!("{m}x{}", c.n_embd),
                m as f64 * row + f(m * c.n_embd),
                0.0,
            )
        });
        let embed = if ids_on_gpu { &self.embed_fed_back } else { &self.embed };
        for (b, row_start, rows) in embed {
            b.set(
                ctx,
                &EmbedParams {
                    n_tokens: m,
                    k: c.n_embd,
                    row_start: *row_start,
                    n_rows: *rows,
                    out_stride: se,
                    _pad: [0; 3],
                },
            );
            b.record_with(rec.pass(), &embed_pipe, grid((m * c.n_embd.div_ceil(8)).div_ceil(WG_ELT)));
        }
        let neox = c.rope_mode == RopeMode::Neox;
        let kv_len = step.kv_len();
        // Where the sequence's region starts, in cache elements (one sequence's prefill).
        let kv_off = step.kv_base * self.shape.kv_stride();
        // Few tokens: GEMV with the RMSNorm fused in; more: a norm dispatch, then GEMM.
        let fused = crate::plan::gemv_takes(m, &ctx.caps)
            && (batched || m <= self.prefill_gemv_cols)
            && step.together.is_none();
        let group_work = |g: &[BoundMatmul]| StageWork::combine(g.iter().map(|b| b.work(ctx, m, batched)).collect());
        // One sequence's one-token steps: the int8 input of the Q/K/V projection where the
        // previous layer's down projection wrote it (`Caps::q8_add_norm`).
        let one_token = m == 1 && !batched;
        let mut qkv_input: Option<&wgpu::Buffer> = None;
        // Prefill: whether the previous layer's down projection wrote the Q/K/V projection's f16
        // input with its reduce (`add_then_norm`), this layer's attention norm with it.
        let mut attn_norm_folded = false;
        for (li, l) in self.layers.iter().enumerate() {
            // Attention: Q, K and V (RoPE and the KV-cache write with them), then attention
            // over the cache, then the output projection added to the residual stream.
            match &l.qkv {
                QkvOps::Stacked { decode, prefill, one_dispatch } => {
                    let one = one_dispatch.as_ref().filter(|b| b.takes_step(m, batched));
                    let prepared = Prepared { blocks: qkv_input, halves: None };
                    if let (true, Some(one)) = (fused, one) {
                        rec.stage(Stage::AttnNormQkv, || one.work(ctx, m, batched));
                        one.record_after(ctx, rec.pass(), m, batched, prepared)?;
                    } else if fused {
                        rec.stage(Stage::AttnNormQkv, || group_work(decode));
                        let group = decode.iter().collect::<Vec<_>>();
                        BoundMatmul::record_group_with(ctx, rec.pass(), &group, m, batched, prepared)?;
                    } else {
                        // The parts read one input: rounded to f16 (or quantized) once.
                        let parts = prefill.iter().collect::<Vec<_>>();
                        let written = std::mem::take(&mut attn_norm_folded) || {
                            rec.stage(Stage::AttnNorm, || norm_work(m, c.n_embd));
                            norm_before(&l.attn_norm, l.attn_norm_f16.as_ref(), prefill, rec.pass())
                        };
                        let halves = prefill[0].half_input(ctx, m).filter(|_| written).map(|(h, _)| h);
                        let prepared = Prepared { blocks: None, halves };
                        rec.stage(Stage::Qkv, || group_work(prefill));
                        if step.together.is_some() || prepared.halves.is_some() {
                            let rows = step.together.is_some();
                            BoundMatmul::record_group_after(ctx, rec.pass(), &parts, m, rows, prepared)?;
                        } else {
                            BoundMatmul::record_group(ctx, rec.pass(), &parts, m, batched)?;
                        }
                    }
                }
                QkvOps::Separate { q, k, v, q_fused, k_fused, v_fused, q_norm, k_norm, rope_q, kv_write } => {
                    if batched || step.together.is_some() {
                        // Their RoPE and cache write take one sequence's positions.
                        return Err(crate::error::KilnError::invalid(
                            "batched step",
                            "separate Q/K/V projections take one sequence's tokens a step",
                        ));
                    }
                    if fused {
                        rec.stage(Stage::AttnNormQkv, || {
                            StageWork::combine(vec![
                                q_fused.work(ctx, m, batched),
                                k_fused.work(ctx, m, batched),
                                v_fused.work(ctx, m, batched),
                            ])
                        });
                        let prepared = Prepared { blocks: qkv_input, halves: None };
                        let group = [q_fused, k_fused, v_fused];
                        BoundMatmul::record_group_with(ctx, rec.pass(), &group, m, false, prepared)?;
                    } else {
                        rec.stage(Stage::AttnNorm, || norm_work(m, c.n_embd));
                        norm(&l.attn_norm, m, c.n_embd, se, rec.pass());
                        rec.stage(Stage::Qkv, || {
                            StageWork::combine(vec![
                                q.work(ctx, m, batched),
                                k.work(ctx, m, batched),
                                v.work(ctx, m, batched),
                            ])
                        });
                        BoundMatmul::record_group(ctx, rec.pass(), &[q, k, v], m, batched)?;
                    }
                    if let (Some(qn), Some(kn)) = (q_norm, k_norm) {
                        rec.stage(Stage::QkNorm, || norm_work(m * (c.n_head + c.n_kv_head), c.head_dim));
                        norm(qn, m * c.n_head, c.head_dim, c.head_dim, rec.pass());
                        norm(kn, m * c.n_kv_head, c.head_dim, c.head_dim, rec.pass());
                    }
                    let rope_grid = |heads: u32| grid((m * heads * (c.head_dim / 2)).div_ceil(WG_ELT));
                    rec.stage(Stage::Rope, || {
                        StageWork::other("rope", format!("{m}x{}", c.q_dim()), 2.0 * f(m * c.q_dim()), 0.0)
                    });
                    rope_q.set(ctx, &self.rope_params(m, c.n_head, c.q_dim()));
                    rope_q.record_with(
                        rec.pass(),
                        &*pipe(&KernelKey::Rope { neox, to_cache: None, rope: true })?,
                        rope_grid(c.n_head),
                    );
                    rec.stage(Stage::KvWrite, || {
                        let n = (m * c.kv_dim()) as f64;
                        StageWork::other(
                            "kv_write (rope k)",
                            format!("2x{m}x{}", c.kv_dim()),
                            2.0 * n * (4.0 + kv_elt),
                            0.0,
                        )
                    });
                    let kvp = self.rope_params(m, c.n_kv_head, c.kv_dim());
                    kv_write.set(ctx, &kvp);
                    kv_write.record_with(
                        rec.pass(),
                        &*pipe(&KernelKey::KvWrite { neox, kv: self.kv })?,
                        crate::kernels::rope::kv_write_grid(&kvp),
                    );
                }
            }
            rec.stage(Stage::Attention, || {
                // Q read and the output written; K and V read once per decode, once per
                // query tile of flash attention (up to the last key the tile sees); the
                // materialized path also writes the score matrix, softmax reads and rewrites
                // it, and P·V reads it again.
                let kv_row = 2.0 * c.kv_dim() as f64 * kv_elt;
                let qo = 2.0 * f(m * c.q_dim());
                let keys = pos0 as f64 + (m as f64 + 1.0) / 2.0;
                let flops = 4.0 * (m * c.n_head * c.head_dim) as f64 * keys;
                // Flash attention by its kernel's name: the cooperative one runs on the matrix cores.
                let flash = flash_attention::planned_key(self.kv, &self.shape, &ctx.caps)
                    .map(|k| k.name())
                    .unwrap_or("flash_attention");
                let shape = format!("{}h x {m}x{kv_len}", c.n_head);
                if batched {
                    // Each column over its own context: at most the longest.
                    return StageWork::other(
                        "attn_decode batched",
                        format!("{m} x {}h x {kv_len}", c.n_head),
                        m as f64 * (kv_len as f64 * kv_row + 2.0 * f(c.q_dim())),
                        4.0 * (m * c.n_head * c.head_dim) as f64 * kv_len as f64,
                    );
                }
                if m == 1 {
                    let launch = attention::decode_launch(&ctx.caps, self.kv, &self.shape, kv_len, l.wo_q8.is_some());
                    let coop = launch.as_ref().is_ok_and(|l| matches!(l.key, KernelKey::AttnDecodeCoop { .. }));
                    let coop = if coop { "_coop" } else { "" };
                    let split = match &launch {
                        Ok(l) if l.combine.is_some() => "+combine",
                        Ok(l) if l.merges() => "+merge",
                        _ => "",
                    };
                    let q8 = if l.wo_q8.is_some() { "+q8out" } else { "" };
                    let kernel = format!("attn_decode{coop}{split}{q8}");
                    return StageWork::other(
                        &kernel,
                        format!("{}h x {kv_len}", c.n_head),
                        kv_len as f64 * kv_row + qo,
                        flops,
                    );
                }
                if let Some(launch) = &step.together {
                    // Each chunk over its own region: at most the longest.
                    return StageWork::other(
                        &format!("{flash} chunks"),
                        format!("{} x {}h x {m}x{kv_len}", launch.grid[2], c.n_head),
                        kv_len as f64 * kv_row * launch.grid[2] as f64 + qo,
                        4.0 * (m * c.n_head * c.head_dim) as f64 * kv_len as f64,
                    );
                }
                match &l.attn_prefill {
                    PrefillAttnOps::Flash { .. } => {
                        let rows = flash_attention::tile_rows(self.kv, &self.shape, &ctx.caps);
                        let kv_bytes = flash_attention::keys_read(&self.shape, m, pos0, rows) as f64 * kv_row;
                        let room = self.split_room;
                        let split = flash_attention::launch(self.kv, &self.shape, m, pos0, &ctx.caps, room)
                            .map(|l| l.params.n_split)
                            .unwrap_or(1);
                        if split > 1 {
                            // The partial outputs written and read back by the combine pass.
                            let partials = 2.0 * f(m * c.q_dim()) * split as f64;
                            let kernel = format!("{flash}+combine[split{split}]");
                            return StageWork::other(&kernel, shape, kv_bytes + qo + partials, flops);
                        }
                        StageWork::other(flash, shape, kv_bytes + qo, flops)
                    }
                    PrefillAttnOps::Gemm { .. } => {
                        let scores = 4.0 * f(m * c.n_head) * kv_len as f64;
                        StageWork::other(
                            "attn_gemm+softmax+attn_gemm",
                            shape,
                            kv_len as f64 * kv_row + qo + scores,
                            flops,
                        )
                    }
                }
            });
            // One token of one sequence: decode attention may write the output projection's
            // int8 input too (`LayerOps::wo_q8`).
            let wo_input = l.wo_q8.as_ref().filter(|_| m == 1 && !batched);
            if m == 1 || batched {
                let launch = if batched {
                    attention::decode_launch_batched(&ctx.caps, self.kv, &self.shape, kv_len, m)?
                } else {
                    attention::decode_launch(&ctx.caps, self.kv, &self.shape, kv_len, wo_input.is_some())?
                };
                let decode = match (launch.merges(), &l.attn_decode_merge) {
                    (true, Some(merge)) => merge,
                    (true, None) => {
                        return Err(crate::error::KilnError::invalid(
                            "decode attention",
                            "a launch that merges its splits in a session that bound none",
                        ))
                    }
                    _ if launch.combine.is_some() => &l.attn_decode_split,
                    _ => &l.attn_decode,
                };
                decode.set(ctx, &launch.params);
                decode.record_with(rec.pass(), &*pipe(&launch.key)?, launch.grid);
                if let Some(g2) = launch.combine {
                    l.attn_combine.set(ctx, &launch.params);
                    l.attn_combine.record_with(rec.pass(), &*pipe(&launch.combine_key)?, g2);
                }
            } else if let Some(launch) = &step.together {
                let PrefillAttnOps::Flash { kernel: flash, .. } = &l.attn_prefill else {
                    return Err(crate::error::KilnError::invalid(
                        "batched step",
                        "the materialized prefill attention takes one sequence's tokens a step",
                    ));
                };
                flash.set(ctx, &launch.params);
                flash.record_with(rec.pass(), &*pipe(&launch.key)?, launch.grid);
            } else {
                match &l.attn_prefill {
                    PrefillAttnOps::Flash { kernel, combine } => {
                        let room = self.split_room;
                        let launch = flash_attention::launch(self.kv, &self.shape, m, pos0, &ctx.caps, room)?;
                        kernel.set(ctx, &flash_attention::FlashParams { kv_off, ..launch.params });
                        kernel.record_with(rec.pass(), &*pipe(&launch.key)?, launch.grid);
                        if let Some((params, grid)) = launch.combine {
                            combine.set(ctx, &params);
                            combine.record_with(rec.pass(), &*pipe(&KernelKey::FlashCombine)?, grid);
                        }
                    }
                    PrefillAttnOps::Gemm { qk, softmax, pv } => {
                        let [(qk_params, g_qk), (pv_params, g_pv)] = attention::prefill_launches(&self.shape, m, pos0)?;
                        let (sp, g_sm) = attention::softmax_launch(&self.shape, m, pos0);
                        let gemm = pipe(&KernelKey::AttnGemm { kv: self.kv })?;
                        qk.set(ctx, &attention::AttnGemmParams { b_off: kv_off, ..qk_params });
                        qk.record_with(rec.pass(), &gemm, g_qk);
                        softmax.set(ctx, &sp);
                        softmax.record_with(rec.pass(), &*pipe(&KernelKey::Softmax { subgroups: sub })?, g_sm);
                        pv.set(ctx, &attention::AttnGemmParams { b_off: kv_off, ..pv_params });
                        pv.record_with(rec.pass(), &gemm, g_pv);
                    }
                }
            }
            rec.stage(Stage::AttnOut, || l.wo.work(ctx, m, batched));
            // Prefill: the FFN's norm in the output projection's split-K reduce where both take it.
            let ffn_fold = match (&l.ffn, &l.ffn_norm_reduce) {
                (FfnOps::Interleaved { prefill, .. }, Some(b)) if !fused => {
                    f16_stride(l.ffn_norm_f16.as_ref(), std::slice::from_ref(prefill)).map(|stride| (b, stride))
                }
                _ => None,
            };
            let wo_prepared = Prepared { blocks: wo_input, halves: None };
            let ffn_norm_folded = add_then_norm(rec, &l.wo, wo_prepared, ffn_fold, Stage::FfnNorm)?;

            // Feed-forward: SwiGLU(norm(x) W_gate, norm(x) W_up) W_down added to the residual.
            match &l.ffn {
                FfnOps::Interleaved { decode, prefill, down } => {
                    // The down projection's input where the gate/up epilogue wrote it: its int8
                    // blocks (decode) or its f16 copy (prefill on cooperative GEMMs).
                    let mut down_input = Prepared::default();
                    if fused {
                        rec.stage(Stage::FfnNormGateUp, || decode.work(ctx, m, batched));
                        // Its int8 input where the output projection's epilogue wrote it.
                        let blocks = l.wo.q8_output(ctx, m, batched).filter(|_| one_token);
                        decode.record_after(ctx, rec.pass(), m, batched, Prepared { blocks, halves: None })?;
                        down_input.blocks = decode.q8_output(ctx, m, batched);
                    } else {
                        let written = ffn_norm_folded || {
                            rec.stage(Stage::FfnNorm, || norm_work(m, c.n_embd));
                            norm_before(&l.ffn_norm, l.ffn_norm_f16.as_ref(), std::slice::from_ref(prefill), rec.pass())
                        };
                        let halves = prefill.half_input(ctx, m).filter(|_| written).map(|(h, _)| h);
                        let prepared = Prepared { blocks: None, halves };
                        rec.stage(Stage::FfnGateUp, || prefill.work(ctx, m, batched));
                        let into = down.half_input(ctx, m).map(|(h, _)| h).filter(|_| !batched);
                        if prefill.record_into_halves(ctx, rec.pass(), m, batched, prepared, into)? {
                            down_input.halves = into;
                        }
                    }
                    rec.stage(Stage::FfnDown, || down.work(ctx, m, batched));
                    // Prefill: the next layer's attention norm in this split-K reduce where both
                    // take it (as the FFN's norm above).
                    let next = self.layers.get(li + 1).filter(|_| !fused);
                    let attn_fold = next.and_then(|n| match (&n.qkv, &n.attn_norm_reduce) {
                        (QkvOps::Stacked { prefill: parts, .. }, Some(b)) => {
                            f16_stride(n.attn_norm_f16.as_ref(), parts).map(|stride| (b, stride))
                        }
                        _ => None,
                    });
                    attn_norm_folded = add_then_norm(rec, down, down_input, attn_fold, Stage::AttnNorm)?;
                    qkv_input = down.q8_output(ctx, m, batched).filter(|_| one_token);
                }
                FfnOps::Separate { gate_fused, up_fused, down_fused, gate, up, silu, down } => {
                    if fused {
                        rec.stage(Stage::FfnNormGateUp, || {
                            StageWork::combine(vec![gate_fused.work(ctx, m, batched), up_fused.work(ctx, m, batched)])
                        });
                        let blocks = l.wo.q8_output(ctx, m, batched).filter(|_| one_token);
                        let prepared = Prepared { blocks, halves: None };
                        BoundMatmul::record_group_with(ctx, rec.pass(), &[gate_fused, up_fused], m, false, prepared)?;
                        rec.stage(Stage::FfnActDown, || down_fused.work(ctx, m, batched));
                        down_fused.record(ctx, rec.pass(), m, batched)?;
                    } else {
                        rec.stage(Stage::FfnNorm, || norm_work(m, c.n_embd));
                        norm(&l.ffn_norm, m, c.n_embd, se, rec.pass());
                        rec.stage(Stage::FfnGateUp, || {
                            StageWork::combine(vec![gate.work(ctx, m, batched), up.work(ctx, m, batched)])
                        });
                        BoundMatmul::record_group(ctx, rec.pass(), &[gate, up], m, batched)?;
                        rec.stage(Stage::FfnAct, || {
                            StageWork::other("silu_mul", format!("{m}x{}", c.n_ff), 3.0 * f(m * sf), 0.0)
                        });
                        silu.set(ctx, &EltParams { n: m * sf, _pad: [0; 3] });
                        silu.record_with(
                            rec.pass(),
                            &*pipe(&KernelKey::Elementwise { op: EltOp::SiluMul })?,
                            grid((m * sf).div_ceil(WG_ELT)),
                        );
                        rec.stage(Stage::FfnDown, || down.work(ctx, m, batched));
                        down.record(ctx, rec.pass(), m, batched)?;
                    }
                }
            }
            // The layers so far to the GPU after layers 1, 2, 4, 8, ... where the caller lets
            // the step go in parts (`Recorder::submit_early`): the first part small, so the
            // GPU starts soon, each later one recorded while the GPU runs the ones before.
            if (li + 1).is_power_of_two() && li + 1 < self.layers.len() {
                rec.submit_so_far();
            }
        }
        Ok(())
    }

    /// Records the output norm, LM head and (for `Argmax`, `Sampled`) the pick over the logits
    /// of `m` rows: one token whose hidden state is in `x` (decode) or `x_last` (after a
    /// prefill), or each column of a batched step (in `x`), the sampled ones by `picker`.
    pub(super) fn record_head(
        &self,
        rec: &mut Recorder<'_>,
        head: &BoundMatmul,
        m: u32,
        pick: Output,
        picker: Picker,
    ) -> Result<()> {
        let ctx = &*self.ctx;
        let v = self.cfg.n_vocab;
        rec.stage(Stage::OutputNormLmHead, || head.work(ctx, m, true));
        // One token, or a batched step's columns: the GEMV (with the output norm fused in)
        // wherever it takes m.
        head.record(ctx, rec.pass(), m, true)?;
        if pick == Output::Sampled {
            rec.stage(Stage::Sample, || {
                StageWork::other("sample", format!("{m}x{v}"), (m * v) as f64 * 4.0 * 3.0, 0.0)
            });
            let table = picker == Picker::Table;
            let sample = if table { &self.sample_table } else { &self.sample };
            // A greedy sampler (the session's own) picks in one pass; any other in two.
            let one_pass = !table && self.sample_greedy;
            for (prune, grid) in crate::kernels::sample::passes(v, m, one_pass) {
                let key = KernelKey::Sample {
                    subgroups: ctx.caps.subgroups,
                    batched: table,
                    prune,
                    tops: ctx.caps.sample_tops,
                    // Only the second pass picks, so only it moves the chain on.
                    chained: picker == Picker::Chained && !prune,
                    greedy: one_pass,
                };
                sample.record_with(rec.pass(), &*ctx.pipeline(&key)?, grid);
            }
        }
        if pick == Output::Argmax {
            rec.stage(Stage::Sample, || StageWork::other("argmax", format!("{v}"), v as f64 * 4.0, 0.0));
            self.argmax.set(ctx, &ArgmaxParams { n: v, stride: v, _pad: [0; 2] });
            self.argmax.record_with(
                rec.pass(),
                &*ctx.pipeline(&KernelKey::Argmax { subgroups: ctx.caps.subgroups })?,
                [1, 1, 1],
            );
        }
        Ok(())
    }
}
