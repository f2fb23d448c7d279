//! Sampling on the GPU: penalties, greedy or top-k/top-p/min-p with temperature and a seeded
//! draw, so that sampled decoding chains its steps on the GPU as greedy decoding does. Two
//! dispatches over the same bindings: wgsl/sample_prune.wgsl (penalties and bans; per slice of
//! each row its largest logit and a floor under its top-k), then wgsl/sample.wgsl (one
//! workgroup per row: the candidates, their softmax and the draw). A greedy configuration of
//! rows that share one takes sample.wgsl alone (ONE_PASS: the penalties, bans and largest
//! logit in one dispatch). The CPU reference is `crate::sample::Sampler`.

use bytemuck::{Pod, Zeroable};

use crate::sample::{SamplerConfig, BAN_CAP, HISTORY_CAP};

/// Invocations per workgroup of the second pass (sample.wgsl).
pub const SAMPLE_WG: u32 = 256;

/// Invocations per workgroup of the second pass where `Caps::wide_workgroups`: one
/// workgroup reads the whole row to gather the candidates (and, where more than the cap
/// reach the floor, four more times for the exact radix select), so the pick's time is
/// those reads' latency; four times the invocations take a quarter of the iterations each.
pub const SAMPLE_WG_WIDE: u32 = 1024;

/// Logits per workgroup of the first pass (sample_prune.wgsl), held in registers, eight per
/// invocation: TinyLlama's 32,000-token rows in 16 workgroups.
pub const SLICE: u32 = 2048;

/// Invocations per workgroup of the first pass.
pub const PRUNE_WG: u32 = 256;

/// Slices of a row of `n_vocab` logits: the first pass's workgroups per row.
pub fn slices(n_vocab: u32) -> u32 {
    n_vocab.div_ceil(SLICE).max(1)
}

/// Candidates a slice of the first pass keeps in order for the second (`Caps::sample_tops`):
/// its usable logits at or above its floor, which holds at most twice top_k once found; a
/// slice with more sends the second pass back to reading the row.
pub const SLICE_CAP: u32 = 128;

/// 16-byte words of the first pass's results per slice: its header (largest logit and index,
/// floor, whether it has one and its candidates' count), then its candidates two to a word.
pub const PRUNE_STRIDE: u32 = 1 + SLICE_CAP / 2;

/// The most slices whose candidates the second pass merges (rows of up to 262,144 logits).
pub const MAX_TOPS_SLICES: u32 = 128;

/// Bytes of the first pass's results for `rows` rows of `n_vocab` logits.
pub fn prune_bytes(n_vocab: u32, rows: u32) -> u64 {
    rows.max(1) as u64 * slices(n_vocab) as u64 * PRUNE_STRIDE as u64 * 16
}

/// The passes sampling `rows` rows of `n_vocab` logits, as (first pass, grid): both, or for a
/// greedy sampler of rows that share one configuration (`one_pass`) the second alone, which
/// then applies the penalties and bans and reads the rows itself (sample.wgsl's ONE_PASS,
/// `KernelKey::Sample::greedy`).
pub fn passes(n_vocab: u32, rows: u32, one_pass: bool) -> Vec<(bool, [u32; 3])> {
    let second = (false, [rows, 1, 1]);
    if one_pass {
        vec![second]
    } else {
        vec![(true, [slices(n_vocab), rows, 1]), second]
    }
}

/// The sampling workgroup's size on an adapter with `caps`.
pub fn sample_wg(caps: &crate::gpu::Caps) -> u32 {
    if caps.wide_workgroups {
        SAMPLE_WG_WIDE
    } else {
        SAMPLE_WG
    }
}

/// The second pass's workgroup size: `sample_wg`, or for a sampled (not greedy) configuration
/// `KILN_SAMPLE_WG` where set (a knob for measurements).
pub fn second_pass_wg(caps: &crate::gpu::Caps, greedy: bool) -> u32 {
    match crate::config::sample_wg_from_env() {
        Some(wg) if !greedy => wg,
        _ => sample_wg(caps),
    }
}

/// The sampler's phases to run: all of them (5), unless `KILN_SAMPLE_PHASES` asks for fewer
/// to time a prefix of them (`cargo bench --bench kernels -- sample`): 1 penalties and the
/// maximum, 2 the slices' floors under the top-k, 3 gathering the candidates, 4 ranking
/// them, 5 the draw. A cut-short kernel picks the maximum.
pub fn phases() -> u32 {
    std::env::var("KILN_SAMPLE_PHASES").ok().and_then(|v| v.parse().ok()).unwrap_or(5).clamp(1, 5)
}

/// Words of one row's sampling state: draws made, tokens appended, banned tokens, one unused,
/// the history ring (`HISTORY_CAP` ids), then the banned ids (`BAN_CAP`).
pub const STATE_WORDS: usize = 4 + HISTORY_CAP + BAN_CAP;

/// Mirrors `Config` in wgsl/sample.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct SampleConfig {
    pub n_vocab: u32,
    pub top_k: u32,
    pub window: u32,
    pub greedy: u32,
    pub temp: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub freq_penalty: f32,
    pub presence_penalty: f32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub logits_stride: u32,
    pub _pad: [u32; 3],
}

impl SampleConfig {
    /// The kernel's configuration for `cfg` over rows of `n_vocab` logits.
    pub fn new(cfg: &SamplerConfig, n_vocab: u32, logits_stride: u32) -> SampleConfig {
        SampleConfig {
            n_vocab,
            top_k: cfg.effective_top_k() as u32,
            window: cfg.penalty_window() as u32,
            greedy: cfg.is_greedy() as u32,
            temp: cfg.temperature,
            top_p: cfg.top_p,
            min_p: cfg.min_p,
            repeat_penalty: cfg.repeat_penalty,
            freq_penalty: cfg.frequency_penalty,
            presence_penalty: cfg.presence_penalty,
            seed_lo: cfg.seed as u32,
            seed_hi: (cfg.seed >> 32) as u32,
            logits_stride,
            _pad: [0; 3],
        }
    }
}

