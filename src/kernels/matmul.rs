//! Matmul with quantized weights: Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias) (+ Y). GEMV or tiled
//! GEMM as the planner decides; one dispatch per weight chunk when a tensor is split.

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{grid, Bound, Dispatch, GpuContext, WeightTensor};
use crate::kernels::{Epi, KernelKey, KvKind};
use crate::plan::MatmulKernel;

/// Mirrors `Params` in common/matmul_params.wgsl (every GEMV, GEMM and the activation quantizer).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct MatmulParams {
    pub m: u32,
    pub k: u32,
    pub n_rows: u32,
    pub row_offset: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub has_bias: u32,
    pub accumulate: u32,
    pub eps: f32,
    /// Split-K: K ranges, and weights per range (GEMM partials and gemm_reduce.wgsl).
    pub splits: u32,
    pub split_k: u32,
    /// Rows from the weights at binding 1: n_rows, but for a GEMV over two formats, whose
    /// rows from here on come from the second weights (`KernelKey::Gemv::second`).
    pub first_rows: u32,
}

/// One matmul: which buffers, and how X and Y are laid out.
pub struct Matmul<'a> {
    pub w: &'a WeightTensor,
    /// X: [m, x_stride] f32, using the first k values of each row; x_stride % 4 == 0.
    pub x: &'a wgpu::Buffer,
    /// Y: [m, y_stride] f32; columns 0..n are written.
    pub y: &'a wgpu::Buffer,
    /// Optional bias [n], added to every row (Qwen2's Q/K/V).
    pub bias: Option<&'a wgpu::Buffer>,
    pub m: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    /// Add into Y instead of overwriting it (fused residual add).
    pub accumulate: bool,
    /// RMSNorm weights and epsilon: X is normalized on the fly (GEMV only; decode).
    pub norm: Option<(&'a wgpu::Buffer, f32)>,
    /// The up activations, laid out as X: the input is silu(X) * up (GEMV only; decode).
    pub glu: Option<&'a wgpu::Buffer>,
    /// Where the outputs go (common/matmul_epilogue.wgsl).
    pub epi: Epilogue<'a>,
}

/// Where a matmul's outputs go, with the buffers that needs.
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    /// Y (+ bias) (+ Y).
    Plain,
    /// W's rows are gate and up interleaved (`quant::interleave_rows`): Y[m, i] =
    /// silu(gate_i) * up_i, Y rows of n/2.
    SwiGlu,
    /// The same, and where the int8 GEMV runs with workgroups over whole blocks
    /// (`plan::covers_q8_blocks`: `Caps::q8_swiglu` for one-token steps), Y also quantized
    /// into `blocks`, the int8 input of the down projection (`BoundMatmul::q8_output`), whose
    /// quantize dispatch is then skipped (`BoundMatmul::record_after`). Y rows of exactly n/2,
    /// a multiple of 32.
    SwiGluQ8 { blocks: &'a wgpu::Buffer },
    /// The same, and where a GEMM runs and the caller asks (`BoundMatmul::record_into_halves`),
    /// Y written as halves into `halves`, the f16 input of the cooperative GEMM after it,
    /// instead of the float Y (`Epi::SwiGluF16`). Y rows of exactly n/2, a multiple of 8.
    SwiGluF16 { halves: &'a wgpu::Buffer },
    /// Y (+ bias) (+ Y), and where the int8 GEMV runs one column with workgroups over whole
    /// blocks of 32 rows (`Caps::q8_add_norm` for one-token steps), Y also quantized times
    /// `norm_w` (the weights of the RMSNorm the next GEMV applies to Y) into `blocks`, with each
    /// block's sum of squares of Y: the next GEMV's int8 input as quantize_q8_lanes.wgsl writes
    /// it through the norm (`BoundMatmul::q8_output`), whose quantize dispatch is then skipped
    /// (`BoundMatmul::record_after`). Y rows of exactly n, a multiple of 32.
    PlainQ8Norm { blocks: &'a wgpu::Buffer, norm_w: &'a wgpu::Buffer },
    /// W's rows are Q, K and V stacked (Q and K rows in NeoX order where `neox`): Q is
    /// rotated into Y, K rotated and V copied into the caches at each token's position.
    Qkv {
        k_cache: &'a wgpu::Buffer,
        v_cache: &'a wgpu::Buffer,
        kv: KvKind,
        neox: bool,
        /// `RopeShape` uniform.
        rope: &'a wgpu::Buffer,
        /// The step's `StepState` (tokens, first position).
        step: &'a wgpu::Buffer,
        /// The first row of the stacked Q/K/V matrix this matmul's weights hold.
        row_base: u32,
    },
}

impl Epilogue<'_> {
    pub fn key(&self) -> Epi {
        match *self {
            Epilogue::Plain | Epilogue::PlainQ8Norm { .. } => Epi::Plain,
            Epilogue::SwiGlu | Epilogue::SwiGluQ8 { .. } | Epilogue::SwiGluF16 { .. } => Epi::SwiGlu,
            Epilogue::Qkv { kv, neox, .. } => Epi::Qkv { kv, neox, batched: false },
        }
    }
}

/// Mirrors `Rope` in common/epilogue_qkv.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct RopeShape {
    pub q_dim: u32,
    pub kv_dim: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub kv_stride: u32,
    pub _pad: u32,
}

/// Mirrors `Step` in common/step_one.wgsl: what a step of one sequence works on (its tokens
/// at positions pos0.. of the sequence, whose KV-cache region starts at row `kv_base`). The
/// head of the step buffer, which the QKV epilogue, decode attention and the combine pass read.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
pub struct StepState {
    pub n_tokens: u32,
    pub pos0: u32,
    pub kv_len: u32,
    pub kv_base: u32,
}

/// Mirrors `Column` in common/step_columns.wgsl: one column of a batched decode step, the
/// next token of its own sequence. The table of columns follows the `StepState` in the step
/// buffer; the batched kernel variants read it.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq, Default)]
pub struct StepColumn {
    /// The token's position in its sequence (RoPE).
    pub pos: u32,
    /// Positions its attention sees (pos + 1).
    pub kv_len: u32,
    /// Its sequence's first KV-cache row.
    pub kv_base: u32,
    /// Its sequence's sampler configuration and state row.
    pub slot: u32,
}

/// Bytes of a step buffer for steps of up to `rows` tokens: the `StepState` and a table of
/// as many columns (at least `plan::GEMV_MAX_COLS`, a batched decode step's).
pub fn step_bytes(rows: u32) -> u64 {
    let cols = rows.max(crate::plan::GEMV_MAX_COLS) as usize;
    (std::mem::size_of::<StepState>() + cols * std::mem::size_of::<StepColumn>()) as u64
}

/// The step buffer's bytes for a batched step over `cols` (one per token of the step: a
/// batched decode step's columns, or the rows of several prompt chunks); the kernels read
/// only the step's columns.
pub fn step_table(cols: &[StepColumn]) -> Vec<u8> {
    let kv_len = cols.iter().map(|c| c.kv_len).max().unwrap_or(0);
    let head = StepState { n_tokens: cols.len() as u32, pos0: 0, kv_len, kv_base: 0 };
    let mut bytes = bytemuck::bytes_of(&head).to_vec();
    bytes.extend_from_slice(bytemuck::cast_slice(cols));
    // A binding of the table holds at least one column.
    bytes.resize(bytes.len().max(step_bytes(1) as usize), 0);
    bytes
}

