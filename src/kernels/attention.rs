//! Attention. Prefill, materialized (`KILN_PREFILL_ATTENTION=gemm`; the default is one
//! dispatch, `flash_attention`): scores = Q·Kᵀ (batched 4D GEMM), causal softmax, out = P·V.
//! Decode: one query per head against the cache, split over the context, then a combine pass;
//! a batched decode step runs one query per column, each over its own sequence's region of a
//! shared cache (the step buffer's table of columns, `matmul::StepColumn`).
//! GQA by indexing: query head h reads KV head h / (n_head / n_kv_head).

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{bind, grid, Dispatch, GpuContext};
use crate::kernels::{KernelKey, KvKind, ATTN_DECODE_HEAD_DIMS, ATTN_DECODE_MAX_BLOCK, ATTN_MAX_HEAD_DIM, ATTN_TILE};

/// The shape of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    /// Cache rows allocated (context length).
    pub n_ctx: u32,
}

impl AttnShape {
    pub fn group(&self) -> u32 {
        self.n_head / self.n_kv_head
    }
    pub fn kv_stride(&self) -> u32 {
        self.n_kv_head * self.head_dim
    }
    pub fn check(&self) -> Result<()> {
        if self.n_kv_head == 0 || self.n_head % self.n_kv_head != 0 {
            return Err(KilnError::invalid(
                "attention",
                format!("{} heads do not divide into {} KV heads", self.n_head, self.n_kv_head),
            ));
        }
        if self.head_dim == 0 || self.head_dim > ATTN_MAX_HEAD_DIM || self.head_dim % 2 != 0 {
            return Err(KilnError::invalid(
                "attention",
                format!("head dim {} (kiln supports even sizes up to {ATTN_MAX_HEAD_DIM})", self.head_dim),
            ));
        }
        Ok(())
    }
    /// The decode kernel's head-dim class for this shape's heads.
    pub fn decode_class(&self) -> u32 {
        decode_class(self.head_dim)
    }
    /// Whether the decode kernel reads this shape's K rows as whole vectors (8 halves or 4
    /// floats): every head's row starts on one.
    pub fn decode_vectors(&self) -> bool {
        self.head_dim % 8 == 0
    }
    /// Query heads one decode workgroup takes at a context of `kv_len`. Up to
    /// `DECODE_SHARE_FROM` positions one head per workgroup: the most workgroups, each with
    /// the least to do, the K and V rows its GQA group shares read again from cache. Past it,
    /// each K and V row is read once for a block of the group's heads: the largest divisor of
    /// the group up to `DECODE_SHARE_BLOCK` that the kernel's workgroup memory takes. H200,
    /// TinyLlama's heads, one layer back to back (run 104, `cargo bench --bench kernels --
    /// attention_decode`, blocks of 1 / 2 / 4 / 8, µs): 128 positions 3.5 / 4.5 / 5.5 / 8.3,
    /// 1,024 8.2 / 8.8 / 9.2 / 12.1, 4,096 14.0 / 14.4 / 12.2 / 13.1, 16,384 38.3 / 36.1 /
    /// 28.7 / 31.0. (Run 67, before the kernel kept K and V as loaded: blocks of 1 ahead up to
    /// 4,096, of 8 at 16,384.) `KILN_DECODE_BLOCK` overrides both.
    pub fn decode_block(&self, kv_len: u32) -> u32 {
        if let Some(b) = crate::config::decode_block_from_env().filter(|&b| self.takes_block(b)) {
            return b;
        }
        if kv_len <= DECODE_SHARE_FROM {
            return 1;
        }
        (1..=DECODE_SHARE_BLOCK).rev().find(|&b| self.takes_block(b)).unwrap_or(1)
    }
    /// The largest block of query heads a decode workgroup can take for this shape.
    pub fn largest_block(&self) -> u32 {
        (1..=max_block_of_class(self.decode_class())).rev().find(|&b| self.takes_block(b)).unwrap_or(1)
    }
    /// Whether a decode workgroup can take blocks of `block` query heads of this shape.
    pub fn takes_block(&self, block: u32) -> bool {
        block >= 1 && block <= max_block_of_class(self.decode_class()) && self.group() % block == 0
    }
    /// Context positions per decode workgroup (a split).
    pub fn decode_chunk(&self) -> u32 {
        chunk_of_class(self.decode_class())
    }
    /// Splits of a context of `kv_len` positions (1: the kernel writes the output itself)
    /// in workgroups of the usual size.
    pub fn decode_splits(&self, kv_len: u32) -> u32 {
        kv_len.div_ceil(self.decode_chunk()).max(1)
    }
    /// Positions a wide decode workgroup takes in its one split.
    pub fn decode_wide_chunk(&self) -> u32 {
        decode_chunk_of_class(self.decode_class(), true)
    }
    /// Whether one sequence's decode attention over `kv_len` positions in blocks of `block`
    /// heads takes wide workgroups (`kernels::ATTN_WG_DECODE_WIDE`) on an adapter with `caps`:
    /// where the usual ones would split the context and the wide ones need not, one head a
    /// workgroup. A combine pass costs more than the wider workgroup (H200, run 253,
    /// `KILN_DECODE_WIDE=0/1` twice: Llama-7B Q4_K_M tg128, whose 128-dimension heads split
    /// past 64 positions, 383.5 -> 389.3-389.5 tok/s; TinyLlama Q4_K_M tg256, past 128,
    /// 1,076-1,079 -> 1,111-1,112), but not where no combine is saved (runs 242-243,
    /// `KILN_DECODE_WG=512` for every step: TinyLlama tg128, which never splits, -2%;
    /// Llama-7B at depth 2,048 -2.4%).
    pub fn decode_wide_takes(&self, caps: &crate::gpu::Caps, kv_len: u32, block: u32) -> bool {
        caps.attn_decode_wide && block == 1 && kv_len > self.decode_chunk() && kv_len <= self.decode_wide_chunk()
    }
    /// Dispatches of one sequence's decode attention over `kv_len` positions in blocks of
    /// `block` heads (off cooperative matrices): one, or the split attention and the combine
    /// pass where its splits do not merge themselves (`decode_merges`).
    pub fn decode_dispatches(&self, caps: &crate::gpu::Caps, kv_len: u32, block: u32) -> usize {
        let splits = self.decode_splits(kv_len);
        if splits == 1 || self.decode_wide_takes(caps, kv_len, block) || self.decode_merges_at(caps, splits, false) {
            1
        } else {
            2
        }
    }
    /// The decode kernels' parameters for splits of `chunk` positions. The kernels read the
    /// step's length from the step state: the parameters stay the same from step to step, so
    /// nothing is rewritten per step.
    fn decode_params(&self, chunk: u32) -> AttnDecodeParams {
        AttnDecodeParams {
            head_dim: self.head_dim,
            n_head: self.n_head,
            group: self.group(),
            kv_len: 0,
            kv_stride: self.kv_stride(),
            n_splits: self.max_splits(),
            q_stride: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            chunk,
            _pad: [0; 3],
        }
    }
    /// Splits the partials buffer has room for: the most any context length can need.
    fn max_splits(&self) -> u32 {
        // The cooperative kernel's smallest tiles make the shortest splits.
        let coop_chunk = DECODE_COOP_SUBGROUPS * DECODE_COOP_SMALLEST_TILE;
        self.n_ctx.div_ceil(self.decode_chunk().min(coop_chunk)).max(1)
    }
    /// Scratch floats the decode kernel needs for its partial results (per column of a
    /// batched step): rows of head_dim + 2 floats for the combine pass, of head_dim + 4 (whole
    /// vec4s) for the kernels that merge their own splits (common/decode_merge.wgsl).
    pub fn decode_scratch_len(&self) -> u32 {
        self.n_head * self.max_splits() * (self.head_dim + 4)
    }
    /// Whether one sequence's decode attention split over the context merges its splits in its
    /// last workgroup rather than a combine pass, on an adapter with `caps`
    /// (`Caps::decode_merge`): heads of a multiple of 4 dimensions (whole vec4 rows).
    pub fn decode_merges(&self, caps: &crate::gpu::Caps) -> bool {
        caps.decode_merge && self.head_dim % 4 == 0
    }
    /// Whether a launch of `splits` splits (on cooperative matrices: `coop`) merges them in
    /// its last workgroups (`decode_merges`), or takes the combine pass: up to
    /// `DECODE_MERGE_MOST_SPLITS` (`DECODE_MERGE_MOST_SPLITS_COOP`).
    pub fn decode_merges_at(&self, caps: &crate::gpu::Caps, splits: u32, coop: bool) -> bool {
        self.decode_merges(caps) && splits <= decode_merge_most_splits(coop)
    }
}

