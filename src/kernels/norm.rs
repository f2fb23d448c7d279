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

/// Values each invocation of reduce_norm.wgsl holds between its two passes: rows of up to
/// `WG_ROW` × 16 = 4,096 values (TinyLlama's 2,048, Llama-7B's 4,096) fold their norm into a
/// split GEMM's reduce; longer rows keep the two dispatches.
pub const REDUCE_NORM_HELD: u32 = 16;

/// Whether reduce_norm.wgsl takes rows of n values.
pub fn reduce_norm_takes(n: u32) -> bool {
    n <= super::WG_ROW * REDUCE_NORM_HELD
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct ReduceNormParams {
    /// Values a row, rows (tokens), K ranges of the partials ([splits][rows][n]).
    pub n: u32,
    pub n_cols: u32,
    pub splits: u32,
    /// Floats between the residual's rows, halves between the output's.
    pub y_stride: u32,
    pub h_stride: u32,
    pub eps: f32,
    pub _pad: [u32; 2],
}

/// Split-K's reduce into the residual stream and the RMSNorm after it as halves, one dispatch
/// (reduce_norm.wgsl): y[r] += Σ_s partials[s][r], then halves[r] = rms_norm(y[r]) · w.
pub fn prepare_reduce(
    ctx: &GpuContext,
    partials: &wgpu::Buffer,
    w: &wgpu::Buffer,
    halves: &wgpu::Buffer,
    y: &wgpu::Buffer,
    params: ReduceNormParams,
    stage: &'static str,
) -> Result<Dispatch> {
    let pipeline = ctx.pipeline(&KernelKey::ReduceNorm { subgroups: ctx.caps.subgroups })?;
    let ub = ctx.uniform(&params, stage);
    let bg = bind(ctx, &pipeline, stage, &[&ub, partials, w, halves, y]);
    Ok(Dispatch { label: stage, pipeline, bind_group: bg, workgroups: grid(params.n_cols), params: Some(ub) })
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