impl<'a> Matmul<'a> {
    /// Y[m, rows] = X[m, k] · Wᵀ with rows packed back to back, nothing fused (tests, benches);
    /// struct-update syntax adds the rest.
    pub fn dense(w: &'a WeightTensor, x: &'a wgpu::Buffer, y: &'a wgpu::Buffer, m: u32) -> Matmul<'a> {
        Matmul {
            w,
            x,
            y,
            bias: None,
            m,
            x_stride: w.k,
            y_stride: w.rows,
            accumulate: false,
            norm: None,
            glu: None,
            epi: Epilogue::Plain,
        }
    }
}

/// `key` reading the rows from `first_rows` on from the second weights, where `second` says.
fn with_second(mut key: KernelKey, second: Option<SecondPart>) -> KernelKey {
    if let (KernelKey::Gemv { second: f2, .. }, Some(s)) = (&mut key, second) {
        *f2 = Some(s.format);
    }
    key
}

/// A matmul's five bindings after the parameters, then the epilogue's.
fn with_extra<'b>(base: [&'b wgpu::Buffer; 5], extra: &[&'b wgpu::Buffer]) -> Vec<&'b wgpu::Buffer> {
    base.into_iter().chain(extra.iter().copied()).collect()
}

/// The pipeline key and grid of `kernel` over one weight chunk of `rows` rows and m columns;
/// `norm`, `glu`: the fused input the kernel applies itself (`x_local`: the int8 GEMV
/// quantizing its own input through the norm).
#[allow(clippy::too_many_arguments)]
pub fn launch(
    ctx: &GpuContext,
    kernel: MatmulKernel,
    format: crate::quant::WeightFormat,
    rows: u32,
    m: u32,
    norm: bool,
    glu: bool,
    x_local: bool,
    epi: Epi,
) -> Result<(KernelKey, [u32; 3])> {
    match kernel {
        MatmulKernel::Gemv { ncols, shape, q8 } => {
            // The planner's groups (`gemv_group_cols`) or up to the float GEMV's for either body;
            // the int8 GEMV's grouped shapes up to `GEMV_Q8_WIDE_COLS`.
            let group = if shape.groups > 1 { crate::plan::GEMV_Q8_WIDE_COLS } else { crate::plan::GEMV_GROUP_COLS };
            if q8 && !format.is_quantized() {
                return Err(KilnError::invalid("matmul", format!("no int8-activation GEMV for {format}")));
            }
            if ncols == 0 || ncols > group {
                return Err(KilnError::invalid("matmul", format!("GEMV workgroups of {ncols} columns (1 to {group})")));
            }
            if m > crate::plan::GEMV_MAX_COLS {
                return Err(KilnError::invalid(
                    "matmul",
                    format!("GEMV over m={m} columns (at most {})", crate::plan::GEMV_MAX_COLS),
                ));
            }
            let key = KernelKey::Gemv {
                format,
                ncols: ncols as u8,
                rows: shape.rows as u8,
                groups: shape.groups as u8,
                wg: shape.wg as u16,
                subgroups: ctx.caps.subgroups,
                norm,
                glu,
                q8,
                x_local,
                epi,
                second: None,
            };
            // One workgroup per ROWS x ROW_GROUPS rows and group of ncols columns (grid z).
            let [gx, gy, _] = grid(rows.div_ceil(shape.rows_per_workgroup()));
            Ok((key, [gx, gy, m.div_ceil(ncols).max(1)]))
        }
        MatmulKernel::Gemm { tile } => {
            if norm || glu {
                return Err(KilnError::invalid("matmul", "a fused RMSNorm or SwiGLU needs the GEMV kernel"));
            }
            let (bm, bn, ..) = tile.dims();
            let (gx, gy) = (rows.div_ceil(bn), m.div_ceil(bm));
            if gx > ctx.limits.max_compute_workgroups_per_dimension
                || gy > ctx.limits.max_compute_workgroups_per_dimension
            {
                return Err(KilnError::invalid("matmul", format!("grid {gx}x{gy} exceeds the adapter's limit")));
            }
            Ok((KernelKey::Gemm { format, tile, epi }, [gx, gy, 1]))
        }
    }
}

/// The int8-activation GEMV's input: X (through the fused RMSNorm or SwiGLU) quantized once
/// into `blocks` by a QuantizeQ8 dispatch, which every weight chunk's GEMV then reads.
struct Q8Input {
    quantize: Bound,
    key: KernelKey,
    /// One binding per weight chunk, as `BoundMatmul::chunks`, with `blocks` in place of X.
    chunks: Vec<Bound>,
    blocks: wgpu::Buffer,
}

/// The int8 epilogues' output (`Epilogue::SwiGluQ8`, `Epilogue::PlainQ8Norm`): one binding per
/// weight chunk, as `Q8Input::chunks` with `blocks` at binding 6, where the kernel writes its
/// outputs' int8 blocks (and the norm's weights at 7); or, `local_input`
/// (`Caps::q8_swiglu_norm`, a fused RMSNorm), with X and the norm's weights, which each
/// workgroup quantizes itself (no quantize dispatch). One-token steps take the int8 GEMV in
/// `shape`, which covers the epilogue's blocks.
struct Q8Output {
    chunks: Vec<Bound>,
    blocks: wgpu::Buffer,
    local_input: bool,
    epi: Epi,
    shape: crate::plan::GemvShape,
}

impl Q8Output {
    /// Whether the int8 GEMV's workgroups of `shape` cover this epilogue's blocks.
    fn covered_by(&self, shape: crate::plan::GemvShape) -> bool {
        match self.epi {
            Epi::AddQ8Norm => crate::plan::covers_q8_rows(shape),
            _ => crate::plan::covers_q8_blocks(shape),
        }
    }
}

/// The f16 SwiGLU epilogue's output (`Epilogue::SwiGluF16`): the GEMMs' bindings with
/// `halves` at binding 6, over X (`chunks`: the float tiles), over the f16 copy of X
/// (`half_chunks`: the cooperative ones) and over the split-K partials (`reduce`).
struct F16Output {
    chunks: Vec<Bound>,
    half_chunks: Vec<Bound>,
    reduce: Vec<Bound>,
    halves: wgpu::Buffer,
}

/// The cooperative GEMM's input: X rounded to f16 once per step by a ToHalf dispatch into
/// `halves` (rows of `stride` halves), which every weight chunk's GEMM then reads. Rounding
/// inside the GEMM cost a conversion per value per tile of N: on an H200 the kernel ran at
/// half its rate.
struct HalfInput {
    convert: Bound,
    /// One binding per weight chunk, as `BoundMatmul::chunks`, with `halves` in place of X;
    /// and the split-K partial GEMMs likewise, where the matmul may split.
    chunks: Vec<Bound>,
    partial: Vec<Bound>,
    halves: wgpu::Buffer,
    stride: u32,
}

/// Whether the planner may put `mm` on the cooperative GEMM (which reads X as halves).
fn wants_halves(ctx: &GpuContext, mm: &Matmul) -> bool {
    crate::plan::coop_gemm_takes(mm.w.format, mm.w.k, &ctx.caps)
}

/// Halves per row of a cooperative GEMM's input of k values.
fn half_stride(k: u32) -> u32 {
    k.next_multiple_of(8)
}

/// The rows X's buffer holds.
fn x_rows(mm: &Matmul) -> u32 {
    (mm.x.size() / (mm.x_stride as u64 * 4)).max(1) as u32
}

/// A buffer for `rows` rows of k values as halves.
fn halves_buffer(ctx: &GpuContext, k: u32, rows: u32) -> Result<wgpu::Buffer> {
    ctx.storage((rows as u64 * half_stride(k) as u64 * 2).next_multiple_of(16), "f16 activations")
}

/// An f16 input buffer of `mm`'s own (one-off matmuls, no session scratch), where the planner
/// may put it on the cooperative GEMM.
fn own_halves(ctx: &GpuContext, mm: &Matmul) -> Result<Option<wgpu::Buffer>> {
    if wants_halves(ctx, mm) {
        Ok(Some(halves_buffer(ctx, mm.w.k, x_rows(mm))?))
    } else {
        Ok(None)
    }
}

/// Whether the planner picks the int8 GEMV for `mm` at some m the GEMV takes (one token, or
/// from `GEMV_Q8_MIN_COLS` columns): the matmul then needs the int8 input bound.
fn wants_q8(ctx: &GpuContext, mm: &Matmul) -> bool {
    // One token, or several columns (`plan::GEMV_Q8_MIN_COLS`: batched steps, short prompts).
    [1, crate::plan::gemv_q8_min_cols()].into_iter().any(|m| {
        matches!(
            crate::plan::plan_matmul(m, mm.w.rows, mm.w.k, mm.w.format, &ctx.caps),
            MatmulKernel::Gemv { q8: true, .. }
        )
    })
}

/// The int8 blocks of up to `GEMV_MAX_COLS` rows of k activations.
fn q8_blocks(ctx: &GpuContext, k: u32) -> Result<wgpu::Buffer> {
    ctx.storage(q8_input_bytes(crate::plan::GEMV_MAX_COLS, k), "int8 activations")
}

/// Bytes of the int8 blocks of `m` rows of k activations (48 per 32: quants, d and sums).
pub fn q8_input_bytes(m: u32, k: u32) -> u64 {
    m as u64 * (k / 32) as u64 * 48
}

/// What the matmuls of one session share: the int8 GEMVs' quantized inputs (one buffer per
/// input length k), the split-K GEMMs' partial sums (one buffer), and how many columns of a
/// prompt chunk go to the GEMV. Each quantize (or partial-sums) dispatch is followed by the
/// dispatches that read its output before the next one writes it, all in one stream of
/// dispatches, so sharing is safe within a session (not between sessions submitted
/// independently).
#[derive(Default)]
pub struct MatmulScratch {
    blocks: std::cell::RefCell<std::collections::HashMap<u32, wgpu::Buffer>>,
    /// Int8 blocks written by a matmul's epilogue for the next matmul (`q8_output`), by k.
    outputs: std::cell::RefCell<std::collections::HashMap<u32, wgpu::Buffer>>,
    /// The cooperative GEMMs' f16 inputs, by k (the largest number of rows asked for so far).
    halves: std::cell::RefCell<std::collections::HashMap<u32, (u32, wgpu::Buffer)>>,
    partials: std::cell::RefCell<Option<wgpu::Buffer>>,
    /// The f16 copy of a K-quant matrix that prefill's GEMMs read
    /// (`Caps::dequant_f16_from`): one buffer for the session, as large as its largest such
    /// matrix (`dequant_f16_bytes`), rewritten before each GEMM that reads it; None where no
    /// matmul takes the route or the copies are resident.
    dequant: Option<wgpu::Buffer>,
    /// Resident f16 copies instead (`with_resident_dequant`): by the weights' buffer, a copy of
    /// each matrix the session keeps one of, decoded when the first matmul over it is bound
    /// (None until then).
    resident: Option<std::cell::RefCell<std::collections::HashMap<wgpu::Buffer, Option<wgpu::Buffer>>>>,
    /// Columns of one sequence's steps (prompt chunks) that go to the GEMV
    /// (`plan::prefill_gemv_cols`); None: `plan::gemv_takes`.
    prefill_gemv_cols: Option<u32>,
}

impl MatmulScratch {
    /// A session's scratch, its prompt chunks of more than `prefill_gemv_cols` tokens on the
    /// GEMM.
    pub fn for_session(prefill_gemv_cols: u32) -> MatmulScratch {
        MatmulScratch { prefill_gemv_cols: Some(prefill_gemv_cols), ..Default::default() }
    }

    /// As it is, with a buffer for the f16 copies of the K-quant matrices among `weights`
    /// that prefill's GEMMs may read (`dequant_f16_bytes`; none where none may).
    pub fn with_dequant<'w>(
        mut self,
        ctx: &GpuContext,
        weights: impl IntoIterator<Item = &'w WeightTensor>,
    ) -> Result<MatmulScratch> {
        let bytes = weights.into_iter().filter_map(|w| dequant_f16_bytes(ctx, w)).max().unwrap_or(0);
        if bytes > 0 {
            self.dequant = Some(ctx.storage(bytes, "f16 weights (prefill)")?);
        }
        Ok(self)
    }

    /// As it is, prefill's GEMMs over the block-format matrices among `weights` (K-quants,
    /// Q8_0) reading a copy of each in f16 that stays in GPU memory (decoded once,
    /// `plan::resident_f16_copies`), instead of one buffer decoded into before every GEMM
    /// (`with_dequant`).
    pub fn with_resident_dequant<'w>(mut self, weights: impl IntoIterator<Item = &'w WeightTensor>) -> MatmulScratch {
        self.dequant = None;
        let keys = weights.into_iter().filter_map(|w| w.chunks.first()).map(|c| (c.buffer.clone(), None));
        self.resident = Some(std::cell::RefCell::new(keys.collect()));
        self
    }

    /// Bytes of the resident f16 copies decoded so far.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.as_ref().map_or(0, |c| c.borrow().values().flatten().map(|b| b.size()).sum())
    }

    /// The resident f16 copy of `w` (one chunk, `resident_f16_bytes` of it) where the session
    /// keeps one, decoded now the first time it is asked for.
    fn resident_copy(&self, ctx: &GpuContext, w: &WeightTensor, bytes: u64) -> Result<Option<wgpu::Buffer>> {
        let Some(copies) = &self.resident else { return Ok(None) };
        let key = &w.chunks[0].buffer;
        match copies.borrow().get(key) {
            None => return Ok(None),
            Some(Some(b)) => return Ok(Some(b.clone())),
            Some(None) => {}
        }
        let copy = ctx.storage(bytes, "f16 weights (prefill, resident)")?;
        let decode = prepare_dequant_f16(ctx, w, &copy)?;
        crate::gpu::buffers::run_dispatches(ctx, &[&decode])?;
        copies.borrow_mut().insert(key.clone(), Some(copy.clone()));
        Ok(Some(copy))
    }

    /// Int8 blocks of k activations that one matmul writes for the next
    /// (`Epilogue::SwiGluQ8`, `BoundMatmul::reading_q8_in`), apart from the blocks the
    /// session's quantize dispatches write.
    pub fn q8_output(&self, ctx: &GpuContext, k: u32) -> Result<wgpu::Buffer> {
        Self::blocks_in(&self.outputs, ctx, k)
    }

    /// The int8 blocks the session's quantize dispatches write for inputs of k values (which
    /// the int8 residual epilogue writes instead where it runs, `Epilogue::PlainQ8Norm`).
    pub fn blocks(&self, ctx: &GpuContext, k: u32) -> Result<wgpu::Buffer> {
        Self::blocks_in(&self.blocks, ctx, k)
    }

    /// The int8 blocks for k values in `map`, allocated the first time k is asked for.
    fn blocks_in(
        map: &std::cell::RefCell<std::collections::HashMap<u32, wgpu::Buffer>>,
        ctx: &GpuContext,
        k: u32,
    ) -> Result<wgpu::Buffer> {
        if let Some(b) = map.borrow().get(&k) {
            return Ok(b.clone());
        }
        let b = q8_blocks(ctx, k)?;
        map.borrow_mut().insert(k, b.clone());
        Ok(b)
    }

    /// A buffer for at least `rows` rows of k values as halves: shared with every matmul of the
    /// session over the same k whose input is at most as long (a longer one gets a new one).
    fn halves(&self, ctx: &GpuContext, k: u32, rows: u32) -> Result<wgpu::Buffer> {
        if let Some((have, b)) = self.halves.borrow().get(&k) {
            if *have >= rows {
                return Ok(b.clone());
            }
        }
        let b = halves_buffer(ctx, k, rows)?;
        self.halves.borrow_mut().insert(k, (rows, b.clone()));
        Ok(b)
    }

    /// The f16 input `mm` needs where the planner may put it on the cooperative GEMM.
    fn halves_for(&self, ctx: &GpuContext, mm: &Matmul) -> Result<Option<wgpu::Buffer>> {
        if wants_halves(ctx, mm) {
            Ok(Some(self.halves(ctx, mm.w.k, x_rows(mm))?))
        } else {
            Ok(None)
        }
    }

    /// The split-K partials buffer, on adapters where the planner splits GEMMs.
    pub fn partials(&self, ctx: &GpuContext) -> Result<Option<wgpu::Buffer>> {
        if split_k_scratch_bytes(&ctx.caps) == 0 {
            return Ok(None);
        }
        if let Some(b) = self.partials.borrow().as_ref() {
            return Ok(Some(b.clone()));
        }
        let b = ctx.storage(SPLIT_K_SCRATCH_BYTES, "split-K partial sums")?;
        *self.partials.borrow_mut() = Some(b.clone());
        Ok(Some(b))
    }
}

