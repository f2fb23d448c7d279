//! Flash attention for prefill (wgsl/flash_attention.wgsl): Q·Kᵀ, the causal online softmax
//! and P·V in one dispatch over tiles of the KV cache (f32 or f16, read in place), for m
//! queries at positions pos0.. (a prompt appended to a cache that already holds pos0 rows).
//! No score matrix: the session needs no buffer that grows with ubatch × context. The CPU
//! reference is `attention::reference`.

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{bind, grid, Dispatch, GpuContext};
use crate::kernels::attention::AttnShape;
use crate::kernels::{KernelKey, KvKind};

/// Invocations per workgroup: 16 rows x 8 columns of invocations.
pub const FLASH_WG: u32 = 128;
/// Query rows per workgroup (tokens x heads of one GQA group).
pub const FLASH_ROWS: u32 = 64;
/// Keys per tile of the cache.
pub const FLASH_KEYS: u32 = 32;
/// Head dimensions per chunk of Q and K while scoring.
pub const FLASH_DIM_CHUNK: u32 = 32;
/// Floats of V staged at a time (a chunk of keys x the head-dim class).
const FLASH_V_FLOATS: u32 = 1024;
/// Head-dim classes: a shader variant per class sizes the output registers at compile time
/// (runtime-sized register arrays would live in slow memory); head_dim is rounded up.
pub const FLASH_HEAD_DIMS: [u16; 4] = [32, 64, 128, 256];

/// Head dimensions of the cooperative-matrix variants (flash_attention_coop.wgsl).
pub const COOP_HEAD_DIMS: [u16; 2] = [64, 128];

/// Query rows per workgroup of the cooperative variant for heads of `head_dim`: 16 per
/// subgroup, 4 subgroups for 64 dimensions, 2 for 128 (its tiles then fill 45 and 39 KiB of
/// the 48 KiB of workgroup memory the adapter guarantees for cooperative matrices).
pub fn coop_rows(head_dim: u32) -> u32 {
    if head_dim > 64 {
        32
    } else {
        64
    }
}

/// Whether prefill attention runs on cooperative matrices: adapters with them, heads of
/// `COOP_HEAD_DIMS` over an f16 cache read as f16; `KILN_FLASH_COOP=0` keeps the f32 kernel
/// (comparisons).
pub fn takes_coop(kv: KvKind, shape: &AttnShape, caps: &crate::gpu::Caps) -> bool {
    caps.coopmat
        && caps.subgroups
        && !caps.cpu_adapter
        && kv == KvKind::F16Native
        && COOP_HEAD_DIMS.iter().any(|&d| d as u32 == shape.head_dim)
        && !crate::config::flash_coop_disabled()
}

/// The class of a head dimension (its variant), None above the largest.
pub fn head_dim_class(head_dim: u32) -> Option<u16> {
    FLASH_HEAD_DIMS.into_iter().find(|&c| head_dim <= c as u32)
}

/// The header constants of a variant of head-dim class `d`: (name, value), in the order the
/// shader declares them.
pub fn shader_consts(d: u32) -> [(&'static str, u32); 8] {
    let kc = (FLASH_V_FLOATS / d).clamp(1, FLASH_KEYS);
    let a_len = FLASH_DIM_CHUNK.max(FLASH_KEYS) * (FLASH_ROWS + 1);
    let b_len = (FLASH_DIM_CHUNK * (FLASH_KEYS + 1)).max(kc * d);
    [
        ("WG", FLASH_WG),
        ("BM", FLASH_ROWS),
        ("BK", FLASH_KEYS),
        ("DK", FLASH_DIM_CHUNK),
        ("D", d),
        ("KC", kc),
        ("A_LEN", a_len),
        ("B_LEN", b_len),
    ]
}

/// Bytes of workgroup memory a variant uses.
pub fn workgroup_bytes(d: u32) -> u32 {
    let c = shader_consts(d);
    4 * (c[6].1 + c[7].1 + FLASH_ROWS)
}

/// Mirrors `Params` in flash_attention.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct FlashParams {
    pub m: u32,
    pub pos0: u32,
    pub head_dim: u32,
    pub group: u32,
    pub q_stride: u32,
    pub kv_stride: u32,
    /// log2(e) / sqrt(head_dim): the kernel's scores are in base 2.
    pub scale: f32,
    pub n_tiles: u32,
    /// The cache element of the sequence's row 0 (its region's first row x kv_stride).
    pub kv_off: u32,
    /// Workgroups each row tile's keys are split among (the cooperative variant; 1: none),
    /// and the keys each takes (a multiple of `COOP_KEYS`).
    pub n_split: u32,
    pub split_keys: u32,
    pub _pad: u32,
}

