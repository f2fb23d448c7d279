//! A session: the KV cache, the activation arena and every kernel bound once, and the
//! forward pass that records one step (prefill of many tokens, or one decode token) into a
//! single submit whose only readback is the sampled token or the requested logits.

mod score;

use std::sync::Arc;

use crate::error::{KilnError, Result};
use crate::gpu::{grid, Bound, GpuContext};
use crate::kernels::argmax::ArgmaxParams;
use crate::kernels::attention::{self, AttnDecodeParams, AttnGemmParams, AttnShape, SoftmaxParams};
use crate::kernels::elementwise::{EltOp, EltParams};
use crate::kernels::embed::EmbedParams;
use crate::kernels::matmul::{BoundMatmul, Matmul};
use crate::kernels::norm::RmsNormParams;
use crate::kernels::rope::{RopeMode, RopeParams};
use crate::kernels::{KernelKey, KvKind, WG_ELT};
use crate::model::config::ModelConfig;
use crate::model::weights::Weights;
use crate::profile::{Profile, ProfileMode, Profiler, Recorder, Stage, StageWork};

fn pad4(n: u32) -> u32 {
    n.div_ceil(4) * 4
}

/// How a session is sized.
#[derive(Debug, Clone, Copy)]
pub struct SessionOptions {
    /// Context length (KV cache rows).
    pub n_ctx: u32,
    /// Most tokens per forward step; longer inputs are split.
    pub ubatch: u32,
    /// F16 KV cache (default) or F32.
    pub f16_kv: bool,
    /// Keep logits for every position of a step (evaluation), not just the last.
    pub all_logits: bool,
}

/// Where the time of the last step went (CPU side), in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTiming {
    /// Recording the command buffer.
    pub encode: f64,
    /// queue.submit.
    pub submit: f64,
    /// Waiting for the GPU and reading the result back.
    pub wait: f64,
    /// GPU time of the step's passes from timestamp queries (0 when not profiling).
    pub gpu: f64,
}

/// What a step returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Greedy token of the last position (4 bytes read back).
    Argmax,
    /// Logits of the last position.
    LastLogits,
    /// Logits of every position (needs `all_logits`).
    AllLogits,
}

struct LayerOps {
    attn_norm: Bound,
    q: BoundMatmul,
    k: BoundMatmul,
    v: BoundMatmul,
    /// The same projections reading the residual stream with the RMSNorm fused (decode).
    q_fused: BoundMatmul,
    k_fused: BoundMatmul,
    v_fused: BoundMatmul,
    gate_fused: BoundMatmul,
    up_fused: BoundMatmul,
    /// The down projection reading silu(gate) * up directly (decode).
    down_fused: BoundMatmul,
    q_norm: Option<Bound>,
    k_norm: Option<Bound>,
    rope_q: Bound,
    /// K rotated and V copied into the caches, one dispatch.
    kv_write: Bound,
    attn_qk: Bound,
    attn_softmax: Bound,
    attn_pv: Bound,
    attn_decode: Bound,
    attn_combine: Bound,
    wo: BoundMatmul,
    ffn_norm: Bound,
    gate: BoundMatmul,
    up: BoundMatmul,
    silu: Bound,
    down: BoundMatmul,
}

