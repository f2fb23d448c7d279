//! A session: the KV cache, the activation arena and every kernel bound once, and the
//! forward pass that records one step (prefill of many tokens, or one decode token) into a
//! single submit whose only readback is the sampled token or the requested logits.

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
    // Kept alive for the bind groups that use them.
    _buffers: Vec<wgpu::Buffer>,
    /// Timing of the last step.
    pub timing: StepTiming,
    timer: Option<crate::gpu::timer::PassTimer>,
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
        let mm = |w, xbuf, xs, ybuf, ys, bias, acc, stage| {
            let m = Matmul {
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
            BoundMatmul::new(&ctx, &m, stage)
        };
        // Decode (m <= 8) reads the residual stream and applies the RMSNorm in the GEMV itself.
        let mm_norm = |w, norm_w, ybuf, ys, bias, stage| {
            let m = Matmul {
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
            BoundMatmul::new(&ctx, &m, stage)
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
            let ops = LayerOps {
                attn_norm: Bound::new::<RmsNormParams>(&ctx, &norm_key, "attn_norm", &[&x, &w.attn_norm, &xn])?,
                q: mm(&w.wq, &xn, se, &qb, q, w.bq.as_ref(), false, "qkv")?,
                k: mm(&w.wk, &xn, se, &kb, kvd, w.bk.as_ref(), false, "qkv")?,
                v: mm(&w.wv, &xn, se, &vb, kvd, w.bv.as_ref(), false, "qkv")?,
                q_fused: mm_norm(&w.wq, &w.attn_norm, &qb, q, w.bq.as_ref(), "qkv")?,
                k_fused: mm_norm(&w.wk, &w.attn_norm, &kb, kvd, w.bk.as_ref(), "qkv")?,
                v_fused: mm_norm(&w.wv, &w.attn_norm, &vb, kvd, w.bv.as_ref(), "qkv")?,
                gate_fused: mm_norm(&w.w_gate, &w.ffn_norm, &gate, sf, None, "ffn_gate_up")?,
                up_fused: mm_norm(&w.w_up, &w.ffn_norm, &up, sf, None, "ffn_gate_up")?,
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
                gate: mm(&w.w_gate, &xn, se, &gate, sf, None, false, "ffn_gate_up")?,
                up: mm(&w.w_up, &xn, se, &up, sf, None, false, "ffn_gate_up")?,
                silu: Bound::new::<EltParams>(
                    &ctx,
                    &KernelKey::Elementwise { op: EltOp::SiluMul },
                    "ffn_gate_up",
                    &[&gate, &up, &act],
                )?,
                down: mm(&w.w_down, &act, sf, &x, se, None, true, "ffn_down")?,
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
            _buffers: keep,
            timing: StepTiming::default(),
            timer: None,
        })
    }

    /// Measure each step's GPU time with timestamp queries (when the adapter has them).
    pub fn enable_gpu_timing(&mut self) -> Result<()> {
        self.timer = Some(crate::gpu::timer::PassTimer::new(&self.ctx, 2)?);
        Ok(())
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
    fn record_step(&self, pass: &mut wgpu::ComputePass<'_>, m: u32, ids_on_gpu: bool) -> Result<()> {
        let ctx = &*self.ctx;
        let c = &self.cfg;
        let (se, sf) = (pad4(c.n_embd), pad4(c.n_ff));
        let pipe = |k: &KernelKey| ctx.pipeline(k);
        let _ = &c;
        let sub = ctx.caps.subgroups;
        let norm_pipe = pipe(&KernelKey::RmsNorm { subgroups: sub })?;
        let norm = |b: &Bound, rows: u32, n: u32, stride: u32, pass: &mut wgpu::ComputePass<'_>| {
            b.set(ctx, &RmsNormParams { n, x_stride: stride, y_stride: stride, eps: c.rms_eps });
            b.record_with(pass, &norm_pipe, grid(rows));
        };

        let embed_pipe = pipe(&KernelKey::Embed { format: self._weights.token_embd.format })?;
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
            b.record_with(pass, &embed_pipe, grid((m * c.n_embd.div_ceil(8)).div_ceil(WG_ELT)));
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
                l.q_fused.record(ctx, pass, m, None)?;
                l.k_fused.record(ctx, pass, m, None)?;
                l.v_fused.record(ctx, pass, m, None)?;
            } else {
                norm(&l.attn_norm, m, c.n_embd, se, pass);
                l.q.record(ctx, pass, m, None)?;
                l.k.record(ctx, pass, m, None)?;
                l.v.record(ctx, pass, m, None)?;
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                norm(qn, m * c.n_head, c.head_dim, c.head_dim, pass);
                norm(kn, m * c.n_kv_head, c.head_dim, c.head_dim, pass);
            }
            l.rope_q.set(ctx, &self.rope_params(m, c.n_head, c.q_dim()));
            l.rope_q.record_with(pass, &rope_q_pipe, rope_grid(c.n_head));
            let kvp = self.rope_params(m, c.n_kv_head, c.kv_dim());
            l.kv_write.set(ctx, &kvp);
            l.kv_write.record_with(pass, &kv_write_pipe, crate::kernels::rope::kv_write_grid(&kvp));
            if m == 1 {
                let (p, g1, g2) = attention::decode_launch(&self.shape, kv_len)?;
                l.attn_decode.set(ctx, &p);
                l.attn_decode.record_with(pass, &*pipe(&KernelKey::AttnDecode { kv: self.kv, subgroups: sub })?, g1);
                l.attn_combine.set(ctx, &p);
                l.attn_combine.record_with(pass, &*pipe(&KernelKey::AttnCombine)?, g2);
            } else {
                let [(qk, g_qk), (pv, g_pv)] = attention::prefill_launches(&self.shape, m, self.pos)?;
                let (sp, g_sm) = attention::softmax_launch(&self.shape, m, self.pos);
                let gemm = pipe(&KernelKey::AttnGemm { kv: self.kv })?;
                l.attn_qk.set(ctx, &qk);
                l.attn_qk.record_with(pass, &gemm, g_qk);
                l.attn_softmax.set(ctx, &sp);
                l.attn_softmax.record_with(pass, &*pipe(&KernelKey::Softmax { subgroups: sub })?, g_sm);
                l.attn_pv.set(ctx, &pv);
                l.attn_pv.record_with(pass, &gemm, g_pv);
            }
            l.wo.record(ctx, pass, m, None)?;
            if fused {
                l.gate_fused.record(ctx, pass, m, None)?;
                l.up_fused.record(ctx, pass, m, None)?;
            } else {
                norm(&l.ffn_norm, m, c.n_embd, se, pass);
                l.gate.record(ctx, pass, m, None)?;
                l.up.record(ctx, pass, m, None)?;
            }
            if fused {
                l.down_fused.record(ctx, pass, m, None)?;
            } else {
                l.silu.set(ctx, &EltParams { n: m * sf, _pad: [0; 3] });
                l.silu.record_with(pass, &silu_pipe, grid((m * sf).div_ceil(WG_ELT)));
                l.down.record(ctx, pass, m, None)?;
            }
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
        let mut timer = self.timer.take();
        let se = pad4(n_embd);
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        {
            let tw = timer.as_mut().and_then(|t| t.pass("layers"));
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("layers"), timestamp_writes: tw });
            self.record_step(&mut pass, m, false)?;
            if out == Output::AllLogits {
                self.out_norm_all.set(&*ctx, &RmsNormParams { n: n_embd, x_stride: se, y_stride: se, eps: rms_eps });
                self.out_norm_all.record_with(
                    &mut pass,
                    &*ctx.pipeline(&KernelKey::RmsNorm { subgroups: ctx.caps.subgroups })?,
                    grid(m),
                );
                self.lm_head_all.record(&ctx, &mut pass, m, None)?;
            } else if m == 1 {
                // One token: x is the last position; the head reads it in the same pass.
                self.lm_head_x.record(&ctx, &mut pass, 1, None)?;
                if out == Output::Argmax {
                    self.argmax.set(&*ctx, &ArgmaxParams { n: v, stride: v, _pad: [0; 2] });
                    let argmax = ctx.pipeline(&KernelKey::Argmax { subgroups: ctx.caps.subgroups })?;
                    self.argmax.record_with(&mut pass, &argmax, [1, 1, 1]);
                }
            }
        }
        let read_bytes;
        if out != Output::AllLogits && m == 1 {
            read_bytes = if out == Output::Argmax { 4 } else { v as u64 * 4 };
            let src = if out == Output::Argmax { &self.out_id } else { &self.logits };
            enc.copy_buffer_to_buffer(src, 0, &self.readback, 0, read_bytes);
        } else if out == Output::AllLogits {
            read_bytes = m as u64 * v as u64 * 4;
            if read {
                enc.copy_buffer_to_buffer(&self.logits, 0, &self.readback, 0, read_bytes);
            }
        } else {
            // Only the last position goes through the output norm and the LM head.
            enc.copy_buffer_to_buffer(&self.x, (m - 1) as u64 * se as u64 * 4, &self.x_last, 0, se as u64 * 4);
            {
                let tw = timer.as_mut().and_then(|t| t.pass("head"));
                let mut pass =
                    enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("head"), timestamp_writes: tw });
                self.lm_head_last.record(&ctx, &mut pass, 1, None)?;
                if out == Output::Argmax {
                    self.argmax.set(&*ctx, &ArgmaxParams { n: v, stride: v, _pad: [0; 2] });
                    self.argmax.record_with(
                        &mut pass,
                        &*ctx.pipeline(&KernelKey::Argmax { subgroups: ctx.caps.subgroups })?,
                        [1, 1, 1],
                    );
                }
            }
            if out == Output::Argmax {
                read_bytes = 4;
                enc.copy_buffer_to_buffer(&self.out_id, 0, &self.readback, 0, 4);
            } else {
                read_bytes = v as u64 * 4;
                enc.copy_buffer_to_buffer(&self.logits, 0, &self.readback, 0, read_bytes);
            }
        }
        if let Some(t) = &timer {
            t.resolve(&mut enc);
        }
        let t1 = std::time::Instant::now();
        ctx.queue.submit([enc.finish()]);
        let t2 = std::time::Instant::now();
        self.pos += m;
        let gpu = match timer.as_mut() {
            Some(t) => t.read(&ctx)?.iter().map(|(_, ns)| ns * 1e-9).sum(),
            None => 0.0,
        };
        self.timer = timer;
        let bytes = if read { self.read(read_bytes)? } else { Vec::new() };
        let t3 = std::time::Instant::now();
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
            let mut enc =
                ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("chained step") });
            s.encode_decode_step(&mut enc, true)?;
            enc.copy_buffer_to_buffer(&s.out_id, 0, &s.chain_stage[k % 2], 0, 4);
            let idx = ctx.queue.submit([enc.finish()]);
            s.pos += 1;
            Ok(idx)
        };
        submitted[0] = Some(submit(self, 0)?);
        for k in 0..max_new {
            if k + 1 < max_new {
                submitted[(k + 1) % 2] = Some(submit(self, k + 1)?);
            }
            let slot = &self.chain_stage[k % 2];
            let (tx, rx) = std::sync::mpsc::channel();
            slot.map_async(wgpu::MapMode::Read, 0..4, move |r| {
                let _ = tx.send(r);
            });
            let polled = ctx.device.poll(wgpu::PollType::Wait {
                submission_index: submitted[k % 2].take(),
                timeout: Some(ctx.poll_timeout),
            });
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

    /// Records one decode step (m = 1) through argmax into `out_id`, in one compute pass.
    fn encode_decode_step(&self, enc: &mut wgpu::CommandEncoder, ids_on_gpu: bool) -> Result<()> {
        let ctx = &*self.ctx;
        let v = self.cfg.n_vocab;
        let mut pass =
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("decode"), timestamp_writes: None });
        self.record_step(&mut pass, 1, ids_on_gpu)?;
        // With one token, x holds just the last position: the head reads it directly.
        self.lm_head_x.record(ctx, &mut pass, 1, None)?;
        self.argmax.set(ctx, &ArgmaxParams { n: v, stride: v, _pad: [0; 2] });
        self.argmax.record_with(
            &mut pass,
            &*ctx.pipeline(&KernelKey::Argmax { subgroups: ctx.caps.subgroups })?,
            [1, 1, 1],
        );
        Ok(())
    }

    /// Greedy next token after feeding `tokens`.
    pub fn next_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        Ok(self.forward(tokens, Output::Argmax)?[0] as u32)
    }
}