/// Keys per tile of the cooperative variant.
pub const COOP_KEYS: u32 = 64;
/// Workgroups a split flash attention aims at where the row tiles alone are fewer: Llama-7B's
/// 512-token steps (512 workgroups of two subgroups) in 4 splits (run 176 on an H200, 512
/// queries at 3584: 2,313 / 2,122 / 2,083 / 1,840 µs in 1 / 2 / 3 / 4; pp4096 4,591 / 4,704 /
/// 4,742 / 4,866 tok/s).
pub const SPLIT_TARGET_WORKGROUPS: u32 = 2048;
/// Whether the cooperative kernel loads the next tile's K and V while this one computes (its
/// PREFETCH): where an invocation's share of a tile is at most 8 vec4s (64-dimension heads;
/// holding 128-dimension heads' 32 cost Llama-7B 14% of pp512 on an H200, run 118). Only the
/// kernels that stage each tile without loading ahead split their keys: more workgroups in
/// flight hide those loads (run 173: Llama-7B's heads, 512 queries at position 3584, 2,369 ->
/// 2,170 µs in 2 splits; pp4096 4,534 -> 4,652 tok/s), while TinyLlama's 64-dimension heads,
/// loading ahead, ran slower split (175 -> 213 µs in 4; run 176: 170 / 187 / 200 / 207 µs in
/// 1-4, pp4096 34,410 / 34,285 -> 34,119 / 34,158 in 2).
pub fn coop_prefetches(head_dim: u32) -> bool {
    COOP_KEYS * head_dim / 4 / (2 * coop_rows(head_dim)) <= 8
}
/// Keys a split takes at least: shorter contexts are not split.
pub const SPLIT_MIN_KEYS: u32 = 512;
/// Splits at most.
pub const SPLIT_MAX: u32 = 4;
/// The partial outputs' buffer is at most this large (wgpu's default binding limit).
pub const SPLIT_MAX_BYTES: u64 = 128 << 20;

/// Bytes of split partial outputs for `m` queries over `n_split` splits: each split's output
/// rows, then each row's max and sum (a vec4 each).
pub fn split_bytes(shape: &AttnShape, m: u32, n_split: u32) -> u64 {
    (n_split as u64) * (m * shape.n_head) as u64 * (shape.head_dim as u64 + 4) * 4
}

/// Bytes a session of `ubatch` tokens a step keeps for split partial outputs: none where
/// prefill attention is not on cooperative matrices.
pub fn split_room(kv: KvKind, shape: &AttnShape, ubatch: u32, caps: &crate::gpu::Caps) -> u64 {
    if !takes_coop(kv, shape, caps) {
        return 0;
    }
    split_bytes(shape, ubatch, SPLIT_MAX).min(SPLIT_MAX_BYTES)
}

/// Into how many workgroups a one-sequence flash attention of `m` queries at `pos0` splits
/// each row tile's keys: where the kernel does not load ahead (`coop_prefetches`), the row
/// tiles' workgroups are fewer than the GPU holds and the context is long (a long prompt's
/// later steps), within `room` bytes of partial outputs; `KILN_FLASH_SPLIT=N` forces N (1: no
/// split).
pub fn split_of(shape: &AttnShape, m: u32, pos0: u32, tile_rows: u32, room: u64) -> u32 {
    let workgroups = (m * shape.group()).div_ceil(tile_rows) * shape.n_kv_head;
    let wanted = match crate::config::flash_split() {
        Some(n) => n,
        None if coop_prefetches(shape.head_dim) => 1,
        None => SPLIT_TARGET_WORKGROUPS.div_ceil(workgroups).min((pos0 + m) / SPLIT_MIN_KEYS).min(SPLIT_MAX),
    };
    wanted.min((room / split_bytes(shape, m, 1).max(1)) as u32).max(1)
}

