//! The planner: which matmul kernel runs a given shape on a given adapter. A pure function,
//! unit-tested without a GPU.

use crate::gpu::Caps;
use crate::quant::WeightFormat;

/// GEMM tile configurations (BM x BN output tile, K step BK, TM x TN per invocation),
/// chosen per adapter class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmTile {
    /// 32x32, 4x4 per invocation, 64 invocations: CPU adapters and small batches.
    T32,
    /// 64x64, 4x4 per invocation, 256 invocations.
    T64,
    /// 128x64, 8x8 per invocation, 128 invocations.
    T128x64,
    /// 128x128, 8x8 per invocation, 256 invocations.
    T128,
    /// 64x128 (64 rows of X, 128 of W), 8x8 per invocation, 128 invocations: F32 weights.
    T64x128,
    /// 16 tokens x 64 weight rows on cooperative matrices (16x16x16 f16 multiply-adds into
    /// f32), four subgroups of 16x16 each (gemm_coop.wgsl): batched decode steps, short prompts.
    Coop16,
    /// 64x64 on cooperative matrices, four subgroups of 32 invocations each computing a 32x32
    /// quadrant: few tokens.
    Coop64,
    /// 128 tokens x 64 weight rows on cooperative matrices, four subgroups of 64x32 each:
    /// prefill where 128x128 tiles would leave SMs idle.
    Coop128x64,
    /// 128x128 on cooperative matrices, eight subgroups of 64x32 each: large prefill GEMMs.
    Coop128,
    /// 256 tokens x 128 weight rows on cooperative matrices, K steps of 16, eight subgroups of
    /// 64x64 each that also load (`coop_shared_loads`): a quarter less traffic from L2 a flop
    /// than Coop128, for F16 GEMMs with tiles to spare (`COOP_256_MIN_TILES`).
    Coop256x128,
    /// 128 tokens x 256 weight rows as one workgroup-scope matrix, K steps of 64 loaded by the
    /// driver through tensor addressing (VK_NV_cooperative_matrix2: `Caps::cm2`,
    /// kernels/gemm_cm2.rs): F16 GEMMs of whole tiles with tiles to spare (`cm2_takes`).
    Cm2,
}

impl GemmTile {
    /// The tiles of the plain (register-tiled) GEMM.
    pub const ALL: [GemmTile; 5] = [GemmTile::T32, GemmTile::T64, GemmTile::T128x64, GemmTile::T128, GemmTile::T64x128];
    /// (BM, BN, BK, TM, TN)
    pub fn dims(self) -> (u32, u32, u32, u32, u32) {
        match self {
            GemmTile::T32 => (32, 32, 16, 4, 4),
            GemmTile::T64 => (64, 64, 16, 4, 4),
            GemmTile::T128x64 => (128, 64, 16, 8, 8),
            GemmTile::T128 => (128, 128, 16, 8, 8),
            GemmTile::T64x128 => (64, 128, 16, 8, 8),
            GemmTile::Coop16 => (16, 64, 32, 16, 16),
            GemmTile::Coop64 => (64, 64, 32, 16, 16),
            GemmTile::Coop128x64 => (128, 64, 32, 16, 16),
            GemmTile::Coop128 => (128, 128, 32, 16, 16),
            GemmTile::Coop256x128 => (256, 128, 16, 16, 16),
            GemmTile::Cm2 => {
                (crate::kernels::gemm_cm2::BM, crate::kernels::gemm_cm2::BN, crate::kernels::gemm_cm2::BK, 16, 16)
            }
        }
    }
    /// The register-tile file for (TM, TN).
    pub fn micro_file(self) -> &'static str {
        match self.dims() {
            (_, _, _, 8, 8) => "gemm_micro_8x8.wgsl",
            _ => "gemm_micro_4x4.wgsl",
        }
    }
    pub fn is_coop(self) -> bool {
        matches!(
            self,
            GemmTile::Coop16
                | GemmTile::Coop64
                | GemmTile::Coop128x64
                | GemmTile::Coop128
                | GemmTile::Coop256x128
                | GemmTile::Cm2
        )
    }
    /// The cooperative-matrix tiles.
    pub const COOP: [GemmTile; 5] =
        [GemmTile::Coop16, GemmTile::Coop64, GemmTile::Coop128x64, GemmTile::Coop128, GemmTile::Coop256x128];
    /// Cooperative tiles: subgroups along N, and 16x16 accumulators per subgroup along M and N
    /// (gemm_coop.wgsl's SGN, FM, FN).
    pub fn coop_layout(self) -> (u32, u32, u32) {
        match self {
            GemmTile::Coop128 => (4, 4, 2),
            GemmTile::Coop128x64 => (2, 4, 2),
            GemmTile::Coop256x128 => (2, 4, 4),
            GemmTile::Coop16 => (4, 1, 1),
            _ => (2, 2, 2),
        }
    }
    /// Cooperative tiles are warp-specialized (gemm_coop.wgsl): (invocations that multiply,
    /// 32 per subgroup of accumulators; invocations that load the tiles, `coop_w_chunks`
    /// 8-value chunks of W each per K step).
    pub fn coop_invocations(self) -> (u32, u32) {
        if self == GemmTile::Cm2 {
            return (crate::kernels::gemm_cm2::WG, 0);
        }
        let (bm, bn, bk, _, _) = self.dims();
        let (sgn, fm, _) = self.coop_layout();
        let multiply = (bm / (fm * 16)) * sgn * 32;
        if self.coop_shared_loads() {
            return (multiply, 0);
        }
        (multiply, bn * bk / 8 / self.coop_w_chunks())
    }
    /// Whether every invocation of the tile loads as well as multiplies (gemm_coop.wgsl's
    /// SHARED, no loading subgroups): the 256x128 tile, whose 64x64 subgroups take more
    /// registers than loader subgroups beside them would leave (a kernel's register count is
    /// every invocation's; H200 runs 396, 405).
    pub fn coop_shared_loads(self) -> bool {
        self == GemmTile::Coop256x128
    }
    /// W chunks a loading invocation moves per K step (gemm_coop.wgsl's W_PER).
    pub fn coop_w_chunks(self) -> u32 {
        let (_, bn, bk, _, _) = self.dims();
        if self.coop_shared_loads() {
            return bn * bk / 8 / self.coop_invocations().0;
        }
        2
    }
    /// Invocations per workgroup (for cooperative tiles, those that multiply and those that load).
    pub fn workgroup_size(self) -> u32 {
        if self.is_coop() {
            let (multiply, load) = self.coop_invocations();
            return multiply + load;
        }
        let (bm, bn, _, tm, tn) = self.dims();
        (bm / tm) * (bn / tn)
    }
}

/// The largest cooperative GEMM workgroup (Coop128: 256 invocations multiply, 256 load); the
/// cooperative path needs adapters that allow it.
pub const COOP_MAX_INVOCATIONS: u32 = 512;

/// GEMV launch shape: invocations per workgroup, and rows per group of invocations. `groups`
/// 1: the whole workgroup strides along K over its `rows` rows; more (the int8 GEMV over many
/// columns): `groups` groups of `wg / groups` invocations, each its own `rows` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemvShape {
    pub wg: u32,
    pub rows: u32,
    pub groups: u32,
}

impl GemvShape {
    pub const fn new(wg: u32, rows: u32) -> GemvShape {
        GemvShape { wg, rows, groups: 1 }
    }

    pub const fn grouped(wg: u32, rows: u32, groups: u32) -> GemvShape {
        GemvShape { wg, rows, groups }
    }

    /// Weight rows one workgroup produces.
    pub fn rows_per_workgroup(&self) -> u32 {
        self.rows * self.groups
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatmulKernel {
    /// Matrix-vector over `ncols` activation columns (1 = single-token decode); `q8`: the
    /// activations are quantized to int8 and multiplied with integer dot products.
    Gemv { ncols: u32, shape: GemvShape, q8: bool },
    /// Tiled matrix-matrix (prefill).
    Gemm { tile: GemmTile },
}

impl std::fmt::Display for MatmulKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MatmulKernel::Gemv { ncols, shape, q8 } => {
                let name = if *q8 { "gemv_q8" } else { "gemv" };
                write!(f, "{name}[cols={ncols},wg={},rows={}", shape.wg, shape.rows)?;
                if shape.groups > 1 {
                    write!(f, "x{}", shape.groups)?;
                }
                write!(f, "]")
            }
            MatmulKernel::Gemm { tile: GemmTile::Cm2 } => {
                let (bm, bn, bk, ..) = GemmTile::Cm2.dims();
                write!(f, "gemm_cm2[{bm}x{bn}x{bk},f16,workgroup]")
            }
            MatmulKernel::Gemm { tile } if tile.is_coop() => {
                let (bm, bn, bk, ..) = tile.dims();
                // Tiles without loading subgroups (every subgroup loads its share) are marked.
                let loads = if tile.coop_shared_loads() { ",self-load" } else { "" };
                write!(f, "gemm_coop[{bm}x{bn}x{bk},f16{loads}]")
            }
            MatmulKernel::Gemm { tile } => {
                let (bm, bn, bk, tm, tn) = tile.dims();
                write!(f, "gemm[{bm}x{bn}x{bk},{tm}x{tn}]")
            }
        }
    }
}

/// The most activation columns the GEMV takes (sizes the int8 inputs and a batched step's
/// table); how many it takes on an adapter is `Caps::gemv_max_cols`. Past one workgroup's
/// columns (`GEMV_GROUP_COLS`, `GEMV_Q8_GROUP_COLS`) they come in groups, one per
/// workgroup_id.z, still one dispatch, each weight read from L2 after the first group.
pub const GEMV_MAX_COLS: u32 = 64;

/// Columns the GEMV takes on GPUs by default: on an H200 (profiling/results/
/// h200-bench-2026-11-23-run11-*.json) it beats the GEMMs (a few dozen workgroups, each
/// looping over all of k) up to 32 tokens and loses at 64: TinyLlama Q4_K_M pp16 / pp20 /
/// pp32 / pp64 at 1,992 / 1,975 / 2,355 / 2,614 tok/s against 1,053 / 1,237 / 1,891 / 3,207,
/// Llama-7B 879 / 936 / 1,028 against 334 / 388 / 582 (pp64 1,097 / 963).
pub const GEMV_DEFAULT_COLS: u32 = 32;

/// Columns one float-GEMV workgroup holds in registers (as llama.cpp's Vulkan backend and candle).
pub const GEMV_GROUP_COLS: u32 = 8;