/// The most splits a decode launch merges in its last workgroups (`AttnShape::decode_merges_at`);
/// more take the combine pass, whose workgroup per head shares the splits among all its
/// invocations. On an H200 (`kiln bench -p 0 -n 128 -r 3`, `KILN_DECODE_MERGE=0/1` alternated
/// twice, tok/s): TinyLlama Q4_K_M at depth 1,024 / 4,096 (cooperative kernel, 8-9 / 33-34
/// splits) 1,003-1,005 / 964-967 -> 1,031-1,033 / 986-988 (run 267), at depth 0 unchanged;
/// Llama-7B (the plain kernel, one head a workgroup, splits of 64 positions) at depth 512 (9-10
/// splits) 365.4-365.5 -> 370.4-370.5 (run 268), but at 1,024 (17-18) 348.1 -> 346.0-346.2
/// (run 268), 2,048 / 2,560 / 4,096 (33-34 / 41-42 / 65-66) 327.4-327.6 / 315.0-315.1 /
/// 286.0-286.2 -> 325.2-325.5 / 309.2-309.5 / 281.4-282.0 (run 267). One layer's attention alone
/// (`cargo bench --bench kernels -- attention_decode`) says the merge wins at Llama-7B's 4,096
/// too (34.2 against 35.5 µs), not at TinyLlama's 16,384 on cooperative matrices (64 splits:
/// 17.9 against 17.5): the bench repeats one layer, the model's steps do not.
pub const DECODE_MERGE_MOST_SPLITS: u32 = 16;
pub const DECODE_MERGE_MOST_SPLITS_COOP: u32 = 48;

/// `DECODE_MERGE_MOST_SPLITS` (`_COOP`), or `KILN_DECODE_MERGE_SPLITS` where set (both).
pub fn decode_merge_most_splits(coop: bool) -> u32 {
    crate::config::decode_merge_splits_from_env().unwrap_or(if coop {
        DECODE_MERGE_MOST_SPLITS_COOP
    } else {
        DECODE_MERGE_MOST_SPLITS
    })
}

/// Contexts up to which decode attention takes one query head per workgroup
/// (`AttnShape::decode_block`): between the H200's 1,024 (one head ahead) and 4,096 (blocks
/// of 4 ahead).
pub const DECODE_SHARE_FROM: u32 = 2048;
/// The most query heads a decode workgroup takes past `DECODE_SHARE_FROM` (8, a whole
/// TinyLlama GQA group, was slower than 4 at 4,096 and 16,384 positions).
pub const DECODE_SHARE_BLOCK: u32 = 4;

