//! Flash attention for prefill (wgsl/flash_attention.wgsl): Q·Kᵀ, the causal online softmax
//! and P·V in one dispatch over tiles of the KV cache (f32 or f16, read in place), for m
//! queries at positions pos0.. (a prompt appended to a cache that already holds pos0 rows).
//! No score matrix: the session needs no buffer that grows with ubatch × context. The CPU
//! reference is `attention::reference`.

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{bind, Dispatch, GpuContext};
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
/// subgroup, 4 subgroups for 64 dimensions, 2 for 128 (its tiles then fill 45 and 47 KiB of
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
    pub _pad: [u32; 3],
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

/// One flash attention: its parameters, pipeline key and grid.
#[derive(Debug, Clone, Copy)]
pub struct FlashLaunch {
    pub params: FlashParams,
    pub key: KernelKey,
    pub grid: [u32; 3],
}

/// The launch for m queries at positions pos0.. over a cache of `kv` values holding pos0 + m
/// rows; on cooperative matrices where `takes_coop` (the same rows per workgroup, grid and
/// parameters).
pub fn launch(kv: KvKind, shape: &AttnShape, m: u32, pos0: u32, caps: &crate::gpu::Caps) -> Result<FlashLaunch> {
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
        _pad: [0; 3],
    };
    Ok(FlashLaunch { params, key, grid: [n_tiles, shape.n_kv_head, 1] })
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
        // Each chunk's own launch: its checks (positions within the context) and its tiles.
        let one = launch(kv, shape, c.m, c.pos0, caps)?;
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
    l.params = FlashParams { m: 0, pos0: 0, n_tiles: 0, kv_off: 0, ..l.params };
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

/// One dispatch.
pub fn prepare(ctx: &GpuContext, kv: KvKind, shape: &AttnShape, a: &FlashArgs) -> Result<Dispatch> {
    let l = launch(kv, shape, a.m, a.pos0, &ctx.caps)?;
    let pipeline = ctx.pipeline(&l.key)?;
    let ub = ctx.uniform(&l.params, "attention.flash");
    // The chunks' table is not read by the one-sequence variant.
    let unused = ctx.storage(std::mem::size_of::<FlashSegment>() as u64, "unused")?;
    let bg = bind(ctx, &pipeline, "attention.flash", &[&ub, a.q, a.k_cache, a.v_cache, a.out, &unused]);
    Ok(Dispatch { label: "attention", pipeline, bind_group: bg, workgroups: l.grid, params: Some(ub) })
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
    let bg = bind(ctx, &pipeline, "attention.flash", &[&ub, a.q, a.k_cache, a.v_cache, a.out, &segments]);
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