/// The int8-activation GEMV holds each column's quantized x in registers: 4 columns a workgroup
/// (8 was slower on an H200: TinyLlama pp16 1,638 against 1,958 tok/s, Llama-7B pp20 567
/// against 941; run 14).
pub const GEMV_Q8_GROUP_COLS: u32 = 4;

/// Columns one workgroup of the int8 GEMV takes in its grouped shape (`GEMV_Q8_WIDE`), which
/// holds one column's x at a time and so can take more of them; more come in groups (grid z).
/// 16 was no faster on Q4_K and slower on Q6_K, whose larger unit headers leave less room
/// (H100, run 98: Q6_K 32000 x 2048 at 16 columns 137 µs in two groups of 8, 290 in one of 16).
pub const GEMV_Q8_WIDE_COLS: u32 = 8;

/// The int8 GEMV's shape from `GEMV_Q8_WIDE_MIN_COLS` columns (batched decode steps of 3 or
/// more sequences, short prompts): 4 groups of 32 invocations, each its own 2 rows, each invocation
/// a 32nd of their units, 8 columns' sums in registers. The ungrouped shapes spread every
/// row over the whole workgroup: each invocation had one or two units of a 2048-wide row, so
/// the kernel waited on one load per invocation and reduced 16 sums over 64 invocations, and
/// 4 columns a workgroup read every weight 4 times at 16 columns. On an H200 at 16 columns
/// (`KILN_BENCH_BATCHED=1 cargo bench --bench kernels`, run 99 in profiling/results), µs:
/// TinyLlama's 11264 x 2048 gate/up 66.9 -> 34.3, 2048 x 2048 19.9 -> 12.5, Q/K/V 24.9 -> 16.7,
/// the Q6_K LM head 174 -> 118, the Q6_K 2048 x 5632 down projection 28.1 -> 28.2; the model
/// (`kiln bench -n 128 --parallel 8,16`) 2,896 -> 3,536 tok/s at 8 sequences, 3,942 -> 6,025 at
/// 16. Groups of 8 (2 x 8 rows a workgroup) made half the workgroups, too few for
/// 2048-row matrices (x16 4,992); 256 invocations in 8 groups 5,691.
pub const GEMV_Q8_WIDE: GemvShape = GemvShape::grouped(128, 2, 4);
/// The same where `GEMV_Q8_WIDE` would make fewer than `GEMV_Q8_WIDE_MIN_WORKGROUPS`
/// workgroups (matrices of few rows at up to 8 columns): 2 groups of 64 invocations, 4 rows a
/// workgroup, so twice the workgroups. H200 (run 113, µs, `GEMV_Q8_WIDE` -> this): at 8
/// columns TinyLlama's 2048 x 2048 11.3 -> 10.0, Q/K/V 15.0 -> 13.7, the Q6_K 2048 x 5632 down
/// projection 24.5 -> 18.1; at 16 columns (two groups of 8 on grid z) it loses (28.2 -> 31.1),
/// as it does for Llama-7B's 4096-row matrices at 8 (pp8 930 -> 847 tok/s).
pub const GEMV_Q8_WIDE_FEW_ROWS: GemvShape = GemvShape::grouped(128, 2, 2);
/// Workgroups below which the grouped int8 GEMV takes `GEMV_Q8_WIDE_FEW_ROWS`: about four per
/// SM of an H200 (132).
pub const GEMV_Q8_WIDE_MIN_WORKGROUPS: u32 = 512;

/// The grouped shape the int8 GEMV takes from `gemv_q8_wide_min_cols` columns (`GEMV_Q8_WIDE`),
/// or `KILN_GEMV_Q8_WIDE` where set (`off`: groups of 4 columns on the ungrouped shapes).
pub fn gemv_q8_wide_shape(m: u32, n: u32) -> Option<GemvShape> {
    let workgroups = n.div_ceil(GEMV_Q8_WIDE.rows_per_workgroup()) * m.div_ceil(GEMV_Q8_WIDE_COLS);
    let planned = if workgroups < GEMV_Q8_WIDE_MIN_WORKGROUPS { GEMV_Q8_WIDE_FEW_ROWS } else { GEMV_Q8_WIDE };
    crate::config::gemv_q8_wide_from_env().unwrap_or(Some(planned))
}

/// The int8 GEMV's shape for the gate/up projection of one-token decode steps with the int8
/// SwiGLU epilogue (`kernels::Epi::SwiGluQ8`, `Caps::q8_swiglu`): 16 groups of 32 invocations,
/// each its own 4 rows, so that a workgroup's 64 interleaved gate/up rows give 32 outputs,
/// one whole int8 block of the down projection's input, which it writes; the down projection
/// then needs no quantize dispatch (one dispatch fewer a layer), and with
/// `Caps::q8_swiglu_norm` the gate/up projection none either. On an H200 (runs 147-148,
/// `KILN_GEMV_Q8_SWIGLU=<shape> KILN_GEMV_Q8_SWIGLU_NORM=1 kiln bench -p 0 -n 128`, alternated),
/// TinyLlama Q4_K_M tg128 901 tok/s with the quantize dispatches, 929 with 256x8x8, 992 with
/// this shape, 913 with 1024x2x32, 802 with 128x16x4.
pub const GEMV_Q8_SWIGLU: GemvShape = GemvShape::grouped(512, 4, 16);

/// The largest gate/up projection (gate and up weights together) that takes the int8 SwiGLU
/// epilogue by default: its 64-row workgroups are fewer than the plain GEMV's 4-row ones, which
/// costs bandwidth where the matrix is large enough to be bound by it rather than by the
/// dispatches saved (H200, run 148: TinyLlama's 23 M weights 901 -> 992 tok/s, Llama-7B's 90 M
/// 328 -> 316). `KILN_GEMV_Q8_SWIGLU` set to a shape or `on` takes it at every size.
pub const GEMV_Q8_SWIGLU_MAX_WEIGHTS: u64 = 1 << 25;

/// The int8 GEMV's shape for a one-token gate/up projection too large for the int8 SwiGLU
/// epilogue (`GEMV_Q8_SWIGLU_MAX_WEIGHTS`; float SwiGLU output, `kernels::Epi::SwiGlu`): 4 groups
/// of 32 invocations, each its own 2 rows (one gate/up pair), where the planner's shape for
/// 8,192 rows and more is 64 invocations on 4 rows. H200, Llama-7B's 22016 x 4096 Q4_K: alone
/// (run 423, weights from memory) 19.9 -> 18.3 µs; tg128 (runs 424-425, `KILN_GEMV_Q8`, two
/// calls) 441.8 -> 447.0 and 442.0 -> 446.7 tok/s; as the planner's rule (run 426, 3 rounds)
/// 441.1 -> 446.4. The same shape on Llama-7B's Q/K/V and LM head as well gained less (444.5),
/// so only the gate/up takes it; only Q4_K is measured.
pub const GEMV_Q8_GLU_FLOAT: GemvShape = GemvShape::grouped(128, 2, 4);

/// The shape a one-token gate/up projection of `format` (n rows of k, float SwiGLU output) takes
/// on the int8 GEMV, where not the planner's: `GEMV_Q8_GLU_FLOAT` for Q4_K matrices past
/// `GEMV_Q8_SWIGLU_MAX_WEIGHTS` (the measured case), unless `KILN_GEMV_Q8` names a shape for
/// the matrix.
pub fn gemv_q8_glu_float_shape(format: WeightFormat, n: u32, k: u32) -> Option<GemvShape> {
    if crate::config::gemv_q8_from_env(n, k).is_some() {
        return None;
    }
    (format == WeightFormat::Q4K && n as u64 * k as u64 > GEMV_Q8_SWIGLU_MAX_WEIGHTS).then_some(GEMV_Q8_GLU_FLOAT)
}

/// Whether the workgroups of the int8 GEMV's `shape` cover whole int8 blocks of SwiGLU
/// outputs: grouped, row pairs, 64 weight rows (32 outputs) or a multiple.
pub fn covers_q8_blocks(shape: GemvShape) -> bool {
    shape.groups > 1 && shape.rows % 2 == 0 && shape.rows_per_workgroup() % 64 == 0
}

/// The int8 GEMV's shape for the one-token projections added to the residual stream (the
/// output and down projections) with the int8 residual epilogue (`kernels::Epi::AddQ8Norm`,
/// `Caps::q8_add_norm`): 16 groups of 64 invocations, each its own 2 rows, so that a
/// workgroup's 32 rows are one int8 block of the next GEMV's input, which it writes through the
/// next RMSNorm's weights; that GEMV (Q/K/V, gate/up, the LM head) then needs no quantize
/// dispatch. Of the 32-row shapes the fastest without the epilogue (H200, run 238,
/// `KILN_GEMV_Q8`: Llama-7B Q4_K_M tg128 351 tok/s against the planner's 356).
pub const GEMV_Q8_ADD_NORM: GemvShape = GemvShape::grouped(1024, 2, 16);

/// Whether the workgroups of the int8 GEMV's `shape` cover whole int8 blocks of 32 rows of Y
/// (the int8 residual epilogue's): grouped, row pairs, 32 rows or a multiple.
pub fn covers_q8_rows(shape: GemvShape) -> bool {
    shape.groups > 1 && shape.rows % 2 == 0 && shape.rows_per_workgroup() % 32 == 0
}

/// `Caps::q8_add_norm` without the context option: `KILN_GEMV_Q8_ADD_NORM` where set, else
/// `GEMV_Q8_ADD_NORM`. On an H200 (run 264, one call, `kiln bench -p 0 -n 128 -r 3`, off / on,
/// twice): Llama-7B Q4_K_M tg128 388.7 -> 408.0 tok/s (2·32 - 1 quantize dispatches fewer a
/// step); TinyLlama, whose gate/up and Q/K/V quantize their own inputs, unchanged (1,138 /
/// 1,136); the shape 256x2x16 303.4.
pub fn gemv_q8_add_norm_shape() -> Option<GemvShape> {
    crate::config::gemv_q8_add_norm_from_env().unwrap_or(Some(GEMV_Q8_ADD_NORM))
}

/// `Caps::q8_swiglu` on an adapter without the context option: `KILN_GEMV_Q8_SWIGLU` where
/// set, else `GEMV_Q8_SWIGLU` (for the matrices `q8_swiglu_takes` lets through).
pub fn gemv_q8_swiglu_shape() -> Option<GemvShape> {
    crate::config::gemv_q8_swiglu_from_env().unwrap_or(Some(GEMV_Q8_SWIGLU))
}