/// Contexts from which one sequence's decode attention runs on cooperative matrices where
/// the adapter has them (`decode_coop_takes`; attention_decode_coop.wgsl) and the GQA groups
/// are large enough (`DECODE_COOP_MIN_GROUP`), or `KILN_DECODE_COOP_FROM` where set. On an
/// H200 (run 198, one layer's attention with its combine pass, coop / plain kernel):
/// TinyLlama's heads at 512 / 1,024 / 4,096 / 16,384 positions 7.8 / 7.8 / 9.1 / 17.5 µs against
/// 7.1 / 8.4 / 12.2 / 28.6, Llama-3-8B's at 1,024 / 4,096 9.4 / 15.1 against 11.6 / 25.5;
/// TinyLlama Q4_K_M tg128 at depth 1024 / 2048 / 4096 935-938 / 915-921 / 905-908 tok/s from
/// 1,024, 915 / 869 / 840 without (from 512: the same at depth 512, 936-940).
pub const DECODE_COOP_FROM: u32 = 1024;
/// Query heads per KV head from which the planner takes the cooperative kernel: its 16-row
/// tiles hold a group's heads, so smaller groups leave most of each product unused (Llama-7B's
/// groups of 1 at 4,096 positions: 50.0 µs against 35.4, tg128 at depth 4096 213 against 250
/// tok/s; Llama-3-8B's heads, groups of 4: 15.2 against 25.3 µs; run 196).
pub const DECODE_COOP_MIN_GROUP: u32 = 4;
/// Subgroups of a cooperative decode workgroup, each taking its own tile of keys.
pub const DECODE_COOP_SUBGROUPS: u32 = 4;
/// The keys a cooperative decode subgroup's tile may hold, largest first.
pub const DECODE_COOP_TILES: [u32; 3] = [64, 32, 16];
const DECODE_COOP_SMALLEST_TILE: u32 = DECODE_COOP_TILES[DECODE_COOP_TILES.len() - 1];
/// Workgroups the cooperative decode kernel aims at: it takes the largest tile whose splits
/// make at least this many (H200, run 197, one layer's attention with its combine pass, tiles of
/// 16 / 32 / 64 keys: TinyLlama's heads at 1,024 positions 7.7 / 8.8 / 10.3 µs, at 4,096 9.8 /
/// 9.1 / 10.6, at 16,384 23.6 / 21.8 / 17.4; Llama-3-8B's at 1,024 9.5 / 10.9 / 14.6, at 4,096
/// 23.2 / 18.0 / 15.1; TinyLlama Q4_K_M tg128 at depth 4096 901 / 912-913 / 884 tok/s).
pub const DECODE_COOP_TARGET_WORKGROUPS: u32 = 128;

/// The most keys of a 64-dimension tile staged through workgroup memory.
pub const DECODE_COOP_STAGED_MOST: u32 = 32;

/// How the cooperative decode kernel's subgroups load a tile of `keys` keys of `head_dim`
/// dimensions: 64-dimension heads in tiles of up to 32 keys through workgroup memory (the
/// 64-key tiles of those would not fit it with the rest), the others straight from the cache
/// into fragments (H200, runs 205-206: the split kernel at 1,024 / 4,096 positions 4.5 / 5.6
/// -> 3.9 / 4.8 µs staged).
pub fn decode_coop_tile_file(head_dim: u32, keys: u32) -> &'static str {
    if head_dim == 64 && keys <= DECODE_COOP_STAGED_MOST {
        "common/decode_coop_staged.wgsl"
    } else {
        "common/decode_coop_direct.wgsl"
    }
}

/// How one sequence's decode attention picks its kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CoopChoice {
    /// The planner's: cooperative matrices from `decode_coop_from` positions, for GQA groups
    /// of `DECODE_COOP_MIN_GROUP` heads or more, with its own block of heads.
    #[default]
    Planned,
    /// The plain kernel.
    Never,
    /// Cooperative matrices wherever they take the step (`decode_coop_takes`), with tiles of
    /// `keys` (None: `decode_coop_keys`' choice).
    Always { keys: Option<u32> },
}

/// Keys of each cooperative decode subgroup's tile at `kv_len` positions: the largest tile
/// whose splits make `DECODE_COOP_TARGET_WORKGROUPS`, else the smallest; 64-dimension heads
/// never below 32 keys, the largest of their staged tiles (`decode_coop_tile_file`), which
/// beat 16-key tiles' more workgroups once they loaded the cache in 16-byte vectors (H200, run
/// 291, TinyLlama Q4_K_M tg128, 16 -> 32 keys: at depth 1,024 1,054-1,055 -> 1,055-1,060
/// tok/s, 2,048 1,013-1,017 -> 1,036-1,038, 3,072 954-965 -> 1,002-1,011; at 4,096 both
/// chose 32). Or `KILN_DECODE_COOP_KEYS` (16, 32 or 64).
pub fn decode_coop_keys(shape: &AttnShape, kv_len: u32) -> u32 {
    crate::config::decode_coop_keys_from_env().unwrap_or_else(|| {
        let workgroups = |keys: u32| kv_len.div_ceil(DECODE_COOP_SUBGROUPS * keys) * shape.n_kv_head;
        let smallest = if shape.head_dim == 64 { DECODE_COOP_STAGED_MOST } else { DECODE_COOP_SMALLEST_TILE };
        DECODE_COOP_TILES
            .into_iter()
            .filter(|&k| k >= smallest)
            .find(|&k| workgroups(k) >= DECODE_COOP_TARGET_WORKGROUPS)
            .unwrap_or(smallest)
    })
}

/// Whether the cooperative decode kernel's workgroups that do not merge read the output
/// projection's weights into L2, a share each by the order they finished in, while the last
/// ones merge (common/decode_merge.wgsl's `merge_wo_ahead`): the rest of the GPU idles then,
/// and the output projection comes next. Only where the shares take the whole matrix (at most
/// 32 KiB a workgroup: TinyLlama's 2.4 MB over 128 takes 18 KiB). Or `KILN_DECODE_WO_AHEAD`.
/// (H200, TinyLlama Q4_K_M tg128 at depth 4,096, the same build without / with, 3 rounds:
/// 1,079.5 -> 1,084.4 in run 446, 1,072.2 -> 1,075.6 in run 447, 1,070.0 -> 1,076.0 in run
/// 448; the first 1-4 MiB of gate/up read as well, run 447, gained nothing or lost up to 1.7%.)
pub fn decode_wo_ahead() -> bool {
    crate::config::decode_wo_ahead_from_env().unwrap_or(true)
}