/// Launch `l` (of the cooperative variant, one sequence) with each row tile's keys split
/// among `n_split` workgroups (at most one per tile of keys), and the combine pass.
pub fn split(mut l: FlashLaunch, shape: &AttnShape, n_split: u32) -> FlashLaunch {
    let (m, n_keys) = (l.params.m, l.params.pos0 + l.params.m);
    let share = n_keys.div_ceil(n_split.clamp(1, n_keys.div_ceil(COOP_KEYS))).div_ceil(COOP_KEYS) * COOP_KEYS;
    let n_split = n_keys.div_ceil(share);
    if n_split <= 1 {
        return l;
    }
    l.params.n_split = n_split;
    l.params.split_keys = share;
    l.grid[0] = l.params.n_tiles * n_split;
    let rows = m * shape.n_head;
    let d4 = shape.head_dim / 4;
    let groups = (rows * d4).div_ceil(crate::kernels::WG_ELT);
    l.combine = Some((CombineParams { rows, d4, n_split, _pad: 0 }, grid(groups)));
    l
}

/// Mirrors `Params` in flash_combine.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
pub struct CombineParams {
    pub rows: u32,
    pub d4: u32,
    pub n_split: u32,
    pub _pad: u32,
}

/// The variant for heads of `shape` over a cache of `kv` values.
pub fn key(kv: KvKind, shape: &AttnShape) -> Result<KernelKey> {
    let head_dim = head_dim_class(shape.head_dim).ok_or_else(|| {
        KilnError::invalid("attention", format!("head dim {} has no flash-attention variant", shape.head_dim))
    })?;
    Ok(KernelKey::AttnFlash { kv, head_dim, segments: false })
}

/// The kernel one sequence's prefill attention runs on an adapter with `caps`: the
/// cooperative one where it takes the shape (`takes_coop`), else the f32 one (`key`).
pub fn planned_key(kv: KvKind, shape: &AttnShape, caps: &crate::gpu::Caps) -> Result<KernelKey> {
    if takes_coop(kv, shape, caps) {
        Ok(KernelKey::AttnFlashCoop { head_dim: shape.head_dim as u16, segments: false })
    } else {
        key(kv, shape)
    }
}

/// One flash attention: its parameters, pipeline key and grid, and where its keys are split,
/// the combine pass (`KernelKey::FlashCombine`) that merges the partial outputs.
#[derive(Debug, Clone, Copy)]
pub struct FlashLaunch {
    pub params: FlashParams,
    pub key: KernelKey,
    pub grid: [u32; 3],
    pub combine: Option<(CombineParams, [u32; 3])>,
}

/// The launch for m queries at positions pos0.. over a cache of `kv` values holding pos0 + m
/// rows; on cooperative matrices where `takes_coop` (the same rows per workgroup, grid and
/// parameters), there with its keys split (`split_of`) within `room` bytes of partial
/// outputs.
pub fn launch(
    kv: KvKind,
    shape: &AttnShape,
    m: u32,
    pos0: u32,
    caps: &crate::gpu::Caps,
    room: u64,
) -> Result<FlashLaunch> {
    shape.check()?;
    let kv_len = pos0 + m;
    if m == 0 || kv_len > shape.n_ctx {
        return Err(KilnError::invalid(
            "attention",
            format!("{m} queries at position {pos0} outside the context of {}", shape.n_ctx),
        ));
    }
    let rows = tile_rows(kv, shape, caps);
    let key = planned_key(kv, shape, caps)?;
    let n_tiles = (m * shape.group()).div_ceil(rows);
    let params = FlashParams {
        m,
        pos0,
        head_dim: shape.head_dim,
        group: shape.group(),
        q_stride: shape.n_head * shape.head_dim,
        kv_stride: shape.kv_stride(),
        scale: std::f32::consts::LOG2_E / (shape.head_dim as f32).sqrt(),
        n_tiles,
        kv_off: 0,
        n_split: 1,
        split_keys: kv_len,
        _pad: 0,
    };
    let l = FlashLaunch { params, key, grid: [n_tiles, shape.n_kv_head, 1], combine: None };
    Ok(match key {
        KernelKey::AttnFlashCoop { .. } => split(l, shape, split_of(shape, m, pos0, rows, room)),
        _ => l,
    })
}