/// Whether a model of these widths runs its one-token gate/up projection with the int8
/// SwiGLU epilogue: where the adapter takes it (`Caps::q8_swiglu`), on whole blocks of 32
/// outputs, and up to `GEMV_Q8_SWIGLU_MAX_WEIGHTS` unless a shape was asked for.
pub fn q8_swiglu_takes(caps: &Caps, n_ff: u32, n_embd: u32) -> bool {
    caps.q8_swiglu.is_some()
        && n_ff % 32 == 0
        && (caps.q8_swiglu_any_size || 2 * n_ff as u64 * n_embd as u64 <= GEMV_Q8_SWIGLU_MAX_WEIGHTS)
}

/// `Caps::q8_swiglu_norm` without the context option: `KILN_GEMV_Q8_SWIGLU_NORM` where set,
/// else on (run 147, H200, TinyLlama Q4_K_M tg128 with the epilogue at 256x8x8: 859 tok/s
/// with the quantize dispatch before the gate/up projection, 926 without).
pub fn gemv_q8_swiglu_norm() -> bool {
    crate::config::gemv_q8_swiglu_norm_from_env().unwrap_or(true)
}

/// `Caps::quantize_lanes` without the context option: `KILN_QUANTIZE_LANES` where set, else
/// on. Before it, one-token steps' quantize dispatch passed over the whole row for the
/// RMSNorm's sum of squares in every workgroup (H200, run 239, Llama-7B Q4_K_M tg128: that
/// pass alone cost 355.7 -> 378.7 tok/s, the whole quantize body 406.5).
pub fn quantize_lanes() -> bool {
    crate::config::quantize_lanes_from_env().unwrap_or(true)
}

/// `Caps::sample_tops` without the context option: `KILN_SAMPLE_TOPS` where set, else on
/// (H200, run 251, `--temp 0.8` tg128 alternated three times: TinyLlama Q4_K_M
/// 1,067-1,082 -> 1,082-1,085 tok/s, Llama-7B Q4_K_M 376.4-376.5 -> 376.7-377.0).
pub fn sample_tops() -> bool {
    crate::config::sample_tops_from_env().unwrap_or(true)
}

/// `Caps::attn_decode_wide` without the context option: `KILN_DECODE_WIDE` where set, else on
/// (`AttnShape::decode_wide_takes` says where it pays).
pub fn attn_decode_wide() -> bool {
    crate::config::decode_wide_from_env().unwrap_or(true)
}

/// `Caps::decode_merge` without the context option: `KILN_DECODE_MERGE` where set, else on
/// (`AttnShape::decode_merges_at` says where it pays: `kernels::attention::DECODE_MERGE_MOST_SPLITS`).
pub fn decode_merge() -> bool {
    crate::config::decode_merge_from_env().unwrap_or(true)
}

/// `Caps::decode_merge_acquire` without the context option: `KILN_DECODE_MERGE_ACQUIRE` where
/// set, else on everywhere but NVIDIA (`gpu::context::NVIDIA_VENDOR`). There the merging
/// workgroup's loads of the partials are L1-bypassing (`@coherent`: LDG.E.STRONG.GPU in the
/// SASS), issued only once the count's atomic has returned (they sit behind a branch on its
/// value), and every other workgroup fenced its partials before counting itself: the last
/// block of CUDA's threadFenceReduction sample, which reads with no fence after its atomic
/// either. The fence is a `MEMBAR.SC.GPU` on the merge's critical path: H200, run 464
/// (`ab.py -n 4`, TinyLlama Q4_K_M tg128, `KILN_DECODE_MERGE_ACQUIRE=1` against the default),
/// GPU µs a step back to back at depth 4,096 896.8 -> 892.3, at depth 0 806.4 -> 806.1.
/// Elsewhere the Vulkan memory model's acquire stays.
pub fn decode_merge_acquire(vendor: u32) -> bool {
    crate::config::decode_merge_acquire_from_env().unwrap_or(vendor != crate::gpu::context::NVIDIA_VENDOR)
}

/// `Caps::attn_q8_out` without the context option: `KILN_ATTN_Q8_OUT` where set, else on.
pub fn attn_q8_out() -> bool {
    crate::config::attn_q8_out_from_env().unwrap_or(true)
}

/// Weights of the output projection from which one-token decode attention writes its int8
/// input (`Caps::attn_q8_out`). On an H200 (run 159, `KILN_ATTN_Q8_OUT=0/1 kiln bench -p 0
/// -n 128`, alternated) TinyLlama's 2048 x 2048 one gained (tg128 992 -> 1,012 tok/s), and
/// Llama-7B's, whose quantize dispatch it saves, more (328 -> 338). Smaller ones keep float
/// activations: they take about as long either way, and a small model's single steps then
/// equal its prefill to 1e-3.
pub const ATTN_Q8_OUT_MIN_WEIGHTS: u64 = 1 << 20;

/// Tokens a prompt step takes where -ub does not say: llama.cpp's 512.
pub const DEFAULT_UBATCH: u32 = 512;

/// Larger prompt steps the planner takes, largest first, where the adapter has cooperative
/// matrices and memory to spare: a 2,048-token step gives the GEMMs four times the tiles of a
/// 512-token one (no split along K, fuller waves) and flash attention four times the query
/// blocks (H200, run 211: TinyLlama Q4_K_M pp4096 34,738 / 36,155 / 39,661 tok/s at 512 /
/// 1,024 / 2,048, pp2048 36,852 -> 42,126; F16 pp4096 39,514 -> 46,331).
pub const LARGE_UBATCHES: [u32; 2] = [2048, 1024];

/// A larger step's activations may take at most this fraction (1/n) of the memory the weights
/// leave, so that the KV cache keeps the rest (TinyLlama at 2,048: 333 MiB).
pub const UBATCH_MEMORY_SHARE: u64 = 16;

/// The prompt step where none is asked for: the largest of `LARGE_UBATCHES` within -b
/// (`batch`) whose activations (`activation_bytes(ubatch)`) fit `UBATCH_MEMORY_SHARE` of
/// `memory_left`, on a GPU with cooperative matrices (where it was measured); else
/// `DEFAULT_UBATCH` (within -b). Unknown memory keeps the default.
pub fn default_ubatch(caps: &Caps, memory_left: Option<u64>, batch: u32, activation_bytes: impl Fn(u32) -> u64) -> u32 {
    let small = DEFAULT_UBATCH.min(batch.max(1));
    let Some(left) = memory_left.filter(|_| caps.coopmat && !caps.cpu_adapter) else {
        return small;
    };
    LARGE_UBATCHES
        .into_iter()
        .filter(|&u| u <= batch && u > small)
        .find(|&u| activation_bytes(u) <= left / UBATCH_MEMORY_SHARE)
        .unwrap_or(small)
}

/// Whether one-token decode attention writes the int8 input of an output projection of
/// `q_dim` inputs and `n_embd` outputs on an adapter with `caps` (everywhere with
/// `Caps::int8_gemv_always`, as tests of the int8 path ask).
pub fn attn_q8_out_takes(caps: &Caps, q_dim: u32, n_embd: u32) -> bool {
    caps.attn_q8_out && (caps.int8_gemv_always || q_dim as u64 * n_embd as u64 >= ATTN_Q8_OUT_MIN_WEIGHTS)
}

/// `Caps::prefill_f16_inputs` without the context option: `KILN_PREFILL_F16_INPUTS` where set, else
/// on (H200, runs 146 and 148, alternated: TinyLlama Q4_K_M pp512 34,392 -> 36,329 tok/s, F16
/// 38,900 -> 41,742, pp4096 31,552 -> 32,694, Llama-7B Q4_K_M pp512 6,196 -> 6,254).
pub fn prefill_f16_inputs() -> bool {
    crate::config::prefill_f16_inputs_from_env().unwrap_or(true)
}

/// `Caps::dequant_f16_from` without the context option, where the cooperative GEMM runs:
/// `DEQUANT_F16_FROM`, or `KILN_DEQUANT_FROM` where set; never with `KILN_PREFILL_DEQUANT=0`.
pub fn prefill_dequant_f16() -> Option<u64> {
    let from = crate::config::dequant_from_env().unwrap_or(DEQUANT_F16_FROM);
    crate::config::prefill_dequant_from_env().unwrap_or(true).then_some(from)
}

/// Whether prefill's f16 copies of the quantized layer matrices (`copies` bytes in all) stay in
/// GPU memory, each decoded once when the session is built, instead of one buffer the size of
/// the largest that each GEMM's weights are decoded into just before it (~12% of Llama-7B's
/// prompt step on an H100, run 332): where they take at most `RESIDENT_SHARE` of the memory the
/// weights, KV cache and activations leave (`memory_left`; unknown: no), or as `caps` says
/// (`Caps::resident_f16_copies`: the context option or `KILN_PREFILL_RESIDENT=0|1`).
pub fn resident_f16_copies(copies: u64, memory_left: Option<u64>, caps: &Caps) -> bool {
    copies > 0
        && caps.resident_f16_copies.unwrap_or_else(|| memory_left.is_some_and(|left| copies <= left / RESIDENT_SHARE))
}

/// Tokens times row length (m·k) from which a prefill GEMM over quantized weights reads their
/// resident f16 copy (`resident_f16_copies`; `Caps::dequant_f16_from` where that is lower).
/// H200, run 342 (`kiln bench -p 64,128,256,512 -n 0 -r 3`, twice, tokens/s, from
/// `DEQUANT_F16_FROM` -> from one token): Llama-7B Q4_K_M pp64 3,688 / 3,648 -> 3,808 / 3,648,
/// pp128 4,640 / 4,669 -> 5,108 / 4,974, pp256 7,596 / 7,692 -> 9,166 / 8,871; TinyLlama Q4_K_M
/// pp64 13,000 / 14,164 -> 12,342 / 12,523, pp128 19,040 / 19,703 -> 19,658 / 19,045, pp256
/// 30,778 / 30,777 -> 34,140 / 33,876, pp512 44,656 / 43,180 -> 47,563 / 46,993.
pub const RESIDENT_F16_FROM: u64 = 128 * 2048;

/// `resident_f16_copies`' share of the memory left: the copies (3.6 times a Q4_K_M model's
/// layers) only where memory would otherwise sit idle; a 24 GB GPU with Llama-7B Q4_K_M (13 GB
/// of copies) decodes before every GEMM, an 80 GB one keeps them.
pub const RESIDENT_SHARE: u64 = 4;

