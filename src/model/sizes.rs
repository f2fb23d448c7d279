//! Every buffer a session allocates, sized in one place: `Session::new` allocates exactly
//! these sizes, and the checks that a session fits the adapter (each buffer bound whole within
//! the binding limit) and the GPU-memory estimates read them too, so a session that passes the
//! checks is one the device accepts.

use crate::config::PrefillAttention;
use crate::error::{KilnError, Result};
use crate::gpu::{kv_storage_size, storage_size, GpuContext};
use crate::kernels::attention::AttnShape;
use crate::model::config::ModelConfig;
use crate::model::session::SessionOptions;

/// Rows of activations are padded to whole 16-byte vectors.
pub fn pad4(n: u32) -> u32 {
    n.div_ceil(4) * 4
}

/// The most columns (sequences) one batched decode step of a session of `n_seq` sequences
/// carries: up to the GEMV's columns; 1 for a session of one sequence.
pub fn batch_columns(n_seq: u32) -> u32 {
    n_seq.clamp(1, crate::plan::GEMV_MAX_COLS)
}

/// Bytes of each buffer of a session (before the storage tail pad). Activations hold a step of
/// `rows` = max(ubatch, batch columns) tokens.
#[derive(Debug, Clone, Copy)]
pub struct SessionSizes {
    /// Token ids of one step: [rows] u32.
    pub ids: u64,
    /// The residual stream and its normed copy: [ubatch, pad4(n_embd)] f32 each.
    pub x: u64,
    /// Q, its Qwen3-normed copy and the attention output: [ubatch, q_dim] f32 each.
    pub q: u64,
    /// K and V of a step and K's normed copy: [ubatch, kv_dim] f32 each.
    pub kv_step: u64,
    /// Gate, up and their SwiGLU product: [ubatch, pad4(n_ff)] f32 each.
    pub ffn: u64,
    /// Prefill attention scores: [n_head, ubatch, n_ctx] f32 with `KILN_PREFILL_ATTENTION=gemm`;
    /// 0 (no buffer) for flash attention, which keeps its scores in workgroup memory.
    pub scores: u64,
    /// Decode attention's partial results per context split, for each column of a batched step;
    /// on cooperative matrices at least room for prefill flash attention's split keys
    /// (`flash_attention::split_room`): the two never run in one step.
    pub partials: u64,
    /// The last position's hidden state, or each sequence's of a step that prefills several:
    /// [batch columns, pad4(n_embd)] f32.
    pub x_last: u64,
    /// Logits: [ubatch with all logits, else the batch columns, n_vocab] f32 (and a readback
    /// buffer of the same size).
    pub logits: u64,
    /// One layer's K (or V) cache, shared by the sequences, each a region of n_ctx rows:
    /// [n_seq * n_ctx, kv_dim] in the cache's element type.
    pub kv_layer: u64,
    /// Each sequence's sampler state (`kernels::sample::STATE_WORDS` u32) ...
    pub sampler_states: u64,
    /// ... and configuration (`kernels::sample::SampleConfig`).
    pub sampler_configs: u64,
    /// The sampler's first pass's results per row and slice of the logits
    /// (`kernels::sample::prune_bytes`) for a step of up to the batch columns.
    pub sampler_slices: u64,
    /// The int8 GEMVs' quantized inputs (`kernels::matmul::MatmulScratch`), one per input length
    /// (n_embd, q_dim, n_ff; 0 where a length repeats), each of up to `plan::GEMV_MAX_COLS`
    /// columns. Counted whether or not the planner picks the int8 GEMV: at most this.
    pub q8_inputs: [u64; 3],
    /// The down projection's own int8 input, where the gate/up epilogue writes it
    /// (`Caps::q8_swiglu`).
    pub q8_swiglu: u64,
    /// The output projection's int8 input, where decode attention writes it
    /// (`Caps::attn_q8_out`; 0 where it shares the down projection's, of the same length).
    pub attn_q8: u64,
    /// The split-K GEMMs' partial sums (`kernels::matmul::split_k_scratch_bytes`: on GPUs;
    /// CPU adapters never split).
    pub split_k_partials: u64,
    /// The f16 copy of a K-quant matrix that prefill's GEMMs read
    /// (`Caps::dequant_f16_from`, `kernels::matmul::dequant_f16_bytes`): counted as the
    /// largest layer matrix's, whatever the weights' formats: at most this.
    pub dequant_f16: u64,
    pub n_layer: u64,
}

impl SessionSizes {
    /// The sizes for the prefill attention this process uses (`KILN_PREFILL_ATTENTION`).
    /// The sizes on an adapter with `caps` (CPU adapters hold no split-K scratch).
    pub fn new(cfg: &ModelConfig, opts: &SessionOptions, caps: &crate::gpu::Caps) -> SessionSizes {
        Self::with_attention(cfg, opts, crate::config::prefill_attention_from_env(), caps)
    }