/// Mirrors `Segment` in common/flash_segments.wgsl: one sequence's chunk of a step that
/// prefills several sequences' prompts side by side.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
pub struct FlashSegment {
    /// Query tokens of the chunk.
    pub m: u32,
    /// Position of its first token in its sequence.
    pub pos0: u32,
    /// The cache element of its sequence's row 0.
    pub kv_off: u32,
    /// Its first row of Q and of the output.
    pub row0: u32,
    /// Row tiles of the chunk per KV head.
    pub n_tiles: u32,
    pub _pad: [u32; 3],
}

/// A chunk of one sequence in a step of several: `m` tokens at positions `pos0..` of the
/// region whose first cache row is `kv_base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub m: u32,
    pub pos0: u32,
    pub kv_base: u32,
}

/// The launch over several sequences' chunks, laid one after another in Q (a workgroup per
/// row tile of a chunk, KV head and chunk: grid z), with the table of chunks it reads at
/// binding 5. Each chunk attends causally over its own region, as `launch` for it alone.
pub fn launch_segments(
    kv: KvKind,
    shape: &AttnShape,
    chunks: &[Chunk],
    caps: &crate::gpu::Caps,
) -> Result<(FlashLaunch, Vec<FlashSegment>)> {
    let mut row0 = 0;
    let mut table = Vec::with_capacity(chunks.len());
    let mut first: Option<FlashLaunch> = None;
    for c in chunks {
        // Each chunk's own launch: its checks (positions within the context) and its tiles
        // (its keys not split).
        let one = launch(kv, shape, c.m, c.pos0, caps, 0)?;
        table.push(FlashSegment {
            m: c.m,
            pos0: c.pos0,
            kv_off: c.kv_base * shape.kv_stride(),
            row0,
            n_tiles: one.params.n_tiles,
            _pad: [0; 3],
        });
        row0 += c.m;
        first.get_or_insert(one);
    }
    let Some(mut l) = first else {
        return Err(KilnError::invalid("attention", "a step of several chunks needs at least one"));
    };
    l.key = match l.key {
        KernelKey::AttnFlash { kv, head_dim, .. } => KernelKey::AttnFlash { kv, head_dim, segments: true },
        KernelKey::AttnFlashCoop { head_dim, .. } => KernelKey::AttnFlashCoop { head_dim, segments: true },
        k => k,
    };
    let most = table.iter().map(|t| t.n_tiles).max().unwrap_or(1);
    // The table says each chunk's tokens, positions and region; the uniform the rest.
    l.params = FlashParams { m: 0, pos0: 0, n_tiles: 0, kv_off: 0, n_split: 1, split_keys: 0, ..l.params };
    l.grid = [most, shape.n_kv_head, chunks.len() as u32];
    Ok((l, table))
}

/// Query rows per workgroup of the variant `launch` picks.
pub fn tile_rows(kv: KvKind, shape: &AttnShape, caps: &crate::gpu::Caps) -> u32 {
    if takes_coop(kv, shape, caps) {
        coop_rows(shape.head_dim)
    } else {
        FLASH_ROWS
    }
}