/// Tokens times row length (m·k) from which a prefill GEMM over K-quant weights reads an f16
/// copy decoded just before it (`Caps::dequant_f16_from`, dequant_f16.wgsl) instead of
/// decoding every tile in its loaders. The copy costs a pass over the weights (2.6 bytes
/// written and read a weight: 25 µs for TinyLlama's gate/up on an H100) whatever the step's
/// length, the GEMM's gain grows with m, and more where k is longer. H100, run 331
/// (`KILN_BENCH_GEMM_SHAPES=... kernels`), µs as a session runs it (split along K where planned)
/// -> via the copy: m = 512, TinyLlama (k 2048) Q/K 63.1 -> 62.1, output 46.9 -> 45.9, gate/up
/// 201.2 -> 203.1, down (Q6_K, k 5632) 111.7 -> 102.9; Llama-7B (k 4096) Q/K 268.9 -> 242.4,
/// output 135.2 -> 123.1, gate/up 843.0 -> 745.0, down (k 11008) 383.0 -> 321.6; m = 1024,
/// TinyLlama gate/up 399.2 -> 367.1, output 70.9 -> 59.8, down 195.2 -> 162.4. Models (run 330,
/// H100, mean of three, route off -> on at every size): TinyLlama Q4_K_M pp256 31,047 -> 28,853,
/// pp384 39,009 -> 36,107, pp512 42,911 -> 42,214, pp4096 (steps of 2,048) 48,044 -> 55,526;
/// Llama-7B pp256 7,272 -> 7,119, pp384 7,273 -> 7,767, pp512 8,018 -> 8,941. So from 384 tokens
/// of k 4096: TinyLlama's matrices from 768 tokens (its down projection from 280), Llama-7B's
/// from 384 (its down projection from 143).
pub const DEQUANT_F16_FROM: u64 = 384 * 4096;

/// The formats whose prefill GEMMs read an f16 copy (`Caps::dequant_f16_from`): the K-quants.
/// Q8_0's GEMM decodes little and ran at 0.9-1.0 of F16's; with the copy's decoder before it,
/// slower (H100, run 329, µs without -> with the copy: 512x4096x11008 342 -> 381, 2048x2048x11264
/// 658 -> 675; H200, run 328: TinyLlama Q8_0 pp512 49,334 -> 43,547 tok/s, mean of three).
pub fn dequant_f16_format(format: WeightFormat) -> bool {
    matches!(format, WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K)
}

/// The formats whose prefill GEMMs read resident f16 copies where the session keeps them
/// (`resident_f16_copies`): the K-quants, and Q8_0, whose copy (decoded once, no dispatch
/// before each GEMM) brings its GEMM to F16's rate.
pub fn resident_f16_format(format: WeightFormat) -> bool {
    dequant_f16_format(format) || format == WeightFormat::Q8_0
}

/// Chunks of eight weights each invocation of dequant_f16.wgsl decodes: 4, or
/// `KILN_DEQUANT_PER=1` (a knob for measurements). H100: TinyLlama's gate/up copy 32.9 µs with
/// one (run 329) -> 25.0 with four (run 331); Llama-7B Q4_K_M pp512 8,672 -> 8,941 tok/s (run
/// 330, mean of three).
pub fn dequant_chunks_per_invocation() -> u32 {
    match crate::config::dequant_per_from_env() {
        Some(1) => 1,
        _ => 4,
    }
}

/// K dimensions and V positions each decode-attention invocation holds in registers
/// (attention_decode.wgsl's PER): a split is 256 x PER / head_dim positions. Fewer make more,
/// shorter splits, which cost more: on an H200 (run 151, TinyLlama's heads, one layer with
/// its combine pass at 4,096 positions) 12.2 us at 32, 15.2 at 16, 19.7 at 8 (tg128 at depth
/// 4096 811 / 760 / 724 tok/s); 64 spilled registers (H100, run 152: 42 us).
pub const ATTN_DECODE_PER_LANE: u32 = 32;

/// Invocations of a decode-attention workgroup (`kernels::ATTN_WG_DECODE`), or
/// `KILN_DECODE_WG` (128, 256 or 512) where set: with `ATTN_DECODE_PER_LANE`, a split's positions.
pub fn attn_decode_wg() -> u32 {
    crate::config::decode_wg_from_env().unwrap_or(crate::kernels::ATTN_WG_DECODE)
}

/// `attn_decode_wg` for heads of class `d`: at least a head's dimensions (the weighted V takes
/// one invocation per dimension).
pub fn attn_decode_wg_of_class(d: u32) -> u32 {
    attn_decode_wg().max(d)
}

/// `ATTN_DECODE_PER_LANE`, or `KILN_DECODE_PER_LANE` (8, 16 or 32) where set.
pub fn attn_decode_per_lane() -> u32 {
    crate::config::decode_per_lane_from_env().unwrap_or(ATTN_DECODE_PER_LANE)
}

/// Workgroup memory the int8 GEMV needs to quantize its own input (common/q8_in_local.wgsl:
/// 12 KiB for up to 8192 values) beside its reduction's (`GEMV_Q8_SWIGLU`: 32 lanes x 65
/// floats) and the rest (20,996 bytes at `GEMV_Q8_SWIGLU` with subgroups).
pub const GEMV_Q8_LOCAL_INPUT_BYTES: u32 = 21 * 1024;
/// The longest input the int8 GEMV quantizes itself (q8_in_local.wgsl's XQ_MAX_BLOCKS).
pub const GEMV_Q8_LOCAL_INPUT_MAX_K: u32 = 8192;

/// Columns from which the int8 GEMV takes its grouped shape (`GEMV_Q8_WIDE`; below them, the
/// ungrouped shapes): on an H200 (run 101, `KILN_GEMV_Q8_WIDE_MIN_COLS=1/2/3/5 kiln bench -p 4
/// -n 128 --parallel 2,3,4`), from 3 columns TinyLlama Q4_K_M x3 1,329 -> 1,741 tok/s, x4
/// 1,701 -> 2,128, pp4 336 -> 1,449; x2 the same either way (1,363 / 1,367); one column
/// slower on it (tg128 912 -> 797).
pub const GEMV_Q8_WIDE_MIN_COLS: u32 = 3;

/// `GEMV_Q8_WIDE_MIN_COLS`, or `KILN_GEMV_Q8_WIDE_MIN_COLS` where set (a knob for measurements).
pub fn gemv_q8_wide_min_cols() -> u32 {
    crate::config::gemv_q8_wide_min_cols_from_env().unwrap_or(GEMV_Q8_WIDE_MIN_COLS)
}

/// Columns one workgroup of the float (`q8` false) or int8 GEMV holds; more come in groups.
pub fn gemv_group_cols(q8: bool) -> u32 {
    if q8 {
        GEMV_Q8_GROUP_COLS
    } else {
        GEMV_GROUP_COLS
    }
}

/// Whether a matmul of m columns runs on the GEMV on an adapter with `caps` (else a GEMM):
/// the planner's choice, which also decides where the forward pass fuses the RMSNorm.
pub fn gemv_takes(m: u32, caps: &Caps) -> bool {
    m <= caps.gemv_max_cols.min(GEMV_MAX_COLS)
}

/// Weights (n x k) from which the int8-activation GEMV takes over from the float one on GPUs
/// with native integer dot products, its quantize dispatch included. On an H200
/// (profiling/results/h200-gemv-q8-prequant-2026-11-21.txt), for K-quants it wins from
/// 5632 x 2048 (Q4_K 8.3 vs 9.6 us) and loses at 2048 x 2048 (6.4 vs 5.7 us): the extra
/// dispatch costs more than a small matrix saves. Q8_0's float GEMV is faster, so it
/// switches later: it ties at 5632 x 2048 and wins from 4096 x 4096 (8.6 vs 9.9 us).
pub const GEMV_Q8_MIN_WEIGHTS: u64 = 1 << 23;

/// Columns from which the int8 GEMV takes every quantized matrix (batched decode steps, short
/// prompts): its quantize dispatch applies the fused RMSNorm once per column, where each
/// float-GEMV workgroup recomputes it over all of its columns. On an H200 at 8 columns
/// (`KILN_BENCH_BATCHED=1 cargo bench`, profiling/results/h200-batched-gemv-2026-11-24-run37.txt),
/// TinyLlama's Q/K/V with the norm took 17 µs against 45 on the float GEMV, its 2048 x 2048
/// output projection 13 against 18; at 2 columns the two tie. Over the model (run 44,
/// `KILN_GEMV_Q8_MIN_COLS=2/3/4/6/9 kiln bench -p 4,6,8 --parallel 2,3,4,6,8,16`), 4 was best
/// or within 3% everywhere: 2 or 3 cost 15% at 2-3 sequences and pp4-pp8, 9 cost 22% at 8
/// sequences (2,208 against 2,832 tok/s) and pp8 1,688 against 2,065.
pub const GEMV_Q8_MIN_COLS: u32 = 4;

/// `GEMV_Q8_MIN_COLS`, or `KILN_GEMV_Q8_MIN_COLS` where set.
pub fn gemv_q8_min_cols() -> u32 {
    crate::config::gemv_q8_min_cols_from_env().unwrap_or(GEMV_Q8_MIN_COLS)
}

/// 128x128 cooperative tiles from this many per GEMM: about one per SM of a large GPU (an
/// H200 has 132), below which 128x64 tiles keep more of them busy; and 64x64 tiles where
/// 128x64 ones would not give each SM two (H200, runs 14 and 18 in profiling/results:
/// TinyLlama Q4_K_M pp128 3,534 -> 5,933 tok/s, pp256 7,637 -> 11,147, pp512 11,384 ->
/// 16,081, F16 pp512 9,863 -> 13,767; Llama-7B pp128 1,212 -> 1,802, pp512 unchanged).
/// Below four 128x64 tiles per SM instead, Llama-7B's 4096-wide matrices went to 64x64 tiles
/// and its pp512 fell from 3,376 to 2,710 (run 21).
pub const COOP_FILL_TILES: u64 = 128;
/// K steps the cooperative GEMM's loaders keep loaded in registers across the steps'
/// barriers (gemm_coop.wgsl's LOAD_AHEAD) instead of loading and storing a step in one go.
/// One step for every format since nothing touches the held loads before the barrier (F16
/// weights kept as words, common/coop_w_half.wgsl; a K loop each for whole and edge tiles).
/// H200, TFLOP/s at 4096^3 / 512x4096x11008 without -> with: F16 127.3 -> 160.5 / 112.3 -> 139.6 (run
/// 310, then 167.8 / 145.7 with the loops apart, run 314), Q8_0 127.3 -> 149.1 / 107.4 -> 130.8,
/// Q6_K 108.8 -> 120.8 / 92.0 -> 103.5, Q4_K and Q5_K (ahead since run 274) 124.8 -> 126.8 /
/// 111.5 -> 115.2 with the loops apart (run 314); pp512 Llama-7B Q4_K_M 7,640 / 7,726 -> 7,969 /
/// 7,968, TinyLlama Q8_0 42,870 / 41,852 -> 46,480 / 46,277. Before either change F16, Q8_0 and
/// Q6_K lost with it (run 274: 124.2 -> 124.2, 128.4 -> 110.4, 104.9 -> 97.3).
/// Two steps for F16 (whose copies also serve the K-quants' prefill) once the multipliers stopped
/// keeping the held loads live (runs 374-375, µs alone: 4096^3 774 -> 733 with one step, 722 with
/// two; TinyLlama's gate/up, 512x2048x11264, 173 -> 162 -> 157; pp512 F16 50,197 / 53,434 ->
/// 55,394 / 57,090, Llama-7B Q4_K_M 10,377 / 10,372 -> 11,278 / 11,352). Q8_0 and Q6_K, whose
/// loaders decode, take the same time with two (run 375).
/// `KILN_COOP_LOAD_AHEAD=0|1|2` sets it for every format (a measurement knob).
pub fn coop_loads_ahead(format: WeightFormat) -> u32 {
    crate::config::coop_load_ahead_from_env().unwrap_or(match format {
        WeightFormat::F16 => 2,
        _ => 1,
    })
}

