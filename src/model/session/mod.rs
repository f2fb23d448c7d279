//! A session: the KV cache, the activation arena and every kernel bound once (`bind.rs`),
//! the forward pass that says what a step computes (`forward.rs`, read top to bottom), and how
//! steps are recorded, submitted and read back (`submit.rs`: one submit per step whose only
//! readback is the sampled token or the requested logits, decode steps chained on the GPU).

mod bind;
mod forward;
mod score;
mod slots;
mod submit;
pub use slots::{BatchStats, Feed, PromptChunk};
pub use submit::BackToBack;

/// Most decode steps recorded into one command buffer.
pub const CHAIN_MAX: usize = 64;

/// Decode steps per submit unless `KILN_STEPS_PER_SUBMIT` says otherwise.
pub const STEPS_PER_SUBMIT: usize = 4;

use std::sync::Arc;

use crate::error::{KilnError, Result};
use crate::gpu::{Bound, GpuContext};
use crate::kernels::attention::AttnShape;
use crate::kernels::matmul::BoundMatmul;
use crate::kernels::KvKind;
use crate::model::config::ModelConfig;
use crate::model::weights::Weights;
use crate::profile::{Profile, ProfileMode, Profiler};

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
    /// Sequences (server slots) sharing the session: each has a region of `n_ctx` rows of
    /// one KV cache, its own position and sampler, and a batched decode step advances up to
    /// `sizes::batch_columns` of them at once. 1: one sequence, the plain session.
    pub n_seq: u32,
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

/// Host time spent on steps since the last `take_host_times`, unprofiled: what the CPU costs
/// per token beside the GPU (seconds, summed over `steps`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostTimes {
    pub steps: u64,
    /// Recording command buffers.
    pub encode: f64,
    /// queue.submit.
    pub submit: f64,
    /// Waiting for results (the GPU's time the host could not hide).
    pub wait: f64,
}

/// What a step returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Greedy token of the last position (4 bytes read back).
    Argmax,
    /// The token the GPU sampler picks for the last position, as `set_sampling` configured
    /// it (4 bytes read back; the pick joins the sampler's history).
    Sampled,
    /// Logits of the last position.
    LastLogits,
    /// Logits of every position (needs `all_logits`).
    AllLogits,
}

/// Which sampler picks a step's tokens (`Output::Sampled`), and what it leaves for the next
/// step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Picker {
    /// The session's own (slot 0's configuration, in its uniform).
    Own,
    /// Each row's slot's, from the step's table (a batched step, or a sequence other than 0).
    Table,
    /// The session's own in a chain of decode steps: it also moves the step state on to the
    /// next position and appends the token to `chain_tokens`.
    Chained,
}

pub(super) struct LayerOps {
    attn_norm: Bound,
    /// The same writing the Q/K/V projection's f16 input, where its cooperative GEMM reads
    /// one (`Caps::prefill_f16_inputs`: no to_half dispatch after the norm).
    attn_norm_f16: Option<Bound>,
    /// The same folded into the previous layer's down projection's split-K reduce
    /// (reduce_norm.wgsl: its partial sums added to the residual, then the norm into the Q/K/V
    /// projection's f16 input), where both GEMMs take that shape (`norm::reduce_norm_takes`).
    attn_norm_reduce: Option<Bound>,
    /// The Q, K and V projections, RoPE and the cache write.
    qkv: QkvOps,
    /// Attention of a step of more than one token.
    attn_prefill: PrefillAttnOps,
    /// Decode attention writing the output itself (a context of one split) ...
    attn_decode: Bound,
    /// ... or its partial results, which its last workgroups merge (`AttnShape::decode_merges`)
    /// ...
    attn_decode_merge: Option<Bound>,
    /// ... or the combine pass.
    attn_decode_split: Bound,
    attn_combine: Bound,
    /// Where one-token decode attention also writes the output projection's int8 input
    /// (`Caps::attn_q8_out`): the blocks, which `wo` then reads without a quantize dispatch.
    wo_q8: Option<wgpu::Buffer>,
    wo: BoundMatmul,
    ffn_norm: Bound,
    /// The same writing the gate/up projection's f16 input (as `attn_norm_f16`).
    ffn_norm_f16: Option<Bound>,
    /// The same folded into the output projection's split-K reduce (as `attn_norm_reduce`).
    ffn_norm_reduce: Option<Bound>,
    ffn: FfnOps,
}

