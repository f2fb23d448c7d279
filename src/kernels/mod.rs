//! Kernels: one module per op family, each with its parameter struct (mirroring the WGSL
//! uniform), its typed pipeline key, host-side dispatch and the CPU reference tests use.

pub mod argmax;
pub mod attention;
pub mod elementwise;
pub mod embed;
pub mod flash_attention;
pub mod gemm_cm2;
pub mod matmul;
pub mod nll;
pub mod norm;
pub mod probe;
pub mod rope;
pub mod sample;

use crate::error::Result;
use crate::gpu::shader::{Composer, ShaderSource};
use crate::gpu::Caps;
use crate::plan::{GemmTile, GemvShape};
use crate::quant::WeightFormat;

/// How the KV cache stores values, and how a kernel reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvKind {
    F32,
    /// Halves read through the f16 type (SHADER_F16).
    F16Native,
    /// The same halves read as packed u32 words (fallback).
    F16Packed,
}

impl KvKind {
    pub const ALL: [KvKind; 3] = [KvKind::F32, KvKind::F16Native, KvKind::F16Packed];
    /// The variant for a cache of `f16` values on an adapter with these capabilities.
    pub fn for_cache(f16_cache: bool, caps: &Caps) -> KvKind {
        match (f16_cache, caps.f16) {
            (false, _) => KvKind::F32,
            (true, true) => KvKind::F16Native,
            (true, false) => KvKind::F16Packed,
        }
    }
    pub fn bytes_per_elem(self) -> u64 {
        if self == KvKind::F32 {
            4
        } else {
            2
        }
    }
    fn file(self) -> &'static str {
        match self {
            KvKind::F32 => "common/kv_f32.wgsl",
            KvKind::F16Native => "common/kv_f16_native.wgsl",
            KvKind::F16Packed => "common/kv_f16_packed.wgsl",
        }
    }
    fn needs_f16(self) -> bool {
        self == KvKind::F16Native
    }
}

fn format_file(f: WeightFormat) -> &'static str {
    match f {
        WeightFormat::F32 => "formats/f32.wgsl",
        WeightFormat::F16 => "formats/f16.wgsl",
        WeightFormat::BF16 => "formats/bf16.wgsl",
        WeightFormat::Q8_0 => "formats/q8_0.wgsl",
        WeightFormat::Q4K => "formats/q4_k.wgsl",
        WeightFormat::Q5K => "formats/q5_k.wgsl",
        WeightFormat::Q6K => "formats/q6_k.wgsl",
    }
}

/// The binding of a GEMV's second weights buffer (`KernelKey::Gemv::second`): after the
/// Q/K/V epilogue's.
pub const SECOND_WEIGHTS_BINDING: u32 = 10;

/// How a GEMV body (its work over a workgroup's rows in `rows_file`, its weights bound by
/// `weights_file`) picks its rows' weights: all from binding 1, or (`second`) the rows from
/// `first_rows` on through a second copy of the format's decoding and of that work over
/// `SECOND_WEIGHTS_BINDING`.
fn gemv_formats(
    c: Composer,
    second: Option<WeightFormat>,
    weights_file: &'static str,
    rows_file: &'static str,
) -> Composer {
    match second {
        None => c.include("common/gemv_one_format.wgsl"),
        Some(f2) => c
            .include_renamed(
                &["common/quant_words.wgsl", format_file(f2), weights_file, rows_file],
                "_b",
                SECOND_WEIGHTS_BINDING,
            )
            .include("common/gemv_two_formats.wgsl"),
    }
}

/// The epilogue files of a matmul variant (common/matmul_epilogue.wgsl and what it needs).
fn epilogue(c: Composer, epi: Epi) -> Composer {
    let c = c.const_u32("EPI", epi.code()).include("common/matmul_epilogue.wgsl");
    match epi {
        Epi::Qkv { kv, neox, batched } => {
            step_file(c.const_bool("NEOX", neox).include(kv.file()), batched).include("common/epilogue_qkv.wgsl")
        }
        Epi::SwiGluF16 => c.include("common/epilogue_f16_out.wgsl"),
        _ => c.include("common/epilogue_none.wgsl"),
    }
}

/// What a kernel that reads the step buffer takes a column's position and cache region from:
/// one sequence's tokens (common/step_one.wgsl), or a batched step's table of columns
/// (common/step_columns.wgsl).
fn step_file(c: Composer, batched: bool) -> Composer {
    if batched {
        c.include("common/step_columns.wgsl")
    } else {
        c.include("common/step_one.wgsl")
    }
}

/// How decode attention's split workgroups are merged: by the last of them
/// (common/decode_merge.wgsl, its int8 output through common/q8_lanes8.wgsl, its fence after
/// the count in common/decode_merge_acquire.wgsl or none: `Caps::decode_merge_acquire`), or by
/// attention_combine.wgsl's pass (the stubs of common/decode_merge_none.wgsl).
fn decode_merge_files(c: Composer, caps: &Caps, merge: bool) -> Composer {
    let c = c.const_bool("MERGE", merge);
    if merge {
        // The fence's choice is a file, not a constant: naga keeps a branch on a constant, and
        // with it NVIDIA's compiler placed the merge after the non-merging workgroups' code
        // rather than straight after the count (H200, run 463: ~2.6 µs a token at depth 4,096).
        let acquire = if caps.decode_merge_acquire {
            "common/decode_merge_acquire.wgsl"
        } else {
            "common/decode_merge_acquire_none.wgsl"
        };
        c.const_bool("WO_AHEAD", attention::decode_wo_ahead())
            .include(acquire)
            .include("common/q8_lanes8.wgsl")
            .include("common/decode_merge.wgsl")
    } else {
        c.include("common/decode_merge_none.wgsl")
    }
}

/// Where flash attention takes its chunk of rows from: the uniform (one sequence), or a table
/// of several sequences' chunks.
fn flash_segment_file(segments: bool) -> &'static str {
    if segments {
        "common/flash_segments.wgsl"
    } else {
        "common/flash_one.wgsl"
    }
}

/// Lanes one `group_sum` of the reduction file adds up, where every lane group has as many
/// (common/gemv_output.wgsl's LANE_GROUP_SIZE, which lets a grouped one-column GEMV's lane
/// groups add up their sums themselves): the adapter's subgroup size where it is fixed, 1
/// without subgroups (each lane its own group), 0 where subgroups vary in size. The int8 GEMV
/// takes it, the float GEMV 0 (H200, run 319, tg128 tok/s, three alternations: Llama-7B Q4_K_M
/// 408.8 -> 418.1, TinyLlama Q4_K_M 1,153 -> 1,160; TinyLlama F16, whose grouped float GEMV is
/// its LM head, 1,000 -> 989).
fn lane_group_size(caps: &Caps, subgroups: bool) -> u32 {
    match subgroups {
        false => 1,
        true if caps.subgroup_min == caps.subgroup_max => caps.subgroup_min,
        true => 0,
    }
}

fn reduce_file(subgroups: bool) -> &'static str {
    if subgroups {
        "common/reduce_subgroup.wgsl"
    } else {
        "common/reduce_shared.wgsl"
    }
}

