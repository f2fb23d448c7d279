//! The other kernels run once on the GPU over given inputs, for comparison with their CPU
//! references: RMSNorm, SiLU·mul and add, embedding gather, RoPE (in place, into the cache,
//! and the combined K/V write), attention (prefill and decode), argmax, NLL scoring, and the
//! sampler.

use crate::error::Result;
use crate::gpu::{run_dispatches, Dispatch, GpuContext, WeightTensor};
use crate::kernels::attention::{self, AttnShape, DecodeArgs, PrefillArgs};
use crate::kernels::elementwise::{self, EltOp};
use crate::kernels::matmul::StepColumn;
use crate::kernels::nll::{self, NllParams};
use crate::kernels::rope::{self, RopeMode, RopeParams};
use crate::kernels::sample::{self, initial_state, SampleConfig};
use crate::kernels::{argmax, embed, norm, KvKind};
use crate::quant::WeightFormat;
use crate::sample::{Sampler, SamplerConfig};

use super::data::{cache_bytes, cache_values, Rng};

fn run(ctx: &GpuContext, ds: &[Dispatch]) -> Result<()> {
    run_dispatches(ctx, &ds.iter().collect::<Vec<_>>())
}

/// RMSNorm of `rows` rows of n values (x, w): the GPU's result.
pub fn rms_norm(ctx: &GpuContext, x: &[f32], w: &[f32], rows: usize, n: usize, eps: f32) -> Result<Vec<f32>> {
    let (xb, wb) = (ctx.upload_f32(x, "x")?, ctx.upload_f32(w, "w")?);
    let y = ctx.storage((rows * n * 4) as u64, "y")?;
    let p = norm::RmsNormParams { n: n as u32, x_stride: n as u32, y_stride: n as u32, eps };
    run(ctx, &[norm::prepare(ctx, &xb, &wb, &y, rows as u32, p, false, "norm")?])?;
    ctx.read_f32(&y, rows * n)
}

/// The same written as halves, as the cooperative GEMM reads its input (rows of n rounded up to
/// 8): the halves' bits. n a multiple of 4.
pub fn rms_norm_halves(ctx: &GpuContext, x: &[f32], w: &[f32], rows: usize, n: usize, eps: f32) -> Result<Vec<u16>> {
    let (xb, wb) = (ctx.upload_f32(x, "x")?, ctx.upload_f32(w, "w")?);
    let stride = n.next_multiple_of(8);
    let y = halves_buffer(ctx, rows * stride)?;
    let p = norm::RmsNormParams { n: n as u32, x_stride: n as u32, y_stride: stride as u32, eps };
    run(ctx, &[norm::prepare(ctx, &xb, &wb, &y, rows as u32, p, true, "norm")?])?;
    read_halves(ctx, &y, rows * stride)
}

/// A buffer for `count` halves (the cooperative GEMM's f16 input), zeroed.
fn halves_buffer(ctx: &GpuContext, count: usize) -> Result<wgpu::Buffer> {
    ctx.storage((count * 2).next_multiple_of(16) as u64, "halves")
}

/// The first `count` halves of `buf`, as bits.
fn read_halves(ctx: &GpuContext, buf: &wgpu::Buffer, count: usize) -> Result<Vec<u16>> {
    let bytes = ctx.read_bytes(buf, 0, (count * 2).next_multiple_of(4) as u64)?;
    Ok(bytes.chunks_exact(2).take(count).map(|b| u16::from_le_bytes([b[0], b[1]])).collect())
}