/// `DECODE_COOP_FROM`, or `KILN_DECODE_COOP_FROM` (None: off).
pub fn decode_coop_from() -> Option<u32> {
    crate::config::decode_coop_from_env().unwrap_or(Some(DECODE_COOP_FROM))
}

/// Whether decode attention of `shape` over a `kv` cache can run on cooperative matrices on
/// an adapter with `caps`: heads of cooperative flash attention's sizes (64 or 128 dimensions:
/// common/coop_out.wgsl's accumulators) over an f16 cache read as f16, GQA groups of at most 16
/// heads (one 16-row tile), contexts of at least a tile.
pub fn decode_coop_takes(caps: &crate::gpu::Caps, kv: KvKind, shape: &AttnShape, kv_len: u32) -> bool {
    caps.coopmat
        && caps.subgroups
        && !caps.cpu_adapter
        && kv == KvKind::F16Native
        && crate::kernels::flash_attention::COOP_HEAD_DIMS.iter().any(|&d| d as u32 == shape.head_dim)
        && shape.group() <= 16
        && kv_len >= DECODE_COOP_TILES[0]
}

/// The decode kernel's head-dim class for heads of `head_dim` dimensions: the smallest of
/// `ATTN_DECODE_HEAD_DIMS` that holds them.
pub fn decode_class(head_dim: u32) -> u32 {
    ATTN_DECODE_HEAD_DIMS.into_iter().map(u32::from).find(|&c| head_dim <= c).unwrap_or(ATTN_MAX_HEAD_DIM)
}

/// K dimensions and V positions one decode invocation holds in registers for heads of class
/// `d` (attention_decode.wgsl's PER): `plan::attn_decode_per_lane`, at most a head.
pub fn per_lane_of_class(d: u32) -> u32 {
    crate::plan::attn_decode_per_lane().min(d)
}

/// Positions per decode split for heads of class `d`: each invocation holds PER K and PER V
/// values of the split in registers (attention_decode.wgsl).
pub fn chunk_of_class(d: u32) -> u32 {
    decode_chunk_of_class(d, false)
}

/// Invocations of a decode workgroup for heads of class `d`, wide (`ATTN_WG_DECODE_WIDE`) or
/// the usual (`plan::attn_decode_wg_of_class`), at least a head's dimensions.
pub fn decode_wg_of_class(d: u32, wide: bool) -> u32 {
    if wide {
        crate::kernels::ATTN_WG_DECODE_WIDE.max(d)
    } else {
        crate::plan::attn_decode_wg_of_class(d)
    }
}

/// Positions per decode split of workgroups of `decode_wg_of_class(d, wide)`.
pub fn decode_chunk_of_class(d: u32, wide: bool) -> u32 {
    decode_wg_of_class(d, wide) * per_lane_of_class(d) / d
}

/// Query heads a decode workgroup of class `d` takes at most: its queries (heads x d) within
/// 512 floats and its weights (heads x positions) within 1024, so the kernel's workgroup
/// memory stays within 16 KiB.
pub fn max_block_of_class(d: u32) -> u32 {
    ATTN_DECODE_MAX_BLOCK.min(512 / d).min(1024 / chunk_of_class(d)).max(1)
}

/// Mirrors `Params` in attention_prefill.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct AttnGemmParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub group: u32,
    pub a_sb: u32,
    pub a_si: u32,
    pub b_sb: u32,
    pub b_sj: u32,
    pub b_sk: u32,
    pub c_sb: u32,
    pub c_si: u32,
    pub b_off: u32,
    pub alpha: f32,
    pub causal_n: u32,
    pub _pad: [u32; 2],
}

/// Mirrors `Params` in softmax.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct SoftmaxParams {
    pub n_cols: u32,
    pub row_stride: u32,
    pub m: u32,
    pub pos0: u32,
}

/// Mirrors `Params` in attention_decode.wgsl and attention_combine.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct AttnDecodeParams {
    pub head_dim: u32,
    pub n_head: u32,
    pub group: u32,
    pub kv_len: u32,
    pub kv_stride: u32,
    /// Splits the partials buffer has room for, per head (its layout's stride).
    pub n_splits: u32,
    pub q_stride: u32,
    pub scale: f32,
    /// Positions per split.
    pub chunk: u32,
    pub _pad: [u32; 3],
}

/// Buffers of one prefill attention.
pub struct PrefillArgs<'a> {
    /// Q: [m, n_head * head_dim], already rotated.
    pub q: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    /// Scores scratch: at least n_head * m * kv_len floats.
    pub scores: &'a wgpu::Buffer,
    /// Output: [m, n_head * head_dim].
    pub out: &'a wgpu::Buffer,
    /// Query tokens in this batch; they sit at positions pos0 .. pos0 + m.
    pub m: u32,
    pub pos0: u32,
}

fn tile_grid(m: u32, n: u32, batches: u32) -> [u32; 3] {
    let (bm, bn, ..) = ATTN_TILE;
    [n.div_ceil(bn), m.div_ceil(bm), batches]
}