/// How a layer computes prefill attention (`config::PrefillAttention`).
pub(super) enum PrefillAttnOps {
    /// One flash-attention dispatch, no score matrix; where its keys are split (long
    /// contexts on cooperative matrices), the combine pass after it.
    Flash { kernel: Bound, combine: Bound },
    /// Q·Kᵀ into the session's score matrix, the causal softmax in place, P·V.
    Gemm { qk: Bound, softmax: Bound, pv: Bound },
}

/// How a layer computes Q, K and V (`weights::Qkv`). Built once a layer when the session is
/// made and never moved after, so its variants' sizes do not matter (clippy's
/// large_enum_variant).
#[allow(clippy::large_enum_variant)]
pub(super) enum QkvOps {
    /// The stacked projection's parts, each with the QKV epilogue (RoPE, the cache write):
    /// decode reads the residual stream with the RMSNorm fused (one group, sharing an int8
    /// input), prefill reads the normed copy. `one_dispatch`: where the parts are two
    /// formats, one GEMV over both for the one-token steps it takes
    /// (`BoundMatmul::two_formats_in`).
    Stacked { decode: Vec<BoundMatmul>, prefill: Vec<BoundMatmul>, one_dispatch: Option<BoundMatmul> },
    /// Separate projections, then (Qwen3) per-head norms, then RoPE of Q and the K/V write.
    Separate {
        q: BoundMatmul,
        k: BoundMatmul,
        v: BoundMatmul,
        /// The same projections reading the residual stream with the RMSNorm fused (decode).
        q_fused: BoundMatmul,
        k_fused: BoundMatmul,
        v_fused: BoundMatmul,
        q_norm: Option<Bound>,
        k_norm: Option<Bound>,
        rope_q: Bound,
        /// K rotated and V copied into the caches, one dispatch.
        kv_write: Bound,
    },
}

/// How a layer computes its feed-forward block (`weights::GateUp`). Built once a layer, as
/// `QkvOps`.
#[allow(clippy::large_enum_variant)]
pub(super) enum FfnOps {
    /// Gate and up interleaved, SwiGLU in the epilogue, writing `act`; then down.
    Interleaved { decode: BoundMatmul, prefill: BoundMatmul, down: BoundMatmul },
    /// Gate and up apart: decode fuses SwiGLU into the down projection's input, prefill runs
    /// it as a dispatch.
    Separate {
        gate_fused: BoundMatmul,
        up_fused: BoundMatmul,
        down_fused: BoundMatmul,
        gate: BoundMatmul,
        up: BoundMatmul,
        silu: Bound,
        down: BoundMatmul,
    },
}

