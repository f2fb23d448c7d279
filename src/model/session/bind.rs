//! Building a session once: every buffer (sized by `model::sizes`) and every kernel bound to
//! its buffers, so that a step creates nothing.

use std::sync::Arc;

use crate::config::PrefillAttention;
use crate::error::{KilnError, Result};
use crate::gpu::{Bound, GpuContext};
use crate::kernels::argmax::ArgmaxParams;
use crate::kernels::attention::{self, AttnDecodeParams, AttnGemmParams, AttnShape, SoftmaxParams};
use crate::kernels::elementwise::{EltOp, EltParams};
use crate::kernels::embed::EmbedParams;
use crate::kernels::flash_attention::{self, FlashParams};
use crate::kernels::matmul::{BoundMatmul, Epilogue, Matmul, MatmulScratch, RopeShape};
use crate::kernels::norm::{self, RmsNormParams};
use crate::kernels::rope::{RopeMode, RopeParams};
use crate::kernels::sample::SampleConfig;
use crate::kernels::{KernelKey, KvKind};
use crate::model::config::ModelConfig;
use crate::model::sizes::{self, pad4, SessionSizes};
use crate::model::weights::{GateUp, Qkv, Weights};

use super::{FfnOps, LayerOps, PrefillAttnOps, QkvOps, Session, SessionOptions, StepTiming};