/// Parameters and grids of the three prefill dispatches (Q·Kᵀ, softmax, P·V) for m queries
/// at positions pos0.. over a cache holding pos0 + m rows.
pub fn prefill_launches(shape: &AttnShape, m: u32, pos0: u32) -> Result<[(AttnGemmParams, [u32; 3]); 2], KilnError> {
    shape.check()?;
    let kv_len = pos0 + m;
    if kv_len > shape.n_ctx {
        return Err(KilnError::invalid(
            "attention",
            format!("{kv_len} positions exceed the context of {}", shape.n_ctx),
        ));
    }
    let (nh, hd) = (shape.n_head, shape.head_dim);
    let qk = AttnGemmParams {
        m,
        n: kv_len,
        k: hd,
        group: shape.group(),
        a_sb: hd,
        a_si: nh * hd,
        b_sb: hd,
        b_sj: shape.kv_stride(),
        b_sk: 1,
        c_sb: m * kv_len,
        c_si: kv_len,
        b_off: 0,
        alpha: 1.0 / (hd as f32).sqrt(),
        causal_n: kv_len,
        _pad: [0; 2],
    };
    let pv = AttnGemmParams {
        m,
        n: hd,
        k: kv_len,
        group: shape.group(),
        a_sb: m * kv_len,
        a_si: kv_len,
        b_sb: hd,
        b_sj: 1,
        b_sk: shape.kv_stride(),
        c_sb: hd,
        c_si: nh * hd,
        b_off: 0,
        alpha: 1.0,
        causal_n: 0,
        _pad: [0; 2],
    };
    Ok([(qk, tile_grid(m, kv_len, nh)), (pv, tile_grid(m, hd, nh))])
}

/// The softmax between the two prefill GEMMs.
pub fn softmax_launch(shape: &AttnShape, m: u32, pos0: u32) -> (SoftmaxParams, [u32; 3]) {
    let kv_len = pos0 + m;
    (SoftmaxParams { n_cols: kv_len, row_stride: kv_len, m, pos0 }, grid(shape.n_head * m))
}

/// Three dispatches: Q·Kᵀ, causal softmax, P·V.
pub fn prepare_prefill(ctx: &GpuContext, kv: KvKind, shape: &AttnShape, a: &PrefillArgs) -> Result<Vec<Dispatch>> {
    let [(qk, g_qk), (pv, g_pv)] = prefill_launches(shape, a.m, a.pos0)?;
    let (sp, g_sm) = softmax_launch(shape, a.m, a.pos0);
    let pipeline = ctx.pipeline(&KernelKey::AttnGemm { kv })?;
    let ub = ctx.uniform(&qk, "attention.qk");
    let bg = bind(ctx, &pipeline, "attention.qk", &[&ub, a.q, a.k_cache, a.scores]);
    let d_qk =
        Dispatch { label: "attention", pipeline: pipeline.clone(), bind_group: bg, workgroups: g_qk, params: Some(ub) };
    let sm_pipe = ctx.pipeline(&KernelKey::Softmax { subgroups: ctx.caps.subgroups })?;
    let ub = ctx.uniform(&sp, "attention.softmax");
    let bg = bind(ctx, &sm_pipe, "attention.softmax", &[&ub, a.scores]);
    let d_sm = Dispatch { label: "attention", pipeline: sm_pipe, bind_group: bg, workgroups: g_sm, params: Some(ub) };
    let ub = ctx.uniform(&pv, "attention.pv");
    let bg = bind(ctx, &pipeline, "attention.pv", &[&ub, a.scores, a.v_cache, a.out]);
    let d_pv = Dispatch { label: "attention", pipeline, bind_group: bg, workgroups: g_pv, params: Some(ub) };
    Ok(vec![d_qk, d_sm, d_pv])
}

/// One decode attention at `kv_len` positions: its parameters, the grid of the attention
/// pass and, where the context is split over several workgroups that do not merge themselves,
/// the grid of the combine pass (None: the attention pass writes the output itself) and its
/// variant.
pub struct DecodeLaunch {
    pub params: AttnDecodeParams,
    pub key: KernelKey,
    pub grid: [u32; 3],
    pub combine: Option<[u32; 3]>,
    pub combine_key: KernelKey,
}

/// The decode attention of one sequence's token; `q8_out`: the output also as the output
/// projection's int8 blocks (`takes_q8_out`), and only so where the splits merge themselves
/// (`DecodeLaunch::merges`: the merge writes no f32 output beside the blocks, which the output
/// projection alone reads).
pub fn decode_launch(
    ctx_caps: &crate::gpu::Caps,
    kv: KvKind,
    shape: &AttnShape,
    kv_len: u32,
    q8_out: bool,
) -> Result<DecodeLaunch> {
    launch_columns(ctx_caps, kv, shape, kv_len, None, None, q8_out, CoopChoice::Planned)
}

/// Whether decode attention can write its output as int8 blocks of 32 values
/// (common/q8_block.wgsl) for the output projection: heads of a multiple of 32 dimensions.
pub fn takes_q8_out(shape: &AttnShape) -> bool {
    shape.head_dim % 32 == 0
}

/// The decode attention of a batched step of `cols` columns (at most `plan::GEMV_MAX_COLS`),
/// each a query over its own sequence, the longest seeing `kv_len` positions: the block and
/// split size follow that one, the grid's z is the column, and the combine pass (if any
/// column is split) skips the columns of a single split.
pub fn decode_launch_batched(
    ctx_caps: &crate::gpu::Caps,
    kv: KvKind,
    shape: &AttnShape,
    kv_len: u32,
    cols: u32,
) -> Result<DecodeLaunch> {
    launch_columns(ctx_caps, kv, shape, kv_len, Some(cols), None, false, CoopChoice::Never)
}

/// What a plain decode kernel's step does besides attending (`KernelKey::AttnDecode`'s flags):
/// one query per column of a batched step; the int8 output; wide workgroups
/// (`AttnShape::decode_wide_takes`); splits merged by their last workgroups
/// (`AttnShape::decode_merges`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeForm {
    pub batched: bool,
    pub q8_out: bool,
    pub wide: bool,
    pub merge: bool,
}

/// The decode kernel's variant for `shape` with blocks of `block` query heads in `form`.
pub fn decode_key(caps: &crate::gpu::Caps, kv: KvKind, shape: &AttnShape, block: u32, form: DecodeForm) -> KernelKey {
    let DecodeForm { batched, q8_out, wide, merge } = form;
    KernelKey::AttnDecode {
        kv,
        subgroups: caps.subgroups,
        head_dim: shape.decode_class() as u16,
        vectors: shape.decode_vectors(),
        block: block as u8,
        batched,
        q8_out,
        wide,
        merge,
    }
}