/// Where a matmul's outputs go (common/matmul_epilogue.wgsl).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epi {
    /// Y (+ bias) (+ the value already there).
    Plain,
    /// Gate and up rows interleaved: Y = silu(gate) * up.
    SwiGlu,
    /// The same, and Y also quantized to int8 blocks (binding 6: common/q8_out.wgsl) for the
    /// int8 GEMV that reads it, so that the FFN's down projection needs no quantize dispatch.
    /// The int8 GEMV's grouped shapes whose workgroups cover whole blocks of 32 outputs
    /// (`plan::covers_q8_blocks`) only.
    SwiGluQ8,
    /// SwiGLU written as halves (binding 6: common/epilogue_f16_out.wgsl), the f16 input of
    /// the cooperative GEMM after it (the down projection), instead of the float Y: no
    /// to_half dispatch between them. GEMMs only.
    SwiGluF16,
    /// Q, K and V rows stacked: Q rotated into Y, K rotated and V copied into the KV cache.
    /// `batched`: each column is its own sequence (a batched decode step's table of
    /// positions and cache regions), else the step's tokens are one sequence's.
    Qkv { kv: KvKind, neox: bool, batched: bool },
    /// A split-K GEMM's raw sums over its K range, into the partials scratch (the real
    /// epilogue runs in `KernelKey::GemmReduce`).
    Partial,
    /// As `Plain` (a projection added to the residual stream), and Y also quantized to int8
    /// blocks times the next RMSNorm's weights (binding 6: common/q8_out.wgsl; the weights at
    /// binding 7: common/q8_out_norm.wgsl), each block with its sum of squares, the int8 input
    /// of the GEMV after the norm (its 1 / rms taken from those sums, as after
    /// quantize_q8_lanes.wgsl), so that GEMV needs no quantize dispatch. The int8 GEMV's
    /// grouped shapes over one column whose workgroups cover whole blocks of 32 rows
    /// (`plan::covers_q8_rows`) only.
    AddQ8Norm,
}

impl Epi {
    /// The variant whose columns are each its own sequence (a batched decode step): only the
    /// Q/K/V epilogue reads positions.
    pub fn batched(self) -> Epi {
        match self {
            Epi::Qkv { kv, neox, .. } => Epi::Qkv { kv, neox, batched: true },
            e => e,
        }
    }

    /// Whether the epilogue writes halves (SHADER_F16): an f16 KV cache read as such, or the f16
    /// SwiGLU output.
    fn needs_f16(self) -> bool {
        matches!(self, Epi::Qkv { kv: KvKind::F16Native, .. } | Epi::SwiGluF16)
    }

    fn code(self) -> u32 {
        match self {
            Epi::Plain => 0,
            Epi::SwiGlu => 1,
            Epi::Qkv { .. } => 2,
            Epi::Partial => 3,
            Epi::SwiGluQ8 => 4,
            Epi::SwiGluF16 => 5,
            Epi::AddQ8Norm => 6,
        }
    }
}

/// Every pipeline kiln can build. Hashing a key finds its pipeline; `source` composes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKey {
    Gemv {
        format: WeightFormat,
        ncols: u8,
        rows: u8,
        /// Groups of invocations, each its own `rows` rows (`plan::GemvShape::groups`).
        groups: u8,
        wg: u16,
        subgroups: bool,
        /// RMSNorm of x fused in front (decode). The int8 GEMV's: over one column, either from
        /// blocks quantized without the norm's 1 / rms (quantize_q8_lanes.wgsl; the sums take it
        /// at the end) or, `x_local`, quantized by each workgroup itself.
        norm: bool,
        /// SiLU(gate) * up fused in front (decode's FFN down projection).
        glu: bool,
        /// Over activations quantized to int8 by `QuantizeQ8`, with integer dot products
        /// (gemv_q8.wgsl; quantized formats only; the fused inputs belong to `QuantizeQ8`, but
        /// the RMSNorm's 1 / rms after quantize_q8_lanes.wgsl and with `x_local`).
        q8: bool,
        /// The int8 GEMV quantizes its own input through the RMSNorm (common/q8_in_local.wgsl)
        /// rather than reading blocks a quantize dispatch wrote.
        x_local: bool,
        epi: Epi,
        /// The format of a second weights buffer (binding `SECOND_WEIGHTS_BINDING`) holding
        /// the rows from `MatmulParams::first_rows` on: one dispatch over a Q/K/V projection
        /// stacked from two formats (common/gemv_two_formats.wgsl; the Q/K/V epilogue only).
        second: Option<WeightFormat>,
    },
    /// A GEMV input quantized to int8 blocks for the int8-activation GEMV, through the fused
    /// RMSNorm or SwiGLU (quantize_q8.wgsl); `plan::GEMV_Q8_GROUP_COLS` rows per workgroup.
    QuantizeQ8 {
        subgroups: bool,
        norm: bool,
        glu: bool,
        /// 8 invocations a block, one column's blocks a `QUANTIZE_LANES_WG` / 8 per workgroup,
        /// and the RMSNorm's 1 / rms left to the GEMV (quantize_q8_lanes.wgsl: one-token
        /// steps, with subgroups; `Caps::quantize_lanes`).
        lanes: bool,
    },
    /// A cooperative GEMM's input rounded to f16 once (to_half.wgsl), which every weight
    /// chunk's GEMM then reads.
    ToHalf,
    /// A K-quant weight matrix decoded to f16 (dequant_f16.wgsl), which the prefill GEMMs
    /// after it read as F16 weights (`Caps::dequant_f16_from`).
    DequantF16 {
        format: WeightFormat,
    },
    Gemm {
        format: WeightFormat,
        tile: GemmTile,
        epi: Epi,
    },
    /// Split-K's second pass (gemm_reduce.wgsl): the partial sums of a `Gemm` with
    /// `Epi::Partial` added up, then `epi` applied.
    GemmReduce {
        epi: Epi,
    },
    Embed {
        format: WeightFormat,
    },
    AttnGemm {
        kv: KvKind,
    },
    Softmax {
        subgroups: bool,
    },
    /// Prefill attention in one dispatch (flash_attention.wgsl), for heads of up to
    /// `head_dim` dimensions (a class of `flash_attention::FLASH_HEAD_DIMS`).
    /// `segments`: the rows are several sequences' prompt chunks, each workgroup's from the
    /// table at binding 5 (common/flash_segments.wgsl), else one sequence's.
    AttnFlash {
        kv: KvKind,
        head_dim: u16,
        segments: bool,
    },
    /// The same on cooperative matrices (flash_attention_coop.wgsl): heads of 64 or 128
    /// dimensions over an f16 cache read as f16 (`KvKind::F16Native`).
    AttnFlashCoop {
        head_dim: u16,
        segments: bool,
    },
    /// Merges the partial outputs of a flash attention whose keys were split among
    /// workgroups (flash_combine.wgsl).
    FlashCombine,
    AttnDecode {
        kv: KvKind,
        subgroups: bool,
        /// The head-dim class (`attention::decode_class`).
        head_dim: u16,
        /// K rows read as whole vectors: heads of a multiple of 8 dimensions.
        vectors: bool,
        /// Query heads per workgroup (`AttnShape::decode_block`).
        block: u8,
        /// One query per column of a batched decode step, each over its own sequence.
        batched: bool,
        /// A step of one split also writes its output as int8 blocks (binding 6) for the
        /// output projection's int8 GEMV (heads of a multiple of 32 dimensions).
        q8_out: bool,
        /// Workgroups of `ATTN_WG_DECODE_WIDE` (one split of `attention::decode_chunk_of_class`
        /// positions; one sequence, one head a workgroup).
        wide: bool,
        /// A split step's last workgroup of each block merges the splits itself, so no
        /// combine pass follows (common/decode_merge.wgsl, bindings 7 to 9; one sequence,
        /// subgroups, heads of a multiple of 4 dimensions: `Caps::decode_merge`).
        merge: bool,
    },
    /// One sequence's decode attention over a long context on cooperative matrices
    /// (attention_decode_coop.wgsl): heads of 64 or 128 dimensions over an f16 cache read as
    /// f16, always split (its partials merged by `AttnCombine`).
    AttnDecodeCoop {
        head_dim: u16,
        /// Keys of a subgroup's tile (`attention::DECODE_COOP_TILES`).
        keys: u8,
        /// Each KV head's last split workgroup merges the splits (as `AttnDecode`'s), with
        /// the output also as int8 blocks where `q8_out`.
        merge: bool,
        q8_out: bool,
    },
    AttnCombine {
        subgroups: bool,
        batched: bool,
        /// The output also as int8 blocks (binding 4), as `AttnDecode`'s.
        q8_out: bool,
    },
    Rope {
        neox: bool,
        to_cache: Option<KvKind>,
        rope: bool,
    },
    /// K rotated and V copied into their caches in one dispatch.
    KvWrite {
        neox: bool,
        kv: KvKind,
    },
    RmsNorm {
        subgroups: bool,
        /// The rows written as halves, the cooperative GEMM's input (SHADER_F16).
        halves: bool,
    },
    /// Split-K's second pass of a GEMM added to the residual stream and the RMSNorm after it
    /// writing halves, in one dispatch (reduce_norm.wgsl; prefill, `norm::ReduceNormParams`).
    ReduceNorm {
        subgroups: bool,
    },
    Elementwise {
        op: elementwise::EltOp,
    },
    Argmax {
        subgroups: bool,
    },
    /// Sampling, two passes over the same bindings: `prune` the first, penalties and bans
    /// and per slice of the row its largest logit and a floor under its top-k
    /// (sample_prune.wgsl); then top-k/top-p/min-p, temperature and a seeded draw (or
    /// greedy), one workgroup per row (sample.wgsl).
    Sample {
        subgroups: bool,
        /// Rows are a batched step's columns, each with its slot's configuration and state.
        batched: bool,
        prune: bool,
        /// The first pass also writes each slice's candidates in order, which the second
        /// merges instead of reading the row (`Caps::sample_tops`).
        tops: bool,
        /// One sequence's chained decode steps: the second pass also moves the step state
        /// (binding 5) on to the next position and appends the token to the chain's list
        /// (binding 6; common/sample_chain.wgsl). Bound either way (one layout); never set on
        /// the first pass, which is the same for chained steps.
        chained: bool,
        /// A greedy sampler's one pass (sample.wgsl's ONE_PASS): no first pass; the penalties,
        /// bans and the row's largest logit in one workgroup a row, one dispatch instead of
        /// two. Only on the second pass (`prune` false) of rows that share one configuration
        /// (not `batched`), for configurations that are greedy (any other would still get the
        /// row's largest logit). Before it a greedy sampler's second pass alone took
        /// `sample::SAMPLE_WG` invocations (run 326); this replaced both passes.
        greedy: bool,
    },
    /// Scoring: each row's negative log-likelihood of its target token (nll.wgsl).
    Nll {
        subgroups: bool,
    },
    /// Device probes (`kiln info --probe`).
    Probe {
        kind: ProbeKind,
    },
}

