//! RMSNorm over rows (also Qwen3's per-head Q/K norm).

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::{bind, grid, Dispatch, GpuContext};
use crate::kernels::KernelKey;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct RmsNormParams {
    pub n: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub eps: f32,
}

/// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, for `rows` rows of n values; `halves`:
/// y as f16, the cooperative GEMM's input (n and the strides multiples of 4).
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    ctx: &GpuContext,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    rows: u32,
    params: RmsNormParams,
    halves: bool,
    stage: &'static str,
) -> Result<Dispatch> {
    let pipeline = ctx.pipeline(&KernelKey::RmsNorm { subgroups: ctx.caps.subgroups, halves })?;
    let ub = ctx.uniform(&params, stage);
    let bg = bind(ctx, &pipeline, stage, &[&ub, x, w, y]);
    Ok(Dispatch { label: stage, pipeline, bind_group: bg, workgroups: grid(rows), params: Some(ub) })
}

pub fn reference(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
            let inv = 1.0 / (ss / n as f64 + eps as f64).sqrt();
            row.iter().zip(w).map(move |(&v, &g)| (v as f64 * inv * g as f64) as f32)
        })
        .collect()
}