impl DecodeLaunch {
    /// Whether the attention pass merges its own splits (binds the partials and the counters:
    /// `KernelKey::needs_coherent`).
    pub fn merges(&self) -> bool {
        self.key.needs_coherent()
    }
}

/// `cols`: a batched step's columns (None: one sequence); `block`: query heads per
/// workgroup, None for `AttnShape::decode_block`'s choice; `q8_out`: one sequence's output
/// also as int8 blocks; `coop`: whether one sequence's step takes the cooperative kernel.
#[allow(clippy::too_many_arguments)]
fn launch_columns(
    ctx_caps: &crate::gpu::Caps,
    kv: KvKind,
    shape: &AttnShape,
    kv_len: u32,
    cols: Option<u32>,
    block: Option<u32>,
    q8_out: bool,
    coop: CoopChoice,
) -> Result<DecodeLaunch> {
    shape.check()?;
    if q8_out && (cols.is_some() || !takes_q8_out(shape)) {
        return Err(KilnError::invalid(
            "attention",
            format!(
                "int8 output for one sequence's heads of a multiple of 32 dimensions (head dim {})",
                shape.head_dim
            ),
        ));
    }
    if let Some(cols) = cols.filter(|&c| c == 0 || c > crate::plan::GEMV_MAX_COLS) {
        return Err(KilnError::invalid(
            "attention",
            format!("{cols} columns (a batched step has 1 to {})", crate::plan::GEMV_MAX_COLS),
        ));
    }
    if kv_len == 0 || kv_len > shape.n_ctx {
        return Err(KilnError::invalid("attention", format!("kv length {kv_len} outside 1..={}", shape.n_ctx)));
    }
    let planned_block = block.is_none();
    let block = match block {
        None => shape.decode_block(kv_len),
        Some(b) if shape.takes_block(b) => b,
        Some(b) => {
            return Err(KilnError::invalid(
                "attention",
                format!("a decode block of {b} heads for {} heads per KV head of {}", shape.group(), shape.head_dim),
            ))
        }
    };
    let (wanted, keys) = match coop {
        CoopChoice::Planned => (
            planned_block
                && shape.group() >= DECODE_COOP_MIN_GROUP
                && decode_coop_from().is_some_and(|from| kv_len >= from),
            None,
        ),
        CoopChoice::Never => (false, None),
        CoopChoice::Always { keys } => (true, keys),
    };
    if cols.is_none() && wanted && decode_coop_takes(ctx_caps, kv, shape, kv_len) {
        // Split always: the last split of each KV head or the combine pass normalizes (and
        // writes the int8 output).
        let keys = keys.unwrap_or_else(|| decode_coop_keys(shape, kv_len));
        if !DECODE_COOP_TILES.contains(&keys) {
            return Err(KilnError::invalid("attention", format!("cooperative decode tiles of {keys} keys")));
        }
        let chunk = DECODE_COOP_SUBGROUPS * keys;
        let splits = kv_len.div_ceil(chunk);
        let params = shape.decode_params(chunk);
        let combine_key = KernelKey::AttnCombine { subgroups: ctx_caps.subgroups, batched: false, q8_out };
        let merge = shape.decode_merges_at(ctx_caps, splits, true);
        return Ok(DecodeLaunch {
            params,
            key: KernelKey::AttnDecodeCoop {
                head_dim: shape.head_dim as u16,
                keys: keys as u8,
                merge,
                q8_out: merge && q8_out,
            },
            grid: [splits, shape.n_kv_head, 1],
            combine: (!merge).then_some([shape.n_head, 1, 1]),
            combine_key,
        });
    }
    let (batched, z) = (cols.is_some(), cols.unwrap_or(1));
    let combine_key = KernelKey::AttnCombine { subgroups: ctx_caps.subgroups, batched, q8_out };
    // One sequence's context just past a split: wide workgroups take it whole.
    if !batched && shape.decode_wide_takes(ctx_caps, kv_len, block) {
        let key = decode_key(ctx_caps, kv, shape, block, DecodeForm { q8_out, wide: true, ..Default::default() });
        let params = shape.decode_params(shape.decode_wide_chunk());
        return Ok(DecodeLaunch { params, key, grid: [shape.n_head, 1, 1], combine: None, combine_key });
    }
    let splits = shape.decode_splits(kv_len);
    let params = shape.decode_params(shape.decode_chunk());
    let merge = !batched && splits > 1 && shape.decode_merges_at(ctx_caps, splits, false);
    let key = decode_key(ctx_caps, kv, shape, block, DecodeForm { batched, q8_out, merge, wide: false });
    // A merging launch's splits of one head block side by side (attention_decode.wgsl).
    let grid = if merge { [splits, shape.n_head / block, z] } else { [shape.n_head / block, splits, z] };
    let combine = (splits > 1 && !merge).then_some([shape.n_head, 1, z]);
    Ok(DecodeLaunch { params, key, grid, combine, combine_key })
}

/// Buffers of one decode attention: a single query token at position kv_len - 1 of the
/// sequence whose cache region starts at row `kv_base`; or, with `columns`, a batched step's
/// queries (row c of q for column c), each as its `StepColumn` says (kv_len, kv_base unused).
pub struct DecodeArgs<'a> {
    pub q: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    /// Scratch of `AttnShape::decode_scratch_len` floats (per column).
    pub partial: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub kv_len: u32,
    pub kv_base: u32,
    pub columns: Option<&'a [crate::kernels::matmul::StepColumn]>,
    /// Query heads per workgroup: None for the planner's choice (`AttnShape::decode_block`).
    pub block: Option<u32>,
    /// The output also as int8 blocks here (one sequence; `takes_q8_out`).
    pub q8_out: Option<&'a wgpu::Buffer>,
    /// Whether one sequence's step takes the cooperative kernel.
    pub coop: CoopChoice,
}