/// Tokens from which the cooperative GEMM takes 128x128 tiles (split along K where they are
/// fewer than COOP_FILL_TILES, `gemm_splits`), and outputs from which (fewer go to 64x64 tiles). H200 sweep
/// at Q4_K, TFLOP/s for 64x64 / 128x128 / 128x128 split in two (run 54,
/// profiling/results/h200-coop-gemm-2026-11-24-run54-*): 512x2048x2048 56 / 41 / 67,
/// 512x5632x2048 72 / 50 / 94, 512x2048x11264 53 / 82 / 83, Llama-7B's 512x4096x4096 59 / 93 /
/// 93; at 128 tokens 64x64 tiles split four ways win (128x2048x2048: 39 against 30, the
/// 128x64 tiles in between everywhere).
pub const COOP_WIDE_MIN_M: u32 = 256;
pub const COOP_WIDE_MIN_N: u32 = 512;
pub const GEMV_Q8_MIN_WEIGHTS_Q8_0: u64 = 1 << 24;

/// Rows from which the float GEMV over one column (decode) takes `GEMV_FLOAT_MANY_ROWS_SHAPE`:
/// 4 groups of 64 invocations, each its own 4 rows, so that a workgroup's fused RMSNorm and
/// x slices serve 16 rows instead of 2. Below it, 128 invocations on 2 rows, or 256 on 2 for
/// rows of 4,096 weights and more (fewer passes along the row per invocation). H200, TinyLlama
/// F16 tg128 with one matrix's shape changed at a time (run 185, alternated twice): gate/up
/// (11,264 x 2,048) 811 -> 876-880 tok/s, down (2,048 x 5,632) 811 -> 831-835, the LM head
/// 811 -> 813-815; the Q/K/V and output projections' 2,048-2,560 rows stayed best on 128 x 2.
pub const GEMV_FLOAT_MANY_ROWS: u32 = 8192;
pub const GEMV_FLOAT_MANY_ROWS_SHAPE: GemvShape = GemvShape::grouped(256, 4, 4);

/// The formats a stacked Q/K/V projection's second part takes in llama.cpp's K-quant mixes
/// (V in Q6_K in Q4_K_M and Q5_K_M files, in Q5_K in some layers of Q4_K_S ones), for which
/// the GEMV over two formats is built (`KernelKey::Gemv::second`).
pub const QKV_SECOND_FORMATS: [WeightFormat; 2] = [WeightFormat::Q5K, WeightFormat::Q6K];

/// The one dispatch over a one-token step of a Q/K/V projection stacked from two quantized
/// formats (`first_rows` rows of `format`, the rest of `second`), where it takes the step:
/// the planner's GEMV for the whole matrix in the first format (int8 or float as for it),
/// whose workgroups each stay in one part (`first_rows` a multiple of their rows).
/// Two dispatches cost a launch and a barrier more: on an H200, 5 µs in each of TinyLlama
/// Q4_K_M's 10 layers with V in Q6_K (run 222).
pub fn plan_two_formats(
    n: u32,
    first_rows: u32,
    k: u32,
    format: WeightFormat,
    second: WeightFormat,
    caps: &Caps,
) -> Option<MatmulKernel> {
    if !format.is_quantized() || format == second || !QKV_SECOND_FORMATS.contains(&second) || first_rows >= n {
        return None;
    }
    let kernel = match plan_matmul(1, n, k, format, caps) {
        // The float one's planned 128 invocations on 2 rows, where no measurement asks for
        // another shape: `GEMV_TWO_FORMATS_FLOAT_SHAPE`.
        MatmulKernel::Gemv { ncols, shape, q8: false }
            if shape == GemvShape::new(128, 2)
                && !caps.cpu_adapter
                && crate::config::gemv_float_from_env(n, k).is_none() =>
        {
            MatmulKernel::Gemv { ncols, shape: GEMV_TWO_FORMATS_FLOAT_SHAPE, q8: false }
        }
        kernel => kernel,
    };
    match kernel {
        MatmulKernel::Gemv { shape, .. } if first_rows % shape.rows_per_workgroup() == 0 => Some(kernel),
        _ => None,
    }
}

/// The float GEMV over two formats (one-token Q/K/V, with the RoPE and cache-write epilogue)
/// in workgroups of 64 invocations on 2 rows rather than 128: with both formats' decoding it
/// takes 53 registers an invocation on the H200 (`examples/pipeline_stats.rs`, run 301;
/// one format's float GEMVs 32-40), so 128-invocation workgroups fit 9 an SM, 1,188 at once
/// on 132 SMs, and TinyLlama Q4_K_M's 1,280 (2,560 rows) ran the last 92 as a second round;
/// 64 fit 18 an SM. Run 302 (TinyLlama Q4_K_M tg128, alternated twice with the 128 x 2 shape,
/// `KILN_GEMV_FLOAT=2560x2048=<shape>`): 1,166-1,171 -> 1,178-1,179 tok/s; 128 x 4 (640
/// workgroups) 1,177-1,178; 32 x 2, 64 x 1, 128 x 1, 64 x 4 and grouped shapes 1,108-1,168.
pub const GEMV_TWO_FORMATS_FLOAT_SHAPE: GemvShape = GemvShape::new(64, 2);

/// Picks the kernel for Y[m, n] = X[m, k] · W[n, k]ᵀ. A GEMV with a fused input (RMSNorm or
/// SwiGLU in front) gets the same choice: the int8 GEMV applies it in its quantize dispatch
/// (Llama-7B Q4_K_M decode on an H200: 141 t/s with fused inputs on the float GEMV, 211
/// with them on the int8 one).
///
/// On GPUs the choices follow `KILN_BENCH_DECODE=1 cargo bench` on an H200 with TinyLlama's
/// shapes (profiling/results/h200-decode-shapes-2026-11-21.txt): small matrices are bound by
/// latency, not bandwidth, so what matters is enough workgroups in flight.
pub fn plan_matmul(m: u32, n: u32, k: u32, format: WeightFormat, caps: &Caps) -> MatmulKernel {
    if gemv_takes(m, caps) {
        let shape = if caps.cpu_adapter {
            GemvShape::new(64, 4)
        } else if n <= 512 {
            // K/V projections of GQA models: 256 invocations on 2 rows, the most parallel reduction.
            GemvShape::new(256, 2)
        } else if n >= GEMV_FLOAT_MANY_ROWS && m == 1 {
            GEMV_FLOAT_MANY_ROWS_SHAPE
        } else if n >= 16384 {
            // The LM head over several columns: 4 rows per workgroup reuse x best.
            GemvShape::new(128, 4)
        } else if k >= 4096 && m == 1 {
            GemvShape::new(256, 2)
        } else {
            GemvShape::new(128, 2)
        };
        // Quants decoded to floats cost more instructions than their bytes take to read;
        // integer dot products over int8 activations take fewer.
        let min_weights = match format {
            WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K => GEMV_Q8_MIN_WEIGHTS,
            WeightFormat::Q8_0 => GEMV_Q8_MIN_WEIGHTS_Q8_0,
            _ => u64::MAX,
        };
        let min_weights = match crate::config::gemv_q8_min_weights_from_env() {
            Some(w) if min_weights < u64::MAX => w,
            _ => min_weights,
        };
        let many_cols = m >= gemv_q8_min_cols();
        let q8 = caps.int8_dot
            && min_weights < u64::MAX
            && (caps.int8_gemv_always || (!caps.cpu_adapter && (many_cols || n as u64 * k as u64 >= min_weights)));
        // H200 sweep: 64 invocations on 4 rows (sharing each x vector) for large matrices
        // and for several columns, 128 on 2 for more workgroups below 8192 rows; one column
        // of 4096 to 8191 rows, 128 on 4 (run 229: Llama-7B Q4_K_M tg128 349.5 tok/s with 128 on
        // 2, 352.7 with 128 on 4 for its output projection, 352.3 for its down projection;
        // TinyLlama's 2048-row ones lose 3-4% with it).
        let shape = match (q8, n >= 8192 || many_cols) {
            (true, many) => {
                let planned = match (many, n >= 4096) {
                    (true, _) => GemvShape::new(64, 4),
                    (false, true) => GemvShape::new(128, 4),
                    (false, false) => GemvShape::new(128, 2),
                };
                let asked = if m == 1 { crate::config::gemv_q8_from_env(n, k) } else { None };
                asked.unwrap_or(planned)
            }
            (false, _) if m == 1 => crate::config::gemv_float_from_env(n, k).unwrap_or(shape),
            (false, _) => shape,
        };
        // From 3 columns, the grouped shape, up to 8 columns a workgroup.
        if q8 && m >= gemv_q8_wide_min_cols() {
            if let Some(shape) = gemv_q8_wide_shape(m, n) {
                return MatmulKernel::Gemv { ncols: m.min(GEMV_Q8_WIDE_COLS), shape, q8 };
            }
        }
        return MatmulKernel::Gemv { ncols: m.clamp(1, gemv_group_cols(q8)), shape, q8 };
    }
    plan_gemm(m, n, k, format, caps)
}

/// Prompt tokens of one sequence that run on the GEMV for a model of width `n_embd`, where
/// the planner splits small GEMMs along K (`gemm_splits`; adapters with matrix cores): past
/// 8 tokens the split GEMM beat the GEMV on TinyLlama's 2048-wide matrices, while Llama-7B's
/// 4096-wide ones stayed faster on the GEMV up to 32 (H200, run 31: TinyLlama Q4_K_M pp20
/// 1,937 -> 2,939-3,080 tok/s and the time to first token of 20 tokens 10.3 -> 6.5-6.8 ms;
/// Llama-7B pp20 912-934 on the GEMV against 657-672). Elsewhere, and for batched decode
/// steps (whose Q/K/V epilogue runs on the GEMV only), `gemv_takes`.
pub const PREFILL_GEMV_COLS_NARROW: u32 = 8;
/// The widest model that `PREFILL_GEMV_COLS_NARROW` applies to.
pub const PREFILL_NARROW_EMBD: u32 = 2048;