/// Bytes of the f16 copy of `w` that prefill's GEMMs may read instead of `w` itself
/// (`Caps::dequant_f16_from`): K-quant formats (`plan::dequant_f16_format`) in one chunk whose
/// copy one binding holds.
pub fn dequant_f16_bytes(ctx: &GpuContext, w: &WeightTensor) -> Option<u64> {
    f16_copy_bytes(ctx, w, crate::plan::dequant_f16_format(w.format))
}

/// Bytes of the resident f16 copy of `w` (`MatmulScratch::with_resident_dequant`): as
/// `dequant_f16_bytes`, for `plan::resident_f16_format`'s formats (Q8_0 too).
pub fn resident_f16_bytes(ctx: &GpuContext, w: &WeightTensor) -> Option<u64> {
    f16_copy_bytes(ctx, w, crate::plan::resident_f16_format(w.format))
}

fn f16_copy_bytes(ctx: &GpuContext, w: &WeightTensor, format_takes: bool) -> Option<u64> {
    let bytes = w.rows as u64 * w.k as u64 * 2;
    let takes = ctx.caps.dequant_f16_from.is_some()
        && format_takes
        && w.chunks.len() == 1
        && w.k % 8 == 0
        && crate::gpu::buffers::storage_size(bytes) <= ctx.max_storage();
    takes.then_some(bytes)
}

/// Bytes of the split-K partials scratch (`plan::SPLIT_K_SCRATCH_FLOATS` floats).
pub const SPLIT_K_SCRATCH_BYTES: u64 = crate::plan::SPLIT_K_SCRATCH_FLOATS * 4;

/// The split-K scratch a session holds on an adapter with `caps`: none on CPU adapters,
/// where the planner never splits.
pub fn split_k_scratch_bytes(caps: &crate::gpu::Caps) -> u64 {
    if caps.cpu_adapter {
        0
    } else {
        SPLIT_K_SCRATCH_BYTES
    }
}

/// A GEMM split along K: per weight chunk, the GEMM writing its partial sums into the
/// scratch (`Epi::Partial`) and the pass adding them up through the real epilogue.
struct SplitK {
    partial: Vec<Bound>,
    reduce: Vec<Bound>,
    scratch_floats: u64,
}

/// A matmul bound to its buffers once (one bind group per weight chunk); each `record`
/// plans the kernel for that step's m and rewrites the parameters.
pub struct BoundMatmul {
    pub stage: &'static str,
    format: crate::quant::WeightFormat,
    k: u32,
    n: u32,
    chunks: Vec<(Bound, u32, u32)>, // (binding, row_start, rows)
    x_stride: u32,
    y_stride: u32,
    has_bias: bool,
    accumulate: bool,
    /// Epsilon of the fused RMSNorm, if any.
    norm_eps: Option<f32>,
    glu: bool,
    epi: Epi,
    /// Added to each chunk's first row: where the weights sit in a stacked matrix.
    row_base: u32,
    /// Present when the int8-activation GEMV may run (the planner picks it for some m, or a
    /// caller asked for it).
    q8: Option<Q8Input>,
    /// Present where the int8 GEMV may also write its SwiGLU output as the next GEMV's int8
    /// input (`Epilogue::SwiGluQ8`).
    q8_out: Option<Q8Output>,
    /// Present where the GEMMs may write their SwiGLU output as the next matmul's halves
    /// (`Epilogue::SwiGluF16`).
    f16_out: Option<F16Output>,
    /// Present where the planner may pick the cooperative GEMM.
    half: Option<HalfInput>,
    /// Present where GEMMs may be split along K (a partials scratch was given).
    split: Option<SplitK>,
    /// K ranges for every GEMM instead of the planner's (tests of the split-K path).
    forced_splits: Option<u32>,
    /// Columns of one sequence's step that go to the GEMV at most (u32::MAX: the planner's
    /// `gemv_takes`; 0: a matmul bound for prefill alone, always on the GEMM). Batched decode
    /// steps take the planner's choice.
    gemv_cols: u32,
    /// One sequence's one-token steps find the int8 input already written by the dispatch
    /// before (decode attention, `Caps::attn_q8_out`): the int8 GEMV at any size.
    fed_q8: bool,
    /// The rows past the first part's in a second format, from a second buffer
    /// (`two_formats_in`): one GEMV dispatch over both.
    second: Option<SecondPart>,
    /// Where prefill's GEMMs may read an f16 copy of K-quant weights (`Caps::dequant_f16_from`).
    dequant: Option<DequantRoute>,
}

/// A K-quant matmul's GEMMs over an f16 copy of its weights: the dispatch decoding them
/// into the session's scratch (dequant_f16.wgsl), then the same matmul bound over the copy as
/// F16 weights (the planner's F16 GEMM, with this matmul's X, Y, epilogue and scratch). The
/// copy is rewritten before every GEMM that reads it: the session's matmuls share it. With
/// resident copies (`MatmulScratch::with_resident_dequant`) there is no decode dispatch: the
/// copy was decoded once.
struct DequantRoute {
    decode: Option<Bound>,
    f16: Box<BoundMatmul>,
    /// Steps whose columns times k reach this take it (`Caps::dequant_f16_from`; 1 in tests).
    from: u64,
}

/// The rows of a stacked matrix from `first_rows` on, in `format` (`BoundMatmul::two_formats_in`),
/// and the GEMV that runs over both parts.
#[derive(Clone, Copy, Debug)]
struct SecondPart {
    format: crate::quant::WeightFormat,
    first_rows: u32,
    rows: u32,
    kernel: MatmulKernel,
}