/// What a probe kernel measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    ReadBandwidth,
    Fma,
    DependentDispatch,
    /// 16x16x16 f16 cooperative-matrix multiply-adds (probe_coop.wgsl; `Caps::coopmat`).
    CoopMma,
}

/// Work sizes shared by host and shader.
pub const WG_ROW: u32 = 256; // one-row-per-workgroup reductions (norm, softmax, argmax, nll)
pub const WG_ELT: u32 = 256; // elementwise and gather kernels
pub const QUANTIZE_WG: u32 = 64; // activation blocks per quantize_q8 workgroup
/// Invocations of a quantize_q8_lanes.wgsl workgroup: 8 a block of 32 values.
pub const QUANTIZE_LANES_WG: u32 = 64;
pub const ATTN_MAX_HEAD_DIM: u32 = 256;
pub const ATTN_WG_DECODE: u32 = 256; // decode attention (`plan::attn_decode_wg`) and its combine pass
/// Invocations of a wide decode-attention workgroup (`AttnShape::decode_wide_takes`): one
/// split of twice the positions where the usual workgroup would need two and a combine pass.
pub const ATTN_WG_DECODE_WIDE: u32 = 512;
pub const ATTN_DECODE_MAX_BLOCK: u32 = 8; // query heads per decode workgroup, at most
/// Head-dim classes of the decode attention's variants (heads of up to that many dimensions).
pub const ATTN_DECODE_HEAD_DIMS: [u16; 4] = [32, 64, 128, 256];
pub const ATTN_TILE: (u32, u32, u32, u32, u32) = (32, 32, 16, 4, 4);

/// How a kernel binds one resource (group 0, bindings in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binding {
    Uniform,
    Read,
    ReadWrite,
}