/// One row's state as the kernel keeps it: `draws` made so far, the most recent tokens (at
/// most `HISTORY_CAP`; older ones first) and the tokens never drawn (at most `BAN_CAP`).
pub fn initial_state(draws: u32, history: &[u32], banned: &[u32]) -> Vec<u32> {
    let mut s = vec![0u32; STATE_WORDS];
    let recent = &history[history.len().saturating_sub(HISTORY_CAP)..];
    let banned = &banned[..banned.len().min(BAN_CAP)];
    s[0] = draws;
    s[1] = recent.len() as u32;
    s[2] = banned.len() as u32;
    s[4..4 + recent.len()].copy_from_slice(recent);
    s[4 + HISTORY_CAP..4 + HISTORY_CAP + banned.len()].copy_from_slice(banned);
    s
}

/// The dispatches sampling `rows` rows of `logits` (tests, tools; two, or one for a greedy
/// configuration, as a session's sampler takes them): `state` holds
/// `STATE_WORDS` words per row (`initial_state`), `ids` one u32 per row.
pub fn prepare(
    ctx: &crate::gpu::GpuContext,
    cfg: &SampleConfig,
    logits: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    state: &wgpu::Buffer,
    rows: u32,
) -> crate::Result<Vec<crate::gpu::Dispatch>> {
    own_rows(ctx, cfg, [logits, ids, state], rows, None)
}

/// The dispatches sampling one row of `logits` in a chain of decode steps (tests): as
/// `prepare`, and the pick also moves `step` (a `matmul::StepState`) on by one position and
/// appends the token to `chain` (word 0 the count, the tokens after it; common/sample_chain.wgsl).
pub fn prepare_chained(
    ctx: &crate::gpu::GpuContext,
    cfg: &SampleConfig,
    [logits, ids, state]: [&wgpu::Buffer; 3],
    step: &wgpu::Buffer,
    chain: &wgpu::Buffer,
) -> crate::Result<Vec<crate::gpu::Dispatch>> {
    own_rows(ctx, cfg, [logits, ids, state], 1, Some((step, chain)))
}

/// Rows sampled with one configuration (the uniform), chained (binding the step state and the
/// token list) or not (placeholders there).
fn own_rows(
    ctx: &crate::gpu::GpuContext,
    cfg: &SampleConfig,
    [logits, ids, state]: [&wgpu::Buffer; 3],
    rows: u32,
    chain: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
) -> crate::Result<Vec<crate::gpu::Dispatch>> {
    let prune = ctx.storage(prune_bytes(cfg.n_vocab, rows), "sampling slices")?;
    let ub = ctx.uniform(cfg, "sample");
    let unused = ctx.storage(16, "unused")?;
    let (step, list) = chain.unwrap_or((&unused, &unused));
    let buffers = [&ub, logits, ids, state, &prune, step, list];
    // Rows of one greedy configuration: one pass, as a session's greedy sampler picks.
    dispatches(ctx, false, chain.is_some(), &ub, &buffers, passes(cfg.n_vocab, rows, cfg.greedy != 0))
}

/// The two dispatches sampling the rows of a batched decode step (tests, tools): row c of
/// `logits` (rows of `n_vocab`) for the slot `cols[c]` names, with that slot's configuration
/// (`configs`, one `SampleConfig` per slot) and state row (`state`, `STATE_WORDS` words per
/// slot).
pub fn prepare_columns(
    ctx: &crate::gpu::GpuContext,
    configs: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    state: &wgpu::Buffer,
    cols: &[crate::kernels::matmul::StepColumn],
    n_vocab: u32,
) -> crate::Result<Vec<crate::gpu::Dispatch>> {
    let rows = cols.len() as u32;
    let prune = ctx.storage(prune_bytes(n_vocab, rows), "sampling slices")?;
    let ub = ctx.uniform(&SampleConfig::zeroed(), "sample");
    let step = ctx.upload(&crate::kernels::matmul::step_table(cols), "step table")?;
    let buffers = [&ub, logits, ids, state, configs, &step, &prune];
    dispatches(ctx, true, false, &ub, &buffers, passes(n_vocab, rows, false))
}

/// The dispatches of `passes` (`passes`: one pass alone is a greedy sampler's).
fn dispatches(
    ctx: &crate::gpu::GpuContext,
    batched: bool,
    chained: bool,
    ub: &wgpu::Buffer,
    buffers: &[&wgpu::Buffer],
    passes: Vec<(bool, [u32; 3])>,
) -> crate::Result<Vec<crate::gpu::Dispatch>> {
    let (subgroups, tops) = (ctx.caps.subgroups, ctx.caps.sample_tops);
    let greedy = passes.len() == 1;
    passes
        .into_iter()
        .map(|(prune, workgroups)| {
            // The first pass is the same for chained steps (one pipeline serves both).
            let chained = chained && !prune;
            let key = crate::kernels::KernelKey::Sample { subgroups, batched, prune, tops, chained, greedy };
            let pipeline = ctx.pipeline(&key)?;
            let bind_group = crate::gpu::bind(ctx, &pipeline, "sample", buffers);
            Ok(crate::gpu::Dispatch { label: "sample", pipeline, bind_group, workgroups, params: Some(ub.clone()) })
        })
        .collect()
}