impl BoundMatmul {
    /// Binds `mm`, with the int8 GEMV's input blocks if the planner picks it for any m.
    pub fn new(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<BoundMatmul> {
        Self::with_q8(ctx, mm, stage, wants_q8(ctx, mm))
    }

    /// As `new`, the int8 input from the session's `scratch`.
    pub fn new_in(ctx: &GpuContext, mm: &Matmul, stage: &'static str, scratch: &MatmulScratch) -> Result<BoundMatmul> {
        let blocks = if wants_q8(ctx, mm) { Some(scratch.blocks(ctx, mm.w.k)?) } else { None };
        Self::bind_in(ctx, mm, stage, scratch, blocks)
    }

    /// As `new_in`, its int8 input in `blocks`: written by the matmul before it where that
    /// one's epilogue does (`Epilogue::SwiGluQ8`, `record_after`), else by its own quantize
    /// dispatch.
    pub fn reading_q8_in(
        ctx: &GpuContext,
        mm: &Matmul,
        stage: &'static str,
        scratch: &MatmulScratch,
        blocks: &wgpu::Buffer,
    ) -> Result<BoundMatmul> {
        Self::bind_in(ctx, mm, stage, scratch, wants_q8(ctx, mm).then(|| blocks.clone()))
    }

    /// As `new_in` for a matmul whose one-token input the dispatch before it writes as int8
    /// `blocks` (decode attention, `Caps::attn_q8_out`; passed to `record_after` as
    /// `Prepared::blocks`): those steps take the int8 GEMV whatever the planner picks for
    /// the size (it would quantize otherwise).
    pub fn fed_q8_in(
        ctx: &GpuContext,
        mm: &Matmul,
        stage: &'static str,
        scratch: &MatmulScratch,
        blocks: &wgpu::Buffer,
    ) -> Result<BoundMatmul> {
        if !mm.w.format.is_quantized() || !ctx.caps.int8_dot {
            return Err(KilnError::invalid("matmul", format!("no int8 GEMV for {} here", mm.w.format)));
        }
        let mut b = Self::bind_in(ctx, mm, stage, scratch, Some(blocks.clone()))?;
        b.fed_q8 = true;
        Ok(b)
    }

    /// Binds `mm` with the int8 input `blocks` and the session's other scratch.
    fn bind_in(
        ctx: &GpuContext,
        mm: &Matmul,
        stage: &'static str,
        scratch: &MatmulScratch,
        blocks: Option<wgpu::Buffer>,
    ) -> Result<BoundMatmul> {
        let halves = scratch.halves_for(ctx, mm)?;
        let mut b = Self::bind(ctx, mm, stage, blocks, halves, scratch.partials(ctx)?, None)?;
        b.gemv_cols = scratch.prefill_gemv_cols.unwrap_or(u32::MAX);
        b.with_dequant_route(ctx, mm, stage, scratch)
    }

    /// For prefill only (no int8 GEMV), with the session's split-K scratch.
    pub fn prefill_in(
        ctx: &GpuContext,
        mm: &Matmul,
        stage: &'static str,
        scratch: &MatmulScratch,
    ) -> Result<BoundMatmul> {
        let halves = scratch.halves_for(ctx, mm)?;
        let mut b = Self::bind(ctx, mm, stage, None, halves, scratch.partials(ctx)?, None)?;
        b.gemv_cols = 0;
        b.with_dequant_route(ctx, mm, stage, scratch)
    }

    /// This matmul with the route through the session's f16 copy of its weights
    /// (`DequantRoute`) where its GEMMs may take it: K-quant weights the scratch holds a copy
    /// of (`dequant_f16_bytes`), no fused input (the GEMV's only) and one format.
    fn with_dequant_route(
        mut self,
        ctx: &GpuContext,
        mm: &Matmul,
        stage: &'static str,
        scratch: &MatmulScratch,
    ) -> Result<BoundMatmul> {
        let bytes = match scratch.resident.is_some() {
            true => resident_f16_bytes(ctx, mm.w),
            false => dequant_f16_bytes(ctx, mm.w),
        };
        let Some(bytes) = bytes else {
            return Ok(self);
        };
        if mm.norm.is_some() || mm.glu.is_some() || self.second.is_some() {
            return Ok(self);
        }
        let chunk = &mm.w.chunks[0];
        // Its own resident copy (none: a matrix the session keeps none of), or the session's
        // one buffer (none: too small).
        let resident = scratch.resident.is_some();
        let copy = match resident {
            true => scratch.resident_copy(ctx, mm.w, bytes)?,
            false => scratch.dequant.clone().filter(|c| c.size() >= bytes),
        };
        let Some(copy) = &copy else {
            return Ok(self);
        };
        let w16 = WeightTensor {
            name: format!("{} (f16 copy)", mm.w.name),
            format: crate::quant::WeightFormat::F16,
            rows: mm.w.rows,
            k: mm.w.k,
            chunks: vec![crate::gpu::buffers::WeightChunk {
                buffer: copy.clone(),
                row_start: chunk.row_start,
                rows: chunk.rows,
            }],
        };
        // The GEMMs' epilogues (the int8 outputs are the GEMV's).
        let epi = match mm.epi {
            Epilogue::SwiGluQ8 { .. } => Epilogue::SwiGlu,
            Epilogue::PlainQ8Norm { .. } => Epilogue::Plain,
            e => e,
        };
        let over_copy = Matmul {
            w: &w16,
            x: mm.x,
            y: mm.y,
            bias: mm.bias,
            m: mm.m,
            x_stride: mm.x_stride,
            y_stride: mm.y_stride,
            accumulate: mm.accumulate,
            norm: None,
            glu: None,
            epi,
        };
        let halves = self.half.as_ref().map(|h| h.halves.clone());
        let mut f16 = Self::bind(ctx, &over_copy, stage, None, halves, scratch.partials(ctx)?, None)?;
        f16.gemv_cols = 0;
        f16.forced_splits = self.forced_splits;
        // Bindings 2, 4 and 5 are unused by the decoder; any buffer fills them.
        let key = KernelKey::DequantF16 { format: mm.w.format };
        let decode = match resident {
            true => None,
            false => Some(Bound::new::<MatmulParams>(ctx, &key, stage, &[&chunk.buffer, mm.x, copy, mm.x, mm.x])?),
        };
        // A resident copy costs no decoding a step: GEMMs take it from shorter steps on.
        let from = ctx.caps.dequant_f16_from.unwrap_or(u64::MAX);
        let from = if resident { from.min(crate::plan::RESIDENT_F16_FROM) } else { from };
        self.dequant = Some(DequantRoute { decode, f16: Box::new(f16), from });
        Ok(self)
    }

    /// The route through the f16 copy where a step over m columns on `kernel` takes it.
    fn dequant_route(&self, m: u32, kernel: MatmulKernel) -> Option<&DequantRoute> {
        let gemm = matches!(kernel, MatmulKernel::Gemm { .. });
        self.dequant.as_ref().filter(|r| gemm && m as u64 * self.k as u64 >= r.from)
    }

    /// As `new`; `q8`: bind the int8 GEMV's input whatever the planner picks.
    pub fn with_q8(ctx: &GpuContext, mm: &Matmul, stage: &'static str, q8: bool) -> Result<BoundMatmul> {
        let blocks = if q8 { Some(q8_blocks(ctx, mm.w.k)?) } else { None };
        let halves = own_halves(ctx, mm)?;
        Self::bind(ctx, mm, stage, blocks, halves, None, None)
    }

    /// Binds matmuls that read the same input (the same X through the same fused RMSNorm or
    /// SwiGLU, e.g. the Q, K and V projections): their int8 GEMVs share one quantized copy
    /// of it, which `record_group` writes once per step.
    pub fn group(ctx: &GpuContext, mms: &[Matmul], stage: &'static str) -> Result<Vec<BoundMatmul>> {
        Self::group_in(ctx, mms, stage, &MatmulScratch::default())
    }

    /// As `group`, the int8 input from the session's `scratch`.
    pub fn group_in(
        ctx: &GpuContext,
        mms: &[Matmul],
        stage: &'static str,
        scratch: &MatmulScratch,
    ) -> Result<Vec<BoundMatmul>> {
        let k = mms.first().map(|mm| mm.w.k).unwrap_or(0);
        if mms.iter().any(|mm| mm.w.k != k) {
            return Err(KilnError::invalid("matmul", "a group of matmuls must share its input length k"));
        }
        let blocks = if mms.iter().any(|mm| wants_q8(ctx, mm)) { Some(scratch.blocks(ctx, k)?) } else { None };
        // One f16 copy of the shared input, as long as the longest member's.
        let rows = mms.iter().map(x_rows).max().unwrap_or(1);
        let halves =
            if mms.iter().any(|mm| wants_halves(ctx, mm)) { Some(scratch.halves(ctx, k, rows)?) } else { None };
        let partials = scratch.partials(ctx)?;
        mms.iter()
            .map(|mm| {
                let mut b = Self::bind(
                    ctx,
                    mm,
                    stage,
                    blocks.clone().filter(|_| wants_q8(ctx, mm)),
                    halves.clone().filter(|_| wants_halves(ctx, mm)),
                    partials.clone(),
                    None,
                )?;
                b.gemv_cols = scratch.prefill_gemv_cols.unwrap_or(u32::MAX);
                b.with_dequant_route(ctx, mm, stage, scratch)
            })
            .collect()
    }

    /// One dispatch over a Q/K/V projection stacked from two formats: `mm.w` its first rows
    /// (`Epilogue::Qkv`, binding every output the rows reach), `second` the rest, which the
    /// GEMV reads from a buffer of its own (`KernelKey::Gemv::second`; Q4_K_M files store V in
    /// Q6_K). For one sequence's one-token steps where the planner takes them
    /// (`plan::plan_two_formats`, `takes_step`); the parts' own matmuls run the others. None
    /// where it never runs: no such step, weights split into chunks, or too few storage
    /// buffers a shader stage for its bindings.
    pub fn two_formats_in(
        ctx: &GpuContext,
        mm: &Matmul,
        second: &WeightTensor,
        stage: &'static str,
        scratch: &MatmulScratch,
    ) -> Result<Option<BoundMatmul>> {
        let Epilogue::Qkv { row_base, .. } = mm.epi else {
            return Err(KilnError::invalid("matmul", "a GEMV over two formats is the Q/K/V projection's"));
        };
        if second.k != mm.w.k || row_base != 0 {
            return Err(KilnError::invalid("matmul", "two formats' parts must share k and start at row 0"));
        }
        let (first_rows, n) = (mm.w.rows, mm.w.rows + second.rows);
        let Some(kernel) = crate::plan::plan_two_formats(n, first_rows, mm.w.k, mm.w.format, second.format, &ctx.caps)
        else {
            return Ok(None);
        };
        let q8 = matches!(kernel, MatmulKernel::Gemv { q8: true, .. });
        let blocks = if q8 { Some(scratch.blocks(ctx, mm.w.k)?) } else { None };
        Self::bind_two_formats(ctx, mm, second, kernel, stage, blocks)
    }

    /// `two_formats_in` on `kernel` (a one-column GEMV; the int8 one reading `blocks`).
    fn bind_two_formats(
        ctx: &GpuContext,
        mm: &Matmul,
        second: &WeightTensor,
        kernel: MatmulKernel,
        stage: &'static str,
        blocks: Option<wgpu::Buffer>,
    ) -> Result<Option<BoundMatmul>> {
        let first_rows = mm.w.rows;
        let part = SecondPart { format: second.format, first_rows, rows: second.rows, kernel };
        let MatmulKernel::Gemv { ncols: 1, shape, q8 } = kernel else {
            return Err(KilnError::invalid("matmul", format!("a GEMV over two formats is one column's, not {kernel}")));
        };
        if first_rows % shape.rows_per_workgroup() != 0 || second.rows % 2 != 0 {
            return Err(KilnError::invalid(
                "matmul",
                format!(
                    "{kernel} over two formats: {first_rows} first rows are not whole workgroups' rows, or {} second rows not pairs",
                    second.rows
                ),
            ));
        }
        if q8 != blocks.is_some() {
            return Err(KilnError::invalid(
                "matmul",
                format!("{kernel} over two formats: int8 blocks given or missing"),
            ));
        }
        // The int8 GEMV's RMSNorm belongs to its quantize dispatch.
        let (key, _) = launch(
            ctx,
            kernel,
            mm.w.format,
            first_rows + second.rows,
            1,
            mm.norm.is_some() && !q8,
            false,
            false,
            mm.epi.key(),
        )?;
        let key = with_second(key, Some(part));
        let storage = key.bindings().iter().filter(|b| **b != super::Binding::Uniform).count() as u32;
        if mm.w.chunks.len() != 1
            || second.chunks.len() != 1
            || ctx.limits.max_storage_buffers_per_shader_stage < storage
        {
            return Ok(None);
        }
        let b = Self::bind(ctx, mm, stage, blocks, None, None, Some((part, &second.chunks[0].buffer, key)))?;
        Ok(Some(b))
    }

    /// Binds `mm`; with `blocks`, also the int8 GEMV reading them and the quantize dispatch
    /// writing them; with `halves`, the cooperative GEMM reading them and the dispatch
    /// rounding X into them; with `partials`, the split-K GEMM writing its partial sums there
    /// and the pass adding them up; with `second`, the rows after `mm.w`'s from that buffer
    /// through that kernel (`two_formats_in`).
    fn bind(
        ctx: &GpuContext,
        mm: &Matmul,
        stage: &'static str,
        blocks: Option<wgpu::Buffer>,
        halves: Option<wgpu::Buffer>,
        partials: Option<wgpu::Buffer>,
        second: Option<(SecondPart, &wgpu::Buffer, KernelKey)>,
    ) -> Result<BoundMatmul> {
        // Y columns written: every row's, half (SwiGLU pairs), or Q's (checked by the caller).
        let y_cols = match mm.epi {
            Epilogue::Plain | Epilogue::PlainQ8Norm { .. } => mm.w.rows,
            Epilogue::SwiGlu | Epilogue::SwiGluQ8 { .. } | Epilogue::SwiGluF16 { .. } => mm.w.rows / 2,
            Epilogue::Qkv { .. } => 0,
        };
        if mm.x_stride < mm.w.k || mm.y_stride < y_cols {
            return Err(KilnError::invalid(
                "matmul",
                format!("strides x={} y={} are smaller than k={} n={y_cols}", mm.x_stride, mm.y_stride, mm.w.k),
            ));
        }
        if mm.x_stride % 4 != 0 {
            return Err(KilnError::invalid(
                "matmul",
                format!("x rows must be padded to a multiple of 4 floats, got a stride of {}", mm.x_stride),
            ));
        }
        if mm.norm.is_some() && mm.w.k % 4 != 0 {
            return Err(KilnError::invalid("matmul", format!("a fused RMSNorm needs k % 4 == 0, got {}", mm.w.k)));
        }
        // Unused bindings get a small placeholder buffer.
        let dummy = ctx.storage(16, "unused")?;
        let bias = mm.bias.unwrap_or(&dummy);
        if mm.norm.is_some() && mm.glu.is_some() {
            return Err(KilnError::invalid("matmul", "a fused RMSNorm and SwiGLU cannot be combined"));
        }
        let norm_w = mm.norm.map(|(w, _)| w).or(mm.glu).unwrap_or(&dummy);
        // Any matmul key with this epilogue has the same bindings; the pipeline is chosen per
        // step.
        let epi = mm.epi.key();
        // (A GEMV over two formats: its own bindings, and the one kernel it runs.)
        let key = match second {
            Some((.., key)) => key,
            None => KernelKey::Gemm { format: mm.w.format, tile: crate::plan::GemmTile::T32, epi },
        };
        if epi != Epi::Plain && (mm.accumulate || mm.w.rows % 2 != 0 || mm.w.chunks.iter().any(|c| c.rows % 2 != 0)) {
            return Err(KilnError::invalid("matmul", "a fused epilogue needs whole row pairs and no accumulation"));
        }
        let mut extra: Vec<&wgpu::Buffer> = match &mm.epi {
            Epilogue::Qkv { k_cache, v_cache, rope, step, .. } => vec![k_cache, v_cache, rope, step],
            _ => Vec::new(),
        };
        // The second format's weights after the epilogue's buffers (`SECOND_WEIGHTS_BINDING`).
        if let Some((_, buffer, _)) = second {
            extra.push(buffer);
        }
        let second = second.map(|(part, ..)| part);
        // One binding of `key` per weight chunk: the chunk's weights at 1, then `rest` (X, Y,
        // bias, fused-input weights), then the epilogue's buffers (from binding 6).
        let bind_chunks = |key: &KernelKey, rest: [&wgpu::Buffer; 4], epilogue: &[&wgpu::Buffer]| {
            mm.w.chunks
                .iter()
                .map(|c| {
                    let [x, y, b, n] = rest;
                    let buffers = with_extra([&c.buffer, x, y, b, n], epilogue);
                    Bound::new::<MatmulParams>(ctx, key, stage, &buffers)
                })
                .collect::<Result<Vec<_>>>()
        };
        let chunks = bind_chunks(&key, [mm.x, mm.y, bias, norm_w], &extra)?
            .into_iter()
            .zip(&mm.w.chunks)
            .map(|(b, c)| (b, c.row_start, c.rows + second.map_or(0, |s| s.rows)))
            .collect();
        let q8 = if let Some(blocks) = blocks {
            if !mm.w.format.is_quantized() {
                return Err(KilnError::invalid("matmul", format!("no int8-activation GEMV for {}", mm.w.format)));
            }
            let (norm, glu) = (mm.norm.is_some(), mm.glu.is_some());
            let qkey = KernelKey::QuantizeQ8 { subgroups: ctx.caps.subgroups, norm, glu, lanes: false };
            // Binding 1 (weights) is unused by the quantizer; any buffer fills it.
            let quantize = Bound::new::<MatmulParams>(ctx, &qkey, stage, &[mm.x, mm.x, &blocks, bias, norm_w])?;
            let chunks = bind_chunks(&key, [&blocks, mm.y, bias, &dummy], &extra)?;
            Some(Q8Input { quantize, key: qkey, chunks, blocks })
        } else {
            None
        };
        let q8_out = match (&mm.epi, &q8) {
            (Epilogue::SwiGluQ8 { blocks: out }, Some(input)) => {
                let (n, half) = (mm.w.rows, mm.w.rows / 2);
                if half % 32 != 0 || mm.y_stride != half || mm.w.chunks.iter().any(|c| c.row_start % 64 != 0) {
                    return Err(KilnError::invalid(
                        "matmul",
                        format!("the int8 SwiGLU epilogue needs outputs in whole blocks of 32 (n={n}, y stride {}) and chunks on them", mm.y_stride),
                    ));
                }
                if *out == &input.blocks
                    || out.size() < q8_input_bytes(x_rows(mm).min(crate::plan::GEMV_MAX_COLS), half)
                {
                    return Err(KilnError::invalid(
                        "matmul",
                        "the int8 SwiGLU epilogue's blocks must be a buffer of their own, large enough for its columns",
                    ));
                }
                // The input quantized by each workgroup where the adapter takes it: X through
                // the RMSNorm, one column of at most GEMV_Q8_LOCAL_INPUT_MAX_K values.
                let local_input =
                    ctx.caps.q8_swiglu_norm && mm.norm.is_some() && mm.w.k <= crate::plan::GEMV_Q8_LOCAL_INPUT_MAX_K;
                // Any int8 GEMV key with this epilogue (and input) has its bindings.
                let okey = KernelKey::Gemv {
                    format: mm.w.format,
                    ncols: 1,
                    rows: crate::plan::GEMV_Q8_SWIGLU.rows as u8,
                    groups: crate::plan::GEMV_Q8_SWIGLU.groups as u8,
                    wg: crate::plan::GEMV_Q8_SWIGLU.wg as u16,
                    subgroups: ctx.caps.subgroups,
                    norm: local_input,
                    glu: false,
                    q8: true,
                    x_local: local_input,
                    epi: Epi::SwiGluQ8,
                    second: None,
                };
                let (x_in, norm_in) = if local_input { (mm.x, norm_w) } else { (&input.blocks, &dummy) };
                let chunks = bind_chunks(&okey, [x_in, mm.y, bias, norm_in], &[out])?;
                let shape = ctx.caps.q8_swiglu.unwrap_or(crate::plan::GEMV_Q8_SWIGLU);
                Some(Q8Output { chunks, blocks: (*out).clone(), local_input, epi: Epi::SwiGluQ8, shape })
            }
            (Epilogue::PlainQ8Norm { blocks: out, norm_w: out_norm }, Some(input)) => {
                let n = mm.w.rows;
                let shape = ctx.caps.q8_add_norm.ok_or_else(|| {
                    KilnError::invalid("matmul", "the int8 residual epilogue where the adapter does not take it")
                })?;
                if n % 32 != 0
                    || mm.y_stride != n
                    || mm.w.chunks.iter().any(|c| c.row_start % 32 != 0)
                    || mm.norm.is_some()
                    || mm.glu.is_some()
                {
                    return Err(KilnError::invalid(
                        "matmul",
                        format!("the int8 residual epilogue needs outputs in whole blocks of 32 (n={n}, y stride {}), chunks on them and no fused input", mm.y_stride),
                    ));
                }
                if *out == &input.blocks || out.size() < q8_input_bytes(1, n) || out_norm.size() < n as u64 * 4 {
                    return Err(KilnError::invalid(
                        "matmul",
                        "the int8 residual epilogue's blocks must be a buffer of their own for one column, and its norm weights cover n",
                    ));
                }
                let okey = KernelKey::Gemv {
                    format: mm.w.format,
                    ncols: 1,
                    rows: shape.rows as u8,
                    groups: shape.groups as u8,
                    wg: shape.wg as u16,
                    subgroups: ctx.caps.subgroups,
                    norm: false,
                    glu: false,
                    q8: true,
                    x_local: false,
                    epi: Epi::AddQ8Norm,
                    second: None,
                };
                let chunks = bind_chunks(&okey, [&input.blocks, mm.y, bias, &dummy], &[out, out_norm])?;
                Some(Q8Output { chunks, blocks: (*out).clone(), local_input: false, epi: Epi::AddQ8Norm, shape })
            }
            _ => None,
        };
        let pkey = KernelKey::Gemm { format: mm.w.format, tile: crate::plan::GemmTile::T32, epi: Epi::Partial };
        let split = match &partials {
            Some(scratch) => {
                let rkey = KernelKey::GemmReduce { epi };
                let partial = bind_chunks(&pkey, [mm.x, scratch, &dummy, &dummy], &[])?;
                let reduce = bind_chunks(&rkey, [scratch, mm.y, bias, &dummy], &extra)?;
                Some(SplitK { partial, reduce, scratch_floats: scratch.size() / 4 })
            }
            None => None,
        };
        let half = match halves {
            Some(halves) => {
                let stride = half_stride(mm.w.k);
                if halves.size() < x_rows(mm) as u64 * stride as u64 * 2 {
                    return Err(KilnError::invalid("matmul", "the f16 input buffer is shorter than X"));
                }
                // Binding 1 (weights) is unused by the conversion; any buffer fills it.
                let convert =
                    Bound::new::<MatmulParams>(ctx, &KernelKey::ToHalf, stage, &[mm.x, mm.x, &halves, &dummy, &dummy])?;
                let chunks = bind_chunks(&key, [&halves, mm.y, bias, &dummy], &extra)?;
                let partial = match &partials {
                    Some(scratch) => bind_chunks(&pkey, [&halves, scratch, &dummy, &dummy], &[])?,
                    None => Vec::new(),
                };
                Some(HalfInput { convert, chunks, partial, halves, stride })
            }
            None => None,
        };
        let f16_out = match &mm.epi {
            Epilogue::SwiGluF16 { halves: out } => {
                let outs = mm.w.rows / 2;
                if outs % 8 != 0 || mm.y_stride != outs {
                    return Err(KilnError::invalid(
                        "matmul",
                        format!("the f16 SwiGLU epilogue needs rows of outputs that are whole halves' rows (n={}, y stride {})", mm.w.rows, mm.y_stride),
                    ));
                }
                let own_input = half.as_ref().is_some_and(|h| h.halves == **out);
                if own_input || out.size() < x_rows(mm) as u64 * outs as u64 * 2 {
                    return Err(KilnError::invalid(
                        "matmul",
                        "the f16 SwiGLU epilogue's halves must be a buffer of their own, large enough for X's rows",
                    ));
                }
                let key =
                    KernelKey::Gemm { format: mm.w.format, tile: crate::plan::GemmTile::T32, epi: Epi::SwiGluF16 };
                let chunks = bind_chunks(&key, [mm.x, mm.y, bias, norm_w], &[out])?;
                let half_chunks = match &half {
                    Some(h) => bind_chunks(&key, [&h.halves, mm.y, bias, &dummy], &[out])?,
                    None => Vec::new(),
                };
                let reduce = match &partials {
                    Some(scratch) => bind_chunks(
                        &KernelKey::GemmReduce { epi: Epi::SwiGluF16 },
                        [scratch, mm.y, bias, &dummy],
                        &[out],
                    )?,
                    None => Vec::new(),
                };
                Some(F16Output { chunks, half_chunks, reduce, halves: (*out).clone() })
            }
            _ => None,
        };
        Ok(BoundMatmul {
            q8,
            q8_out,
            f16_out,
            half,
            split,
            forced_splits: None,
            gemv_cols: u32::MAX,
            fed_q8: false,
            dequant: None,
            stage,
            format: mm.w.format,
            k: mm.w.k,
            n: mm.w.rows + second.map_or(0, |s| s.rows),
            second,
            chunks,
            x_stride: mm.x_stride,
            y_stride: mm.y_stride,
            has_bias: mm.bias.is_some(),
            accumulate: mm.accumulate,
            norm_eps: mm.norm.map(|(_, e)| e),
            glu: mm.glu.is_some(),
            epi,
            row_base: match mm.epi {
                Epilogue::Qkv { row_base, .. } => row_base,
                _ => 0,
            },
        })
    }

    /// The parameters of one weight chunk's dispatch over m columns.
    fn params(&self, m: u32, row_start: u32, rows: u32) -> MatmulParams {
        MatmulParams {
            m,
            k: self.k,
            n_rows: rows,
            row_offset: self.row_base + row_start,
            x_stride: self.x_stride,
            y_stride: self.y_stride,
            has_bias: self.has_bias as u32,
            accumulate: self.accumulate as u32,
            eps: self.norm_eps.unwrap_or(0.0),
            splits: 1,
            split_k: self.k,
            first_rows: self.second.map_or(rows, |s| s.first_rows),
        }
    }

    /// A GEMM's K ranges over m columns of a chunk of `rows` rows: (weights per range,
    /// ranges); one range where it is not split or cannot be.
    fn split_k(&self, ctx: &GpuContext, m: u32, rows: u32, tile: crate::plan::GemmTile) -> (u32, u32) {
        let Some(split) = &self.split else { return (self.k, 1) };
        let want = self.forced_splits.unwrap_or_else(|| crate::plan::gemm_splits(m, rows, self.k, tile, &ctx.caps));
        let (len, splits) = crate::plan::split_k_range(self.k, tile, want);
        if splits > 1 && splits as u64 * m as u64 * rows as u64 <= split.scratch_floats {
            (len, splits)
        } else {
            (self.k, 1)
        }
    }

    /// Whether this matmul runs a step over m columns (`batched`: a batched decode step's):
    /// every step, but one over two formats (`two_formats_in`) only one sequence's one-token
    /// steps.
    pub fn takes_step(&self, m: u32, batched: bool) -> bool {
        self.second.is_none() || (!batched && m == 1)
    }

    /// The kernel the planner picks for a step of one sequence over m columns.
    pub fn plan(&self, ctx: &GpuContext, m: u32) -> MatmulKernel {
        if m > self.gemv_cols {
            return self.planned_gemm(ctx, m);
        }
        self.fitted(ctx, m, crate::plan::plan_matmul(m, self.n, self.k, self.format, &ctx.caps))
    }

    /// The planner's GEMM over m columns (`fitted`).
    fn planned_gemm(&self, ctx: &GpuContext, m: u32) -> MatmulKernel {
        self.fitted(ctx, m, crate::plan::plan_gemm(m, self.n, self.k, self.format, &ctx.caps))
    }

    /// The planner's `kernel` over m columns, but where it is a workgroup-scope tile this
    /// matmul does not fit (`cm2_fits`), the GEMM the planner picks without them.
    fn fitted(&self, ctx: &GpuContext, m: u32, kernel: MatmulKernel) -> MatmulKernel {
        if kernel == (MatmulKernel::Gemm { tile: crate::plan::GemmTile::Cm2 }) && !self.cm2_fits() {
            let caps = crate::gpu::Caps { cm2: false, ..ctx.caps };
            return crate::plan::plan_gemm(m, self.n, self.k, self.format, &caps);
        }
        kernel
    }

    /// Whether the workgroup-scope GEMM (kernels/gemm_cm2.rs) can run this matmul: its
    /// epilogue is Y's plain write (+ Y) without a bias, the weights are one chunk, X's halves
    /// come in rows of whole 16-byte units, and K is not split.
    fn cm2_fits(&self) -> bool {
        self.epi == Epi::Plain
            && !self.has_bias
            && self.chunks.len() == 1
            && self.forced_splits.is_none()
            && self.second.is_none()
            && self.half.as_ref().is_some_and(|h| h.stride % 8 == 0)
    }

    /// The kernel for m columns: a batched decode step's (`batched`: the planner's choice,
    /// the GEMV wherever it takes m) or one sequence's (`plan`; one column on the int8 GEMV
    /// where its input arrives quantized, `fed_q8_in`); for one column on the int8
    /// GEMV, the int8 SwiGLU epilogue's shape where this matmul has it and the adapter takes it
    /// (`Caps::q8_swiglu`).
    fn plan_step(&self, ctx: &GpuContext, m: u32, batched: bool) -> MatmulKernel {
        if let Some(s) = self.second {
            return s.kernel;
        }
        let kernel = if batched {
            crate::plan::plan_matmul(m, self.n, self.k, self.format, &ctx.caps)
        } else if self.fed_q8 && m == 1 {
            let caps = crate::gpu::Caps { int8_gemv_always: true, ..ctx.caps };
            crate::plan::plan_matmul(m, self.n, self.k, self.format, &caps)
        } else {
            self.plan(ctx, m)
        };
        match (kernel, &self.q8_out) {
            // (The residual epilogue for one sequence's steps only: batched ones quantize.)
            (MatmulKernel::Gemv { q8: true, .. }, Some(o)) if m == 1 && !(batched && o.epi == Epi::AddQ8Norm) => {
                MatmulKernel::Gemv { ncols: 1, shape: o.shape, q8: true }
            }
            // A gate/up projection with the float SwiGLU output (too large for the int8 one).
            (MatmulKernel::Gemv { q8: true, ncols: 1, shape }, None)
                if m == 1 && !batched && self.epi == Epi::SwiGlu =>
            {
                let shape = crate::plan::gemv_q8_glu_float_shape(self.format, self.n, self.k).unwrap_or(shape);
                MatmulKernel::Gemv { ncols: 1, shape, q8: true }
            }
            _ => kernel,
        }
    }

    /// Whether `kernel` writes the int8 epilogue's blocks.
    fn writes_q8_out(&self, kernel: MatmulKernel) -> bool {
        match (kernel, &self.q8_out) {
            (MatmulKernel::Gemv { q8: true, shape, ncols }, Some(o)) => {
                o.covered_by(shape) && (o.epi != Epi::AddQ8Norm || ncols == 1)
            }
            _ => false,
        }
    }

    /// The int8 blocks this matmul's step over m columns also writes its output into
    /// (`Epilogue::SwiGluQ8`, `Epilogue::PlainQ8Norm`), for the GEMV that reads them next
    /// (`record_after`).
    pub fn q8_output(&self, ctx: &GpuContext, m: u32, batched: bool) -> Option<&wgpu::Buffer> {
        let kernel = self.plan_step(ctx, m, batched);
        self.q8_out.as_ref().filter(|_| self.writes_q8_out(kernel)).map(|o| &o.blocks)
    }

    /// The int8 blocks a one-token step of one sequence reads as its input through its fused
    /// RMSNorm, the norm's 1 / rms taken from the blocks' sums of squares
    /// (`Caps::quantize_lanes`): what the int8 residual epilogue of the matmul before it can
    /// write instead of this one's quantize dispatch (`Epilogue::PlainQ8Norm`). None where the
    /// step runs another kernel or quantizes its own input.
    pub fn q8_input_through_norm(&self, ctx: &GpuContext) -> Option<&wgpu::Buffer> {
        let kernel = self.plan_step(ctx, 1, false);
        let lanes = self.lanes_input(ctx, 1, self.quantizes_own_input(kernel));
        match kernel {
            MatmulKernel::Gemv { q8: true, .. } if lanes && self.norm_eps.is_some() && !self.glu => {
                self.q8.as_ref().map(|q| &q.blocks)
            }
            _ => None,
        }
    }

    /// Whether `kernel` is the int8 GEMV quantizing its own input (`Q8Output::local_input`).
    fn quantizes_own_input(&self, kernel: MatmulKernel) -> bool {
        self.writes_q8_out(kernel) && self.q8_out.as_ref().is_some_and(|o| o.local_input)
    }

    /// Whether a step over m columns takes its int8 input quantized 8 invocations a block, the
    /// RMSNorm's 1 / rms left to the GEMV (`Caps::quantize_lanes`): chosen by m alone, so that
    /// every group member reading the blocks one of them wrote takes them alike.
    fn lanes_input(&self, ctx: &GpuContext, m: u32, local_input: bool) -> bool {
        ctx.caps.quantize_lanes && self.k % 32 == 0 && m == 1 && !local_input
    }

    /// What one call over m columns does, for the profile: the kernel the planner picks (for
    /// one sequence's step or, `batched`, a batched decode step's), the shape, and the bytes
    /// (weights, X, Y) and flops it needs at the least.
    pub fn work(&self, ctx: &GpuContext, m: u32, batched: bool) -> crate::profile::StageWork {
        let fused = match (self.norm_eps.is_some(), self.glu) {
            (true, _) => "+norm",
            (_, true) => "+swiglu",
            _ => "",
        };
        let bytes = |format: crate::quant::WeightFormat, rows: u32| {
            format.gpu_tensor_bytes(rows as usize, self.k as usize).unwrap_or(0) as f64
        };
        let (w_bytes, formats) = match self.second {
            Some(s) => (
                bytes(self.format, s.first_rows) + bytes(s.format, s.rows),
                format!("{}+{}", self.format.name(), s.format.name()),
            ),
            None => (bytes(self.format, self.n), self.format.name().to_string()),
        };
        let (m64, k64, n64) = (m as f64, self.k as f64, self.n as f64);
        let x_bytes = m64 * k64 * 4.0 * if self.glu { 2.0 } else { 1.0 };
        let y_bytes = m64 * n64 * 4.0 * if self.accumulate { 2.0 } else { 1.0 };
        let kernel = self.plan_step(ctx, m, batched);
        if let Some(route) = self.dequant_route(m, kernel) {
            // The copy's GEMM, after the decoder read the weights and wrote them as halves.
            let mut work = route.f16.work(ctx, m, batched);
            if route.decode.is_some() {
                work.kernel = format!("dequant_f16+{} from {formats}", work.kernel);
                work.bytes += w_bytes + n64 * k64 * 2.0;
            } else {
                work.kernel = format!("{} over a resident f16 copy of {formats}", work.kernel);
            }
            return work;
        }
        let q8_out = match &self.q8_out {
            Some(o) if self.writes_q8_out(kernel) && o.local_input => "+q8in+q8out",
            Some(_) if self.writes_q8_out(kernel) => "+q8out",
            _ => "",
        };
        let split = match kernel {
            MatmulKernel::Gemm { tile } => {
                let rows = self.chunks.iter().map(|c| c.2).max().unwrap_or(self.n);
                match self.split_k(ctx, m, rows, tile).1 {
                    1 => String::new(),
                    s => format!("+splitK{s}"),
                }
            }
            _ => String::new(),
        };
        crate::profile::StageWork {
            kernel: format!("{kernel}{split}{fused}{q8_out} {formats}"),
            shape: format!("{m}x{}·{}", self.k, self.n),
            bytes: w_bytes + x_bytes + y_bytes,
            flops: 2.0 * m64 * k64 * n64,
        }
    }

    /// Records Y[0..m] = X[0..m] · Wᵀ with the planner's kernel: for one sequence's step, or
    /// (`batched`) a batched decode step's columns, which stay on the GEMV wherever it takes
    /// them so that a column's result does not depend on the columns beside it.
    pub fn record(&self, ctx: &GpuContext, pass: &mut wgpu::ComputePass<'_>, m: u32, batched: bool) -> Result<()> {
        self.record_after(ctx, pass, m, batched, Prepared::default())
    }

    /// As `record_after`, writing its SwiGLU output as the halves `into` (the next matmul's f16
    /// input, `half_input`; None for a batched step) instead of the float Y where that is the
    /// buffer this matmul was bound to write (`Epilogue::SwiGluF16`) and a GEMM runs; whether
    /// it did.
    pub fn record_into_halves(
        &self,
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        m: u32,
        batched: bool,
        prepared: Prepared<'_>,
        into: Option<&wgpu::Buffer>,
    ) -> Result<bool> {
        let kernel = self.plan_step(ctx, m, batched);
        let halves = into.is_some()
            && self.f16_out.as_ref().map(|o| &o.halves) == into
            && matches!(kernel, MatmulKernel::Gemm { .. });
        let end = if halves { StepEnd::Halves } else { StepEnd::Y };
        for (b, pipeline, grid) in self.dispatches(ctx, m, kernel, prepared, batched, end)? {
            b.record_with(pass, &pipeline, grid);
        }
        Ok(halves)
    }

    /// As `record_after` for one sequence's step, but where the planner splits the GEMM along
    /// K and its epilogue is a plain residual add (one weight chunk, no bias), it stops after
    /// the partial sums: the caller's pass adds them to Y (reduce_norm.wgsl, the reduce folded
    /// into the RMSNorm after it). What it left, or None where it recorded the whole matmul.
    pub fn record_leaving_reduce(
        &self,
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        m: u32,
        prepared: Prepared<'_>,
    ) -> Result<Option<LeftPartials>> {
        let kernel = self.plan_step(ctx, m, false);
        let left = self.leaves_partials(ctx, m, kernel);
        let end = if left.is_some() { StepEnd::Partials } else { StepEnd::Y };
        for (b, pipeline, grid) in self.dispatches(ctx, m, kernel, prepared, false, end)? {
            b.record_with(pass, &pipeline, grid);
        }
        Ok(left)
    }

    /// The partial sums a step of `kernel` over m columns can leave for the caller's reduce
    /// (`record_leaving_reduce`): a split GEMM (over the f16 copy where it reads one) whose
    /// epilogue only adds Y to the value there.
    fn leaves_partials(&self, ctx: &GpuContext, m: u32, kernel: MatmulKernel) -> Option<LeftPartials> {
        if let Some(route) = self.dequant_route(m, kernel) {
            return route.f16.leaves_partials(ctx, m, route.f16.plan(ctx, m));
        }
        let MatmulKernel::Gemm { tile } = kernel else { return None };
        let plain_add = self.epi == Epi::Plain && self.accumulate && !self.has_bias && self.row_base == 0;
        let one_chunk = matches!(self.chunks[..], [(_, 0, _)]);
        if !plain_add || !one_chunk || self.second.is_some() || self.split.is_none() {
            return None;
        }
        let rows = self.chunks[0].2;
        let (_, splits) = self.split_k(ctx, m, rows, tile);
        (splits > 1).then_some(LeftPartials { splits, rows })
    }

    /// The f16 copy of X (and its row stride in halves) that one sequence's step of m tokens
    /// reads, where the planner puts it on the cooperative GEMM: a dispatch before it may
    /// write it (the RMSNorm, `Caps::prefill_f16_inputs`) instead of its to_half dispatch.
    pub fn half_input(&self, ctx: &GpuContext, m: u32) -> Option<(&wgpu::Buffer, u32)> {
        match self.plan(ctx, m) {
            MatmulKernel::Gemm { tile } if tile.is_coop() => self.half.as_ref().map(|h| (&h.halves, h.stride)),
            _ => None,
        }
    }

    /// The buffer of the f16 copy of X, where the cooperative GEMM may run.
    pub fn half_buffer(&self) -> Option<&wgpu::Buffer> {
        self.half.as_ref().map(|h| &h.halves)
    }

    /// As `record`, after a dispatch that wrote this one's input already (`Prepared`: the
    /// down projection's int8 blocks from the gate/up epilogue, the f16 copy of X from the
    /// RMSNorm): no quantize or to_half dispatch for it.
    pub fn record_after(
        &self,
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        m: u32,
        batched: bool,
        prepared: Prepared<'_>,
    ) -> Result<()> {
        self.record_into_halves(ctx, pass, m, batched, prepared, None).map(|_| ())
    }

    /// Records the members of one `group` over m columns with the kernels the planner picks:
    /// the shared input is quantized (or rounded to f16) once, by the first member whose
    /// kernel reads it so.
    /// `batched`: the columns are a batched decode step's (the Q/K/V epilogue reads each
    /// column's position and cache region from the step's table).
    pub fn record_group(
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        group: &[&BoundMatmul],
        m: u32,
        batched: bool,
    ) -> Result<()> {
        Self::record_group_with(ctx, pass, group, m, batched, Prepared::default())
    }

    /// As `record_group`, after a dispatch that `prepared` the shared input (the int8 blocks the
    /// residual epilogue wrote, `Epilogue::PlainQ8Norm`).
    pub fn record_group_with(
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        group: &[&BoundMatmul],
        m: u32,
        batched: bool,
        prepared: Prepared<'_>,
    ) -> Result<()> {
        Self::record_group_as(ctx, pass, group, m, batched, batched, prepared)
    }

    /// As `record_group` for one sequence's step (`rows`: as `record_group_rows`, several
    /// sequences' prompt chunks), after a dispatch that `prepared` the shared input.
    pub fn record_group_after(
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        group: &[&BoundMatmul],
        m: u32,
        rows: bool,
        prepared: Prepared<'_>,
    ) -> Result<()> {
        Self::record_group_as(ctx, pass, group, m, false, rows, prepared)
    }

    /// As `record_group`, over the rows of several sequences' prompt chunks side by side: the
    /// kernels a step of m tokens of one sequence takes, the Q/K/V epilogue reading each
    /// row's position and cache region from the step's table.
    pub fn record_group_rows(
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        group: &[&BoundMatmul],
        m: u32,
    ) -> Result<()> {
        Self::record_group_as(ctx, pass, group, m, false, true, Prepared::default())
    }

    /// `record_group` with the planner's choice (`plan_batched`: a batched decode step's) and
    /// the epilogue variant (`table`: each column's position from the step's table) apart.
    fn record_group_as(
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        group: &[&BoundMatmul],
        m: u32,
        plan_batched: bool,
        table: bool,
        prepared: Prepared<'_>,
    ) -> Result<()> {
        let mut prepared = prepared;
        for b in group {
            let kernel = b.plan_step(ctx, m, plan_batched);
            for (bound, pipeline, grid) in b.dispatches(ctx, m, kernel, prepared, table, StepEnd::Y)? {
                bound.record_with(pass, &pipeline, grid);
            }
            match kernel {
                MatmulKernel::Gemv { q8: true, .. } => prepared.blocks = b.q8.as_ref().map(|q| &q.blocks),
                MatmulKernel::Gemm { tile } if tile.is_coop() => prepared.halves = b.half.as_ref().map(|h| &h.halves),
                _ => {}
            }
        }
        Ok(())
    }

    /// The bindings (parameters written), pipelines and grids of `kernel` over m columns:
    /// for the int8 GEMV the quantize dispatch, for the cooperative GEMM the f16 conversion
    /// (each unless a group member `prepared` the same buffer already), then one matmul per
    /// weight chunk; `batched` picks the epilogue variant of a batched decode step; `end`: where
    /// the result goes (`StepEnd::Partials` only where `leaves_partials` says it can).
    fn dispatches(
        &self,
        ctx: &GpuContext,
        m: u32,
        kernel: MatmulKernel,
        prepared: Prepared<'_>,
        batched: bool,
        end: StepEnd,
    ) -> Result<Vec<StepDispatch<'_>>> {
        if self.second.is_some_and(|s| s.kernel != kernel) || !self.takes_step(m, batched) {
            return Err(KilnError::invalid(
                "matmul",
                format!("{}: no GEMV over two formats for this step", self.stage),
            ));
        }
        if kernel == (MatmulKernel::Gemm { tile: crate::plan::GemmTile::Cm2 }) && !self.cm2_fits() {
            return Err(KilnError::invalid(
                "matmul",
                format!("{}: the workgroup-scope GEMM takes a plain epilogue over one chunk, unsplit", self.stage),
            ));
        }
        // Over the f16 copy: the weights decoded into it, then the copy's GEMM.
        if let Some(route) = self.dequant_route(m, kernel) {
            let mut out = Vec::new();
            if let Some(decode) = &route.decode {
                decode.set(ctx, &self.params(m, 0, self.n));
                let key = KernelKey::DequantF16 { format: self.format };
                out.push((decode, ctx.pipeline(&key)?, dequant_grid(self.n, self.k)));
            }
            let f16 = &route.f16;
            out.extend(f16.dispatches(ctx, m, f16.plan(ctx, m), prepared, batched, end)?);
            return Ok(out);
        }
        let mut epi = if batched { self.epi.batched() } else { self.epi };
        // The GEMMs writing their SwiGLU output as halves (`Epilogue::SwiGluF16`).
        let f16_out =
            self.f16_out.as_ref().filter(|_| end == StepEnd::Halves && matches!(kernel, MatmulKernel::Gemm { .. }));
        if f16_out.is_some() {
            epi = Epi::SwiGluF16;
        }
        let norm = self.norm_eps.is_some();
        let mut out = Vec::new();
        // X's stride as the kernel reads it (halves per row for the cooperative GEMM).
        let mut x_stride = self.x_stride;
        let mut half_partials: Option<&Vec<Bound>> = None;
        let local_input = self.quantizes_own_input(kernel);
        // One token's int8 input quantized 8 invocations a block (`lanes_input`); its bindings
        // are the other quantizer's.
        let lanes_key = self.lanes_input(ctx, m, local_input).then_some(KernelKey::QuantizeQ8 {
            subgroups: true,
            norm,
            glu: self.glu,
            lanes: true,
        });
        // The fused input the kernel applies itself: the int8 GEMV's is applied by its quantize
        // dispatch (`Q8Input`), but where the GEMV quantizes its own input or takes the norm's
        // 1 / rms from the blocks.
        let q8 = matches!(kernel, MatmulKernel::Gemv { q8: true, .. });
        let kernel_norm = norm && (!q8 || local_input || lanes_key.is_some());
        let kernel_glu = self.glu && !q8;
        let chunks: Vec<&Bound> = match kernel {
            MatmulKernel::Gemv { q8: true, .. } => {
                let q8 = self.q8.as_ref().ok_or_else(|| {
                    KilnError::invalid("matmul", format!("{} was bound without the int8 GEMV's input", self.stage))
                })?;
                if !local_input && prepared.blocks != Some(&q8.blocks) {
                    q8.quantize.set(ctx, &self.params(m, 0, 0));
                    // One workgroup per QUANTIZE_WG blocks and group of the quantizer's columns,
                    // or per QUANTIZE_LANES_WG vectors of 4 values.
                    let (key, grid) = match lanes_key {
                        Some(key) => (key, grid((self.k / 4).div_ceil(super::QUANTIZE_LANES_WG))),
                        None => {
                            let [gx, gy, _] = grid((self.k / 32).div_ceil(super::QUANTIZE_WG));
                            (q8.key, [gx, gy, m.div_ceil(crate::plan::GEMV_Q8_GROUP_COLS).max(1)])
                        }
                    };
                    out.push((&q8.quantize, ctx.pipeline(&key)?, grid));
                }
                match &self.q8_out {
                    Some(o) if self.writes_q8_out(kernel) => {
                        epi = o.epi;
                        o.chunks.iter().collect()
                    }
                    _ => q8.chunks.iter().collect(),
                }
            }
            MatmulKernel::Gemm { tile } if tile.is_coop() => {
                let half = self.half.as_ref().ok_or_else(|| {
                    KilnError::invalid(
                        "matmul",
                        format!("{} was bound without the cooperative GEMM's f16 input", self.stage),
                    )
                })?;
                if prepared.halves != Some(&half.halves) {
                    half.convert.set(ctx, &MatmulParams { y_stride: half.stride, ..self.params(m, 0, 0) });
                    let chunks8 = m * (half.stride / 8);
                    out.push((&half.convert, ctx.pipeline(&KernelKey::ToHalf)?, grid(chunks8.div_ceil(super::WG_ELT))));
                }
                x_stride = half.stride;
                half_partials = Some(&half.partial);
                match f16_out {
                    Some(o) => o.half_chunks.iter().collect(),
                    None => half.chunks.iter().collect(),
                }
            }
            _ => match f16_out {
                Some(o) => o.chunks.iter().collect(),
                None => self.chunks.iter().map(|(b, ..)| b).collect(),
            },
        };
        for (i, (b, (_, row_start, rows))) in chunks.into_iter().zip(&self.chunks).enumerate() {
            let (key, grid) = launch(ctx, kernel, self.format, *rows, m, kernel_norm, kernel_glu, local_input, epi)?;
            let key = with_second(key, self.second);
            let params = MatmulParams { x_stride, ..self.params(m, *row_start, *rows) };
            if let (MatmulKernel::Gemm { tile }, Some(split)) = (kernel, &self.split) {
                let (split_k, splits) = self.split_k(ctx, m, *rows, tile);
                if splits > 1 {
                    let params = MatmulParams { splits, split_k, ..params };
                    // The GEMM over each K range into the scratch, then the sums through the
                    // epilogue: one invocation per pair of outputs.
                    let partial = &half_partials.unwrap_or(&split.partial)[i];
                    partial.set(ctx, &params);
                    let pkey = KernelKey::Gemm { format: self.format, tile, epi: Epi::Partial };
                    out.push((partial, ctx.pipeline(&pkey)?, [grid[0], grid[1], splits]));
                    if end == StepEnd::Partials {
                        continue;
                    }
                    // The reduce pass reads the partials, not X: its parameters keep X's stride.
                    let params = MatmulParams { splits, split_k, ..self.params(m, *row_start, *rows) };
                    let reduce = match f16_out {
                        Some(o) => &o.reduce[i],
                        None => &split.reduce[i],
                    };
                    reduce.set(ctx, &params);
                    let pairs = m * rows.div_ceil(2);
                    let rkey = KernelKey::GemmReduce { epi };
                    out.push((reduce, ctx.pipeline(&rkey)?, crate::gpu::grid(pairs.div_ceil(super::WG_ELT))));
                    continue;
                }
            }
            b.set(ctx, &params);
            out.push((b, ctx.pipeline(&key)?, grid));
        }
        Ok(out)
    }
}