/// Split-K's reduce folded into the norm after it (reduce_norm.wgsl): `rows` rows of n values,
/// `partials` [splits][rows][n] added to y (rows of n), then the norm's halves (rows of n
/// rounded up to 8). The new y and the halves' bits. n a multiple of 4.
#[allow(clippy::too_many_arguments)]
pub fn reduce_norm(
    ctx: &GpuContext,
    partials: &[f32],
    y: &[f32],
    w: &[f32],
    rows: usize,
    n: usize,
    splits: usize,
    eps: f32,
) -> Result<(Vec<f32>, Vec<u16>)> {
    let (pb, yb, wb) = (ctx.upload_f32(partials, "partials")?, ctx.upload_f32(y, "y")?, ctx.upload_f32(w, "w")?);
    let stride = n.next_multiple_of(8);
    let h = halves_buffer(ctx, rows * stride)?;
    let p = norm::ReduceNormParams {
        n: n as u32,
        n_cols: rows as u32,
        splits: splits as u32,
        y_stride: n as u32,
        h_stride: stride as u32,
        eps,
        _pad: [0; 2],
    };
    run(ctx, &[norm::prepare_reduce(ctx, &pb, &wb, &h, &yb, p, "reduce_norm")?])?;
    Ok((ctx.read_f32(&yb, rows * n)?, read_halves(ctx, &h, rows * stride)?))
}

/// m rows of k floats (x_stride apart) rounded to f16 as the cooperative GEMM's input is: the
/// halves' bits, rows of k rounded up to 8.
pub fn to_half(ctx: &GpuContext, x: &[f32], m: usize, k: usize, x_stride: usize) -> Result<Vec<u16>> {
    let xb = ctx.upload_f32(x, "x")?;
    let stride = k.next_multiple_of(8);
    let out = halves_buffer(ctx, m * stride)?;
    run(ctx, &[crate::kernels::matmul::prepare_to_half(ctx, &xb, &out, m as u32, k as u32, x_stride as u32)?])?;
    read_halves(ctx, &out, m * stride)
}

/// An elementwise op over a and b.
pub fn elementwise(ctx: &GpuContext, op: EltOp, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
    let (ab, bb) = (ctx.upload_f32(a, "a")?, ctx.upload_f32(b, "b")?);
    let out = ctx.storage((a.len() * 4) as u64, "out")?;
    run(ctx, &[elementwise::prepare(ctx, op, &ab, &bb, &out, a.len() as u32, "elt")?])?;
    ctx.read_f32(&out, a.len())
}

/// Rows `ids` of a [rows, k] table in `format` (GGUF-layout `bytes`), gathered and decoded.
pub fn gather(
    ctx: &GpuContext,
    format: WeightFormat,
    rows: usize,
    k: usize,
    bytes: &[u8],
    ids: &[u32],
) -> Result<Vec<f32>> {
    let table = WeightTensor::upload(ctx, "table", format, rows, k, bytes)?;
    let idb = ctx.upload(bytemuck::cast_slice(ids), "ids")?;
    let out = ctx.storage((ids.len() * k * 4) as u64, "out")?;
    run(ctx, &embed::prepare(ctx, &table, &idb, &out, ids.len() as u32, k as u32)?)?;
    ctx.read_f32(&out, ids.len() * k)
}

/// RoPE parameters for packed [n_tokens, n_heads, head_dim] rows at positions pos0.., with
/// linear scaling 0.5.
pub fn rope_params(n_tokens: u32, n_heads: u32, head_dim: u32, n_rot: u32, pos0: u32) -> RopeParams {
    RopeParams {
        n_tokens,
        n_heads,
        head_dim,
        n_rot,
        pos0,
        src_stride: n_heads * head_dim,
        dst_stride: n_heads * head_dim,
        dst_offset: 0,
        freq_base: 10000.0,
        freq_scale: 0.5,
        _pad: [0; 2],
    }
}

/// Cache rows pos0.. of a `kv` cache written by one dispatch.
fn cache_rows(ctx: &GpuContext, cache: &wgpu::Buffer, kv: KvKind, p: &RopeParams) -> Result<Vec<f32>> {
    let row = (p.n_heads * p.head_dim) as u64 * kv.bytes_per_elem();
    let bytes = ctx.read_bytes(cache, p.pos0 as u64 * row, p.n_tokens as u64 * row)?;
    Ok(cache_values(&bytes, kv))
}