pub fn prefill_gemv_cols(n_embd: u32, caps: &Caps) -> u32 {
    let most = caps.gemv_max_cols.min(GEMV_MAX_COLS);
    if caps.coopmat && !caps.cpu_adapter && n_embd <= PREFILL_NARROW_EMBD {
        most.min(PREFILL_GEMV_COLS_NARROW)
    } else {
        most
    }
}

/// Whether the cooperative-matrix GEMM can take a matmul of `format` weights over rows of k:
/// quantized and F16 weights (F32 and BF16 would lose range in f16), F16 rows in whole
/// 16-byte chunks (gemm_coop.wgsl moves them as they are).
pub fn coop_gemm_takes(format: WeightFormat, k: u32, caps: &Caps) -> bool {
    caps.coopmat && !caps.cpu_adapter && (format.is_quantized() || (format == WeightFormat::F16 && k % 8 == 0))
}

/// The GEMM tile for Y[m, n] = X[m, k] · W[n, k]ᵀ (prefill: `plan_matmul` past the GEMV's
/// columns; any m for matmuls bound for prefill alone).
pub fn plan_gemm(m: u32, n: u32, k: u32, format: WeightFormat, caps: &Caps) -> MatmulKernel {
    // Matrix cores from the first column past the GEMV's: a 20-token prompt on TinyLlama's
    // shapes went to 32x32 float tiles (64-80 workgroups each looping over all of k).
    let coop = coop_gemm_takes(format, k, caps);
    if caps.cpu_adapter || (!coop && m < 64) || n < 128 {
        return MatmulKernel::Gemm { tile: GemmTile::T32 };
    }
    let tiles = |bm: u32, bn: u32| m.div_ceil(bm) as u64 * n.div_ceil(bn) as u64;
    // 128x64 tiles do the most per byte loaded but only pay off with enough of them to fill the
    // GPU: at 512 tokens they win for 5632 outputs (352 tiles), and lose by 1.5x to 64x64 tiles
    // for 2048 outputs (128 tiles).
    // Weights that decode cheaply (F32, F16, BF16, Q8_0) take 128 W rows per tile instead:
    // H200, cooperative matrices off, the reworked kernel (run 491, µs at 512x2048x5632 /
    // 512x4096x11008 / 4096^3): F16 544 / 2,171 / 6,164 -> 436 / 1,712 / 4,924, BF16 -20 to
    // -24%, Q8_0 -7 to -13%; the K-quants, whose 128 rows cost more decoding, keep 128x64 (Q4_K
    // +1 / +1 / +7%, Q6_K +3 / -1 / +7% with 64x128).
    // Matrix cores where the adapter has them, for quantized and F16 weights (F32 and BF16
    // would lose range in f16): 128x128 tiles from COOP_WIDE_MIN_M tokens, split along K
    // where they are too few to fill the GPU (`gemm_splits`), 64x64 tiles split along K below,
    // and 16x64 tiles up to 16 tokens, where a 64-row tile would mostly multiply padding (H200,
    // `KILN_BENCH_BATCHED=1 cargo bench`, run 86, at 16 columns: TinyLlama's 2048x2048 Q4_K
    // 17.5 -> 15.2 µs, 2048x5632 Q6_K 26.7 -> 24.4; TinyLlama Q4_K_M pp16 2,513 -> 3,292-3,361
    // tok/s).
    if coop {
        if caps.cm2 && cm2_takes(m, n, k, format) {
            return MatmulKernel::Gemm { tile: GemmTile::Cm2 };
        }
        let tile = if m >= COOP_WIDE_MIN_M && n >= COOP_WIDE_MIN_N {
            if coop_256_takes(m, n, format) {
                GemmTile::Coop256x128
            } else {
                GemmTile::Coop128
            }
        } else if m <= 16 {
            GemmTile::Coop16
        } else {
            GemmTile::Coop64
        };
        return MatmulKernel::Gemm { tile };
    }
    let tile = if tiles(128, 64) < 256 {
        GemmTile::T64
    } else if matches!(format, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 | WeightFormat::Q8_0) {
        GemmTile::T64x128
    } else {
        GemmTile::T128x64
    };
    MatmulKernel::Gemm { tile }
}

/// 256x128 tiles (`GemmTile::Coop256x128`) from this many of them: each takes an SM, and they
/// win only with waves to spare. H200, F16, µs for the GEMM alone against 128x128x32 (kernels
/// bench with KILN_BENCH_SWEEP=1, runs 407-411): 4096^3 (512 tiles) 674-694 against 722-724;
/// 2048x2048x2560 (80 tiles) 178.1 against 140.7.
pub const COOP_256_MIN_TILES: u64 = 4 * COOP_FILL_TILES;

/// Whether an F16 GEMM of m tokens over n outputs that takes 128x128 tiles takes 256x128 ones
/// instead (`COOP_256_MIN_TILES`); `KILN_COOP_256=0|1` never / wherever 128x128 would run (to
/// compare).
pub fn coop_256_takes(m: u32, n: u32, format: WeightFormat) -> bool {
    if let Some(forced) = crate::config::coop_256_from_env() {
        return forced;
    }
    format == WeightFormat::F16 && m.div_ceil(256) as u64 * n.div_ceil(128) as u64 >= COOP_256_MIN_TILES
}

/// Whether an F16 GEMM of m tokens over n outputs and k weights a row takes the workgroup-scope
/// tile (`GemmTile::Cm2`, where the adapter has it): whole tiles and whole unrolled K steps
/// only (the kernel has no edges), and at least `COOP_256_MIN_TILES` of them, where it was
/// measured. H200, F16 4096^3 (512 tiles), the GEMM alone: 520.8 µs against the 256x128 tile's
/// 645.9 (run 501). The models' 512-token shapes (22-43 tiles of 128x256) keep the
/// subgroup-scope tiles: in the lab the 128x256 tile lost there (512x4096x11008 in 303 µs
/// against kiln's 255, run 494), and a 128x128x64 tile, faster alone than the planner's tiles
/// at the output and down projections' shapes, cost the models' pp512 12-13% in kiln, where
/// it replaced the split-K GEMM whose reduce also takes the next norm (runs 505-506,
/// profiling/results/measured-cm2-gemm-128x128-tile-not-kept-2026-11-29-run505-506.diff).
/// In a model the tile pays where its shapes come whole: Llama-7B pp4096 at `-ub 4096` +6.8%
/// (run 508). `KILN_DISABLE=cm2` turns it off. The caller also checks that its epilogue is a plain one
/// (`BoundMatmul`).
pub fn cm2_takes(m: u32, n: u32, k: u32, format: WeightFormat) -> bool {
    use crate::kernels::gemm_cm2::{BK, BM, BN, UNROLL};
    format == WeightFormat::F16
        && m % BM == 0
        && n % BN == 0
        && k % (BK * UNROLL) == 0
        && (m / BM) as u64 * (n / BN) as u64 >= COOP_256_MIN_TILES
}

/// Split-K: a GEMM with fewer tiles than this is split along K into ranges that run as
/// workgroups of their own (workgroup_id.z), their partial sums added up by a second
/// dispatch that applies the epilogue (gemm_reduce.wgsl). Two tiles per SM of an H200: below
/// that, each workgroup walked all of K alone while most SMs idled (a 128-token prompt on
/// TinyLlama's 2048-wide matrices: 64 tiles of 64x64).
pub const SPLIT_K_FILL_TILES: u64 = 2 * COOP_FILL_TILES;
/// The most K ranges.
pub const SPLIT_K_MAX: u32 = 8;
/// The fewest BK steps one K range walks.
pub const SPLIT_K_MIN_STEPS: u32 = 8;
/// Floats of the partial sums a split GEMM may write ([splits][m][rows]): a session's one
/// scratch buffer, which bounds the splits (so it fits by construction).
/// 16 MiB: two K ranges of a 512-token GEMM over 4096 outputs.
pub const SPLIT_K_SCRATCH_FLOATS: u64 = 4 * SPLIT_K_FILL_TILES * 64 * 64;

/// K ranges for a GEMM of `tile` over Y[m, n] = X[m, k] · W[n, k]ᵀ: 1 (no split) on CPU
/// adapters, for the wide tiles (picked only where tiles are plenty), and wherever the tiles
/// fill the GPU; else the ranges, each of at least `SPLIT_K_MIN_STEPS` K steps, at most
/// `SPLIT_K_MAX`, within the scratch, whose waves of `SPLIT_K_FILL_TILES` (or, for 128x128
/// tiles, `COOP_FILL_TILES`) workgroups take the least time.
/// `KILN_SPLIT_K=N` sets N wherever a GEMM runs on a GPU (1: never split; to compare).
pub fn gemm_splits(m: u32, n: u32, k: u32, tile: GemmTile, caps: &Caps) -> u32 {
    let (bm, bn, bk, ..) = tile.dims();
    let steps = k.div_ceil(bk);
    let most_by_scratch = (SPLIT_K_SCRATCH_FLOATS / (m.max(1) as u64 * n.max(1) as u64)).min(SPLIT_K_MAX as u64) as u32;
    // The workgroup-scope tile runs where tiles are plenty, and has no partials epilogue.
    if caps.cpu_adapter || tile == GemmTile::Cm2 {
        return 1;
    }
    if let Some(forced) = crate::config::split_k_from_env() {
        return forced.min(steps).min(most_by_scratch).max(1);
    }
    // 128x128 cooperative tiles take one workgroup per SM; the small tiles two.
    let fill = match tile {
        GemmTile::T32 | GemmTile::T64 | GemmTile::Coop16 | GemmTile::Coop64 => SPLIT_K_FILL_TILES,
        GemmTile::Coop128 => COOP_FILL_TILES,
        _ => return 1,
    };
    let tiles = m.div_ceil(bm) as u64 * n.div_ceil(bn) as u64;
    if tiles >= fill {
        return 1;
    }
    let most = (steps / SPLIT_K_MIN_STEPS).min(most_by_scratch).clamp(1, SPLIT_K_MAX);
    // The splits whose waves of `fill` workgroups take the least time: a workgroup's work falls
    // as 1/s while the waves grow as ceil(tiles s / fill), so a split that leaves a last wave
    // nearly empty loses (72 tiles of 128x128, Q and K of TinyLlama at 512 tokens: 2 ranges
    // make 144 workgroups, one wave and a tail of 12; 3 make 216, two fuller waves). Ties go
    // to fewer ranges (a smaller reduce pass).
    let waves = |s: u32| (tiles * s as u64).div_ceil(fill) as f64 / s as f64;
    (1..=most).min_by(|&a, &b| waves(a).total_cmp(&waves(b))).unwrap_or(1)
}