/// One dispatch of a matmul's step: its bindings, pipeline and grid.
type StepDispatch<'a> = (&'a Bound, std::sync::Arc<wgpu::ComputePipeline>, [u32; 3]);

/// Where a matmul's step leaves its result.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StepEnd {
    /// Through its epilogue into Y.
    Y,
    /// Its SwiGLU output as the next GEMM's halves (`Epilogue::SwiGluF16`).
    Halves,
    /// A split GEMM's partial sums, its reduce pass left to the caller
    /// (`BoundMatmul::record_leaving_reduce`).
    Partials,
}

/// A split-K GEMM's partial sums left in the scratch for the caller's pass to add up
/// (`BoundMatmul::record_leaving_reduce`): [splits][m][rows] floats.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LeftPartials {
    pub splits: u32,
    pub rows: u32,
}

/// The inputs prepared already in this step, whose quantize or to_half dispatch a matmul then
/// skips: by a group member (`BoundMatmul::record_group`), the gate/up epilogue (the down
/// projection's int8 blocks, `BoundMatmul::q8_output`) or the RMSNorm before it (the f16 copy
/// of X, `BoundMatmul::half_input`).
#[derive(Default, Clone, Copy)]
pub struct Prepared<'b> {
    pub blocks: Option<&'b wgpu::Buffer>,
    pub halves: Option<&'b wgpu::Buffer>,
}