/// One dispatch (a context of one split, or splits that merge themselves), or the split
/// attention and the combine pass.
pub fn prepare_decode(ctx: &GpuContext, kv: KvKind, shape: &AttnShape, a: &DecodeArgs) -> Result<Vec<Dispatch>> {
    use crate::kernels::matmul::{step_table, StepState};
    let (l, step_bytes) = match a.columns {
        Some(cols) => {
            let kv_len = cols.iter().map(|c| c.kv_len).max().unwrap_or(0);
            let l = launch_columns(
                &ctx.caps,
                kv,
                shape,
                kv_len,
                Some(cols.len() as u32),
                a.block,
                a.q8_out.is_some(),
                a.coop,
            )?;
            (l, step_table(cols))
        }
        None => {
            let l = launch_columns(&ctx.caps, kv, shape, a.kv_len, None, a.block, a.q8_out.is_some(), a.coop)?;
            let state = StepState { n_tokens: 1, pos0: a.kv_len - 1, kv_len: a.kv_len, kv_base: a.kv_base };
            (l, bytemuck::bytes_of(&state).to_vec())
        }
    };
    let pipe = ctx.pipeline(&l.key)?;
    let ub = ctx.uniform(&l.params, "attention.decode");
    let dst = if l.combine.is_some() { a.partial } else { a.out };
    let step = ctx.upload(&step_bytes, "step state")?;
    let unused = ctx.storage(16, "unused")?;
    let q8 = a.q8_out.unwrap_or(&unused);
    let bg = if l.merges() {
        let done = ctx.storage(merge_counters_bytes(shape), "attention.merge counters")?;
        // (The weights read ahead: any buffer here; a session binds the output projection's.)
        bind(
            ctx,
            &pipe,
            "attention.decode",
            &[&ub, a.q, a.k_cache, a.v_cache, dst, &step, q8, a.partial, &done, a.k_cache],
        )
    } else {
        bind(ctx, &pipe, "attention.decode", &[&ub, a.q, a.k_cache, a.v_cache, dst, &step, q8])
    };
    let mut v =
        vec![Dispatch { label: "attention", pipeline: pipe, bind_group: bg, workgroups: l.grid, params: Some(ub) }];
    if let Some(g2) = l.combine {
        let pipe = ctx.pipeline(&l.combine_key)?;
        let ub = ctx.uniform(&l.params, "attention.combine");
        let bg = bind(ctx, &pipe, "attention.combine", &[&ub, a.partial, a.out, &step, q8]);
        v.push(Dispatch { label: "attention", pipeline: pipe, bind_group: bg, workgroups: g2, params: Some(ub) });
    }
    Ok(v)
}

/// Storage buffers a decode kernel that merges its own splits binds (its layout in
/// `KernelKey::bindings`): the adapter must allow as many a shader stage (`Caps::decode_merge`).
pub const DECODE_MERGE_STORAGE_BUFFERS: u32 = 9;

/// Bytes of the counters of decode attention that merges its own splits: one u32 per block of
/// heads (at most one per head), zero between dispatches, then one word nothing reads (the
/// sink of common/decode_merge.wgsl's `merge_wo_ahead`).
pub fn merge_counters_bytes(shape: &AttnShape) -> u64 {
    4 * shape.n_head.max(1) as u64 + 4
}