fn cache(ctx: &GpuContext, kv: KvKind, p: &RopeParams, label: &str) -> Result<wgpu::Buffer> {
    ctx.storage((p.pos0 + p.n_tokens) as u64 * (p.n_heads * p.head_dim) as u64 * kv.bytes_per_elem(), label)
}

/// x rotated in place.
pub fn rope_in_place(ctx: &GpuContext, mode: RopeMode, x: &[f32], p: RopeParams) -> Result<Vec<f32>> {
    let xb = ctx.upload_f32(x, "x")?;
    run(ctx, &[rope::prepare_in_place(ctx, mode, &xb, p, "rope")?])?;
    ctx.read_f32(&xb, x.len())
}

/// x rotated into rows pos0.. of a `kv` cache, read back from there.
pub fn rope_to_cache(ctx: &GpuContext, mode: RopeMode, kv: KvKind, x: &[f32], p: RopeParams) -> Result<Vec<f32>> {
    let c = cache(ctx, kv, &p, "cache")?;
    let src = ctx.upload_f32(x, "src")?;
    run(ctx, &[rope::prepare_to_cache(ctx, Some(mode), kv, &src, &c, p, "kv")?])?;
    cache_rows(ctx, &c, kv, &p)
}

/// K rotated and V copied into their caches by one dispatch: (K rows, V rows) read back.
pub fn kv_write(
    ctx: &GpuContext,
    mode: RopeMode,
    kv: KvKind,
    k: &[f32],
    v: &[f32],
    p: RopeParams,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (kc, vc) = (cache(ctx, kv, &p, "k")?, cache(ctx, kv, &p, "v")?);
    let (kb, vb) = (ctx.upload_f32(k, "k")?, ctx.upload_f32(v, "v")?);
    let buffers = rope::KvWriteBuffers { k_src: &kb, k_cache: &kc, v_src: &vb, v_cache: &vc };
    run(ctx, &[rope::prepare_kv_write(ctx, mode, kv, buffers, p)?])?;
    Ok((cache_rows(ctx, &kc, kv, &p)?, cache_rows(ctx, &vc, kv, &p)?))
}

/// A KV cache of `shape.n_ctx` random rows in `kv`'s storage type, on the GPU, with the
/// values the kernels read from it (for the reference).
pub struct AttnCase {
    pub shape: AttnShape,
    pub kv: KvKind,
    pub k_vals: Vec<f32>,
    pub v_vals: Vec<f32>,
    /// Query heads per decode workgroup: None for the planner's choice, or a block variant
    /// the planner would not pick at this context (every block is checked whatever the policy).
    pub block: Option<u32>,
    /// Whether decode attention takes the cooperative kernel.
    pub coop: attention::CoopChoice,
    k_cache: wgpu::Buffer,
    v_cache: wgpu::Buffer,
}

impl AttnCase {
    pub fn new(ctx: &GpuContext, shape: AttnShape, kv: KvKind, r: &mut Rng) -> Result<AttnCase> {
        let n = (shape.n_ctx * shape.kv_stride()) as usize;
        let (kb, k_vals) = cache_bytes(&r.normal(n, 1.0), kv);
        let (vb, v_vals) = cache_bytes(&r.normal(n, 1.0), kv);
        let (k_cache, v_cache) = (ctx.upload(&kb, "k")?, ctx.upload(&vb, "v")?);
        Ok(AttnCase { shape, kv, k_vals, v_vals, block: None, coop: attention::CoopChoice::Planned, k_cache, v_cache })
    }

    /// The f64 reference for m queries at positions pos0...
    pub fn reference(&self, q: &[f32], m: usize, pos0: usize) -> Vec<f32> {
        attention::reference(&self.shape, q, &self.k_vals, &self.v_vals, m, pos0)
    }