impl KernelKey {
    /// The kernel's bind group layout. Explicit (not derived from the shader) so that kernels
    /// with the same bindings, e.g. every GEMV and GEMM variant, share bind groups.
    pub fn bindings(&self) -> &'static [Binding] {
        use Binding::*;
        match self {
            KernelKey::Gemv { epi: Epi::Qkv { .. }, second: Some(_), .. } => {
                &[Uniform, Read, Read, ReadWrite, Read, Read, ReadWrite, ReadWrite, Uniform, Read, Read]
            }
            KernelKey::Gemv { epi: Epi::Qkv { .. }, .. }
            | KernelKey::Gemm { epi: Epi::Qkv { .. }, .. }
            | KernelKey::GemmReduce { epi: Epi::Qkv { .. } } => {
                &[Uniform, Read, Read, ReadWrite, Read, Read, ReadWrite, ReadWrite, Uniform, Read]
            }
            // The int8 blocks, then the norm's weights they are scaled by.
            KernelKey::Gemv { epi: Epi::AddQ8Norm, .. } => {
                &[Uniform, Read, Read, ReadWrite, Read, Read, ReadWrite, Read]
            }
            // The int8 blocks, or the halves, written last.
            KernelKey::Gemv { epi: Epi::SwiGluQ8, .. }
            | KernelKey::Gemm { epi: Epi::SwiGluF16, .. }
            | KernelKey::GemmReduce { epi: Epi::SwiGluF16 } => &[Uniform, Read, Read, ReadWrite, Read, Read, ReadWrite],
            KernelKey::Gemv { .. }
            | KernelKey::Gemm { .. }
            | KernelKey::GemmReduce { .. }
            | KernelKey::QuantizeQ8 { .. }
            | KernelKey::ToHalf
            | KernelKey::DequantF16 { .. } => &[Uniform, Read, Read, ReadWrite, Read, Read],
            KernelKey::Embed { .. }
            | KernelKey::AttnGemm { .. }
            | KernelKey::RmsNorm { .. }
            | KernelKey::Elementwise { .. } => &[Uniform, Read, Read, ReadWrite],
            // The partials, the norm's weights, the halves, then the residual stream.
            KernelKey::ReduceNorm { .. } => &[Uniform, Read, Read, ReadWrite, ReadWrite],
            KernelKey::Softmax { .. } => &[Uniform, ReadWrite],
            // The step state and the chain's token list last, bound whether or not the variant
            // uses them (`chained`), so that every variant takes one bind group.
            KernelKey::Sample { batched: false, .. } => {
                &[Uniform, ReadWrite, ReadWrite, ReadWrite, ReadWrite, ReadWrite, ReadWrite]
            }
            // The slots' configurations and the step's table of columns.
            KernelKey::Sample { batched: true, .. } => {
                &[Uniform, ReadWrite, ReadWrite, ReadWrite, Read, Read, ReadWrite]
            }
            // The int8 output last, bound (to a placeholder) whether or not the variant writes
            // it, so that every variant takes one bind group.
            // The cooperative variant leaves the int8 output unused, sharing the bind groups.
            KernelKey::AttnDecode { merge: false, .. } | KernelKey::AttnDecodeCoop { merge: false, .. } => {
                &[Uniform, Read, Read, Read, ReadWrite, Read, ReadWrite]
            }
            // Those that merge their own splits: the partials and the blocks' counters after,
            // then the output projection's weights (read ahead, common/decode_merge.wgsl).
            KernelKey::AttnDecode { merge: true, .. } | KernelKey::AttnDecodeCoop { merge: true, .. } => {
                &[Uniform, Read, Read, Read, ReadWrite, Read, ReadWrite, ReadWrite, ReadWrite, Read]
            }
            // The chunks' table (unused by the one-sequence variants, so that both share the
            // bind group), then the split keys' partial outputs (the cooperative variant's).
            KernelKey::AttnFlash { .. } | KernelKey::AttnFlashCoop { .. } => {
                &[Uniform, Read, Read, Read, ReadWrite, Read, ReadWrite]
            }
            KernelKey::FlashCombine => &[Uniform, Read, ReadWrite],
            KernelKey::Nll { .. } => &[Uniform, Read, Read, ReadWrite],
            KernelKey::AttnCombine { .. } => &[Uniform, Read, ReadWrite, Read, ReadWrite],
            KernelKey::Argmax { .. } | KernelKey::Probe { .. } => &[Uniform, Read, ReadWrite],
            // The step state (position, cache region), then the rows.
            KernelKey::Rope { to_cache: None, .. } => &[Uniform, Read, ReadWrite],
            KernelKey::Rope { to_cache: Some(_), .. } => &[Uniform, Read, ReadWrite, ReadWrite],
            KernelKey::KvWrite { .. } => &[Uniform, Read, ReadWrite, ReadWrite, Read, ReadWrite],
        }
    }

    /// The kernel's name (its WGSL file's), as profiles and `kiln bench --ablate` say it.
    pub fn name(&self) -> &'static str {
        match self {
            KernelKey::Gemv { q8: true, .. } => "gemv_q8",
            KernelKey::Gemv { .. } => "gemv",
            KernelKey::QuantizeQ8 { .. } => "quantize_q8",
            KernelKey::ToHalf => "to_half",
            KernelKey::DequantF16 { .. } => "dequant_f16",
            KernelKey::Gemm { tile: GemmTile::Cm2, .. } => "gemm_cm2",
            KernelKey::Gemm { tile, .. } if tile.is_coop() => "gemm_coop",
            KernelKey::Gemm { .. } => "gemm",
            KernelKey::GemmReduce { .. } => "gemm_reduce",
            KernelKey::Embed { .. } => "embed",
            KernelKey::AttnGemm { .. } => "attention_prefill",
            KernelKey::Softmax { .. } => "softmax",
            KernelKey::AttnFlash { .. } => "flash_attention",
            KernelKey::AttnFlashCoop { .. } => "flash_attention_coop",
            KernelKey::FlashCombine => "flash_combine",
            KernelKey::AttnDecode { .. } => "attention_decode",
            KernelKey::AttnDecodeCoop { .. } => "attention_decode_coop",
            KernelKey::AttnCombine { .. } => "attention_combine",
            KernelKey::Rope { .. } | KernelKey::KvWrite { .. } => "rope",
            KernelKey::RmsNorm { .. } => "rms_norm",
            KernelKey::ReduceNorm { .. } => "reduce_norm",
            KernelKey::Elementwise { .. } => "elementwise",
            KernelKey::Argmax { .. } => "argmax",
            KernelKey::Sample { prune: true, .. } => "sample_prune",
            KernelKey::Sample { .. } => "sample",
            KernelKey::Nll { .. } => "nll",
            KernelKey::Probe { .. } => "probe",
        }
    }

    pub fn entry(&self) -> &'static str {
        match self {
            KernelKey::Rope { to_cache: Some(_), .. } => "to_cache",
            KernelKey::KvWrite { .. } => "kv_write",
            KernelKey::Probe { kind: ProbeKind::ReadBandwidth } => "read_bw",
            KernelKey::Probe { kind: ProbeKind::Fma } => "fma_peak",
            KernelKey::Probe { kind: ProbeKind::DependentDispatch } => "chain",
            KernelKey::Probe { kind: ProbeKind::CoopMma } => "mma_peak",
            _ => "main",
        }
    }

    /// Composes this kernel's WGSL.
    pub fn source(&self, caps: &Caps) -> Result<ShaderSource> {
        let label = format!("{self:?}");
        let c = Composer::new(label);
        if let KernelKey::Gemm { epi: Epi::SwiGluQ8, .. } | KernelKey::GemmReduce { epi: Epi::SwiGluQ8 } = self {
            return Err(crate::error::KilnError::invalid("kernel", "the int8 SwiGLU epilogue is the int8 GEMV's only"));
        }
        if let KernelKey::Gemv { epi: Epi::SwiGluF16, .. } = self {
            return Err(crate::error::KilnError::invalid("kernel", "the f16 SwiGLU epilogue is the GEMMs' only"));
        }
        if let KernelKey::Gemm { tile: GemmTile::Cm2, .. } = self {
            return Err(crate::error::KilnError::invalid(
                "kernel",
                "the workgroup-scope GEMM is SPIR-V (`spirv`), not WGSL",
            ));
        }
        if let KernelKey::Gemm { epi: Epi::AddQ8Norm, .. } | KernelKey::GemmReduce { epi: Epi::AddQ8Norm } = self {
            return Err(crate::error::KilnError::invalid(
                "kernel",
                "the int8 residual epilogue is the int8 GEMV's only",
            ));
        }
        match *self {
            KernelKey::Gemv { format, ncols, rows, groups, wg, subgroups, norm, glu, q8, x_local, epi, second } => {
                // The int8 GEMV's fused RMSNorm, over one column: each workgroup quantizes the
                // column itself (common/q8_in_local.wgsl), or the blocks come without the
                // norm's 1 / rms (common/q8_in_global.wgsl); otherwise the quantize dispatch
                // applies it.
                if q8 && (!format.is_quantized() || glu || (norm && ncols != 1)) || (x_local && !(q8 && norm)) {
                    return Err(crate::error::KilnError::invalid(
                        "kernel",
                        format!("the int8-activation GEMV needs a quantized format, no fused SwiGLU and one column with a fused RMSNorm (which its own quantization needs), not {format} over {ncols}"),
                    ));
                }
                let shape = GemvShape::grouped(wg as u32, rows as u32, groups as u32);
                if epi == Epi::SwiGluQ8 && !(q8 && crate::plan::covers_q8_blocks(shape)) {
                    return Err(crate::error::KilnError::invalid(
                        "kernel",
                        format!("the int8 SwiGLU epilogue needs the int8 GEMV's workgroups over whole blocks of 32 outputs, not {wg}x{rows}x{groups}"),
                    ));
                }
                if epi == Epi::AddQ8Norm && !(q8 && ncols == 1 && crate::plan::covers_q8_rows(shape)) {
                    return Err(crate::error::KilnError::invalid(
                        "kernel",
                        format!("the int8 residual epilogue needs the int8 GEMV over one column in workgroups over whole blocks of 32 rows, not {wg}x{rows}x{groups} over {ncols}"),
                    ));
                }
                if groups == 0 || (groups > 1 && !q8 && ncols != 1) || wg % groups as u16 != 0 {
                    return Err(crate::error::KilnError::invalid(
                        "kernel",
                        format!("GEMV row groups: {groups} of {wg} invocations (a divisor of its workgroup; the float GEMV's over one column only)"),
                    ));
                }
                if let Some(f2) = second {
                    if !matches!(epi, Epi::Qkv { batched: false, .. }) || ncols != 1 || (q8 && !f2.is_quantized()) {
                        return Err(crate::error::KilnError::invalid(
                            "kernel",
                            format!("a GEMV over two formats takes one column through the Q/K/V epilogue (and, int8, quantized formats), not {epi:?} over {ncols} in {f2}"),
                        ));
                    }
                }
                let c = c
                    .enable_f16(matches!(epi, Epi::Qkv { kv: KvKind::F16Native, .. }))
                    .const_u32("WG", wg as u32)
                    .const_u32("ROWS", rows as u32)
                    .const_u32("NCOLS", ncols as u32)
                    .const_u32("ROW_GROUPS", groups as u32)
                    .const_u32("LANE_GROUP_SIZE", if q8 { lane_group_size(caps, subgroups) } else { 0 })
                    .const_bool("NORM", norm)
                    .const_bool("GLU", glu)
                    .include("common/quant.wgsl")
                    .include("common/quant_words.wgsl")
                    .include(format_file(format))
                    .include(reduce_file(subgroups))
                    .include("common/matmul_params.wgsl")
                    .include("common/gemv_output.wgsl")
                    .include("common/inv_rms.wgsl");
                let c = epilogue(c, epi);
                if q8 {
                    // Where the epilogue writes the next GEMV's int8 blocks, and what scales them.
                    let c = c.include("common/q8_block.wgsl");
                    let c = match epi {
                        Epi::SwiGluQ8 => c.include("common/q8_out.wgsl").include("common/q8_out_unweighted.wgsl"),
                        Epi::AddQ8Norm => c.include("common/q8_out.wgsl").include("common/q8_out_norm.wgsl"),
                        _ => c.include("common/q8_out_none.wgsl"),
                    };
                    let c = if x_local {
                        let c = c.include("common/gemv_input.wgsl").include("common/q8_in_local.wgsl");
                        if subgroups {
                            c.include("common/q8_lanes8.wgsl").include("common/q8_prepare_subgroups.wgsl")
                        } else {
                            c.include("common/q8_prepare_lanes.wgsl")
                        }
                    } else {
                        c.include("common/q8_in_global.wgsl")
                    };
                    let c = c.include("common/weights_vec4.wgsl").include("common/gemv_q8_rows.wgsl");
                    gemv_formats(c, second, "common/weights_vec4.wgsl", "common/gemv_q8_rows.wgsl")
                        .include("gemv_q8.wgsl")
                        .build()
                } else {
                    // Float weights as whole 16-byte vectors, one load instruction each (H200,
                    // run 247: TinyLlama F16 tg128 916 -> 937 tok/s); block formats read
                    // scattered words (their Q4_K_M lost 1% as vectors). A second format (the
                    // two-format Q/K/V) is a block format.
                    let words = "common/weights_words.wgsl";
                    let weights = if format.is_quantized() { words } else { "common/weights_vec4.wgsl" };
                    let c = c.include(weights).include("common/gemv_input.wgsl").include("common/gemv_rows.wgsl");
                    gemv_formats(c, second, words, "common/gemv_rows.wgsl").include("gemv.wgsl").build()
                }
            }
            KernelKey::QuantizeQ8 { subgroups, norm, glu, lanes: true } => {
                if !subgroups {
                    return Err(crate::error::KilnError::invalid("kernel", "quantize_q8_lanes needs subgroups"));
                }
                c.const_u32("WG", QUANTIZE_LANES_WG)
                    .const_u32("NCOLS", 1)
                    .const_bool("NORM", norm)
                    .const_bool("GLU", glu)
                    .include("common/quant.wgsl")
                    .include("common/q8_block.wgsl")
                    .include("common/q8_lanes8.wgsl")
                    .include(reduce_file(true))
                    .include("common/matmul_params.wgsl")
                    .include("common/gemv_input.wgsl")
                    .include("quantize_q8_lanes.wgsl")
                    .build()
            }
            KernelKey::QuantizeQ8 { subgroups, norm, glu, lanes: false } => c
                .const_u32("WG", QUANTIZE_WG)
                .const_u32("NCOLS", crate::plan::GEMV_Q8_GROUP_COLS)
                .const_bool("NORM", norm)
                .const_bool("GLU", glu)
                .include("common/quant.wgsl")
                .include("common/q8_block.wgsl")
                .include(reduce_file(subgroups))
                .include("common/matmul_params.wgsl")
                .include("common/gemv_input.wgsl")
                .include("quantize_q8.wgsl")
                .build(),
            KernelKey::ToHalf => c
                .enable_f16(true)
                .const_u32("WG", WG_ELT)
                .include("common/matmul_params.wgsl")
                .include("common/half8.wgsl")
                .include("to_half.wgsl")
                .build(),
            // The K-quants' loads as the cooperative GEMM binds them (16-byte vectors, see `Gemm`
            // below).
            KernelKey::DequantF16 { format } => c
                .enable_f16(true)
                .const_u32("WG", WG_ELT)
                .const_u32("PER", crate::plan::dequant_chunks_per_invocation())
                .include("common/matmul_params.wgsl")
                .include("common/half8.wgsl")
                .include("common/quant.wgsl")
                .include("common/quant_words.wgsl")
                .include(format_file(format))
                .include("common/weights_vec4.wgsl")
                .include("common/chunk_half8.wgsl")
                .include("dequant_f16.wgsl")
                .build(),
            KernelKey::Gemm { format, tile, epi } => {
                let (bm, bn, bk, tm, tn) = tile.dims();
                let coop = tile.is_coop();
                // The cooperative GEMM moves F16 weights (k a multiple of 8, which the
                // planner checks) to workgroup memory as they are; other formats are decoded.
                let halves = coop && format == WeightFormat::F16;
                let c = c
                    .enable_f16(coop || epi.needs_f16())
                    .enable_coopmat(coop)
                    .const_u32("BM", bm)
                    .const_u32("BN", bn)
                    .const_u32("BK", bk)
                    .const_u32("WG", if coop { tile.coop_invocations().0 } else { tile.workgroup_size() })
                    .include("common/matmul_params.wgsl")
                    .include("common/gemm_io.wgsl");
                let c = if halves {
                    c
                } else {
                    c.include("common/quant.wgsl")
                        .include("common/quant_words.wgsl")
                        .include(format_file(format))
                        // Float weights are streamed as whole 16-byte vectors; block formats
                        // read scattered words, but in the cooperative GEMM the K-quants' 16-byte
                        // aligned blocks are bound as vectors too, their headers and quant pairs
                        // a load each (the format files' fetch8). H200, run 282, TFLOP/s at
                        // 4096^3 words -> vectors: Q4_K 94.7 -> 125.4, Q5_K 81.9 -> 111.5, Q6_K
                        // 101.3 -> 109.5; Q8_0, whose 36-byte blocks straddle vectors, 128.7 -> 123.9.
                        .include(if !format.is_quantized() || (coop && format != WeightFormat::Q8_0) {
                            "common/weights_vec4.wgsl"
                        } else {
                            "common/weights_words.wgsl"
                        })
                        .include("common/gemm_w_decode.wgsl")
                };
                let c = epilogue(c, epi);
                if coop {
                    let (sgn, fm, fnn) = tile.coop_layout();
                    let c = c
                        .const_u32("LWG", tile.coop_invocations().1)
                        .const_u32("LOAD_AHEAD", crate::plan::coop_loads_ahead(format))
                        .const_u32("SGN", sgn)
                        .const_u32("FM", fm)
                        .const_u32("FN", fnn)
                        .include("common/half8.wgsl")
                        .include("common/gemm_x_f16.wgsl");
                    let c = if halves {
                        c.include("common/coop_w_half.wgsl")
                    } else {
                        c.include("common/chunk_half8.wgsl").include("common/coop_w_decode.wgsl")
                    };
                    c.include("gemm_coop.wgsl").build()
                } else {
                    c.const_u32("TM", tm)
                        .const_u32("TN", tn)
                        .include("common/gemm_x_f32.wgsl")
                        .include(tile.micro_file())
                        .include("gemm.wgsl")
                        .build()
                }
            }
            KernelKey::GemmReduce { epi } => {
                let c = c.enable_f16(epi.needs_f16()).const_u32("WG", WG_ELT).include("common/matmul_params.wgsl");
                epilogue(c, epi).include("gemm_reduce.wgsl").build()
            }
            KernelKey::Embed { format } => c
                .const_u32("WG", WG_ELT)
                .include("common/quant.wgsl")
                .include("common/quant_words.wgsl")
                .include(format_file(format))
                .include("common/weights_words.wgsl")
                .include("embed.wgsl")
                .build(),
            KernelKey::AttnGemm { kv } => {
                let (bm, bn, bk, tm, tn) = ATTN_TILE;
                c.enable_f16(kv.needs_f16())
                    .const_u32("BM", bm)
                    .const_u32("BN", bn)
                    .const_u32("BK", bk)
                    .const_u32("TM", tm)
                    .const_u32("TN", tn)
                    .const_u32("WG", (bm / tm) * (bn / tn))
                    .include(kv.file())
                    .include("attention_prefill.wgsl")
                    .build()
            }
            KernelKey::Softmax { subgroups } => {
                c.const_u32("WG", WG_ROW).include(reduce_file(subgroups)).include("softmax.wgsl").build()
            }
            KernelKey::AttnFlashCoop { head_dim, segments } => {
                let d = head_dim as u32;
                let nsg = flash_attention::coop_rows(d) / 16;
                c.enable_f16(true)
                    .enable_coopmat(true)
                    .const_u32("NSG", nsg)
                    .const_u32("WG", 32 * nsg)
                    .const_u32("BM", 16 * nsg)
                    .const_u32("BK", flash_attention::COOP_KEYS)
                    .const_u32("D", d)
                    .const_bool("PREFETCH", flash_attention::coop_prefetches(d))
                    .include("common/flash_segment.wgsl")
                    .include(flash_segment_file(segments))
                    .include("common/coop_out.wgsl")
                    .include("common/half8.wgsl")
                    .include("flash_attention_coop.wgsl")
                    .build()
            }
            KernelKey::AttnFlash { kv, head_dim, segments } => flash_attention::shader_consts(head_dim as u32)
                .into_iter()
                .fold(c.enable_f16(kv.needs_f16()), |c, (name, v)| c.const_u32(name, v))
                .include(kv.file())
                .include("common/flash_segment.wgsl")
                .include(flash_segment_file(segments))
                .include("flash_attention.wgsl")
                .build(),
            KernelKey::AttnDecode { kv, subgroups, head_dim, vectors, block, batched, q8_out, wide, merge } => {
                step_file(
                    decode_merge_files(c, caps, merge)
                        .enable_f16(kv.needs_f16())
                        .const_u32("WG", attention::decode_wg_of_class(head_dim as u32, wide))
                        .const_u32("D", head_dim as u32)
                        .const_u32("PER", attention::per_lane_of_class(head_dim as u32))
                        .const_u32("C", attention::decode_chunk_of_class(head_dim as u32, wide))
                        .const_u32("NB", block as u32)
                        .const_bool("Q8_OUT", q8_out)
                        .const_u32("OB", if q8_out { block as u32 * head_dim as u32 / 4 } else { 1 })
                        .include("common/q8_block.wgsl")
                        .include(kv.file())
                        .include(if vectors { "common/kv_rows_vec.wgsl" } else { "common/kv_rows_scalar.wgsl" })
                        .include(reduce_file(subgroups)),
                    batched,
                )
                .include("attention_decode.wgsl")
                .build()
            }
            KernelKey::AttnDecodeCoop { head_dim, keys, merge, q8_out } => decode_merge_files(c, caps, merge)
                .const_bool("Q8_OUT", q8_out)
                .include("common/q8_block.wgsl")
                .enable_f16(true)
                .enable_coopmat(true)
                .const_u32("D", head_dim as u32)
                .const_u32("BK", keys as u32)
                .const_u32("NSG", attention::DECODE_COOP_SUBGROUPS)
                .const_u32("WG", 32 * attention::DECODE_COOP_SUBGROUPS)
                .include("common/step_one.wgsl")
                .include("common/coop_out.wgsl")
                .include("common/half8.wgsl")
                .include(attention::decode_coop_tile_file(head_dim as u32, keys as u32))
                .include("attention_decode_coop.wgsl")
                .build(),
            KernelKey::FlashCombine => c.const_u32("WG", WG_ELT).include("flash_combine.wgsl").build(),
            KernelKey::AttnCombine { subgroups, batched, q8_out } => step_file(
                c.const_u32("WG", ATTN_WG_DECODE)
                    .const_bool("Q8_OUT", q8_out)
                    .include("common/q8_block.wgsl")
                    .include(reduce_file(subgroups)),
                batched,
            )
            .include("attention_combine.wgsl")
            .build(),
            KernelKey::Rope { neox, to_cache, rope } => {
                let kv = to_cache.unwrap_or(KvKind::F32);
                c.enable_f16(kv.needs_f16())
                    .const_u32("WG", WG_ELT)
                    .const_bool("NEOX", neox)
                    .const_bool("ROPE", rope)
                    .include(kv.file())
                    .include("common/step_one.wgsl")
                    .include("rope.wgsl")
                    .build()
            }
            KernelKey::KvWrite { neox, kv } => c
                .enable_f16(kv.needs_f16())
                .const_u32("WG", WG_ELT)
                .const_bool("NEOX", neox)
                .const_bool("ROPE", true)
                .include(kv.file())
                .include("common/step_one.wgsl")
                .include("rope.wgsl")
                .build(),
            KernelKey::RmsNorm { subgroups, halves } => c
                .enable_f16(halves)
                .const_u32("WG", WG_ROW)
                .include(reduce_file(subgroups))
                .include("rms_norm.wgsl")
                .include(if halves { "common/norm_out_f16.wgsl" } else { "common/norm_out_f32.wgsl" })
                .build(),
            KernelKey::ReduceNorm { subgroups } => c
                .enable_f16(true)
                .const_u32("WG", WG_ROW)
                .const_u32("HELD", norm::REDUCE_NORM_HELD)
                .include(reduce_file(subgroups))
                .include("reduce_norm.wgsl")
                .build(),
            KernelKey::Elementwise { op } => {
                c.const_u32("WG", WG_ELT).const_u32("OP", op as u32).include("elementwise.wgsl").build()
            }
            KernelKey::Argmax { subgroups } => {
                c.const_u32("WG", WG_ROW).include(reduce_file(subgroups)).include("argmax.wgsl").build()
            }
            KernelKey::Sample { subgroups, batched, prune, tops, chained, greedy } => {
                let wg = if prune { sample::PRUNE_WG } else { sample::second_pass_wg(caps, greedy) };
                let c = c
                    .const_u32("WG", wg)
                    .const_bool("ONE_PASS", greedy && !prune)
                    .const_bool("TOPS", tops)
                    .const_u32("SCAP", sample::SLICE_CAP)
                    .const_u32("PSTRIDE", sample::PRUNE_STRIDE)
                    .const_u32("MAX_TOPS_SLICES", sample::MAX_TOPS_SLICES)
                    .const_u32("SLICE", sample::SLICE)
                    .const_u32("CAP", crate::sample::SAMPLE_CAP as u32)
                    .const_u32("HIST", crate::sample::HISTORY_CAP as u32)
                    .const_u32("BAN", crate::sample::BAN_CAP as u32)
                    .const_u32("PHASES", sample::phases())
                    .include(reduce_file(subgroups));
                let c = c.include("common/sample_common.wgsl");
                let c = if batched {
                    step_file(c, true).include("common/sample_columns.wgsl").include("common/sample_no_chain.wgsl")
                } else {
                    c.include("common/sample_one.wgsl").include(if chained {
                        "common/sample_chain.wgsl"
                    } else {
                        "common/sample_no_chain.wgsl"
                    })
                };
                c.include(if prune { "sample_prune.wgsl" } else { "sample.wgsl" }).build()
            }
            KernelKey::Nll { subgroups } => {
                c.const_u32("WG", WG_ROW).include(reduce_file(subgroups)).include("nll.wgsl").build()
            }
            KernelKey::Probe { kind: ProbeKind::CoopMma } => {
                c.enable_f16(true).enable_coopmat(true).const_u32("WG", 128).include("probe_coop.wgsl").build()
            }
            KernelKey::Probe { .. } => c.const_u32("WG", WG_ELT).include("probe.wgsl").build(),
        }
    }

    /// The variants written as SPIR-V and passed through to the driver, not composed from WGSL:
    /// the workgroup-scope GEMM (gemm_cm2.rs), F16 weights and the plain epilogue only.
    pub fn spirv(&self) -> Option<Result<Vec<u32>>> {
        match *self {
            KernelKey::Gemm { tile: GemmTile::Cm2, format: WeightFormat::F16, epi: Epi::Plain } => {
                Some(Ok(gemm_cm2::spirv()))
            }
            KernelKey::Gemm { tile: GemmTile::Cm2, format, epi } => Some(Err(crate::error::KilnError::invalid(
                "kernel",
                format!("the workgroup-scope GEMM takes F16 weights and the plain epilogue, not {format} and {epi:?}"),
            ))),
            _ => None,
        }
    }

    /// Whether the variant binds storage `@coherent` (MEMORY_DECORATION_COHERENT): decode
    /// attention that merges its own splits (common/decode_merge.wgsl).
    pub fn needs_coherent(&self) -> bool {
        matches!(self, KernelKey::AttnDecode { merge: true, .. } | KernelKey::AttnDecodeCoop { merge: true, .. })
    }

    /// Whether the variant runs on cooperative matrices (EXPERIMENTAL_COOPERATIVE_MATRIX with
    /// 16x16x16 f16 -> f32, subgroups of 32: `Caps::coopmat`; it needs SHADER_F16 too).
    pub fn needs_coopmat(&self) -> bool {
        matches!(self, KernelKey::Gemm { tile, .. } if tile.is_coop())
            || matches!(
                self,
                KernelKey::Probe { kind: ProbeKind::CoopMma }
                    | KernelKey::AttnFlashCoop { .. }
                    | KernelKey::AttnDecodeCoop { .. }
            )
    }

    /// Whether the adapter must offer SHADER_F16 / SUBGROUP for this variant.
    pub fn needs(&self) -> (bool, bool) {
        match *self {
            // Its epilogue runs each subgroup on its own, behind subgroup barriers.
            KernelKey::Gemm { tile, .. } if tile.is_coop() => (true, true),
            KernelKey::Probe { kind: ProbeKind::CoopMma } => (true, false),
            KernelKey::ToHalf | KernelKey::DequantF16 { .. } => (true, false),
            KernelKey::Gemm { epi, .. } | KernelKey::GemmReduce { epi } => (epi.needs_f16(), false),
            KernelKey::Gemv { subgroups, epi: Epi::Qkv { kv, .. }, .. } => (kv.needs_f16(), subgroups),
            KernelKey::RmsNorm { subgroups, halves } => (halves, subgroups),
            KernelKey::ReduceNorm { subgroups } => (true, subgroups),
            KernelKey::Gemv { subgroups, .. }
            | KernelKey::QuantizeQ8 { subgroups, .. }
            | KernelKey::Softmax { subgroups }
            | KernelKey::Argmax { subgroups }
            | KernelKey::Sample { subgroups, .. }
            | KernelKey::Nll { subgroups } => (false, subgroups),
            KernelKey::AttnDecode { kv, subgroups, merge, .. } => (kv.needs_f16(), subgroups || merge),
            KernelKey::AttnCombine { subgroups, .. } => (false, subgroups),
            KernelKey::AttnGemm { kv } | KernelKey::AttnFlash { kv, .. } => (kv.needs_f16(), false),
            KernelKey::AttnFlashCoop { .. } | KernelKey::AttnDecodeCoop { .. } => (true, true),
            KernelKey::Rope { to_cache, .. } => (to_cache.map(|k| k.needs_f16()).unwrap_or(false), false),
            KernelKey::KvWrite { kv, .. } => (kv.needs_f16(), false),
            _ => (false, false),
        }
    }

    /// Every variant the planner and the ops can ask for (the offline validation test walks
    /// this list).
    pub fn all_variants() -> Vec<KernelKey> {
        let mut v = Vec::new();
        // The epilogues the planner pairs with a fused input (RMSNorm, or int8 blocks): the
        // fused Q/K/V and gate/up projections.
        // The batched Q/K/V epilogue: each column its own sequence's token (batched decode
        // steps, several prompts prefilled together).
        let mut fused_epis = vec![Epi::SwiGlu];
        let mut batched_epis = Vec::new();
        for kv in KvKind::ALL {
            for neox in [false, true] {
                if !(neox && kv == KvKind::F16Packed) {
                    fused_epis.push(Epi::Qkv { kv, neox, batched: false });
                    batched_epis.push(Epi::Qkv { kv, neox, batched: true });
                }
            }
        }
        for format in WeightFormat::ALL {
            for subgroups in [false, true] {
                for ncols in 1..=crate::plan::GEMV_GROUP_COLS as u8 {
                    // (launch shape, int8, fused input (RMSNorm, SwiGLU), epilogue)
                    let mut kinds: Vec<(GemvShape, bool, (bool, bool), Epi)> = Vec::new();
                    let q8_epis = || std::iter::once(Epi::Plain).chain(fused_epis.iter().chain(&batched_epis).copied());
                    for (wg, rows) in [(32, 4), (64, 4), (128, 4), (256, 2), (128, 2)] {
                        let shape = GemvShape::new(wg, rows);
                        for input in [(false, false), (true, false), (false, true)] {
                            kinds.push((shape, false, input, Epi::Plain));
                        }
                        for &epi in fused_epis.iter().chain(&batched_epis) {
                            kinds.push((shape, false, (true, false), epi));
                        }
                        if format.is_quantized() && ncols as u32 <= crate::plan::GEMV_Q8_GROUP_COLS {
                            kinds.extend(q8_epis().map(|epi| (shape, true, (false, false), epi)));
                        }
                        // One token's blocks without the RMSNorm's 1 / rms (quantize_q8_lanes.wgsl).
                        if format.is_quantized() && ncols == 1 {
                            kinds.extend(q8_epis().map(|epi| (shape, true, (true, false), epi)));
                        }
                    }
                    // The float GEMV's grouped shape over one column (many rows).
                    if ncols == 1 {
                        let shape = crate::plan::GEMV_FLOAT_MANY_ROWS_SHAPE;
                        for input in [(false, false), (true, false), (false, true)] {
                            kinds.push((shape, false, input, Epi::Plain));
                        }
                        kinds.extend(fused_epis.iter().map(|&epi| (shape, false, (true, false), epi)));
                    }
                    // The int8 GEMV's grouped shapes over several columns.
                    if format.is_quantized() && ncols as u32 <= crate::plan::GEMV_Q8_WIDE_COLS {
                        for shape in [crate::plan::GEMV_Q8_WIDE, crate::plan::GEMV_Q8_WIDE_FEW_ROWS] {
                            kinds.extend(q8_epis().map(|epi| (shape, true, (false, false), epi)));
                        }
                        // The gate/up projection writing the down projection's int8 input
                        // (one-token decode steps; several columns in the tests), and over one
                        // token's blocks without the RMSNorm's 1 / rms (below: quantizing its
                        // own input).
                        if ncols == 1 || ncols == 3 {
                            kinds.push((crate::plan::GEMV_Q8_SWIGLU, true, (false, false), Epi::SwiGluQ8));
                        }
                        if ncols == 1 {
                            kinds.push((crate::plan::GEMV_Q8_SWIGLU, true, (true, false), Epi::SwiGluQ8));
                            // The output and down projections writing the next GEMV's input.
                            kinds.push((crate::plan::GEMV_Q8_ADD_NORM, true, (false, false), Epi::AddQ8Norm));
                        }
                    }
                    let key = |shape: GemvShape, q8, norm, glu, x_local, epi| KernelKey::Gemv {
                        second: None,
                        format,
                        ncols,
                        rows: shape.rows as u8,
                        groups: shape.groups as u8,
                        wg: shape.wg as u16,
                        subgroups,
                        norm,
                        glu,
                        q8,
                        x_local,
                        epi,
                    };
                    v.extend(
                        kinds.into_iter().map(|(shape, q8, (norm, glu), epi)| key(shape, q8, norm, glu, false, epi)),
                    );
                    // The int8 SwiGLU epilogue's gate/up projection quantizing its own input.
                    if format.is_quantized() && ncols == 1 {
                        v.push(key(crate::plan::GEMV_Q8_SWIGLU, true, true, false, true, Epi::SwiGluQ8));
                    }
                }
            }
            // One dispatch over a Q/K/V projection stacked from two formats (one-column decode
            // steps): the float GEMV through the RMSNorm, the int8 GEMV after its quantize
            // dispatch, in the shapes the planner gives one column.
            for second in crate::plan::QKV_SECOND_FORMATS.into_iter().filter(|&f| f != format && format.is_quantized())
            {
                let qkv = || fused_epis.iter().copied().filter(|e| matches!(e, Epi::Qkv { .. }));
                for subgroups in [false, true] {
                    let float = [
                        GemvShape::new(128, 2),
                        GemvShape::new(256, 2),
                        GemvShape::new(64, 4),
                        crate::plan::GEMV_FLOAT_MANY_ROWS_SHAPE,
                    ];
                    let int8 = [GemvShape::new(64, 4), GemvShape::new(128, 4), GemvShape::new(128, 2)];
                    let kinds = float.into_iter().map(|s| (s, false)).chain(int8.into_iter().map(|s| (s, true)));
                    // The int8 GEMV's with the quantize dispatch's blocks with or without the
                    // RMSNorm's 1 / rms (`Caps::quantize_lanes`).
                    let mut kinds: Vec<_> = kinds.flat_map(|(s, q8)| [(s, q8, true), (s, q8, !q8)]).collect();
                    kinds.dedup();
                    for (shape, q8, norm) in kinds {
                        v.extend(qkv().map(|epi| KernelKey::Gemv {
                            format,
                            ncols: 1,
                            rows: shape.rows as u8,
                            groups: shape.groups as u8,
                            wg: shape.wg as u16,
                            subgroups,
                            norm,
                            glu: false,
                            q8,
                            x_local: false,
                            epi,
                            second: Some(second),
                        }));
                    }
                }
            }
            // The batched Q/K/V epilogue on the GEMMs: several sequences' prompts prefilled together.
            // (The f16 SwiGLU epilogue: prefill's gate/up projection before a cooperative GEMM.)
            for tile in GemmTile::ALL.into_iter().chain(GemmTile::COOP) {
                let own = [Epi::Plain, Epi::Partial, Epi::SwiGluF16];
                for epi in own.into_iter().chain(fused_epis.iter().chain(&batched_epis).copied()) {
                    v.push(KernelKey::Gemm { format, tile, epi });
                }
            }
            v.push(KernelKey::Embed { format });
            if crate::plan::resident_f16_format(format) {
                v.push(KernelKey::DequantF16 { format });
            }
        }
        for epi in [Epi::Plain, Epi::SwiGluF16].into_iter().chain(fused_epis.iter().chain(&batched_epis).copied()) {
            v.push(KernelKey::GemmReduce { epi });
        }
        for kv in KvKind::ALL {
            v.push(KernelKey::AttnGemm { kv });
            for head_dim in flash_attention::FLASH_HEAD_DIMS {
                for segments in [false, true] {
                    v.push(KernelKey::AttnFlash { kv, head_dim, segments });
                }
            }
            for subgroups in [false, true] {
                for head_dim in ATTN_DECODE_HEAD_DIMS {
                    for block in 1..=attention::max_block_of_class(head_dim as u32) as u8 {
                        // (vectors, batched, q8_out, wide): plain or batched, K read as scalars
                        // or vectors; the int8 output (one sequence's steps, heads of a multiple
                        // of 32 dimensions, so read as vectors); one sequence's wide workgroups
                        // (one head each, either output).
                        let mut forms = vec![
                            (false, false, false, false),
                            (true, false, false, false),
                            (false, true, false, false),
                            (true, true, false, false),
                            (true, false, true, false),
                        ];
                        if block == 1 {
                            forms.extend([
                                (false, false, false, true),
                                (true, false, false, true),
                                (true, false, true, true),
                            ]);
                        }
                        // Splits merged by their last workgroup: one sequence's usual
                        // workgroups, with subgroups (`Caps::decode_merge`).
                        let merged: &[(bool, bool, bool, bool)] = if subgroups {
                            &[(false, false, false, false), (true, false, false, false), (true, false, true, false)]
                        } else {
                            &[]
                        };
                        let forms = forms.iter().map(|&f| (f, false)).chain(merged.iter().map(|&f| (f, true)));
                        for ((vectors, batched, q8_out, wide), merge) in forms {
                            v.push(KernelKey::AttnDecode {
                                kv,
                                subgroups,
                                head_dim,
                                vectors,
                                block,
                                batched,
                                q8_out,
                                wide,
                                merge,
                            });
                        }
                    }
                }
            }
            for neox in [false, true] {
                for rope in [false, true] {
                    v.push(KernelKey::Rope { neox, to_cache: Some(kv), rope });
                }
                v.push(KernelKey::KvWrite { neox, kv });
            }
        }
        for neox in [false, true] {
            v.push(KernelKey::Rope { neox, to_cache: None, rope: true });
        }
        v.push(KernelKey::ToHalf);
        for head_dim in flash_attention::COOP_HEAD_DIMS {
            for segments in [false, true] {
                v.push(KernelKey::AttnFlashCoop { head_dim, segments });
            }
            for keys in attention::DECODE_COOP_TILES {
                for (merge, q8_out) in [(false, false), (true, false), (true, true)] {
                    v.push(KernelKey::AttnDecodeCoop { head_dim, keys: keys as u8, merge, q8_out });
                }
            }
        }
        v.push(KernelKey::FlashCombine);
        for subgroups in [false, true] {
            v.push(KernelKey::AttnCombine { subgroups, batched: false, q8_out: false });
            v.push(KernelKey::AttnCombine { subgroups, batched: true, q8_out: false });
            v.push(KernelKey::AttnCombine { subgroups, batched: false, q8_out: true });
        }
        for subgroups in [false, true] {
            for (norm, glu) in [(false, false), (true, false), (false, true)] {
                v.push(KernelKey::QuantizeQ8 { subgroups, norm, glu, lanes: false });
                if subgroups {
                    v.push(KernelKey::QuantizeQ8 { subgroups, norm, glu, lanes: true });
                }
            }
            v.push(KernelKey::Softmax { subgroups });
            for halves in [false, true] {
                v.push(KernelKey::RmsNorm { subgroups, halves });
            }
            v.push(KernelKey::ReduceNorm { subgroups });
            v.push(KernelKey::Argmax { subgroups });
            for (prune, tops) in [(false, false), (true, false), (false, true), (true, true)] {
                v.push(KernelKey::Sample { subgroups, batched: false, prune, tops, chained: false, greedy: false });
                // Chained steps' variants and greedy samplers' one pass: the second pass only (the
                // first is the same for chained steps, and greedy samplers take none).
                if !prune {
                    for (chained, greedy) in [(true, false), (false, true), (true, true)] {
                        v.push(KernelKey::Sample { subgroups, batched: false, prune, tops, chained, greedy });
                    }
                }
                v.push(KernelKey::Sample { subgroups, batched: true, prune, tops, chained: false, greedy: false });
            }
            v.push(KernelKey::Nll { subgroups });
        }
        for kind in [ProbeKind::ReadBandwidth, ProbeKind::Fma, ProbeKind::DependentDispatch, ProbeKind::CoopMma] {
            v.push(KernelKey::Probe { kind });
        }
        for op in [elementwise::EltOp::SiluMul, elementwise::EltOp::Add] {
            v.push(KernelKey::Elementwise { op });
        }
        v
    }
}