pub struct Session {
    ctx: Arc<GpuContext>,
    pub cfg: ModelConfig,
    _weights: Arc<Weights>,
    pub opts: SessionOptions,
    kv: KvKind,
    shape: AttnShape,
    /// Bytes of the attention partials' buffer, which prefill flash attention's split keys
    /// may fill (`flash_attention::split_of`).
    split_room: u64,
    /// Tokens in each sequence's region of the KV cache (`opts.n_seq` of them; the
    /// single-sequence API works on sequence 0, whose region starts at row 0).
    pos: Vec<u32>,
    /// The most sequences a batched decode step carries (slots.rs): 1 unless every layer has
    /// the stacked Q/K/V projection, whose epilogue takes each column's position.
    batch_cols: usize,
    /// Prompt tokens of one sequence's step that run on the GEMV (`plan::prefill_gemv_cols`);
    /// more go to the GEMM, after a norm dispatch.
    prefill_gemv_cols: u32,
    /// What batched decode steps carried so far.
    batches: BatchStats,
    ids: wgpu::Buffer,
    x: wgpu::Buffer,
    x_last: wgpu::Buffer,
    logits: wgpu::Buffer,
    out_id: wgpu::Buffer,
    readback: wgpu::Buffer,
    embed: Vec<(Bound, u32, u32)>,
    embed_fed_back: Vec<(Bound, u32, u32)>,
    /// Two readback slots for chained decoding (`CHAIN_MAX` tokens each): one group's tokens
    /// being read while the next group writes the other.
    chain_stage: [wgpu::Buffer; 2],
    /// Chained decode steps' tokens as the sampler appends them (the count, then the tokens;
    /// common/sample_chain.wgsl), copied to `chain_stage` once per group of steps. The same
    /// pick moves `step_state` on to the next step's position.
    chain_tokens: wgpu::Buffer,
    /// Decode steps recorded per command buffer in `generate_chained`.
    steps_per_submit: usize,
    /// A generation's first decode step, recorded while the GPU ran the prompt before it
    /// (submit.rs, `prerecord_first_step`), and whether prompts record one (`set_prerecord`).
    prerecorded: Option<submit::Prerecorded>,
    prerecord: bool,
    /// Bytes of prefill's resident f16 copies of the quantized weights (0: none).
    resident_f16_bytes: u64,
    /// Pipelined batched steps (slots.rs, `submit_slots`): the picks of the last one, kept
    /// apart from `out_id` (which a prompt's step in between overwrites) for the next step
    /// to feed back; the slots of its columns, in order; and the steps in flight (their
    /// submission, readback slot of `chain_stage`, columns).
    step_picks: wgpu::Buffer,
    last_step_slots: Vec<usize>,
    steps_in_flight: std::collections::VecDeque<(wgpu::SubmissionIndex, usize, usize)>,
    next_stage: usize,
    layers: Vec<LayerOps>,
    out_norm_all: Bound,
    /// LM head on x itself (one-token steps), with the output norm fused.
    lm_head_x: BoundMatmul,
    lm_head_all: BoundMatmul,
    lm_head_last: BoundMatmul,
    argmax: Bound,
    /// Log-softmax and NLL over the logits (sessions with all logits; see score.rs).
    scorer: Option<score::Scorer>,
    /// The GPU sampler (wgsl/sample.wgsl) over the logits, writing `out_id`, configured by
    /// its uniform (sequence 0's sampler) ...
    sample: Bound,
    /// Whether that uniform's configuration is greedy (`set_sampling`): its steps take the
    /// narrower second pass (`KernelKey::Sample::greedy`).
    sample_greedy: bool,
    /// ... and the one whose rows are a batched step's columns (or a sequence other than
    /// 0), each configured by its slot's entry of `sample_configs`.
    sample_table: Bound,
    /// Their state per sequence: draws made, tokens appended, the penalties' history ring.
    sample_state: wgpu::Buffer,
    sample_configs: wgpu::Buffer,
    /// The step buffer: the step's tokens and position (`matmul::StepState`), then a batched
    /// step's table of columns (`matmul::StepColumn`); read by the fused QKV epilogue, decode
    /// attention and the table sampler.
    step_state: wgpu::Buffer,
    /// A step of several sequences' prompt chunks (slots.rs): flash attention's table of the
    /// chunks, and the sampler's columns for the rows the head takes.
    chunks: wgpu::Buffer,
    head_cols: wgpu::Buffer,
    _rope_shape: wgpu::Buffer,
    /// Bound where a matmul part writes nothing (see bind.rs).
    _unused: [wgpu::Buffer; 3],
    // Kept alive for the bind groups that use them.
    _buffers: Vec<wgpu::Buffer>,
    /// Timing of the last step.
    pub timing: StepTiming,
    /// Host time of every step since `take_host_times`.
    host: HostTimes,
    /// A stage the GPU leaves out of every step (`kiln bench --ablate`).
    skip: Option<crate::profile::Stage>,
    /// Per-stage timestamps and totals when profiling.
    prof: Option<Profiler>,
}

impl Session {
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

    /// Bytes of the f16 copies of the quantized layer weights that prefill's GEMMs read, where
    /// they stay in GPU memory (`plan::resident_f16_copies`); 0 where they do not.
    pub fn resident_f16_bytes(&self) -> u64 {
        self.resident_f16_bytes
    }

    /// Bytes of one element of the KV cache (2 for f16, 4 for f32).
    pub fn kv_bytes_per_elem(&self) -> u64 {
        self.kv.bytes_per_elem()
    }

    /// Tokens in the KV cache (sequence 0's).
    pub fn position(&self) -> u32 {
        self.pos[0]
    }