/// One-off dispatches for `mm` with the kernel the planner picks (tests, tools).
pub fn prepare(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<Vec<Dispatch>> {
    let kernel = crate::plan::plan_matmul(mm.m, mm.w.rows, mm.w.k, mm.w.format, &ctx.caps);
    prepare_with(ctx, mm, kernel, stage)
}

/// As `prepare`, with the kernel chosen by the caller (benchmarks, tests of each variant).
pub fn prepare_with(ctx: &GpuContext, mm: &Matmul, kernel: MatmulKernel, stage: &'static str) -> Result<Vec<Dispatch>> {
    prepare_columns(ctx, mm, kernel, stage, false)
}

/// As `prepare_with`; `batched`: the Q/K/V epilogue of a batched decode step, each column at
/// the position and cache region its `StepColumn` in the step buffer says (tests).
pub fn prepare_columns(
    ctx: &GpuContext,
    mm: &Matmul,
    kernel: MatmulKernel,
    stage: &'static str,
    batched: bool,
) -> Result<Vec<Dispatch>> {
    let q8 = matches!(kernel, MatmulKernel::Gemv { q8: true, .. });
    let bm = BoundMatmul::with_q8(ctx, mm, stage, q8)?;
    one_off(ctx, &bm, mm.m, kernel, batched, stage)
}

/// `bm`'s dispatches of `kernel` over m columns as stand-alone `Dispatch`es (their bind
/// groups and parameters cloned out of `bm`).
fn one_off(
    ctx: &GpuContext,
    bm: &BoundMatmul,
    m: u32,
    kernel: MatmulKernel,
    batched: bool,
    stage: &'static str,
) -> Result<Vec<Dispatch>> {
    let dispatches = bm
        .dispatches(
            ctx,
            m,
            kernel,
            Prepared::default(),
            batched,
            if bm.f16_out.is_some() { StepEnd::Halves } else { StepEnd::Y },
        )?
        .into_iter()
        .map(|(b, pipeline, grid)| Dispatch {
            label: stage,
            pipeline,
            bind_group: b.bind_group.clone(),
            workgroups: grid,
            params: Some(b.params.clone()),
        })
        .collect();
    Ok(dispatches)
}

/// One-off dispatches of one GEMV on `kernel` over a Q/K/V projection stacked from two
/// formats (`mm.w` its first rows, `second` the rest; tests of `BoundMatmul::two_formats_in`'s
/// kernels); an error where the adapter cannot bind it.
pub fn prepare_two_formats(
    ctx: &GpuContext,
    mm: &Matmul,
    second: &WeightTensor,
    kernel: MatmulKernel,
    stage: &'static str,
) -> Result<Vec<Dispatch>> {
    let blocks = match kernel {
        MatmulKernel::Gemv { q8: true, .. } => Some(q8_blocks(ctx, mm.w.k)?),
        _ => None,
    };
    let bm = BoundMatmul::bind_two_formats(ctx, mm, second, kernel, stage, blocks)?
        .ok_or_else(|| KilnError::invalid("matmul", "this adapter cannot bind a GEMV over two formats"))?;
    one_off(ctx, &bm, mm.m, kernel, false, stage)
}

/// One-off dispatches for `mm` on `kernel` (a GEMM) split into `splits` K ranges (fewer where
/// K has fewer steps), the partial sums in a scratch buffer of their own (tests of split-K);
/// `batched`: the Q/K/V epilogue reads each column's position from the step's table.
pub fn prepare_split(
    ctx: &GpuContext,
    mm: &Matmul,
    kernel: MatmulKernel,
    splits: u32,
    stage: &'static str,
    batched: bool,
) -> Result<Vec<Dispatch>> {
    let scratch = ctx.storage(SPLIT_K_SCRATCH_BYTES, "split-K partial sums")?;
    let halves = own_halves(ctx, mm)?;
    let mut bm = BoundMatmul::bind(ctx, mm, stage, None, halves, Some(scratch), None)?;
    bm.forced_splits = Some(splits);
    one_off(ctx, &bm, mm.m, kernel, batched, stage)
}

/// One-off dispatches for `mm` as a session binds it for prefill: the planner's GEMM, split
/// along K where the planner splits it (benchmarks beside `prepare_dequant`).
pub fn prepare_planned(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<Vec<Dispatch>> {
    let scratch = MatmulScratch::default();
    let bm = BoundMatmul::bind(ctx, mm, stage, None, own_halves(ctx, mm)?, scratch.partials(ctx)?, None)?;
    let kernel = bm.planned_gemm(ctx, mm.m);
    one_off(ctx, &bm, mm.m, kernel, false, stage)
}

/// One-off dispatches for `mm` (K-quant weights) on the planner's GEMM over an f16 copy
/// of its weights decoded first (`DequantRoute`, a copy buffer of its own), at any m (tests of
/// the route); an error where the route does not take `mm` (`dequant_f16_bytes`).
pub fn prepare_dequant(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<Vec<Dispatch>> {
    let scratch = MatmulScratch::default().with_dequant(ctx, [mm.w])?;
    let bm = BoundMatmul::bind(ctx, mm, stage, None, own_halves(ctx, mm)?, None, None)?;
    let mut bm = bm.with_dequant_route(ctx, mm, stage, &scratch)?;
    let route = bm
        .dequant
        .as_mut()
        .ok_or_else(|| KilnError::invalid("matmul", format!("no f16 copy of {} weights here", mm.w.format)))?;
    route.from = 1;
    let kernel = bm.planned_gemm(ctx, mm.m);
    one_off(ctx, &bm, mm.m, kernel, false, stage)
}

/// The f16 copy's decoder alone: the K-quant weights `w` (one chunk) decoded into
/// `halves`, rows of k halves (tests).
pub fn prepare_dequant_f16(ctx: &GpuContext, w: &WeightTensor, halves: &wgpu::Buffer) -> Result<Dispatch> {
    let [chunk] = &w.chunks[..] else {
        return Err(KilnError::invalid("matmul", "the f16 decoder takes weights in one chunk"));
    };
    let key = KernelKey::DequantF16 { format: w.format };
    let b = Bound::new::<MatmulParams>(
        ctx,
        &key,
        "dequant_f16",
        &[&chunk.buffer, &chunk.buffer, halves, &chunk.buffer, &chunk.buffer],
    )?;
    let params = MatmulParams {
        m: 0,
        k: w.k,
        n_rows: w.rows,
        row_offset: 0,
        x_stride: 0,
        y_stride: 0,
        has_bias: 0,
        accumulate: 0,
        eps: 0.0,
        splits: 1,
        split_k: w.k,
        first_rows: w.rows,
    };
    b.set(ctx, &params);
    Ok(Dispatch {
        label: "dequant_f16",
        pipeline: ctx.pipeline(&key)?,
        bind_group: b.bind_group.clone(),
        workgroups: dequant_grid(w.rows, w.k),
        params: Some(b.params.clone()),
    })
}

/// The f16 decoder's workgroups over `rows` rows of k weights.
fn dequant_grid(rows: u32, k: u32) -> [u32; 3] {
    let per_workgroup = super::WG_ELT * crate::plan::dequant_chunks_per_invocation();
    grid((rows * (k / 8)).div_ceil(per_workgroup))
}

/// The cooperative GEMM's input conversion alone: m rows of k floats of `x` (x_stride apart)
/// rounded to f16 into `halves`, rows of `half_stride(k)` halves, zeros past k (tests).
pub fn prepare_to_half(
    ctx: &GpuContext,
    x: &wgpu::Buffer,
    halves: &wgpu::Buffer,
    m: u32,
    k: u32,
    x_stride: u32,
) -> Result<Dispatch> {
    let stride = half_stride(k);
    let b = Bound::new::<MatmulParams>(ctx, &KernelKey::ToHalf, "to_half", &[x, x, halves, x, x])?;
    let params = MatmulParams {
        m,
        k,
        n_rows: 0,
        row_offset: 0,
        x_stride,
        y_stride: stride,
        has_bias: 0,
        accumulate: 0,
        eps: 0.0,
        splits: 1,
        split_k: k,
        first_rows: 0,
    };
    b.set(ctx, &params);
    Ok(Dispatch {
        label: "to_half",
        pipeline: ctx.pipeline(&KernelKey::ToHalf)?,
        bind_group: b.bind_group.clone(),
        workgroups: grid((m * stride / 8).div_ceil(super::WG_ELT)),
        params: Some(b.params.clone()),
    })
}

/// CPU reference of `prepare_to_half`: the halves' bits, rows of `half_stride(k)`.
pub fn to_half_reference(x: &[f32], m: usize, k: usize, x_stride: usize) -> Vec<u16> {
    let stride = half_stride(k as u32) as usize;
    let mut out = vec![0u16; m * stride];
    for r in 0..m {
        for c in 0..k {
            out[r * stride + c] = half::f16::from_f32(x[r * x_stride + c]).to_bits();
        }
    }
    out
}

/// CPU reference: y[m, n] = sum_k w[n, k] x[m, k] (+ bias[n]) (+ y_in[m, n]), in f64.
pub fn reference(
    w: &[f32],
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    bias: Option<&[f32]>,
    y_in: Option<&[f32]>,
) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for mi in 0..m {
        for ni in 0..n {
            let mut acc = 0f64;
            for ki in 0..k {
                acc += w[ni * k + ki] as f64 * x[mi * k + ki] as f64;
            }
            if let Some(b) = bias {
                acc += b[ni] as f64;
            }
            if let Some(yi) = y_in {
                acc += yi[mi * n + ni] as f64;
            }
            y[mi * n + ni] = acc as f32;
        }
    }
    y
}