impl Session {
    pub fn new(
        ctx: Arc<GpuContext>,
        cfg: &ModelConfig,
        weights: Arc<Weights>,
        opts: SessionOptions,
    ) -> Result<Session> {
        let c = cfg;
        let (e, q, kvd, ff, v) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.n_vocab);
        if q % 4 != 0 || kvd % 2 != 0 {
            return Err(KilnError::invalid(
                "model",
                format!("{} heads of {} dimensions are not supported", c.n_head, c.head_dim),
            ));
        }
        let b = opts.ubatch.max(1);
        let (se, sf) = (pad4(e), pad4(ff));
        let shape = AttnShape { n_head: c.n_head, n_kv_head: c.n_kv_head, head_dim: c.head_dim, n_ctx: opts.n_ctx };
        shape.check()?;
        let kv = KvKind::for_cache(opts.f16_kv, &ctx.caps);
        let prefill_attention = crate::config::prefill_attention_from_env();
        let sizes = SessionSizes::with_attention(c, &opts, prefill_attention, &ctx.caps);
        if let Some((what, needed)) = sizes.first_too_large(&ctx) {
            return Err(KilnError::TooLarge {
                what: format!("the session's {what} ({b} tokens per step, {} positions)", opts.n_ctx),
                needed,
                limit: ctx.max_storage(),
            });
        }
        let st = |size: u64, label: &str| ctx.storage(size, label);
        let ids = st(sizes.ids, "ids")?;
        let x = st(sizes.x, "x")?;
        let xn = st(sizes.x, "xn")?;
        let qb = st(sizes.q, "q")?;
        let kb = st(sizes.kv_step, "k")?;
        let vb = st(sizes.kv_step, "v")?;
        let qn = st(sizes.q, "q_normed")?;
        let kn = st(sizes.kv_step, "k_normed")?;
        let attn = st(sizes.q, "attn")?;
        let gate = st(sizes.ffn, "gate")?;
        let up = st(sizes.ffn, "up")?;
        let act = st(sizes.ffn, "act")?;
        // Only the materialized prefill attention has a score matrix.
        let scores = match prefill_attention {
            PrefillAttention::Gemm => Some(st(sizes.scores, "scores")?),
            PrefillAttention::Flash => None,
        };
        let partial = st(sizes.partials, "attention partials")?;
        let x_last = st(sizes.x_last, "x_last")?;
        let logits = st(sizes.logits, "logits")?;
        // The picked token of a step, or of each column of a batched step.
        let out_id = st((sizes::batch_columns(opts.n_seq) as u64 * 4).max(16), "sampled ids")?;
        let readback = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: sizes.logits.max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });

        let sub = ctx.caps.subgroups;
        let norm_key = KernelKey::RmsNorm { subgroups: sub, halves: false };
        // Any variant serves the bind groups: batched or not, with an int8 output or not, they
        // bind the same buffers (binding one builds its pipeline: the one steps take).
        let decode_key = |q8_out, merge| {
            let form = attention::DecodeForm { q8_out, merge, ..Default::default() };
            attention::decode_key(&ctx.caps, kv, &shape, shape.decode_block(opts.n_ctx), form)
        };
        // Split decode attention that merges its own splits counts them here (one counter a
        // block of heads, shared by the layers: their dispatches never overlap).
        let merges = shape.decode_merges(&ctx.caps);
        let merge_done = st(attention::merge_counters_bytes(&shape), "attention merge counters")?;
        let dense = |w, xbuf, xs, ybuf, ys, bias, acc| Matmul {
            w,
            x: xbuf,
            y: ybuf,
            bias,
            m: 0,
            x_stride: xs,
            y_stride: ys,
            accumulate: acc,
            norm: None,
            glu: None,
            epi: Epilogue::Plain,
        };
        // The int8 GEMVs' quantized inputs, one buffer per input length for the session, and
        // the split-K GEMMs' partial sums.
        let prefill_gemv_cols = crate::plan::prefill_gemv_cols(c.n_embd, &ctx.caps);
        // (And the f16 copies of the block-format matrices that prefill's GEMMs read,
        // `Caps::dequant_f16_from`: resident where memory allows, else one buffer decoded into
        // before each GEMM.)
        let scratch = MatmulScratch::for_session(prefill_gemv_cols);
        // (The LM head's GEMM runs only where every position's logits are asked for.)
        let head = opts.all_logits.then(|| weights.lm_head());
        let matrices = || weights.layers.iter().flat_map(|l| l.matrices()).chain(head);
        let copies: u64 = matrices()
            .filter_map(|w| crate::kernels::matmul::resident_f16_bytes(&ctx, w))
            .map(crate::gpu::buffers::storage_size)
            .sum();
        let used = ctx.buffers_alive().bytes + sizes.kv_bytes() + sizes.activation_bytes();
        let left = ctx.device_memory.map(|m| m.saturating_sub(used));
        let scratch = if crate::plan::resident_f16_copies(copies, left, &ctx.caps) {
            scratch.with_resident_dequant(matrices())
        } else {
            scratch.with_dequant(&ctx, matrices())?
        };
        let mm = |w, xbuf, xs, ybuf, ys, bias, acc, stage| {
            BoundMatmul::new_in(&ctx, &dense(w, xbuf, xs, ybuf, ys, bias, acc), stage, &scratch)
        };
        // Matmuls that only prefill runs (past the GEMV's columns, after a norm or SwiGLU dispatch) are GEMMs:
        // no int8 GEMV input to bind.
        let mm_prefill = |w, xbuf, xs, ybuf, ys, bias, acc, stage| {
            BoundMatmul::prefill_in(&ctx, &dense(w, xbuf, xs, ybuf, ys, bias, acc), stage, &scratch)
        };
        // Decode and short prompts (the GEMV's columns) read the residual stream and applies the RMSNorm in the GEMV itself
        // (or in the quantize dispatch that the int8 GEMVs of a group share).
        let mm_norm = |w, norm_w, ybuf, ys, bias| Matmul {
            w,
            x: &x,
            y: ybuf,
            bias,
            m: 0,
            x_stride: se,
            y_stride: ys,
            accumulate: false,
            norm: Some((norm_w, c.rms_eps)),
            glu: None,
            epi: Epilogue::Plain,
        };
        // Two gathers: token ids written by the host, or the id the previous step sampled on
        // the GPU (chained greedy decoding never waits for the host between steps).
        let bind_embed = |ids_buf: &wgpu::Buffer| {
            weights
                .token_embd
                .chunks
                .iter()
                .map(|ch| {
                    let key = KernelKey::Embed { format: weights.token_embd.format };
                    Ok((
                        Bound::new::<EmbedParams>(&ctx, &key, "embed", &[&ch.buffer, ids_buf, &x])?,
                        ch.row_start,
                        ch.rows,
                    ))
                })
                .collect::<Result<Vec<_>>>()
        };
        let embed = bind_embed(&ids)?;
        let embed_fed_back = bind_embed(&out_id)?;
        // What the fused Q/K/V epilogue needs: the rotation's shape (static) and the step's
        // tokens and position (written per step, advanced on the GPU by chained decoding).
        let rope_shape = ctx.uniform(
            &RopeShape {
                q_dim: q,
                kv_dim: kvd,
                head_dim: c.head_dim,
                n_rot: c.n_rot,
                freq_base: c.rope_base,
                freq_scale: c.rope_freq_scale,
                kv_stride: kvd,
                _pad: 0,
            },
            "rope shape",
        );
        // The step buffer: the step's `StepState`, then a batched step's table of columns.
        let step_state = st(crate::kernels::matmul::step_bytes(b), "step state")?;
        // Prompts of several sequences prefilled in one step (slots.rs, `prefill_slots`): flash
        // attention's table of their chunks, and the columns the sampler reads for the rows
        // that go through the head (copied over the step's table once the layers have read it).
        let chunk_bytes = std::mem::size_of::<flash_attention::FlashSegment>() as u64;
        let chunks = st(sizes::batch_columns(opts.n_seq) as u64 * chunk_bytes, "prefill chunks")?;
        let col_bytes = std::mem::size_of::<crate::kernels::matmul::StepColumn>() as u64;
        let head_cols = st(sizes::batch_columns(opts.n_seq) as u64 * col_bytes, "head columns")?;
        // One per stacked part (at most Q, K, V): a buffer two parts both wrote would order them.
        let unused = [st(16, "unused output")?, st(16, "unused output")?, st(16, "unused output")?];
        // Decode attention's int8 output where the session does not take it.
        let no_q8 = st(16, "unused int8 output")?;
        let rope_neox = c.rope_mode == RopeMode::Neox;
        // One-token steps' output and down projections may write the int8 input of the GEMV
        // after them (gate/up, the next layer's Q/K/V) through its RMSNorm
        // (`Caps::q8_add_norm`), into the blocks that GEMV's quantize dispatch would write.
        let embd_blocks = scratch.blocks(&ctx, c.n_embd)?;
        let residual_q8 = |reads: Option<&wgpu::Buffer>| {
            ctx.caps.q8_add_norm.is_some() && c.n_embd % 32 == 0 && reads == Some(&embd_blocks)
        };
        let mut layers: Vec<LayerOps> = Vec::new();
        let mut k_caches: Vec<wgpu::Buffer> = Vec::new();
        for (li, w) in weights.layers.iter().enumerate() {
            let kc = ctx.kv_storage(sizes.kv_layer, &format!("k_cache.{li}"))?;
            let vc = ctx.kv_storage(sizes.kv_layer, &format!("v_cache.{li}"))?;
            let (qkv, q_src) = match &w.qkv {
                Qkv::Stacked { parts, bias } => {
                    // Decode reads the residual stream with the RMSNorm fused, prefill the normed copy.
                    // Each part binds only the outputs its rows reach (a placeholder for the
                    // others): parts that write disjoint buffers share no read-write binding,
                    // so the GPU may run them side by side, with no barrier between.
                    let reaches = |p: usize, from: u32, to: u32| {
                        let (a, b) = (parts[p].row_base, parts[p].row_base + parts[p].w.rows);
                        a < to && b > from
                    };
                    let part = |p: usize, norm: bool| Matmul {
                        w: &parts[p].w,
                        x: if norm { &x } else { &xn },
                        y: if reaches(p, 0, q) { &qb } else { &unused[p] },
                        bias: bias.as_ref(),
                        m: 0,
                        x_stride: se,
                        y_stride: q,
                        accumulate: false,
                        norm: norm.then_some((&w.attn_norm, c.rms_eps)),
                        glu: None,
                        epi: Epilogue::Qkv {
                            k_cache: if reaches(p, q, q + kvd) { &kc } else { &unused[p] },
                            v_cache: if reaches(p, q + kvd, q + 2 * kvd) { &vc } else { &unused[p] },
                            kv,
                            neox: rope_neox,
                            rope: &rope_shape,
                            step: &step_state,
                            row_base: parts[p].row_base,
                        },
                    };
                    let decode: Vec<Matmul> = (0..parts.len()).map(|p| part(p, true)).collect();
                    let prefill: Vec<BoundMatmul> = (0..parts.len())
                        .map(|p| BoundMatmul::prefill_in(&ctx, &part(p, false), "qkv", &scratch))
                        .collect::<Result<_>>()?;
                    // Two formats (V in Q6_K): also one GEMV over both for one-token steps,
                    // binding every output.
                    let one_dispatch = match &parts[..] {
                        [first, second] => {
                            let whole = Matmul {
                                y: &qb,
                                epi: Epilogue::Qkv {
                                    k_cache: &kc,
                                    v_cache: &vc,
                                    kv,
                                    neox: rope_neox,
                                    rope: &rope_shape,
                                    step: &step_state,
                                    row_base: 0,
                                },
                                ..part(0, true)
                            };
                            debug_assert_eq!(second.row_base, first.w.rows);
                            BoundMatmul::two_formats_in(&ctx, &whole, &second.w, "qkv", &scratch)?
                        }
                        _ => None,
                    };
                    let decode = BoundMatmul::group_in(&ctx, &decode, "qkv", &scratch)?;
                    (QkvOps::Stacked { decode, prefill, one_dispatch }, &qb)
                }
                Qkv::Separate { wq, wk, wv, bq, bk, bv, q_norm, k_norm } => {
                    let (q_src, k_src) = if q_norm.is_some() { (&qn, &kn) } else { (&qb, &kb) };
                    let fused = [
                        mm_norm(wq, &w.attn_norm, &qb, q, bq.as_ref()),
                        mm_norm(wk, &w.attn_norm, &kb, kvd, bk.as_ref()),
                        mm_norm(wv, &w.attn_norm, &vb, kvd, bv.as_ref()),
                    ];
                    let [q_fused, k_fused, v_fused]: [BoundMatmul; 3] =
                        BoundMatmul::group_in(&ctx, &fused, "qkv", &scratch)?
                            .try_into()
                            .map_err(|_| KilnError::invalid("model", "Q/K/V group"))?;
                    let head_norm = |g: &Option<wgpu::Buffer>, src, dst| -> Result<Option<Bound>> {
                        match g {
                            Some(g) => {
                                Ok(Some(Bound::new::<RmsNormParams>(&ctx, &norm_key, "qk_norm", &[src, g, dst])?))
                            }
                            None => Ok(None),
                        }
                    };
                    let ops = QkvOps::Separate {
                        q: mm_prefill(wq, &xn, se, &qb, q, bq.as_ref(), false, "qkv")?,
                        k: mm_prefill(wk, &xn, se, &kb, kvd, bk.as_ref(), false, "qkv")?,
                        v: mm_prefill(wv, &xn, se, &vb, kvd, bv.as_ref(), false, "qkv")?,
                        q_fused,
                        k_fused,
                        v_fused,
                        q_norm: head_norm(q_norm, &qb, &qn)?,
                        k_norm: head_norm(k_norm, &kb, &kn)?,
                        // Their position and cache region come from the step state, which
                        // chained steps each copy their own into.
                        rope_q: Bound::new::<RopeParams>(
                            &ctx,
                            &KernelKey::Rope { neox: rope_neox, to_cache: None, rope: true },
                            "rope",
                            &[&step_state, q_src],
                        )?,
                        kv_write: Bound::new::<RopeParams>(
                            &ctx,
                            &KernelKey::KvWrite { neox: rope_neox, kv },
                            "kv_write",
                            &[&step_state, k_src, &kc, &vb, &vc],
                        )?,
                    };
                    (ops, q_src)
                }
            };
            // The blocks this layer's one-token Q/K/V GEMV reads through the norm: the next
            // layer's, bound alike, reads the same.
            let qkv_reads = match &qkv {
                QkvOps::Stacked { decode, one_dispatch, .. } => {
                    match one_dispatch.as_ref().filter(|b| b.takes_step(1, false)) {
                        Some(one) => one.q8_input_through_norm(&ctx),
                        None => decode.first().and_then(|d| d.q8_input_through_norm(&ctx)),
                    }
                }
                QkvOps::Separate { q_fused, .. } => q_fused.q8_input_through_norm(&ctx),
            };
            let next_attn_norm = weights.layers.get(li + 1).map(|n| &n.attn_norm).filter(|_| residual_q8(qkv_reads));
            // One-token steps' decode attention may write the output projection's int8 input
            // (`Caps::attn_q8_out`), into blocks apart from the quantize dispatches'.
            let takes = crate::plan::attn_q8_out_takes(&ctx.caps, c.q_dim(), c.n_embd);
            let wo_q8 = match takes && attention::takes_q8_out(&shape) && w.wo.format.is_quantized() {
                true => Some(scratch.q8_output(&ctx, c.q_dim())?),
                false => None,
            };
            let ffn = match &w.ffn {
                GateUp::Interleaved(gate_up) => {
                    // One-token steps may write the down projection's int8 input from the
                    // gate/up epilogue (`Caps::q8_swiglu`), into blocks the down projection
                    // reads (and quantizes into itself otherwise) apart from every other
                    // GEMV's input.
                    // (Weights split into chunks must split on whole blocks of outputs.)
                    let whole_blocks = gate_up.chunks.iter().all(|ch| ch.row_start % 64 == 0);
                    let q8_out = match crate::plan::q8_swiglu_takes(&ctx.caps, c.n_ff, c.n_embd) {
                        true if sf == c.n_ff && whole_blocks => Some(scratch.q8_output(&ctx, c.n_ff)?),
                        _ => None,
                    };
                    // (With the next layer's Q/K/V int8 input written by its epilogue, into blocks
                    // apart from its own input's: those of n_ff values, unless the gate/up
                    // epilogue writes them.)
                    let own_input_apart = q8_out.is_some() || c.n_ff != c.n_embd;
                    let down = Matmul {
                        epi: match next_attn_norm.filter(|_| own_input_apart) {
                            Some(norm_w) => Epilogue::PlainQ8Norm { blocks: &embd_blocks, norm_w },
                            None => Epilogue::Plain,
                        },
                        ..dense(&w.w_down, &act, sf, &x, se, None, true)
                    };
                    let down = match &q8_out {
                        Some(blocks) => BoundMatmul::reading_q8_in(&ctx, &down, "ffn_down", &scratch, blocks)?,
                        None => BoundMatmul::new_in(&ctx, &down, "ffn_down", &scratch)?,
                    };
                    // Prefill's gate/up GEMM may write the down projection's f16 input itself
                    // (`Caps::prefill_f16_inputs`; a buffer apart from its own f16 input).
                    let down_halves = down.half_buffer().filter(|_| {
                        ctx.caps.prefill_f16_inputs && c.n_ff % 8 == 0 && sf == c.n_ff && c.n_ff != c.n_embd
                    });
                    let gu = |norm: bool| Matmul {
                        w: gate_up,
                        x: if norm { &x } else { &xn },
                        y: &act,
                        bias: None,
                        m: 0,
                        x_stride: se,
                        y_stride: sf,
                        accumulate: false,
                        norm: norm.then_some((&w.ffn_norm, c.rms_eps)),
                        glu: None,
                        epi: match (&q8_out, down_halves, norm) {
                            (Some(blocks), _, true) => Epilogue::SwiGluQ8 { blocks },
                            (_, Some(halves), false) => Epilogue::SwiGluF16 { halves },
                            _ => Epilogue::SwiGlu,
                        },
                    };
                    FfnOps::Interleaved {
                        decode: BoundMatmul::new_in(&ctx, &gu(true), "ffn_gate_up", &scratch)?,
                        prefill: BoundMatmul::prefill_in(&ctx, &gu(false), "ffn_gate_up", &scratch)?,
                        down,
                    }
                }
                GateUp::Separate { w_gate, w_up } => {
                    let fused =
                        [mm_norm(w_gate, &w.ffn_norm, &gate, sf, None), mm_norm(w_up, &w.ffn_norm, &up, sf, None)];
                    let [gate_fused, up_fused]: [BoundMatmul; 2] =
                        BoundMatmul::group_in(&ctx, &fused, "ffn_gate_up", &scratch)?
                            .try_into()
                            .map_err(|_| KilnError::invalid("model", "gate/up group"))?;
                    FfnOps::Separate {
                        gate_fused,
                        up_fused,
                        down_fused: BoundMatmul::new_in(
                            &ctx,
                            &Matmul {
                                glu: Some(&up),
                                accumulate: true,
                                y_stride: se,
                                ..Matmul::dense(&w.w_down, &gate, &x, 0)
                            },
                            "ffn_down",
                            &scratch,
                        )?,
                        gate: mm_prefill(w_gate, &xn, se, &gate, sf, None, false, "ffn_gate_up")?,
                        up: mm_prefill(w_up, &xn, se, &up, sf, None, false, "ffn_gate_up")?,
                        silu: Bound::new::<EltParams>(
                            &ctx,
                            &KernelKey::Elementwise { op: EltOp::SiluMul },
                            "ffn_gate_up",
                            &[&gate, &up, &act],
                        )?,
                        down: mm_prefill(&w.w_down, &act, sf, &x, se, None, true, "ffn_down")?,
                    }
                }
            };
            // Prefill's norms writing the f16 input of the projection after them, where its
            // cooperative GEMM reads one (`Caps::prefill_f16_inputs`).
            let norm_f16 = |g: &wgpu::Buffer, into: Option<&wgpu::Buffer>, stage| -> Result<Option<Bound>> {
                match into {
                    Some(halves) if ctx.caps.prefill_f16_inputs && c.n_embd % 4 == 0 => {
                        let key = KernelKey::RmsNorm { subgroups: sub, halves: true };
                        Ok(Some(Bound::new::<RmsNormParams>(&ctx, &key, stage, &[&x, g, halves])?))
                    }
                    _ => Ok(None),
                }
            };
            // And the same folded into the split-K reduce of the GEMM before them (the residual
            // add's), where the GEMMs may split.
            let partials = scratch.partials(&ctx)?;
            let reduce_norm = |f16_norm: &Option<Bound>, g: &wgpu::Buffer, into: Option<&wgpu::Buffer>, stage| match (
                f16_norm, &partials, into,
            ) {
                (Some(_), Some(partials), Some(halves)) if norm::reduce_norm_takes(c.n_embd) => {
                    let key = KernelKey::ReduceNorm { subgroups: sub };
                    Bound::new::<norm::ReduceNormParams>(&ctx, &key, stage, &[partials, g, halves, &x]).map(Some)
                }
                _ => Ok(None),
            };
            let (attn_norm_f16, attn_norm_reduce) = match &qkv {
                QkvOps::Stacked { prefill, .. } => {
                    let halves = prefill[0].half_buffer();
                    let f16 = norm_f16(&w.attn_norm, halves, "attn_norm")?;
                    let reduce = reduce_norm(&f16, &w.attn_norm, halves, "attn_norm")?;
                    (f16, reduce)
                }
                QkvOps::Separate { .. } => (None, None),
            };
            let (ffn_norm_f16, ffn_norm_reduce) = match &ffn {
                FfnOps::Interleaved { prefill, .. } => {
                    let halves = prefill.half_buffer();
                    let f16 = norm_f16(&w.ffn_norm, halves, "ffn_norm")?;
                    let reduce = reduce_norm(&f16, &w.ffn_norm, halves, "ffn_norm")?;
                    (f16, reduce)
                }
                FfnOps::Separate { .. } => (None, None),
            };
            let ops = LayerOps {
                attn_norm: Bound::new::<RmsNormParams>(&ctx, &norm_key, "attn_norm", &[&x, &w.attn_norm, &xn])?,
                attn_norm_f16,
                attn_norm_reduce,
                ffn_norm_f16,
                ffn_norm_reduce,
                qkv,
                attn_prefill: match &scores {
                    None => PrefillAttnOps::Flash {
                        kernel: Bound::new::<FlashParams>(
                            &ctx,
                            &flash_attention::key(kv, &shape)?,
                            "attention",
                            &[q_src, &kc, &vc, &attn, &chunks, &partial],
                        )?,
                        combine: Bound::new::<flash_attention::CombineParams>(
                            &ctx,
                            &KernelKey::FlashCombine,
                            "attention",
                            &[&partial, &attn],
                        )?,
                    },
                    Some(scores) => PrefillAttnOps::Gemm {
                        qk: Bound::new::<AttnGemmParams>(
                            &ctx,
                            &KernelKey::AttnGemm { kv },
                            "attention",
                            &[q_src, &kc, scores],
                        )?,
                        softmax: Bound::new::<SoftmaxParams>(
                            &ctx,
                            &KernelKey::Softmax { subgroups: sub },
                            "attention",
                            &[scores],
                        )?,
                        pv: Bound::new::<AttnGemmParams>(
                            &ctx,
                            &KernelKey::AttnGemm { kv },
                            "attention",
                            &[scores, &vc, &attn],
                        )?,
                    },
                },
                attn_decode: Bound::new::<AttnDecodeParams>(
                    &ctx,
                    &decode_key(wo_q8.is_some(), false),
                    "attention",
                    &[q_src, &kc, &vc, &attn, &step_state, wo_q8.as_ref().unwrap_or(&no_q8)],
                )?,
                attn_decode_merge: if merges {
                    Some(Bound::new::<AttnDecodeParams>(
                        &ctx,
                        &decode_key(wo_q8.is_some(), true),
                        "attention",
                        &[
                            q_src,
                            &kc,
                            &vc,
                            &attn,
                            &step_state,
                            wo_q8.as_ref().unwrap_or(&no_q8),
                            &partial,
                            &merge_done,
                            // (Read ahead into L2 while the last split workgroups merge.)
                            &w.wo.chunks[0].buffer,
                        ],
                    )?)
                } else {
                    None
                },
                attn_decode_split: Bound::new::<AttnDecodeParams>(
                    &ctx,
                    &decode_key(wo_q8.is_some(), false),
                    "attention",
                    &[q_src, &kc, &vc, &partial, &step_state, &no_q8],
                )?,
                attn_combine: Bound::new::<AttnDecodeParams>(
                    &ctx,
                    &KernelKey::AttnCombine { subgroups: sub, batched: false, q8_out: wo_q8.is_some() },
                    "attention",
                    &[&partial, &attn, &step_state, wo_q8.as_ref().unwrap_or(&no_q8)],
                )?,
                wo: match &wo_q8 {
                    Some(blocks) => {
                        // With the gate/up projection's int8 input written by its epilogue.
                        let gate_up_reads = match &ffn {
                            FfnOps::Interleaved { decode, .. } => decode.q8_input_through_norm(&ctx),
                            FfnOps::Separate { gate_fused, .. } => gate_fused.q8_input_through_norm(&ctx),
                        };
                        let epi = if residual_q8(gate_up_reads) {
                            Epilogue::PlainQ8Norm { blocks: &embd_blocks, norm_w: &w.ffn_norm }
                        } else {
                            Epilogue::Plain
                        };
                        let wo = Matmul { epi, ..dense(&w.wo, &attn, q, &x, se, None, true) };
                        BoundMatmul::fed_q8_in(&ctx, &wo, "attn_out", &scratch, blocks)?
                    }
                    None => mm(&w.wo, &attn, q, &x, se, None, true, "attn_out")?,
                },
                wo_q8,
                ffn_norm: Bound::new::<RmsNormParams>(&ctx, &norm_key, "ffn_norm", &[&x, &w.ffn_norm, &xn])?,
                ffn,
            };
            layers.push(ops);
            k_caches.push(kc);
            k_caches.push(vc);
        }
        let out_norm_all =
            Bound::new::<RmsNormParams>(&ctx, &norm_key, "output_norm", &[&x, &weights.output_norm, &xn])?;
        let lm_head_all = mm(weights.lm_head(), &xn, se, &logits, v, None, false, "lm_head")?;
        let head = |xbuf| {
            let m = Matmul {
                w: weights.lm_head(),
                x: xbuf,
                y: &logits,
                bias: None,
                m: 0,
                x_stride: se,
                y_stride: v,
                accumulate: false,
                norm: Some((&weights.output_norm, c.rms_eps)),
                glu: None,
                epi: Epilogue::Plain,
            };
            BoundMatmul::new_in(&ctx, &m, "lm_head", &scratch)
        };
        let lm_head_x = head(&x)?;
        let lm_head_last = head(&x_last)?;
        let argmax =
            Bound::new::<ArgmaxParams>(&ctx, &KernelKey::Argmax { subgroups: sub }, "sample", &[&logits, &out_id])?;
        let stage = |i: usize| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(if i == 0 { "chain readback 0" } else { "chain readback 1" }),
                size: super::CHAIN_MAX as u64 * 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let chain_stage = [stage(0), stage(1)];
        let step_picks = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("picks of the last batched step"),
            size: super::CHAIN_MAX as u64 * 4,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // Chained decode steps' picks, appended by the sampler (common/sample_chain.wgsl):
        // the count, then up to `CHAIN_MAX` tokens.
        let chain_tokens = st((1 + super::CHAIN_MAX as u64) * 4, "chained tokens")?;
        let steps_per_submit = std::env::var("KILN_STEPS_PER_SUBMIT")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(super::STEPS_PER_SUBMIT)
            .clamp(1, super::CHAIN_MAX);
        let scorer = super::score::Scorer::new(&ctx, &logits, &opts)?;
        // The GPU sampler's state per sequence: draws made, tokens appended and the penalties'
        // history. The session's own sampler (slot 0) takes its configuration from its
        // uniform; the table sampler each row's slot's from `sample_configs`.
        let sample_state = st(sizes.sampler_states, "sampling state")?;
        let sample_configs = st(sizes.sampler_configs, "sampler configurations")?;
        // The first pass's results per row and slice of the logits (any step's rows).
        let sample_slices = st(sizes.sampler_slices, "sampler slices")?;
        // Both passes, chained or not, bind the same buffers (one layout): one bind group
        // records any of them.
        let sample = Bound::new::<SampleConfig>(
            &ctx,
            &KernelKey::Sample {
                subgroups: sub,
                batched: false,
                prune: false,
                tops: false,
                chained: false,
                greedy: false,
            },
            "sample",
            &[&logits, &out_id, &sample_state, &sample_slices, &step_state, &chain_tokens],
        )?;
        let sample_table = Bound::new::<SampleConfig>(
            &ctx,
            &KernelKey::Sample {
                subgroups: sub,
                batched: true,
                prune: false,
                tops: false,
                chained: false,
                greedy: false,
            },
            "sample",
            &[&logits, &out_id, &sample_state, &sample_configs, &step_state, &sample_slices],
        )?;
        // Batched steps need the stacked Q/K/V epilogue (it takes each column's position), and
        // stay on the GEMV, whose results for a column do not depend on the others beside it.
        let batch_cols = if !layers.iter().all(|l| matches!(l.qkv, QkvOps::Stacked { .. })) {
            1
        } else {
            sizes::batch_columns(opts.n_seq).min(ctx.caps.gemv_max_cols)
        };
        let mut keep = vec![xn, qb, kb, vb, qn, kn, attn, gate, up, act, partial, merge_done];
        keep.extend(scores);
        keep.extend(k_caches);
        let resident_f16_bytes = scratch.resident_bytes();
        if resident_f16_bytes > 0 {
            tracing::info!(
                "prefill reads f16 copies of the quantized weights kept in GPU memory ({:.1} MiB; KILN_PREFILL_RESIDENT=0: none)",
                resident_f16_bytes as f64 / (1 << 20) as f64
            );
        }
        let mut session = Session {
            ctx,
            cfg: cfg.clone(),
            _weights: weights,
            opts,
            kv,
            shape,
            split_room: sizes.partials,
            pos: vec![0; opts.n_seq.max(1) as usize],
            batch_cols: batch_cols as usize,
            prefill_gemv_cols,
            batches: Default::default(),
            ids,
            x,
            x_last,
            logits,
            out_id,
            readback,
            embed,
            embed_fed_back,
            chain_stage,
            chain_tokens,
            steps_per_submit,
            prerecorded: None,
            prerecord: true,
            resident_f16_bytes,
            step_picks,
            last_step_slots: Vec::new(),
            steps_in_flight: Default::default(),
            next_stage: 0,
            layers,
            out_norm_all,
            lm_head_x,
            lm_head_all,
            lm_head_last,
            argmax,
            scorer,
            sample,
            sample_greedy: false,
            sample_table,
            sample_state,
            sample_configs,
            step_state,
            chunks,
            head_cols,
            _rope_shape: rope_shape,
            _unused: unused,
            _buffers: keep,
            timing: StepTiming::default(),
            host: Default::default(),
            skip: None,
            prof: None,
        };
        session.set_sampling(
            &crate::sample::Sampler::new(crate::sample::SamplerConfig { temperature: 0.0, ..Default::default() }),
            &[],
        );
        Ok(session)
    }
}