/// CPU reference for causal attention of m queries at positions pos0.. over a cache of
/// kv_len rows (f64). q: [m, n_head*hd]; caches: [n_ctx, n_kv*hd]. Returns [m, n_head*hd].
pub fn reference(shape: &AttnShape, q: &[f32], k: &[f32], v: &[f32], m: usize, pos0: usize) -> Vec<f32> {
    let (nh, hd, kvs, g) =
        (shape.n_head as usize, shape.head_dim as usize, shape.kv_stride() as usize, shape.group() as usize);
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; m * nh * hd];
    for i in 0..m {
        let last = pos0 + i;
        for h in 0..nh {
            let kvh = h / g;
            let qv = &q[i * nh * hd + h * hd..][..hd];
            let s: Vec<f64> = (0..=last)
                .map(|j| (0..hd).map(|d| qv[d] as f64 * k[j * kvs + kvh * hd + d] as f64).sum::<f64>() * scale)
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                let acc: f64 = (0..=last).map(|j| e[j] * v[j * kvs + kvh * hd + d] as f64).sum();
                out[i * nh * hd + h * hd + d] = (acc / sum) as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coop_gpu() -> crate::gpu::Caps {
        crate::gpu::Caps { subgroups: true, f16: true, coopmat: true, ..crate::gpu::Caps::baseline() }
    }

    fn shape(n_head: u32, n_kv_head: u32, head_dim: u32) -> AttnShape {
        AttnShape { n_head, n_kv_head, head_dim, n_ctx: 32768 }
    }

    #[test]
    fn merging_kernels_bind_as_many_storage_buffers_as_caps_asks_for() {
        for key in [
            KernelKey::AttnDecodeCoop { head_dim: 64, keys: 32, merge: true, q8_out: true },
            KernelKey::AttnDecode {
                kv: KvKind::F16Native,
                subgroups: true,
                head_dim: 64,
                vectors: true,
                block: 1,
                batched: false,
                q8_out: true,
                wide: false,
                merge: true,
            },
        ] {
            let storage = key.bindings().iter().filter(|b| **b != crate::kernels::Binding::Uniform).count();
            assert_eq!(storage as u32, DECODE_MERGE_STORAGE_BUFFERS, "{key:?}");
        }
    }

    #[test]
    fn long_contexts_take_cooperative_decode_attention_with_tiles_for_enough_workgroups() {
        let (caps, kv) = (coop_gpu(), KvKind::F16Native);
        let coop = |s: &AttnShape, kv_len: u32| {
            let l = decode_launch(&caps, kv, s, kv_len, false).unwrap();
            match l.key {
                KernelKey::AttnDecodeCoop { keys, .. } => Some((keys as u32, l.grid, l.combine.is_some())),
                _ => None,
            }
        };
        let tinyllama = shape(32, 4, 64);
        assert_eq!(coop(&tinyllama, DECODE_COOP_FROM - 1), None);
        // 64-dimension heads: tiles of 32 keys (the largest staged ones) up to where 64 make 128
        // workgroups (4 KV heads), of 64 from 8,193.
        assert_eq!(coop(&tinyllama, 1024), Some((32, [8, 4, 1], true)));
        assert_eq!(coop(&tinyllama, 3072), Some((32, [24, 4, 1], true)));
        assert_eq!(coop(&tinyllama, 4096), Some((32, [32, 4, 1], true)));
        assert_eq!(coop(&tinyllama, 16384), Some((64, [64, 4, 1], true)));
        // Llama-3-8B's 8 KV heads make 128 workgroups of 64-key tiles at 4,096 positions; its
        // 128-dimension heads take 16-key tiles where no larger make 128.
        assert_eq!(coop(&shape(32, 8, 128), 4096).map(|c| c.0), Some(64));
        assert_eq!(coop(&shape(32, 8, 128), 1024).map(|c| c.0), Some(16));
        // Groups of 1 (Llama-7B), other head sizes, adapters without cooperative matrices and
        // f32 caches keep the plain kernel; batched steps too.
        assert_eq!(coop(&shape(32, 32, 128), 4096), None);
        assert_eq!(coop(&shape(32, 4, 80), 4096), None);
        let plain = decode_launch(&crate::gpu::Caps { coopmat: false, ..caps }, kv, &tinyllama, 4096, false).unwrap();
        assert!(matches!(plain.key, KernelKey::AttnDecode { .. }));
        let f32_cache = decode_launch(&caps, KvKind::F32, &tinyllama, 4096, false).unwrap();
        assert!(matches!(f32_cache.key, KernelKey::AttnDecode { .. }));
        let batched = decode_launch_batched(&caps, kv, &tinyllama, 4096, 2).unwrap();
        assert!(matches!(batched.key, KernelKey::AttnDecode { .. }));
        // The partials buffer has room for the shortest splits at the longest context.
        assert!(tinyllama.max_splits() >= 32768 / (DECODE_COOP_SUBGROUPS * 16));
    }

    #[test]
    fn split_decode_attention_merges_itself_where_the_adapter_can() {
        let kv = KvKind::F16Native;
        let merging = crate::gpu::Caps { decode_merge: true, ..coop_gpu() };
        let tinyllama = shape(32, 4, 64);
        // Cooperative: each KV head's last split merges (the int8 output too), no combine pass.
        let l = decode_launch(&merging, kv, &tinyllama, 4096, true).unwrap();
        assert_eq!(l.key, KernelKey::AttnDecodeCoop { head_dim: 64, keys: 32, merge: true, q8_out: true });
        assert!(l.merges() && l.combine.is_none());
        // Plain, split: one dispatch; one split: the usual kernel, which writes the output.
        let plain = crate::gpu::Caps { coopmat: false, ..merging };
        let l = decode_launch(&plain, kv, &tinyllama, 600, false).unwrap();
        assert!(l.merges() && l.combine.is_none() && l.grid[0] == 600u32.div_ceil(tinyllama.decode_chunk()));
        let l = decode_launch(&plain, kv, &tinyllama, 100, false).unwrap();
        assert!(!l.merges() && l.combine.is_none());
        assert_eq!(tinyllama.decode_dispatches(&plain, 600, 1), 1);
        // Batched steps, heads of other than a multiple of 4 dimensions and adapters without
        // the merge keep the combine pass.
        let l = decode_launch_batched(&plain, kv, &tinyllama, 600, 2).unwrap();
        assert!(!l.merges() && l.combine.is_some());
        let l = decode_launch(&plain, kv, &shape(4, 2, 6), 600, false).unwrap();
        assert!(!l.merges() && l.combine.is_some());
        let l = decode_launch(&crate::gpu::Caps { decode_merge: false, ..plain }, kv, &tinyllama, 600, false).unwrap();
        assert!(!l.merges() && l.combine.is_some());
        assert_eq!(tinyllama.decode_dispatches(&crate::gpu::Caps { decode_merge: false, ..plain }, 600, 1), 2);
        // Past `DECODE_MERGE_MOST_SPLITS` splits (16; `_COOP`, 48), the combine pass:
        // Llama-7B's heads at 2,048 positions (32 splits of 64), TinyLlama's on cooperative
        // matrices at 16,384 (64); Llama-7B's at 1,024 (16) and TinyLlama's on cooperative
        // matrices at 4,097 (33), the merge.
        let mut llama7b = shape(32, 32, 128);
        llama7b.n_ctx = 8192;
        let l = decode_launch(&merging, kv, &llama7b, 2048, true).unwrap();
        assert!(matches!(l.key, KernelKey::AttnDecode { merge: false, .. }) && l.combine.is_some());
        assert_eq!(llama7b.decode_dispatches(&merging, 2048, 1), 2);
        let l = decode_launch(&merging, kv, &llama7b, 1024, true).unwrap();
        assert!(l.merges() && l.combine.is_none() && l.grid[0] == 1024 / llama7b.decode_chunk());
        let l = decode_launch(&merging, kv, &tinyllama, 4097, true).unwrap();
        assert!(l.merges() && l.combine.is_none() && l.grid[0] == 33);
        let mut long = tinyllama;
        long.n_ctx = 16384;
        let l = decode_launch(&merging, kv, &long, 16384, true).unwrap();
        assert!(matches!(l.key, KernelKey::AttnDecodeCoop { merge: false, .. }) && l.combine.is_some());
    }
}