    pub fn with_attention(
        cfg: &ModelConfig,
        opts: &SessionOptions,
        attn: PrefillAttention,
        caps: &crate::gpu::Caps,
    ) -> SessionSizes {
        let n_seq = opts.n_seq.max(1) as u64;
        let cols = batch_columns(opts.n_seq) as u64;
        let b = (opts.ubatch.max(1) as u64).max(cols);
        let f = |n: u64| n * 4;
        let shape =
            AttnShape { n_head: cfg.n_head, n_kv_head: cfg.n_kv_head, head_dim: cfg.head_dim, n_ctx: opts.n_ctx };
        let logit_rows = if opts.all_logits { b } else { cols };
        let kv_elem = if opts.f16_kv { 2 } else { 4 };
        SessionSizes {
            ids: f(b),
            x: f(b * pad4(cfg.n_embd) as u64),
            q: f(b * cfg.q_dim() as u64),
            kv_step: f(b * cfg.kv_dim() as u64),
            ffn: f(b * pad4(cfg.n_ff) as u64),
            scores: match attn {
                PrefillAttention::Flash => 0,
                PrefillAttention::Gemm => f(cfg.n_head as u64 * b * opts.n_ctx as u64),
            },
            partials: f(cols * shape.decode_scratch_len() as u64).max(match attn {
                PrefillAttention::Flash => crate::kernels::flash_attention::split_room(
                    crate::kernels::KvKind::for_cache(opts.f16_kv, caps),
                    &shape,
                    b as u32,
                    caps,
                ),
                PrefillAttention::Gemm => 0,
            }),
            x_last: f(cols * pad4(cfg.n_embd) as u64),
            logits: f(logit_rows * cfg.n_vocab as u64),
            kv_layer: n_seq * opts.n_ctx as u64 * cfg.kv_dim() as u64 * kv_elem,
            sampler_states: n_seq * f(crate::kernels::sample::STATE_WORDS as u64),
            sampler_configs: n_seq * std::mem::size_of::<crate::kernels::sample::SampleConfig>() as u64,
            sampler_slices: crate::kernels::sample::prune_bytes(cfg.n_vocab, cols as u32),
            q8_inputs: {
                let ks = [cfg.n_embd, cfg.q_dim(), cfg.n_ff];
                let bytes = |k| crate::kernels::matmul::q8_input_bytes(crate::plan::GEMV_MAX_COLS, k);
                std::array::from_fn(|i| if ks[..i].contains(&ks[i]) { 0 } else { bytes(ks[i]) })
            },
            q8_swiglu: match crate::plan::q8_swiglu_takes(caps, cfg.n_ff, cfg.n_embd) {
                true => crate::kernels::matmul::q8_input_bytes(crate::plan::GEMV_MAX_COLS, cfg.n_ff),
                false => 0,
            },
            attn_q8: {
                let takes = crate::plan::attn_q8_out_takes(caps, cfg.q_dim(), cfg.n_embd)
                    && crate::kernels::attention::takes_q8_out(&shape);
                let shared = cfg.q_dim() == cfg.n_ff && crate::plan::q8_swiglu_takes(caps, cfg.n_ff, cfg.n_embd);
                match takes && !shared {
                    true => crate::kernels::matmul::q8_input_bytes(crate::plan::GEMV_MAX_COLS, cfg.q_dim()),
                    false => 0,
                }
            },
            split_k_partials: crate::kernels::matmul::split_k_scratch_bytes(caps),
            dequant_f16: match caps.dequant_f16_from.is_some() {
                true => {
                    let (e, q, kv, ff) = (cfg.n_embd as u64, cfg.q_dim() as u64, cfg.kv_dim() as u64, cfg.n_ff as u64);
                    2 * e * (q + 2 * kv).max(2 * ff)
                }
                false => 0,
            },
            n_layer: cfg.n_layer as u64,
        }
    }

