//! Rotary position embedding, in place (Q) or fused with the write into the KV cache (K),
//! and the plain cache write (V).

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{bind, grid, Dispatch, GpuContext};
use crate::kernels::{KernelKey, KvKind, WG_ELT};

/// Which pairs rotate together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Adjacent pairs (2i, 2i+1): Llama, Mistral ("norm" in llama.cpp).
    Norm,
    /// Halves (i, i + n_rot/2): Qwen2, Qwen3, GPT-NeoX.
    Neox,
}

/// Mirrors `Params` in rope.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct RopeParams {
    pub n_tokens: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    pub pos0: u32,
    pub src_stride: u32,
    pub dst_stride: u32,
    pub dst_offset: u32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub _pad: [u32; 2],
}

fn check(p: &RopeParams) -> Result<()> {
    if p.dst_stride != 0 && p.dst_offset % p.dst_stride != 0 {
        return Err(KilnError::invalid("rope", "the cache offset must be a whole number of rows"));
    }
    if p.head_dim % 2 != 0 || p.n_rot % 2 != 0 || p.n_rot > p.head_dim {
        return Err(KilnError::invalid(
            "rope",
            format!("head_dim {} / n_rot {} must be even with n_rot <= head_dim", p.head_dim, p.n_rot),
        ));
    }
    Ok(())
}

/// The step state the kernels take the position and cache region from, as `p` gives them
/// (one-off dispatches: tests, tools).
fn step_of(ctx: &GpuContext, p: &RopeParams) -> Result<wgpu::Buffer> {
    let kv_base = p.dst_offset.checked_div(p.dst_stride).unwrap_or(0);
    let state =
        crate::kernels::matmul::StepState { n_tokens: p.n_tokens, pos0: p.pos0, kv_len: p.pos0 + p.n_tokens, kv_base };
    ctx.upload(bytemuck::bytes_of(&state), "rope step")
}

fn threads(p: &RopeParams) -> u32 {
    p.n_tokens * p.n_heads * (p.head_dim / 2)
}

/// Rotates x[t, h, :] in place.
pub fn prepare_in_place(
    ctx: &GpuContext,
    mode: RopeMode,
    x: &wgpu::Buffer,
    p: RopeParams,
    stage: &'static str,
) -> Result<Dispatch> {
    check(&p)?;
    let key = KernelKey::Rope { neox: mode == RopeMode::Neox, to_cache: None, rope: true };
    let pipeline = ctx.pipeline(&key)?;
    let ub = ctx.uniform(&p, stage);
    let bg = bind(ctx, &pipeline, stage, &[&ub, &step_of(ctx, &p)?, x]);
    Ok(Dispatch {
        label: stage,
        pipeline,
        bind_group: bg,
        workgroups: grid(threads(&p).div_ceil(WG_ELT)),
        params: Some(ub),
    })
}

/// Writes (rotated, when `mode` is given) src[t, h, :] into cache row pos0 + t.
pub fn prepare_to_cache(
    ctx: &GpuContext,
    mode: Option<RopeMode>,
    kv: KvKind,
    src: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    p: RopeParams,
    stage: &'static str,
) -> Result<Dispatch> {
    check(&p)?;
    let key = KernelKey::Rope { neox: mode == Some(RopeMode::Neox), to_cache: Some(kv), rope: mode.is_some() };
    let pipeline = ctx.pipeline(&key)?;
    let ub = ctx.uniform(&p, stage);
    let bg = bind(ctx, &pipeline, stage, &[&ub, &step_of(ctx, &p)?, src, cache]);
    Ok(Dispatch {
        label: stage,
        pipeline,
        bind_group: bg,
        workgroups: grid(threads(&p).div_ceil(WG_ELT)),
        params: Some(ub),
    })
}

/// CPU reference over packed [n_tokens, n_heads, head_dim] rows, in f64.
pub fn reference(x: &[f32], mode: RopeMode, p: &RopeParams) -> Vec<f32> {
    let (hd, nr) = (p.head_dim as usize, p.n_rot as usize);
    let mut out = x.to_vec();
    for t in 0..p.n_tokens as usize {
        let pos = (p.pos0 as usize + t) as f64;
        for h in 0..p.n_heads as usize {
            let b = t * p.src_stride as usize + h * hd;
            for i in 0..nr / 2 {
                let th = pos * p.freq_scale as f64 * (p.freq_base as f64).powf(-2.0 * i as f64 / nr as f64);
                let (a, c) = match mode {
                    RopeMode::Norm => (b + 2 * i, b + 2 * i + 1),
                    RopeMode::Neox => (b + i, b + i + nr / 2),
                };
                let (x0, x1) = (x[a] as f64, x[c] as f64);
                out[a] = (x0 * th.cos() - x1 * th.sin()) as f32;
                out[c] = (x0 * th.sin() + x1 * th.cos()) as f32;
            }
        }
    }
    out
}

/// The K/V write's buffers: the step's K and V rows and the layer's caches.
pub struct KvWriteBuffers<'a> {
    pub k_src: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_src: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
}

/// Writes K (rotated) and V rows into their caches at rows pos0.. in one dispatch.
pub fn prepare_kv_write(
    ctx: &GpuContext,
    mode: RopeMode,
    kv: KvKind,
    b: KvWriteBuffers,
    p: RopeParams,
) -> Result<Dispatch> {
    check(&p)?;
    let key = KernelKey::KvWrite { neox: mode == RopeMode::Neox, kv };
    let pipeline = ctx.pipeline(&key)?;
    let ub = ctx.uniform(&p, "kv_write");
    let bg = bind(ctx, &pipeline, "kv_write", &[&ub, &step_of(ctx, &p)?, b.k_src, b.k_cache, b.v_src, b.v_cache]);
    Ok(Dispatch { label: "kv_write", pipeline, bind_group: bg, workgroups: kv_write_grid(&p), params: Some(ub) })
}

/// Grid of the combined K/V write: one invocation per element pair of K and of V.
pub fn kv_write_grid(p: &RopeParams) -> [u32; 3] {
    grid((2 * threads(p)).div_ceil(WG_ELT))
}