/// Keys the launch's workgroups read, summed over query tiles of `tile_rows` rows (each tile
/// reads keys 0 up to the last its last token sees): what the profile counts as K/V traffic.
pub fn keys_read(shape: &AttnShape, m: u32, pos0: u32, tile_rows: u32) -> u64 {
    let rows = m * shape.group();
    (0..rows.div_ceil(tile_rows))
        .map(|t| {
            let last_row = ((t + 1) * tile_rows).min(rows) - 1;
            (pos0 + last_row / shape.group() + 1) as u64
        })
        .sum()
}

/// Buffers of one flash attention.
pub struct FlashArgs<'a> {
    /// Q: [m, n_head * head_dim], already rotated.
    pub q: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    /// Output: [m, n_head * head_dim].
    pub out: &'a wgpu::Buffer,
    /// Query tokens; they sit at positions pos0 .. pos0 + m, whose K and V are in the cache.
    pub m: u32,
    pub pos0: u32,
}

/// The dispatches as planned (one, or the split kernel and its combine pass).
pub fn prepare(ctx: &GpuContext, kv: KvKind, shape: &AttnShape, a: &FlashArgs) -> Result<Vec<Dispatch>> {
    let room = split_room(kv, shape, a.m, &ctx.caps);
    prepare_launch(ctx, shape, a, &launch(kv, shape, a.m, a.pos0, &ctx.caps, room)?)
}

/// The dispatches of launch `l` (tests force its split).
pub fn prepare_launch(ctx: &GpuContext, shape: &AttnShape, a: &FlashArgs, l: &FlashLaunch) -> Result<Vec<Dispatch>> {
    let pipeline = ctx.pipeline(&l.key)?;
    let ub = ctx.uniform(&l.params, "attention.flash");
    // The chunks' table is not read by the one-sequence variant, nor partial outputs unsplit.
    let unused = ctx.storage(std::mem::size_of::<FlashSegment>() as u64, "unused")?;
    let partial = ctx.storage(split_bytes(shape, a.m, l.params.n_split).max(16), "attention.flash partials")?;
    let bg = bind(ctx, &pipeline, "attention.flash", &[&ub, a.q, a.k_cache, a.v_cache, a.out, &unused, &partial]);
    let mut v = vec![Dispatch { label: "attention", pipeline, bind_group: bg, workgroups: l.grid, params: Some(ub) }];
    if let Some((cp, grid)) = l.combine {
        let pipeline = ctx.pipeline(&KernelKey::FlashCombine)?;
        let ub = ctx.uniform(&cp, "attention.flash combine");
        let bg = bind(ctx, &pipeline, "attention.flash combine", &[&ub, &partial, a.out]);
        v.push(Dispatch { label: "attention", pipeline, bind_group: bg, workgroups: grid, params: Some(ub) });
    }
    Ok(v)
}