    /// Forgets the context of every sequence (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos.iter_mut().for_each(|p| *p = 0);
        self.prerecorded = None;
        // No pick of an earlier step is a sequence's next token any more.
        self.last_step_slots.clear();
    }

    /// Rewinds to `pos` tokens (they stay valid in the cache).
    pub fn truncate(&mut self, pos: u32) {
        self.pos[0] = self.pos[0].min(pos);
    }

    /// Feeds `tokens` (split into steps of at most `ubatch`) and returns what `out` asks for,
    /// for the last step. `AllLogits` returns every position's logits, [tokens, n_vocab].
    pub fn forward(&mut self, tokens: &[u32], out: Output) -> Result<Vec<f32>> {
        self.forward_in(0, tokens, out)
    }

    /// Whether `tokens` can go into `slot`'s sequence: some, each in the vocabulary, and room
    /// for them in its region.
    pub(super) fn check_tokens(&self, slot: usize, tokens: &[u32]) -> Result<()> {
        let pos = self.pos[slot];
        if tokens.is_empty() {
            return Err(KilnError::invalid("input", "no tokens to evaluate"));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
            return Err(KilnError::invalid(
                "input",
                format!("token id {bad} is outside the vocabulary of {}", self.cfg.n_vocab),
            ));
        }
        if pos as usize + tokens.len() > self.opts.n_ctx as usize {
            return Err(KilnError::invalid(
                "input",
                format!("the context is full: {} + {} tokens exceed {} (raise -c)", pos, tokens.len(), self.opts.n_ctx),
            ));
        }
        Ok(())
    }

    /// `forward` on sequence `slot` (its region of the cache, its position; a sampled pick
    /// uses its sampler).
    pub(super) fn forward_in(&mut self, slot: usize, tokens: &[u32], out: Output) -> Result<Vec<f32>> {
        self.check_tokens(slot, tokens)?;
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
            let got = self.step(slot, chunk, step_out, last || out == Output::AllLogits)?;
            if out == Output::AllLogits {
                all.extend_from_slice(&got[..chunk.len() * v]);
            } else if last {
                return Ok(got);
            }
        }
        Ok(all)
    }

    /// Decode steps `generate_chained` records per command buffer (1 ..= `CHAIN_MAX`): more
    /// spreads the host's submit cost over more tokens, fewer hands tokens out sooner.
    pub fn set_steps_per_submit(&mut self, n: usize) {
        self.steps_per_submit = n.clamp(1, CHAIN_MAX);
    }

    /// Whether a prompt's step records the first decode step of the chained generation that
    /// usually follows it while the GPU runs the prompt (default on; a session whose prompts
    /// are followed by anything else, such as the server's steps, turns it off: the recording
    /// would be thrown away).
    pub fn set_prerecord(&mut self, on: bool) {
        self.prerecord = on;
        if !on {
            self.prerecorded = None;
        }
    }

    /// Whether a first decode step recorded during the last prompt waits for `generate_chained`.
    pub fn has_prerecorded(&self) -> bool {
        self.prerecorded.is_some()
    }

    /// Leaves `stage` out of every step from now on (None: the whole step again). What it
    /// computes is wrong without it; what the step costs without it is the measurement.
    pub fn skip_stage(&mut self, stage: Option<crate::profile::Stage>) {
        self.skip = stage;
    }

    /// The host time of the steps since the last call, and a fresh count.
    pub fn take_host_times(&mut self) -> HostTimes {
        std::mem::take(&mut self.host)
    }

    /// Configures the GPU sampler for the next `Output::Sampled` steps and chained decoding
    /// as `sampler` is (its settings, draws made and banned tokens), with the token `history`
    /// the penalties look back on (the prompt included): it picks what `sampler` would.
    pub fn set_sampling(&mut self, sampler: &crate::sample::Sampler, history: &[u32]) {
        self.set_sampling_in(0, sampler, history);
    }

    /// `set_sampling` for sequence `slot`: its configuration (the uniform of the session's
    /// own sampler for slot 0, and the slot's entry for the table sampler) and state row.
    pub(super) fn set_sampling_in(&mut self, slot: usize, sampler: &crate::sample::Sampler, history: &[u32]) {
        use crate::kernels::sample::{initial_state, SampleConfig, STATE_WORDS};
        let v = self.cfg.n_vocab;
        let cfg = SampleConfig::new(&sampler.cfg, v, v);
        if slot == 0 {
            self.sample.set(&self.ctx, &cfg);
            self.sample_greedy = cfg.greedy != 0;
        }
        let size = std::mem::size_of::<SampleConfig>() as u64;
        self.ctx.queue.write_buffer(&self.sample_configs, slot as u64 * size, bytemuck::bytes_of(&cfg));
        let state = initial_state(sampler.draws, history, &sampler.banned);
        let at = (slot * STATE_WORDS * 4) as u64;
        self.ctx.queue.write_buffer(&self.sample_state, at, bytemuck::cast_slice(&state));
    }

    /// Greedy next token after feeding `tokens`.
    pub fn next_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        Ok(self.forward(tokens, Output::Argmax)?[0] as u32)
    }
}