    /// Each kind of activation storage buffer, as (what, bytes allocated with the tail pad,
    /// how many of it a session holds).
    fn activation_buffers(&self) -> [(&'static str, u64, u64); 18] {
        let q8 = |i: usize| ("int8 activations", storage_size(self.q8_inputs[i]), (self.q8_inputs[i] > 0) as u64);
        let b = |what, bytes, count| (what, storage_size(bytes), count);
        [
            b("token ids", self.ids, 1),
            b("hidden states", self.x, 2),
            b("query activations", self.q, 3),
            b("key/value activations", self.kv_step, 3),
            b("feed-forward activations", self.ffn, 3),
            b("attention scores", self.scores, (self.scores > 0) as u64),
            b("attention partials", self.partials, 1),
            b("last hidden state", self.x_last, 1),
            b("logits", self.logits, 1),
            b("sampler states", self.sampler_states, 1),
            b("sampler configurations", self.sampler_configs, 1),
            b("sampler slices", self.sampler_slices, 1),
            q8(0),
            q8(1),
            q8(2),
            b("int8 down-projection input", self.q8_swiglu, (self.q8_swiglu > 0) as u64),
            b("int8 output-projection input", self.attn_q8, (self.attn_q8 > 0) as u64),
            b("split-K partial sums", self.split_k_partials, (self.split_k_partials > 0) as u64),
        ]
    }

    /// GPU memory of the KV cache (every layer's K and V).
    pub fn kv_bytes(&self) -> u64 {
        2 * self.n_layer * kv_storage_size(self.kv_layer)
    }

    /// GPU memory of everything else: activations, logits and their readback.
    pub fn activation_bytes(&self) -> u64 {
        let storage: u64 = self.activation_buffers().iter().map(|b| b.2 * b.1).sum();
        // (The f16 weights' copy is left out of `first_too_large`: where one binding cannot
        // hold a matrix's copy, that matrix's GEMMs decode their own tiles.)
        let dequant = if self.dequant_f16 > 0 { storage_size(self.dequant_f16) } else { 0 };
        storage + dequant + self.logits
    }

    /// The first buffer the device cannot bind whole, as (what, bytes allocated).
    pub fn first_too_large(&self, ctx: &GpuContext) -> Option<(&'static str, u64)> {
        let readback_ok = self.logits <= ctx.limits.max_buffer_size;
        self.activation_buffers()
            .into_iter()
            .map(|b| (b.0, b.1))
            .chain([("KV cache", kv_storage_size(self.kv_layer))])
            .find(|b| b.1 > ctx.max_storage())
            .or(if readback_ok { None } else { Some(("logits readback", self.logits)) })
    }
}

/// `opts` with the ubatch lowered, if needed, to the largest that lets every buffer of the
/// session fit the device (all-position logits grow with it, and with
/// `KILN_PREFILL_ATTENTION=gemm` prefill's attention scores);
/// an error naming the buffer and what to do when even one token per step does not fit.
pub fn fit_session(ctx: &GpuContext, cfg: &ModelConfig, opts: SessionOptions) -> Result<SessionOptions> {
    let with = |ubatch: u32| SessionOptions { ubatch, ..opts };
    let too_large = |ubatch: u32| SessionSizes::new(cfg, &with(ubatch), &ctx.caps).first_too_large(ctx);
    let want = opts.ubatch.max(1);
    if let Some((what, needed)) = too_large(1) {
        let hint = match what {
            "KV cache" | "attention partials" => format!("lower the context (-c, now {})", opts.n_ctx),
            _ => "this model does not fit this adapter".to_string(),
        };
        return Err(KilnError::TooLarge {
            what: format!("the session's {what} ({hint})"),
            needed,
            limit: ctx.max_storage(),
        });
    }
    if too_large(want).is_none() {
        return Ok(with(want));
    }
    // Every buffer that grows with the ubatch grows linearly: bisect (lo fits, hi does not).
    let (mut lo, mut hi) = (1, want);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if too_large(mid).is_none() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Whole 16-token steps suit the GEMM tiles.
    let fitted = if lo >= 16 { lo / 16 * 16 } else { lo };
    tracing::info!(
        "ubatch lowered from {want} to {fitted} so every buffer fits the adapter's {} MiB binding limit",
        ctx.max_storage() >> 20
    );
    Ok(with(fitted))
}

/// The planner's prompt step (`plan::default_ubatch`) for a session of `n_ctx` positions (with
/// every position's logits where `all_logits`) on `ctx`, within -b (`batch`), against the
/// memory that `weight_bytes` of weights leave.
pub fn planned_ubatch(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    weight_bytes: u64,
    n_ctx: u32,
    f16_kv: bool,
    all_logits: bool,
    batch: u32,
) -> u32 {
    let left = ctx.device_memory.map(|m| m.saturating_sub(weight_bytes));
    crate::plan::default_ubatch(&ctx.caps, left, batch, |ubatch| {
        let opts = SessionOptions { n_ctx, ubatch, f16_kv, all_logits, n_seq: 1 };
        SessionSizes::new(cfg, &opts, &ctx.caps).activation_bytes()
    })
}

/// What a caller asks of a session, before it is fitted to the adapter.
#[derive(Debug, Clone, Copy)]
pub struct SessionRequest {
    /// `-c`: a context asked for explicitly (refused, not reduced, when it does not fit);
    /// None: the model's training context, reduced with a note where needed.
    pub ctx_size: Option<u32>,
    /// The least context the caller can work with (the prompt, say).
    pub min_ctx: u32,
    /// `-ub`: tokens a prompt step takes; None: the planner's (`planned_ubatch`).
    pub ubatch: Option<u32>,
    /// `-b`: caps the ubatch.
    pub batch: u32,
    pub f16_kv: bool,
    pub all_logits: bool,
}

/// Session options that fit the adapter, and what was reduced to get there (one line each).
#[derive(Debug, Clone)]
pub struct Fitted {
    pub opts: SessionOptions,
    pub notes: Vec<String>,
}

/// Fits a session to the adapter: one layer's K (or V) cache within a binding, the KV cache
/// and activations within the memory the weights (`weight_bytes`) leave where the adapter
/// reports its memory (a smaller ubatch first, then a shorter context), and every other
/// buffer within a binding (`fit_session`). A context asked for with -c is never reduced:
/// it fails with the sizes and what would fit.
pub fn fit_request(ctx: &GpuContext, cfg: &ModelConfig, weight_bytes: u64, req: &SessionRequest) -> Result<Fitted> {
    let mut notes = Vec::new();
    let (f16_kv, all_logits) = (req.f16_kv, req.all_logits);
    let mut n_ctx = req.ctx_size.unwrap_or(cfg.n_ctx_train).max(req.min_ctx).max(1);
    let sizes = |n_ctx: u32, ubatch: u32| {
        SessionSizes::new(cfg, &SessionOptions { n_ctx, ubatch, f16_kv, all_logits, n_seq: 1 }, &ctx.caps)
    };
    // One layer's K (or V) cache must fit one buffer binding.
    if !ctx.fits_kv_storage(sizes(n_ctx, 1).kv_layer) {
        let per_pos = sizes(1, 1).kv_layer;
        // The longest context that fits (bisect: lo fits or is 0, hi does not).
        let (mut lo, mut hi) = (0u32, n_ctx);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if ctx.fits_kv_storage(mid as u64 * per_pos) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        if req.ctx_size.is_some() || lo < req.min_ctx.max(1) {
            return Err(KilnError::TooLarge {
                what: format!("a KV cache of {n_ctx} positions (one layer's keys; -c {lo} would fit)"),
                needed: kv_storage_size(sizes(n_ctx, 1).kv_layer),
                limit: ctx.max_storage(),
            });
        }
        notes.push(format!(
            "context capped at {lo} positions (the model's {n_ctx} would not fit one buffer); use -c to choose"
        ));
        n_ctx = lo;
    }
    let mut ubatch = match req.ubatch {
        Some(u) => u.min(req.batch).max(1),
        None => planned_ubatch(ctx, cfg, weight_bytes, n_ctx, f16_kv, all_logits, req.batch),
    };
    // The KV cache and activations must fit the memory the weights left.
    if let Some(total) = ctx.device_memory {
        let left = total.saturating_sub(weight_bytes);
        let needed = |n: u32, b: u32| {
            let s = sizes(n, b);
            s.kv_bytes() + s.activation_bytes()
        };
        if needed(n_ctx, ubatch) > left {
            // Smaller batches first (they only cost prompt speed), then a shorter context.
            while ubatch > 32 && needed(n_ctx, ubatch) > left {
                ubatch /= 2;
            }
            let mut fit = n_ctx;
            while fit > 0 && needed(fit, ubatch) > left {
                fit = fit.saturating_sub((fit / 8).max(1));
            }
            if fit < n_ctx {
                if req.ctx_size.is_some() || fit < req.min_ctx.max(1) {
                    return Err(KilnError::OutOfMemory {
                        what: format!("a context of {n_ctx} tokens (weights, KV cache and activations)"),
                        needed: needed(n_ctx, ubatch) + weight_bytes,
                        available: total,
                        hint: if fit > 0 { format!("use -c {fit} or less") } else { "use a smaller model".into() },
                    });
                }
                notes.push(format!(
                    "context reduced to {fit} tokens: the model's {n_ctx} would need {:.1} MiB of GPU memory, the adapter has {:.1} MiB; use -c to choose",
                    (needed(n_ctx, ubatch) + weight_bytes) as f64 / (1 << 20) as f64,
                    total as f64 / (1 << 20) as f64
                ));
                n_ctx = fit;
            }
        }
    }
    let opts = fit_session(ctx, cfg, SessionOptions { n_ctx, ubatch, f16_kv, all_logits, n_seq: 1 })?;
    Ok(Fitted { opts, notes })
}