    /// Prefill attention (Q·Kᵀ, causal softmax, P·V) of m queries at positions pos0...
    pub fn prefill(&self, ctx: &GpuContext, q: &[f32], m: u32, pos0: u32) -> Result<Vec<f32>> {
        let s = &self.shape;
        let qb = ctx.upload_f32(q, "q")?;
        let out = ctx.storage((m * s.n_head * s.head_dim * 4) as u64, "out")?;
        let scores = ctx.storage((s.n_head * m * (pos0 + m) * 4) as u64, "scores")?;
        let a =
            PrefillArgs { q: &qb, k_cache: &self.k_cache, v_cache: &self.v_cache, scores: &scores, out: &out, m, pos0 };
        run(ctx, &attention::prepare_prefill(ctx, self.kv, s, &a)?)?;
        ctx.read_f32(&out, q.len())
    }

    /// Decode attention of one query over kv_len positions: the output and the number of
    /// dispatches (2 where the context is split and combined).
    pub fn decode(&self, ctx: &GpuContext, q: &[f32], kv_len: u32) -> Result<(Vec<f32>, usize)> {
        let one = StepColumn { pos: kv_len.saturating_sub(1), kv_len, kv_base: 0, slot: 0 };
        self.decode_columns(ctx, q, self.shape.n_ctx, &[one], false)
    }

    /// As `decode`, the output also written as int8 blocks for the output projection
    /// (`attention::takes_q8_out`): the output, the blocks' bytes, the number of dispatches.
    pub fn decode_q8(&self, ctx: &GpuContext, q: &[f32], kv_len: u32) -> Result<(Vec<f32>, Vec<u8>, usize)> {
        let one = StepColumn { pos: kv_len.saturating_sub(1), kv_len, kv_base: 0, slot: 0 };
        let bytes = crate::kernels::matmul::q8_input_bytes(1, q.len() as u32);
        let blocks = ctx.storage(bytes, "int8 output")?;
        let (out, n) = self.decode_into(ctx, q, self.shape.n_ctx, &[one], false, Some(&blocks))?;
        Ok((out, ctx.read_bytes(&blocks, 0, bytes)?, n))
    }

    /// The columns of a batched step over regions of `region` rows of a shared cache, in
    /// another order than the regions, as (slot, position): a first token, a short context,
    /// the region's last row, two splits, exactly one split (256 positions).
    pub fn shared_cache_columns(region: u32) -> Vec<StepColumn> {
        [(3u32, 0u32), (0, 17), (4, region - 1), (1, 130), (2, 255)]
            .iter()
            .map(|&(slot, pos)| StepColumn { pos, kv_len: pos + 1, kv_base: slot * region, slot })
            .collect()
    }

    /// A batched decode step's attention: query row c (of `cols.len()`) over the region of
    /// `region` cache rows that column c's `kv_base` starts, up to its `kv_len`; the cache is
    /// the case's, `shape.n_ctx` rows holding several regions. With `kv_base` unset, the
    /// single-sequence kernel runs column 0 (`cols.len() == 1`) at its region instead.
    /// Returns the output [columns, n_head * head_dim] and the dispatches.
    pub fn decode_columns(
        &self,
        ctx: &GpuContext,
        q: &[f32],
        region: u32,
        cols: &[StepColumn],
        batched: bool,
    ) -> Result<(Vec<f32>, usize)> {
        self.decode_into(ctx, q, region, cols, batched, None)
    }