/// Weights per K range of a GEMM split `splits` ways (a whole number of BK steps), and the
/// ranges that takes (the last may be shorter; never empty).
pub fn split_k_range(k: u32, tile: GemmTile, splits: u32) -> (u32, u32) {
    let bk = tile.dims().2;
    let len = k.div_ceil(bk).div_ceil(splits.max(1)).max(1) * bk;
    (len, k.div_ceil(len).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> Caps {
        Caps { subgroups: true, f16: true, ..Caps::baseline() }
    }

    #[test]
    fn large_q4k_gate_up_with_float_swiglu_takes_row_pairs_in_groups() {
        // Llama-7B's gate/up (2 x 11008 rows of 4096): past the int8 SwiGLU epilogue's size.
        assert_eq!(gemv_q8_glu_float_shape(WeightFormat::Q4K, 22016, 4096), Some(GEMV_Q8_GLU_FLOAT));
        assert_eq!(GEMV_Q8_GLU_FLOAT.rows % 2, 0, "a gate/up pair stays in one group");
        // TinyLlama's (23 M weights) takes the int8 epilogue's shape; other formats are unmeasured.
        assert_eq!(gemv_q8_glu_float_shape(WeightFormat::Q4K, 11264, 2048), None);
        assert_eq!(gemv_q8_glu_float_shape(WeightFormat::Q6K, 22016, 4096), None);
        assert_eq!(gemv_q8_glu_float_shape(WeightFormat::Q8_0, 22016, 4096), None);
    }

    #[test]
    fn prompt_steps_grow_where_cooperative_matrices_and_memory_allow() {
        let coop = Caps { coopmat: true, ..gpu() };
        // 100 bytes an activation token: 2,048 tokens take 204,800.
        let act = |u: u32| u as u64 * 100;
        assert_eq!(default_ubatch(&coop, Some(16 * 204_800), 2048, act), 2048);
        // Too little memory for 2,048 takes 1,024, then llama.cpp's 512.
        assert_eq!(default_ubatch(&coop, Some(16 * 204_800 - 1), 2048, act), 1024);
        assert_eq!(default_ubatch(&coop, Some(16 * 102_400 - 1), 2048, act), DEFAULT_UBATCH);
        // -b caps it, as it caps -ub.
        assert_eq!(default_ubatch(&coop, Some(1 << 40), 1024, act), 1024);
        assert_eq!(default_ubatch(&coop, Some(1 << 40), 1500, act), 1024);
        assert_eq!(default_ubatch(&coop, Some(1 << 40), 256, act), 256);
        // Unknown memory, no cooperative matrices, or a CPU adapter: the default.
        assert_eq!(default_ubatch(&coop, None, 2048, act), DEFAULT_UBATCH);
        assert_eq!(default_ubatch(&gpu(), Some(1 << 40), 2048, act), DEFAULT_UBATCH);
        assert_eq!(default_ubatch(&Caps { cpu_adapter: true, ..coop }, Some(1 << 40), 2048, act), DEFAULT_UBATCH);
    }

    #[test]
    fn the_int8_swiglu_shape_covers_whole_blocks_and_the_others_do_not() {
        assert!(covers_q8_blocks(GEMV_Q8_SWIGLU));
        assert!(covers_q8_blocks(GemvShape::grouped(128, 16, 4)));
        // A workgroup of 16 or 4 rows holds 8 or 2 outputs of a block of 32.
        assert!(!covers_q8_blocks(GEMV_Q8_WIDE) && !covers_q8_blocks(GemvShape::new(64, 4)));
        // Odd rows would split a gate/up pair between groups.
        assert!(!covers_q8_blocks(GemvShape::grouped(64, 1, 64)));
    }

    #[test]
    fn the_int8_swiglu_epilogue_takes_small_gate_up_matrices_unless_a_shape_was_asked_for() {
        let c = Caps { q8_swiglu: Some(GEMV_Q8_SWIGLU), ..gpu() };
        // TinyLlama (2048 x 5632) and Qwen3-0.6B (1024 x 3072) take it, Llama-7B (4096 x 11008) not.
        assert!(q8_swiglu_takes(&c, 5632, 2048) && q8_swiglu_takes(&c, 3072, 1024));
        assert!(!q8_swiglu_takes(&c, 11008, 4096));
        assert!(q8_swiglu_takes(&Caps { q8_swiglu_any_size: true, ..c }, 11008, 4096));
        // Outputs that are not whole blocks of 32, or an adapter without it.
        assert!(!q8_swiglu_takes(&c, 5630, 2048));
        assert!(!q8_swiglu_takes(&Caps { q8_swiglu: None, ..c }, 5632, 2048));
    }

    #[test]
    fn decode_goes_to_gemv_and_prefill_to_gemm() {
        let c = gpu();
        assert!(matches!(plan_matmul(1, 4096, 4096, WeightFormat::Q4K, &c), MatmulKernel::Gemv { ncols: 1, .. }));
        assert!(matches!(plan_matmul(8, 4096, 4096, WeightFormat::Q6K, &c), MatmulKernel::Gemv { ncols: 8, .. }));
        assert!(matches!(
            plan_matmul(9, 4096, 4096, WeightFormat::F16, &c),
            MatmulKernel::Gemm { tile: GemmTile::T32 }
        ));
        assert!(matches!(
            plan_matmul(512, 4096, 4096, WeightFormat::Q8_0, &c),
            MatmulKernel::Gemm { tile: GemmTile::T64x128 }
        ));
        assert!(matches!(
            plan_matmul(512, 4096, 4096, WeightFormat::Q4K, &c),
            MatmulKernel::Gemm { tile: GemmTile::T128x64 }
        ));
    }

    #[test]
    fn two_format_qkv_takes_one_column_in_whole_workgroups() {
        let (q4, q6) = (WeightFormat::Q4K, WeightFormat::Q6K);
        // TinyLlama's Q/K (2,304 rows) and V (256): the float GEMV's 2-row workgroups.
        let k = plan_two_formats(2560, 2304, 2048, q4, q6, &gpu());
        let shape = GEMV_TWO_FORMATS_FLOAT_SHAPE;
        assert!(matches!(k, Some(MatmulKernel::Gemv { ncols: 1, q8: false, shape: s }) if s == shape), "{k:?}");
        // Llama-7B's: the int8 GEMV, as for the whole matrix.
        let int8 = Caps { int8_dot: true, ..gpu() };
        let k = plan_two_formats(12288, 8192, 4096, q4, q6, &int8);
        assert!(matches!(k, Some(MatmulKernel::Gemv { ncols: 1, q8: true, .. })), "{k:?}");
        // Not in whole workgroups (16-row ones from 8,192 rows), the same format twice, a
        // second format no mix makes, or a float first one.
        assert_eq!(plan_two_formats(9000, 8200, 2048, q4, q6, &gpu()), None);
        assert_eq!(plan_two_formats(2560, 2304, 2048, q4, q4, &gpu()), None);
        assert_eq!(plan_two_formats(2560, 2304, 2048, q6, q4, &gpu()), None);
        assert_eq!(plan_two_formats(2560, 2304, 2048, WeightFormat::F16, q6, &gpu()), None);
    }

    #[test]
    fn int8_gemv_for_large_quantized_gemvs() {
        let c = Caps { int8_dot: true, ..gpu() };
        let plan = |m, n, k, f| plan_matmul(m, n, k, f, &c);
        let q8 = |m, n, k, f| matches!(plan(m, n, k, f), MatmulKernel::Gemv { q8: true, .. });
        assert!(q8(1, 65536, 8192, WeightFormat::Q4K));
        assert!(q8(4, 4096, 4096, WeightFormat::Q6K));
        assert!(q8(1, 5632, 2048, WeightFormat::Q5K));
        assert!(!q8(1, 2048, 2048, WeightFormat::Q4K), "small");
        assert!(q8(1, 4096, 4096, WeightFormat::Q8_0));
        assert!(!q8(1, 5632, 2048, WeightFormat::Q8_0), "Q8_0 switches later");
        assert!(!q8(1, 65536, 8192, WeightFormat::F16), "float weights");
        // From 3 columns the int8 GEMV takes its grouped shape, up to 8 columns a workgroup
        // (grid z for more), up to the GEMV's columns.
        let wide = Caps { gemv_max_cols: 32, ..c };
        assert!(matches!(
            plan_matmul(2, 65536, 8192, WeightFormat::Q4K, &wide),
            MatmulKernel::Gemv { q8: true, ncols: 2, shape: GemvShape { groups: 1, .. } }
        ));
        assert_eq!(
            plan_matmul(4, 65536, 8192, WeightFormat::Q4K, &wide),
            MatmulKernel::Gemv { q8: true, ncols: 4, shape: GEMV_Q8_WIDE }
        );
        // Matrices of few rows at up to 8 columns: twice the workgroups.
        let shape_of = |m, n| match plan_matmul(m, n, 2048, WeightFormat::Q4K, &wide) {
            MatmulKernel::Gemv { shape, q8: true, .. } => shape,
            k => panic!("{k}"),
        };
        assert_eq!(shape_of(8, 2048), GEMV_Q8_WIDE_FEW_ROWS);
        assert_eq!(shape_of(16, 2048), GEMV_Q8_WIDE);
        assert_eq!(shape_of(8, 11264), GEMV_Q8_WIDE);
        assert_eq!(
            plan_matmul(11, 65536, 8192, WeightFormat::Q4K, &wide),
            MatmulKernel::Gemv { q8: true, ncols: GEMV_Q8_WIDE_COLS, shape: GEMV_Q8_WIDE }
        );
        assert!(matches!(plan_matmul(32, 4096, 4096, WeightFormat::Q4K, &wide), MatmulKernel::Gemv { q8: true, .. }));
        assert!(matches!(plan_matmul(33, 4096, 4096, WeightFormat::Q4K, &wide), MatmulKernel::Gemm { .. }));
        let shape = |n, k| match plan(1, n, k, WeightFormat::Q4K) {
            MatmulKernel::Gemv { shape, .. } => (shape.wg, shape.rows),
            k => panic!("{k}"),
        };
        assert_eq!(shape(65536, 8192), (64, 4));
        assert_eq!(shape(4096, 4096), (128, 4));
        assert_eq!(shape(2048, 5632), (128, 2));
        let no_dot = Caps { int8_dot: false, ..gpu() };
        assert!(!matches!(
            plan_matmul(1, 65536, 8192, WeightFormat::Q4K, &no_dot),
            MatmulKernel::Gemv { q8: true, .. }
        ));
        let cpu = Caps { cpu_adapter: true, ..c };
        assert!(!matches!(plan_matmul(1, 65536, 8192, WeightFormat::Q4K, &cpu), MatmulKernel::Gemv { q8: true, .. }));
        let always = Caps { int8_gemv_always: true, ..cpu };
        assert!(matches!(plan_matmul(4, 256, 256, WeightFormat::Q5K, &always), MatmulKernel::Gemv { q8: true, .. }));
        assert!(!matches!(plan_matmul(1, 256, 256, WeightFormat::F32, &always), MatmulKernel::Gemv { q8: true, .. }));
        assert!(!matches!(
            plan_matmul(1, 256, 256, WeightFormat::Q4K, &Caps { int8_dot: false, ..always }),
            MatmulKernel::Gemv { q8: true, .. }
        ));
    }

    #[test]
    fn small_matrices_get_more_workgroups() {
        let c = gpu();
        let shape = |m, n, k, format| match plan_matmul(m, n, k, format, &c) {
            MatmulKernel::Gemv { shape, .. } => (shape.wg, shape.rows, shape.groups),
            k => panic!("{k}"),
        };
        let gemv = |n| shape(1, n, 2048, WeightFormat::Q4K);
        assert_eq!(gemv(256), (256, 2, 1));
        assert_eq!(gemv(2048), (128, 2, 1));
        // Many rows over one column: row groups; over several, 4 rows a workgroup.
        assert_eq!(gemv(32000), (256, 4, 4));
        assert_eq!(shape(1, 11264, 2048, WeightFormat::F16), (256, 4, 4));
        assert_eq!(shape(3, 32000, 2048, WeightFormat::Q4K), (128, 4, 1));
        // Long rows: 256 invocations along them.
        assert_eq!(shape(1, 2048, 5632, WeightFormat::F16), (256, 2, 1));
        assert_eq!(shape(2, 2048, 5632, WeightFormat::F16), (128, 2, 1));
        let gemm = |m, n| match plan_matmul(m, n, 2048, WeightFormat::Q4K, &c) {
            MatmulKernel::Gemm { tile } => tile,
            k => panic!("{k}"),
        };
        assert_eq!(gemm(512, 5632), GemmTile::T128x64);
        assert_eq!(gemm(512, 2048), GemmTile::T64);
        assert_eq!(gemm(512, 256), GemmTile::T64);
        assert_eq!(gemm(2048, 2048), GemmTile::T128x64);
        for f in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8_0] {
            assert!(matches!(plan_matmul(512, 5632, 2048, f, &c), MatmulKernel::Gemm { tile: GemmTile::T64x128 }));
        }
        assert!(matches!(
            plan_matmul(512, 5632, 2048, WeightFormat::Q6K, &c),
            MatmulKernel::Gemm { tile: GemmTile::T128x64 }
        ));
    }

    #[test]
    fn prefill_uses_matrix_cores_where_offered() {
        let c = Caps { coopmat: true, ..gpu() };
        let gemm_n = |m, n, f| match plan_matmul(m, n, 4096, f, &c) {
            MatmulKernel::Gemm { tile } => Some(tile),
            _ => None,
        };
        let gemm = |m, f| gemm_n(m, 4096, f);
        // 128x128 tiles from 256 tokens and 512 outputs (split along K where they are few).
        assert_eq!(gemm(512, WeightFormat::Q4K), Some(GemmTile::Coop128));
        assert_eq!(gemm_n(512, 2048, WeightFormat::Q4K), Some(GemmTile::Coop128));
        assert_eq!(gemm_n(256, 2048, WeightFormat::Q4K), Some(GemmTile::Coop128));
        assert_eq!(gemm_n(512, 256, WeightFormat::Q6K), Some(GemmTile::Coop64));
        assert_eq!(gemm_n(128, 2048, WeightFormat::Q4K), Some(GemmTile::Coop64));
        assert_eq!(gemm_n(2048, 2048, WeightFormat::Q4K), Some(GemmTile::Coop128));
        let c128 = |m, n| gemm_splits(m, n, 2048, GemmTile::Coop128, &c);
        assert_eq!((c128(512, 2048), c128(512, 2304), c128(512, 4096), c128(2048, 2048)), (2, 3, 1, 1));
        // 64x64 tiles at 128 tokens (64 of them): 4 ranges, one wave of 256.
        assert_eq!(gemm_splits(128, 2048, 2048, GemmTile::Coop64, &c), 4);
        assert_eq!(gemm(64, WeightFormat::Q8_0), Some(GemmTile::Coop64));
        assert_eq!(gemm(512, WeightFormat::F16), Some(GemmTile::Coop128));
        // 256x128 tiles for F16 from 512 of them (4096^3: 16 x 32), never for block formats.
        if crate::config::coop_256_from_env().is_none() {
            assert_eq!(gemm(4096, WeightFormat::F16), Some(GemmTile::Coop256x128));
            assert_eq!(gemm_n(2048, 2048, WeightFormat::F16), Some(GemmTile::Coop128));
            assert_eq!(gemm(4096, WeightFormat::Q8_0), Some(GemmTile::Coop128));
        }
        assert_eq!(gemm(512, WeightFormat::F32), Some(GemmTile::T64x128));
        assert_eq!(gemm(512, WeightFormat::BF16), Some(GemmTile::T64x128));
        assert_eq!(gemm(32, WeightFormat::Q4K), Some(GemmTile::Coop64));
        // 16-row tiles up to 16 tokens (batched decode steps, short prompts).
        assert_eq!(gemm(9, WeightFormat::F16), Some(GemmTile::Coop16));
        assert_eq!(gemm(16, WeightFormat::Q4K), Some(GemmTile::Coop16));
        assert_eq!(gemm(17, WeightFormat::Q4K), Some(GemmTile::Coop64));
        assert_eq!(gemm(32, WeightFormat::F32), Some(GemmTile::T32));
        assert_eq!(gemm(4, WeightFormat::Q4K), None);
    }

    #[test]
    fn coop_layouts_cover_their_tiles() {
        for tile in GemmTile::COOP {
            let (bm, bn, bk, _, _) = tile.dims();
            let (sgn, fm, fnn) = tile.coop_layout();
            // gemm_coop.wgsl writes out FM = 1, 2 or 4 and FN = 1, 2 or 4 by name (FN 1 only with
            // FM 1, FN 4 only with FM 4).
            assert!(fm == 1 || fm == 2 || fm == 4, "{tile:?}");
            assert!(fnn == 2 || (fnn == 1 && fm == 1) || (fnn == 4 && fm == 4), "{tile:?}");
            let (multiply, load) = tile.coop_invocations();
            let sgm = multiply / 32 / sgn;
            assert_eq!((sgm * fm * 16, sgn * fnn * 16), (bm, bn), "{tile:?}");
            // One or two W chunks per loading invocation and K step; X chunks: 1, 2 or 4 per
            // loading invocation, or (16-row tiles) one for each of the first whole subgroups.
            assert!([1, 2].contains(&tile.coop_w_chunks()), "{tile:?}");
            let load = if tile.coop_shared_loads() { multiply } else { load };
            assert_eq!(bn * bk / 8, tile.coop_w_chunks() * load, "{tile:?}");
            assert_eq!(load % 32, 0, "{tile:?}");
            let x_chunks = bm * bk / 8;
            assert!(
                [load, 2 * load, 4 * load].contains(&x_chunks) || (x_chunks < load && x_chunks % 32 == 0),
                "{tile:?}"
            );
            // Within the workgroup size the cooperative path asks of the adapter.
            assert!(tile.workgroup_size() <= COOP_MAX_INVOCATIONS, "{tile:?}");
            // Workgroup memory: double-buffered padded tiles and a 16x16 f32 slice per
            // multiplying subgroup, within 48 KiB.
            let bytes = 2 * (bm + bn) * (bk + 8) * 2 + multiply / 32 * 1024;
            assert!(bytes <= 48 * 1024, "{tile:?}: {bytes}");
        }
    }

    #[test]
    fn cpu_adapters_get_small_shapes() {
        let c = Caps { cpu_adapter: true, ..gpu() };
        assert!(matches!(
            plan_matmul(512, 4096, 4096, WeightFormat::F32, &c),
            MatmulKernel::Gemm { tile: GemmTile::T32 }
        ));
        assert!(matches!(
            plan_matmul(1, 4096, 4096, WeightFormat::F32, &c),
            MatmulKernel::Gemv { shape: GemvShape { wg: 64, .. }, .. }
        ));
    }

    #[test]
    fn tiles_fit_workgroup_limits() {
        for t in GemmTile::ALL {
            let (bm, bn, bk, tm, tn) = t.dims();
            assert!(t.workgroup_size() <= 256);
            assert_eq!(bk % 8, 0);
            // The register tiles are written out for these sizes only.
            assert!(matches!((tm, tn), (4, 4) | (8, 8)));
            assert!((bm + bn) * bk * 4 <= 32768);
        }
    }

    #[test]
    fn cm2_takes_large_whole_tile_f16_gemms() {
        let caps = Caps { coopmat: true, cm2: true, ..gpu() };
        let kernel = |m, n, k, f| plan_gemm(m, n, k, f, &caps);
        let cm2 = MatmulKernel::Gemm { tile: GemmTile::Cm2 };
        assert_eq!(kernel(4096, 4096, 4096, WeightFormat::F16), cm2);
        // Other formats, too few tiles, edges, K not in whole unrolled steps: the other tiles.
        assert_ne!(kernel(4096, 4096, 4096, WeightFormat::Q8_0), cm2);
        assert_ne!(kernel(512, 4096, 11008, WeightFormat::F16), cm2);
        assert_ne!(kernel(4000, 4096, 4096, WeightFormat::F16), cm2);
        assert_ne!(kernel(4096, 4000, 4096, WeightFormat::F16), cm2);
        assert_ne!(kernel(4096, 4096, 4032, WeightFormat::F16), cm2);
        assert_ne!(plan_gemm(4096, 4096, 4096, WeightFormat::F16, &Caps { cm2: false, ..caps }), cm2);
        // Never split along K (it has no partials epilogue).
        assert_eq!(gemm_splits(128, 256, 1 << 16, GemmTile::Cm2, &caps), 1);
    }
}