/// One dispatch over several sequences' `chunks`, their queries one after another in `a.q`
/// (`a.m` and `a.pos0` unused), each over its own region of the cache (tests).
pub fn prepare_segments(
    ctx: &GpuContext,
    kv: KvKind,
    shape: &AttnShape,
    a: &FlashArgs,
    chunks: &[Chunk],
) -> Result<(Dispatch, wgpu::Buffer)> {
    let (l, table) = launch_segments(kv, shape, chunks, &ctx.caps)?;
    let pipeline = ctx.pipeline(&l.key)?;
    let ub = ctx.uniform(&l.params, "attention.flash");
    let segments = ctx.upload(bytemuck::cast_slice(&table), "attention.flash chunks")?;
    let unused = ctx.storage(16, "unused")?;
    let bg = bind(ctx, &pipeline, "attention.flash", &[&ub, a.q, a.k_cache, a.v_cache, a.out, &segments, &unused]);
    Ok((Dispatch { label: "attention", pipeline, bind_group: bg, workgroups: l.grid, params: Some(ub) }, segments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_fit_webgpu_workgroup_memory() {
        for d in FLASH_HEAD_DIMS {
            assert!(workgroup_bytes(d as u32) <= 16384, "class {d}: {} bytes", workgroup_bytes(d as u32));
        }
        assert_eq!(head_dim_class(2), Some(32));
        assert_eq!(head_dim_class(64), Some(64));
        assert_eq!(head_dim_class(66), Some(128));
        assert_eq!(head_dim_class(crate::kernels::ATTN_MAX_HEAD_DIM), Some(256));
    }

    #[test]
    fn long_contexts_split_their_keys_where_row_tiles_are_few() {
        let tl = AttnShape { n_head: 32, n_kv_head: 4, head_dim: 64, n_ctx: 4096 };
        let l7 = AttnShape { n_head: 32, n_kv_head: 32, head_dim: 128, n_ctx: 4096 };
        let room = split_bytes(&tl, 512, SPLIT_MAX);
        // A 4096-token prompt's last step of 512: Llama-7B's 512 workgroups split in 4 (its
        // second step, 1,024 keys, in 2); TinyLlama's 64-dimension heads not at all.
        let room7 = split_bytes(&l7, 512, SPLIT_MAX);
        assert_eq!(split_of(&l7, 512, 3584, 32, room7), 4);
        assert_eq!(split_of(&l7, 512, 512, 32, room7), 2);
        assert_eq!(split_of(&tl, 512, 3584, 64, room), 1);
        // Its first step (512 keys at most), a single 4096-token step (4096 row tiles), no room.
        assert_eq!(split_of(&l7, 512, 0, 32, room7), 1);
        assert_eq!(split_of(&l7, 4096, 0, 32, split_bytes(&l7, 4096, SPLIT_MAX)), 1);
        assert_eq!(split_of(&l7, 512, 3584, 32, 0), 1);
        // Half the workgroups (a 256-token step): still 4, the most; room for 2 only: 2.
        assert_eq!(split_of(&l7, 256, 3840, 32, room7), 4);
        assert_eq!(split_of(&l7, 512, 3584, 32, split_bytes(&l7, 512, 2)), 2);
        // The split launch: shares of whole key tiles, a grid of tiles x splits, the combine
        // pass over every output row's 4-dimension chunks.
        let base = FlashLaunch {
            params: FlashParams {
                m: 512,
                pos0: 3584,
                head_dim: 64,
                group: 8,
                q_stride: 2048,
                kv_stride: 256,
                scale: 1.0,
                n_tiles: 64,
                kv_off: 0,
                n_split: 1,
                split_keys: 4096,
                _pad: 0,
            },
            key: KernelKey::AttnFlashCoop { head_dim: 64, segments: false },
            grid: [64, 4, 1],
            combine: None,
        };
        let l = split(base, &tl, 3);
        assert_eq!((l.params.n_split, l.params.split_keys, l.grid), (3, 1408, [192, 4, 1]));
        let (c, grid) = l.combine.unwrap();
        assert_eq!((c.rows, c.d4, c.n_split, grid), (512 * 32, 16, 3, [1024, 1, 1]));
        // Fewer keys than splits asked: one a tile of keys at most.
        let short = FlashLaunch { params: FlashParams { m: 100, pos0: 0, ..base.params }, ..base };
        assert_eq!(split(short, &tl, 4).params.n_split, 2);
        assert!(split(FlashLaunch { params: FlashParams { m: 60, ..short.params }, ..short }, &tl, 4)
            .combine
            .is_none());
    }

    #[test]
    fn causal_tiles_read_only_the_keys_they_see() {
        // 100 tokens of an 8-head group: 800 rows, 13 tiles of 8 tokens (the last of 4).
        let shape = AttnShape { n_head: 32, n_kv_head: 4, head_dim: 64, n_ctx: 200 };
        let want: u64 = (1..=12).map(|t| t * 8).sum::<u64>() + 100;
        assert_eq!(keys_read(&shape, 100, 0, FLASH_ROWS), want);
        assert_eq!(keys_read(&shape, 100, 50, FLASH_ROWS), want + 13 * 50);
        // Tiles of 32 rows (the cooperative variant for heads of 128): 4 tokens each, 25 tiles.
        let want32: u64 = (1..=25).map(|t| t * 4).sum();
        assert_eq!(keys_read(&shape, 100, 0, 32), want32);
    }
}