pub struct Session {
    ctx: Arc<GpuContext>,
    pub cfg: ModelConfig,
    _weights: Arc<Weights>,
    pub opts: SessionOptions,
    kv: KvKind,
    shape: AttnShape,
    /// Tokens in the KV cache.
    pos: u32,
    ids: wgpu::Buffer,
    x: wgpu::Buffer,
    x_last: wgpu::Buffer,
    logits: wgpu::Buffer,
    out_id: wgpu::Buffer,
    readback: wgpu::Buffer,
    embed: Vec<(Bound, u32, u32)>,
    embed_fed_back: Vec<(Bound, u32, u32)>,
    /// Two readback slots for chained decoding: one being read while the next is written.
    chain_stage: [wgpu::Buffer; 2],
    layers: Vec<LayerOps>,
    out_norm_all: Bound,
    /// LM head on x itself (one-token steps), with the output norm fused.
    lm_head_x: BoundMatmul,
    lm_head_all: BoundMatmul,
    lm_head_last: BoundMatmul,
    argmax: Bound,
    /// Log-softmax and NLL over the logits (sessions with all logits; see score.rs).
    scorer: Option<score::Scorer>,
    // Kept alive for the bind groups that use them.
    _buffers: Vec<wgpu::Buffer>,
    /// Timing of the last step.
    pub timing: StepTiming,
    /// Per-stage timestamps and totals when profiling.
    prof: Option<Profiler>,
}

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
        let f = |n: u64| n * 4;
        let st = |size: u64, label: &str| ctx.storage(size, label);
        let ids = st(f(b as u64), "ids")?;
        let x = st(f((b * se) as u64), "x")?;
        let xn = st(f((b * se) as u64), "xn")?;
        let qb = st(f((b * q) as u64), "q")?;
        let kb = st(f((b * kvd) as u64), "k")?;
        let vb = st(f((b * kvd) as u64), "v")?;
        let qn = st(f((b * q) as u64), "q_normed")?;
        let kn = st(f((b * kvd) as u64), "k_normed")?;
        let attn = st(f((b * q) as u64), "attn")?;
        let gate = st(f((b * sf) as u64), "gate")?;
        let up = st(f((b * sf) as u64), "up")?;
        let act = st(f((b * sf) as u64), "act")?;
        let scores_len = f(c.n_head as u64 * b as u64 * opts.n_ctx as u64);
        if scores_len > ctx.max_binding {
            return Err(KilnError::TooLarge {
                what: format!("attention scores for {b} tokens x {} positions", opts.n_ctx),
                needed: scores_len,
                limit: ctx.max_binding,
            });
        }
        let scores = st(scores_len, "scores")?;
        let partial = st(f(shape.decode_scratch_len() as u64), "attention partials")?;
        let x_last = st(f(se as u64), "x_last")?;
        let logit_rows = if opts.all_logits { b } else { 1 };
        let logits = st(f(logit_rows as u64 * v as u64), "logits")?;
        let out_id = st(16, "sampled id")?;
        let readback = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: f(logit_rows as u64 * v as u64).max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });

        let sub = ctx.caps.subgroups;
        let norm_key = KernelKey::RmsNorm { subgroups: sub };
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
        };
        let mm = |w, xbuf, xs, ybuf, ys, bias, acc, stage| {
            BoundMatmul::new(&ctx, &dense(w, xbuf, xs, ybuf, ys, bias, acc), stage)
        };
        // Matmuls that only prefill runs (m > 8, after a norm or SwiGLU dispatch) are GEMMs:
        // no int8 GEMV input to bind.
        let mm_prefill = |w, xbuf, xs, ybuf, ys, bias, acc, stage| {
            BoundMatmul::with_q8(&ctx, &dense(w, xbuf, xs, ybuf, ys, bias, acc), stage, false)
        };
        // Decode (m <= 8) reads the residual stream and applies the RMSNorm in the GEMV itself
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
        let mut layers = Vec::new();
        let mut k_caches = Vec::new();
        for (li, w) in weights.layers.iter().enumerate() {
            let cache_bytes = opts.n_ctx as u64 * kvd as u64 * kv.bytes_per_elem();
            let kc = st(cache_bytes, &format!("k_cache.{li}"))?;
            let vc = st(cache_bytes, &format!("v_cache.{li}"))?;
            let qwen3 = w.q_norm.is_some();
            let (q_src, k_src) = if qwen3 { (&qn, &kn) } else { (&qb, &kb) };
            let rope_neox = c.rope_mode == RopeMode::Neox;
            let qkv_fused = [
                mm_norm(&w.wq, &w.attn_norm, &qb, q, w.bq.as_ref()),
                mm_norm(&w.wk, &w.attn_norm, &kb, kvd, w.bk.as_ref()),
                mm_norm(&w.wv, &w.attn_norm, &vb, kvd, w.bv.as_ref()),
            ];
            let [q_fused, k_fused, v_fused]: [BoundMatmul; 3] = BoundMatmul::group(&ctx, &qkv_fused, "qkv")?
                .try_into()
                .map_err(|_| KilnError::invalid("model", "Q/K/V group"))?;
            let gate_up_fused =
                [mm_norm(&w.w_gate, &w.ffn_norm, &gate, sf, None), mm_norm(&w.w_up, &w.ffn_norm, &up, sf, None)];
            let [gate_fused, up_fused]: [BoundMatmul; 2] = BoundMatmul::group(&ctx, &gate_up_fused, "ffn_gate_up")?
                .try_into()
                .map_err(|_| KilnError::invalid("model", "gate/up group"))?;
            let ops = LayerOps {
                attn_norm: Bound::new::<RmsNormParams>(&ctx, &norm_key, "attn_norm", &[&x, &w.attn_norm, &xn])?,
                q: mm_prefill(&w.wq, &xn, se, &qb, q, w.bq.as_ref(), false, "qkv")?,
                k: mm_prefill(&w.wk, &xn, se, &kb, kvd, w.bk.as_ref(), false, "qkv")?,
                v: mm_prefill(&w.wv, &xn, se, &vb, kvd, w.bv.as_ref(), false, "qkv")?,
                q_fused,
                k_fused,
                v_fused,
                gate_fused,
                up_fused,
                down_fused: BoundMatmul::new(
                    &ctx,
                    &Matmul {
                        w: &w.w_down,
                        x: &gate,
                        y: &x,
                        bias: None,
                        m: 0,
                        x_stride: sf,
                        y_stride: se,
                        accumulate: true,
                        norm: None,
                        glu: Some(&up),
                    },
                    "ffn_down",
                )?,
                q_norm: match &w.q_norm {
                    Some(g) => Some(Bound::new::<RmsNormParams>(&ctx, &norm_key, "qk_norm", &[&qb, g, &qn])?),
                    None => None,
                },
                k_norm: match &w.k_norm {
                    Some(g) => Some(Bound::new::<RmsNormParams>(&ctx, &norm_key, "qk_norm", &[&kb, g, &kn])?),
                    None => None,
                },
                rope_q: Bound::new::<RopeParams>(
                    &ctx,
                    &KernelKey::Rope { neox: rope_neox, to_cache: None, rope: true },
                    "rope",
                    &[q_src],
                )?,
                kv_write: Bound::new::<RopeParams>(
                    &ctx,
                    &KernelKey::KvWrite { neox: rope_neox, kv },
                    "kv_write",
                    &[k_src, &kc, &vb, &vc],
                )?,
                attn_qk: Bound::new::<AttnGemmParams>(
                    &ctx,
                    &KernelKey::AttnGemm { kv },
                    "attention",
                    &[q_src, &kc, &scores],
                )?,
                attn_softmax: Bound::new::<SoftmaxParams>(
                    &ctx,
                    &KernelKey::Softmax { subgroups: sub },
                    "attention",
                    &[&scores],
                )?,
                attn_pv: Bound::new::<AttnGemmParams>(
                    &ctx,
                    &KernelKey::AttnGemm { kv },
                    "attention",
                    &[&scores, &vc, &attn],
                )?,
                attn_decode: Bound::new::<AttnDecodeParams>(
                    &ctx,
                    &KernelKey::AttnDecode { kv, subgroups: sub },
                    "attention",
                    &[q_src, &kc, &vc, &partial],
                )?,
                attn_combine: Bound::new::<AttnDecodeParams>(
                    &ctx,
                    &KernelKey::AttnCombine,
                    "attention",
                    &[&partial, &attn],
                )?,
                wo: mm(&w.wo, &attn, q, &x, se, None, true, "attn_out")?,
                ffn_norm: Bound::new::<RmsNormParams>(&ctx, &norm_key, "ffn_norm", &[&x, &w.ffn_norm, &xn])?,
                gate: mm_prefill(&w.w_gate, &xn, se, &gate, sf, None, false, "ffn_gate_up")?,
                up: mm_prefill(&w.w_up, &xn, se, &up, sf, None, false, "ffn_gate_up")?,
                silu: Bound::new::<EltParams>(
                    &ctx,
                    &KernelKey::Elementwise { op: EltOp::SiluMul },
                    "ffn_gate_up",
                    &[&gate, &up, &act],
                )?,
                down: mm_prefill(&w.w_down, &act, sf, &x, se, None, true, "ffn_down")?,
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
            };
            BoundMatmul::new(&ctx, &m, "lm_head")
        };
        let lm_head_x = head(&x)?;
        let lm_head_last = head(&x_last)?;
        let argmax =
            Bound::new::<ArgmaxParams>(&ctx, &KernelKey::Argmax { subgroups: sub }, "sample", &[&logits, &out_id])?;
        let stage = |i: usize| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(if i == 0 { "chain readback 0" } else { "chain readback 1" }),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let chain_stage = [stage(0), stage(1)];
        let scorer = score::Scorer::new(&ctx, &logits, &opts)?;
        let mut keep = vec![xn, qb, kb, vb, qn, kn, attn, gate, up, act, scores, partial];
        keep.extend(k_caches);
        Ok(Session {
            ctx,
            cfg: cfg.clone(),
            _weights: weights,
            opts,
            kv,
            shape,
            pos: 0,
            ids,
            x,
            x_last,
            logits,
            out_id,
            readback,
            embed,
            embed_fed_back,
            chain_stage,
            layers,
            out_norm_all,
            lm_head_x,
            lm_head_all,
            lm_head_last,
            argmax,
            scorer,
            _buffers: keep,
            timing: StepTiming::default(),
            prof: None,
        })
    }

    /// Times every stage of every step with timestamp queries from now on (an error when
    /// the adapter has no timestamps). `timing.gpu` then holds each step's GPU time.
    pub fn enable_profiling(&mut self) -> Result<()> {
        if self.prof.is_none() {
            self.prof = Some(Profiler::new(&self.ctx, 2, ProfileMode::Auto)?);
        }
        Ok(())
    }

    /// Profiling with the timestamps placed as `mode` says (replaces any profile so far).
    pub fn enable_profiling_mode(&mut self, mode: ProfileMode) -> Result<()> {
        self.prof = Some(Profiler::new(&self.ctx, 2, mode)?);
        Ok(())
    }

    /// Stops profiling: steps write no timestamps again.
    pub fn disable_profiling(&mut self) {
        self.prof = None;
    }

    /// The stage totals so far (None when not profiling).
    pub fn profile(&self) -> Option<&Profile> {
        self.prof.as_ref().map(|p| &p.profile)
    }

    /// Returns the totals so far and starts new ones.
    pub fn take_profile(&mut self) -> Option<Profile> {
        self.prof.as_mut().map(|p| std::mem::take(&mut p.profile))
    }

    /// Adds host time spent sampling and detokenizing a decode step (generation loops).
    pub fn add_host_time(&mut self, sample: f64, detokenize: f64) {
        if let Some(p) = self.prof.as_mut() {
            p.profile.decode.cpu.sample += sample;
            p.profile.decode.cpu.detokenize += detokenize;
        }
    }

    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Bytes of one element of the KV cache (2 for f16, 4 for f32).
    pub fn kv_bytes_per_elem(&self) -> u64 {
        self.kv.bytes_per_elem()
    }

    /// Tokens in the KV cache.
    pub fn position(&self) -> u32 {
        self.pos
    }

    /// Forgets the context (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Rewinds to `pos` tokens (they stay valid in the cache).
    pub fn truncate(&mut self, pos: u32) {
        self.pos = self.pos.min(pos);
    }

    fn rope_params(&self, m: u32, n_heads: u32, src_stride: u32) -> RopeParams {
        let c = &self.cfg;
        RopeParams {
            n_tokens: m,
            n_heads,
            head_dim: c.head_dim,
            n_rot: c.n_rot,
            pos0: self.pos,
            src_stride,
            dst_stride: c.kv_dim(),
            dst_offset: 0,
            freq_base: c.rope_base,
            freq_scale: c.rope_freq_scale,
            _pad: [0; 2],
        }
    }

    /// Runs `tokens` (at most `ubatch`) through the model at the current position.
    fn record_step(&self, rec: &mut Recorder<'_>, m: u32, ids_on_gpu: bool) -> Result<()> {
        let ctx = &*self.ctx;
        let c = &self.cfg;
        let (se, sf) = (pad4(c.n_embd), pad4(c.n_ff));
        let pipe = |k: &KernelKey| ctx.pipeline(k);
        let sub = ctx.caps.subgroups;
        let norm_pipe = pipe(&KernelKey::RmsNorm { subgroups: sub })?;
        let norm = |b: &Bound, rows: u32, n: u32, stride: u32, pass: &mut wgpu::ComputePass<'_>| {
            b.set(ctx, &RmsNormParams { n, x_stride: stride, y_stride: stride, eps: c.rms_eps });
            b.record_with(pass, &norm_pipe, grid(rows));
        };
        // Bytes of activations (f32) and of the KV cache, for the profile's work estimates.
        let f = |n: u32| n as f64 * 4.0;
        let kv_elt = self.kv.bytes_per_elem() as f64;
        let norm_work = |rows: u32, n: u32| StageWork::other("rms_norm", format!("{rows}x{n}"), 2.0 * f(rows * n), 0.0);

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
        let rope_q_pipe = pipe(&KernelKey::Rope { neox, to_cache: None, rope: true })?;
        let kv_write_pipe = pipe(&KernelKey::KvWrite { neox, kv: self.kv })?;
        let silu_pipe = pipe(&KernelKey::Elementwise { op: EltOp::SiluMul })?;
        let rope_grid = |heads: u32| grid((m * heads * (c.head_dim / 2)).div_ceil(WG_ELT));
        let kv_len = self.pos + m;
        // Few tokens: GEMV with the RMSNorm fused in; more: a norm dispatch, then GEMM.
        let fused = m <= crate::plan::GEMV_MAX_COLS;
        for l in &self.layers {
            if fused {
                rec.stage(Stage::AttnNormQkv, || {
                    StageWork::combine(vec![l.q_fused.work(ctx, m), l.k_fused.work(ctx, m), l.v_fused.work(ctx, m)])
                });
                BoundMatmul::record_group(ctx, rec.pass(), &[&l.q_fused, &l.k_fused, &l.v_fused], m)?;
            } else {
                rec.stage(Stage::AttnNorm, || norm_work(m, c.n_embd));
                norm(&l.attn_norm, m, c.n_embd, se, rec.pass());
                rec.stage(Stage::Qkv, || {
                    StageWork::combine(vec![l.q.work(ctx, m), l.k.work(ctx, m), l.v.work(ctx, m)])
                });
                l.q.record(ctx, rec.pass(), m, None)?;
                l.k.record(ctx, rec.pass(), m, None)?;
                l.v.record(ctx, rec.pass(), m, None)?;
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                rec.stage(Stage::QkNorm, || norm_work(m * (c.n_head + c.n_kv_head), c.head_dim));
                norm(qn, m * c.n_head, c.head_dim, c.head_dim, rec.pass());
                norm(kn, m * c.n_kv_head, c.head_dim, c.head_dim, rec.pass());
            }
            rec.stage(Stage::Rope, || {
                StageWork::other("rope", format!("{m}x{}", c.q_dim()), 2.0 * f(m * c.q_dim()), 0.0)
            });
            l.rope_q.set(ctx, &self.rope_params(m, c.n_head, c.q_dim()));
            l.rope_q.record_with(rec.pass(), &rope_q_pipe, rope_grid(c.n_head));
            rec.stage(Stage::KvWrite, || {
                let n = (m * c.kv_dim()) as f64;
                StageWork::other("kv_write (rope k)", format!("2x{m}x{}", c.kv_dim()), 2.0 * n * (4.0 + kv_elt), 0.0)
            });
            let kvp = self.rope_params(m, c.n_kv_head, c.kv_dim());
            l.kv_write.set(ctx, &kvp);
            l.kv_write.record_with(rec.pass(), &kv_write_pipe, crate::kernels::rope::kv_write_grid(&kvp));
            rec.stage(Stage::Attention, || {
                // K and V read once, Q read and the output written; in prefill the score
                // matrix is written, read and rewritten by softmax, and read again.
                let kv_bytes = 2.0 * kv_len as f64 * c.kv_dim() as f64 * kv_elt;
                let qo = 2.0 * f(m * c.q_dim());
                let keys = self.pos as f64 + (m as f64 + 1.0) / 2.0;
                let flops = 4.0 * (m * c.n_head * c.head_dim) as f64 * keys;
                if m == 1 {
                    StageWork::other("attn_decode+combine", format!("{}h x {kv_len}", c.n_head), kv_bytes + qo, flops)
                } else {
                    let scores = 4.0 * f(m * c.n_head) * kv_len as f64;
                    StageWork::other(
                        "attn_gemm+softmax+attn_gemm",
                        format!("{}h x {m}x{kv_len}", c.n_head),
                        kv_bytes + qo + scores,
                        flops,
                    )
                }
            });
            if m == 1 {
                let (p, g1, g2) = attention::decode_launch(&self.shape, kv_len)?;
                l.attn_decode.set(ctx, &p);
                l.attn_decode.record_with(
                    rec.pass(),
                    &*pipe(&KernelKey::AttnDecode { kv: self.kv, subgroups: sub })?,
                    g1,
                );
                l.attn_combine.set(ctx, &p);
                l.attn_combine.record_with(rec.pass(), &*pipe(&KernelKey::AttnCombine)?, g2);
            } else {
                let [(qk, g_qk), (pv, g_pv)] = attention::prefill_launches(&self.shape, m, self.pos)?;
                let (sp, g_sm) = attention::softmax_launch(&self.shape, m, self.pos);
                let gemm = pipe(&KernelKey::AttnGemm { kv: self.kv })?;
                l.attn_qk.set(ctx, &qk);
                l.attn_qk.record_with(rec.pass(), &gemm, g_qk);
                l.attn_softmax.set(ctx, &sp);
                l.attn_softmax.record_with(rec.pass(), &*pipe(&KernelKey::Softmax { subgroups: sub })?, g_sm);
                l.attn_pv.set(ctx, &pv);
                l.attn_pv.record_with(rec.pass(), &gemm, g_pv);
            }
            rec.stage(Stage::AttnOut, || l.wo.work(ctx, m));
            l.wo.record(ctx, rec.pass(), m, None)?;
            if fused {
                rec.stage(Stage::FfnNormGateUp, || {
                    StageWork::combine(vec![l.gate_fused.work(ctx, m), l.up_fused.work(ctx, m)])
                });
                BoundMatmul::record_group(ctx, rec.pass(), &[&l.gate_fused, &l.up_fused], m)?;
                rec.stage(Stage::FfnActDown, || l.down_fused.work(ctx, m));
                l.down_fused.record(ctx, rec.pass(), m, None)?;
            } else {
                rec.stage(Stage::FfnNorm, || norm_work(m, c.n_embd));
                norm(&l.ffn_norm, m, c.n_embd, se, rec.pass());
                rec.stage(Stage::FfnGateUp, || StageWork::combine(vec![l.gate.work(ctx, m), l.up.work(ctx, m)]));
                l.gate.record(ctx, rec.pass(), m, None)?;
                l.up.record(ctx, rec.pass(), m, None)?;
                rec.stage(Stage::FfnAct, || {
                    StageWork::other("silu_mul", format!("{m}x{}", c.n_ff), 3.0 * f(m * sf), 0.0)
                });
                l.silu.set(ctx, &EltParams { n: m * sf, _pad: [0; 3] });
                l.silu.record_with(rec.pass(), &silu_pipe, grid((m * sf).div_ceil(WG_ELT)));
                rec.stage(Stage::FfnDown, || l.down.work(ctx, m));
                l.down.record(ctx, rec.pass(), m, None)?;
            }
        }
        Ok(())
    }

    /// Records the output norm, LM head and (for `Argmax`) the argmax over the logits of one
    /// token whose hidden state is in `x` (decode) or `x_last` (after a prefill).
    fn record_head(&self, rec: &mut Recorder<'_>, head: &BoundMatmul, argmax: bool) -> Result<()> {
        let ctx = &*self.ctx;
        let v = self.cfg.n_vocab;
        rec.stage(Stage::OutputNormLmHead, || head.work(ctx, 1));
        head.record(ctx, rec.pass(), 1, None)?;
        if argmax {
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

    /// Feeds `tokens` (split into steps of at most `ubatch`) and returns what `out` asks for,
    /// for the last step. `AllLogits` returns every position's logits, [tokens, n_vocab].
    pub fn forward(&mut self, tokens: &[u32], out: Output) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(KilnError::invalid("input", "no tokens to evaluate"));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
            return Err(KilnError::invalid(
                "input",
                format!("token id {bad} is outside the vocabulary of {}", self.cfg.n_vocab),
            ));
        }
        if self.pos as usize + tokens.len() > self.opts.n_ctx as usize {
            return Err(KilnError::invalid(
                "input",
                format!(
                    "the context is full: {} + {} tokens exceed {} (raise -c)",
                    self.pos,
                    tokens.len(),
                    self.opts.n_ctx
                ),
            ));
        }
        if out == Output::AllLogits && !self.opts.all_logits {
            return Err(KilnError::invalid("session", "all logits were not enabled for this session"));
        }
        let v = self.cfg.n_vocab as usize;
        let mut all = Vec::new();
        let ubatch = self.opts.ubatch as usize;
        let n_chunks = tokens.len().div_ceil(ubatch);
        for (i, chunk) in tokens.chunks(ubatch).enumerate() {
            let last = i + 1 == n_chunks;
            let step_out = if out == Output::AllLogits {
                Output::AllLogits
            } else if last {
                out
            } else {
                Output::LastLogits
            };
            let got = self.step(chunk, step_out, last || out == Output::AllLogits)?;
            if out == Output::AllLogits {
                all.extend_from_slice(&got[..chunk.len() * v]);
            } else if last {
                return Ok(got);
            }
        }
        Ok(all)
    }

    /// One forward step: one command buffer, one submit, one readback (when `read`).
    fn step(&mut self, tokens: &[u32], out: Output, read: bool) -> Result<Vec<f32>> {
        let t0 = std::time::Instant::now();
        let ctx = self.ctx.clone();
        let m = tokens.len() as u32;
        let (n_embd, rms_eps, v) = (self.cfg.n_embd, self.cfg.rms_eps, self.cfg.n_vocab);
        let mut prof = self.prof.take();
        let se = pad4(n_embd);
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        let read_bytes;
        {
            let mut rec = Recorder::new(&mut enc, "step", prof.as_mut().map(|p| p.slot(0, m)));
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
                self.record_head(&mut rec, head, out == Output::Argmax)?;
                let (src, n) = if out == Output::Argmax { (&self.out_id, 4) } else { (&self.logits, v as u64 * 4) };
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
        if !read {
            return Ok(Vec::new());
        }
        if out == Output::Argmax {
            let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            return Ok(vec![id as f32]);
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    fn read(&self, n: u64) -> Result<Vec<u8>> {
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

    /// Greedy decoding with the steps chained on the GPU: step k+1 reads the token step k
    /// sampled straight from GPU memory and is submitted before the host reads token k, so
    /// the GPU never waits for the host. `first` is the token to feed; `on_token` gets each
    /// new token and returns false to stop. Returns the tokens generated (at most `max_new`).
    pub fn generate_greedy_chained(
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
            let mut enc =
                ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("chained step") });
            let mut prof = s.prof.take();
            let recorded = {
                let mut rec = Recorder::new(&mut enc, "decode", prof.as_mut().map(|p| p.slot(k, 1)));
                let r = s.record_step(&mut rec, 1, true).and_then(|_| s.record_head(&mut rec, &s.lm_head_x, true));
                if r.is_ok() {
                    rec.encoder().copy_buffer_to_buffer(&s.out_id, 0, &s.chain_stage[k % 2], 0, 4);
                }
                rec.finish();
                r
            };
            let t1 = std::time::Instant::now();
            let idx = recorded.map(|_| ctx.queue.submit([enc.finish()]));
            if let Some(p) = prof.as_mut() {
                p.profile.decode.cpu.encode += (t1 - t0).as_secs_f64();
                p.profile.decode.cpu.submit += t1.elapsed().as_secs_f64();
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

    /// Greedy next token after feeding `tokens`.
    pub fn next_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        Ok(self.forward(tokens, Output::Argmax)?[0] as u32)
    }
}
