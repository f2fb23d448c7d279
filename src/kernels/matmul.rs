//! Matmul with quantized weights: Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias) (+ Y). GEMV or tiled
//! GEMM as the planner decides; one dispatch per weight chunk when a tensor is split.

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{bind, grid, Dispatch, GpuContext, WeightTensor};
use crate::kernels::KernelKey;
use crate::plan::{plan_matmul, MatmulKernel};

/// Mirrors `Params` in gemv.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct GemvParams {
    pub k: u32,
    pub n_rows: u32,
    pub row_offset: u32,
    pub y_stride: u32,
    pub x_stride: u32,
    pub n_cols: u32,
    pub has_bias: u32,
    pub accumulate: u32,
}

/// Mirrors `Params` in gemm.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct GemmParams {
    pub m: u32,
    pub k: u32,
    pub n_rows: u32,
    pub row_offset: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub has_bias: u32,
    pub accumulate: u32,
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
}

/// Records-once dispatches for `mm` with the kernel the planner picks.
pub fn prepare(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<Vec<Dispatch>> {
    let kernel = plan_matmul(mm.m, mm.w.rows, mm.w.k, mm.w.format, &ctx.caps);
    prepare_with(ctx, mm, kernel, stage)
}

/// As `prepare`, with the kernel chosen by the caller (benchmarks, tests of each variant).
pub fn prepare_with(
    ctx: &GpuContext,
    mm: &Matmul,
    kernel: MatmulKernel,
    stage: &'static str,
) -> Result<Vec<Dispatch>> {
    if mm.x_stride < mm.w.k || mm.y_stride < mm.w.rows {
        return Err(KilnError::invalid(
            "matmul",
            format!(
                "strides x={} y={} are smaller than k={} n={}",
                mm.x_stride, mm.y_stride, mm.w.k, mm.w.rows
            ),
        ));
    }
    if mm.x_stride % 4 != 0 {
        return Err(KilnError::invalid(
            "matmul",
            format!(
                "x rows must be padded to a multiple of 4 floats, got a stride of {}",
                mm.x_stride
            ),
        ));
    }
    let dummy;
    let bias = match mm.bias {
        Some(b) => b,
        None => {
            dummy = ctx.storage(16, "no-bias")?;
            &dummy
        }
    };
    let mut out = Vec::new();
    for chunk in &mm.w.chunks {
        let d = match kernel {
            MatmulKernel::Gemv { ncols, shape } => {
                if mm.x_stride % 4 != 0 {
                    return Err(KilnError::invalid(
                        "matmul",
                        format!(
                            "GEMV needs an x row stride that is a multiple of 4, got {}",
                            mm.x_stride
                        ),
                    ));
                }
                if mm.m > ncols {
                    return Err(KilnError::invalid(
                        "matmul",
                        format!("GEMV for {ncols} columns given m={}", mm.m),
                    ));
                }
                let key = KernelKey::Gemv {
                    format: mm.w.format,
                    ncols: ncols as u8,
                    rows: shape.rows as u8,
                    wg: shape.wg as u16,
                    subgroups: ctx.caps.subgroups,
                };
                let params = GemvParams {
                    k: mm.w.k,
                    n_rows: chunk.rows,
                    row_offset: chunk.row_start,
                    y_stride: mm.y_stride,
                    x_stride: mm.x_stride,
                    n_cols: mm.m,
                    has_bias: mm.bias.is_some() as u32,
                    accumulate: mm.accumulate as u32,
                };
                let pipeline = ctx.pipeline(&key)?;
                let ub = ctx.uniform(&params, stage);
                let bg = bind(
                    ctx,
                    &pipeline,
                    stage,
                    &[&ub, &chunk.buffer, mm.x, mm.y, bias],
                );
                Dispatch {
                    label: stage,
                    pipeline,
                    bind_group: bg,
                    workgroups: grid(chunk.rows.div_ceil(shape.rows)),
                    params: Some(ub),
                }
            }
            MatmulKernel::Gemm { tile } => {
                let key = KernelKey::Gemm {
                    format: mm.w.format,
                    tile,
                };
                let (bm, bn, ..) = tile.dims();
                let params = GemmParams {
                    m: mm.m,
                    k: mm.w.k,
                    n_rows: chunk.rows,
                    row_offset: chunk.row_start,
                    x_stride: mm.x_stride,
                    y_stride: mm.y_stride,
                    has_bias: mm.bias.is_some() as u32,
                    accumulate: mm.accumulate as u32,
                };
                let pipeline = ctx.pipeline(&key)?;
                let ub = ctx.uniform(&params, stage);
                let bg = bind(
                    ctx,
                    &pipeline,
                    stage,
                    &[&ub, &chunk.buffer, mm.x, mm.y, bias],
                );
                let gx = chunk.rows.div_ceil(bn);
                let gy = mm.m.div_ceil(bm);
                if gx > ctx.limits.max_compute_workgroups_per_dimension
                    || gy > ctx.limits.max_compute_workgroups_per_dimension
                {
                    return Err(KilnError::invalid(
                        "matmul",
                        format!("grid {gx}x{gy} exceeds the adapter's limit"),
                    ));
                }
                Dispatch {
                    label: stage,
                    pipeline,
                    bind_group: bg,
                    workgroups: [gx, gy, 1],
                    params: Some(ub),
                }
            }
        };
        out.push(d);
    }
    Ok(out)
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