    /// As `decode_columns`, with the int8 output in `q8_out` where given.
    fn decode_into(
        &self,
        ctx: &GpuContext,
        q: &[f32],
        region: u32,
        cols: &[StepColumn],
        batched: bool,
        q8_out: Option<&wgpu::Buffer>,
    ) -> Result<(Vec<f32>, usize)> {
        let s = AttnShape { n_ctx: region, ..self.shape };
        let qb = ctx.upload_f32(q, "q")?;
        let width = s.n_head * s.head_dim;
        let out = ctx.storage((cols.len() as u32 * width * 4) as u64, "out")?;
        let partial = ctx.storage(cols.len() as u64 * s.decode_scratch_len() as u64 * 4, "partial")?;
        let one = cols.first().copied().unwrap_or_default();
        let a = DecodeArgs {
            q: &qb,
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            partial: &partial,
            out: &out,
            kv_len: one.kv_len,
            kv_base: one.kv_base,
            columns: batched.then_some(cols),
            block: self.block,
            q8_out,
            coop: self.coop,
        };
        let ds = attention::prepare_decode(ctx, self.kv, &s, &a)?;
        run(ctx, &ds)?;
        Ok((ctx.read_f32(&out, q.len())?, ds.len()))
    }

    /// The f64 reference of one query of a batched step: row `c` of `q` at the position and
    /// region `col` says.
    pub fn reference_column(&self, q: &[f32], c: usize, col: &StepColumn) -> Vec<f32> {
        let s = &self.shape;
        let (width, kvs) = ((s.n_head * s.head_dim) as usize, s.kv_stride() as usize);
        let from = col.kv_base as usize * kvs;
        let query = &q[c * width..(c + 1) * width];
        attention::reference(s, query, &self.k_vals[from..], &self.v_vals[from..], 1, col.pos as usize)
    }
}

/// The index of each row's largest logit.
pub fn argmax(ctx: &GpuContext, logits: &[f32], rows: usize, n: usize) -> Result<Vec<u32>> {
    let xb = ctx.upload_f32(logits, "logits")?;
    let ids = ctx.storage((rows * 4) as u64, "ids")?;
    run(ctx, &[argmax::prepare(ctx, &xb, &ids, rows as u32, n as u32, n as u32)?])?;
    ctx.read_u32(&ids, rows)
}

/// NLL scores written into an output of `len` floats that starts as -1 everywhere (so writes
/// outside the scored rows show).
pub fn nll(ctx: &GpuContext, logits: &[f32], targets: &[u32], p: NllParams, len: usize) -> Result<Vec<f32>> {
    let lb = ctx.upload_f32(logits, "logits")?;
    let tb = ctx.upload(bytemuck::cast_slice(targets), "targets")?;
    let ob = ctx.upload_f32(&vec![-1.0; len], "nll")?;
    run(ctx, &[nll::prepare(ctx, &lb, &tb, &ob, p)?])?;
    ctx.read_f32(&ob, len)
}

/// Samples `logits` on the GPU `steps` times (the logits uploaded afresh each step, since the
/// penalties change them in place), each pick joining the history as in generation.
pub fn gpu_tokens(
    ctx: &GpuContext,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    steps: usize,
) -> Result<Vec<u32>> {
    let k = SampleConfig::new(cfg, logits.len() as u32, logits.len() as u32);
    let state = ctx.upload(bytemuck::cast_slice(&initial_state(0, history, &[])), "state")?;
    let ids = ctx.storage(4, "ids")?;
    (0..steps)
        .map(|_| {
            let lb = ctx.upload_f32(logits, "logits")?;
            let d = sample::prepare(ctx, &k, &lb, &ids, &state, 1)?;
            run_dispatches(ctx, &d.iter().collect::<Vec<_>>())?;
            Ok(ctx.read_u32(&ids, 1)?[0])
        })
        .collect()
}

/// The CPU reference sampler's picks for the same steps.
pub fn cpu_tokens(cfg: &SamplerConfig, logits: &[f32], history: &[u32], steps: usize) -> Vec<u32> {
    let mut s = Sampler::new(*cfg);
    let mut h = history.to_vec();
    (0..steps)
        .map(|_| {
            let t = s.sample(logits, &h);
            h.push(t);
            t
        })
        .collect()
}
