//! Matmul with quantized weights: Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias) (+ Y). GEMV or tiled
//! GEMM as the planner decides; one dispatch per weight chunk when a tensor is split.

use bytemuck::{Pod, Zeroable};

use crate::error::{KilnError, Result};
use crate::gpu::{grid, Bound, Dispatch, GpuContext, WeightTensor};
use crate::kernels::KernelKey;
use crate::plan::MatmulKernel;

/// Mirrors `Params` in gemv.wgsl and gemm.wgsl (the same layout for both).
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
    pub _pad: [u32; 3],
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
}

impl<'a> Matmul<'a> {
    /// Y[m, rows] = X[m, k] · Wᵀ with rows packed back to back, nothing fused (tests, benches);
    /// struct-update syntax adds the rest.
    pub fn dense(w: &'a WeightTensor, x: &'a wgpu::Buffer, y: &'a wgpu::Buffer, m: u32) -> Matmul<'a> {
        Matmul { w, x, y, bias: None, m, x_stride: w.k, y_stride: w.rows, accumulate: false, norm: None, glu: None }
    }
}

/// The pipeline key and grid of `kernel` over one weight chunk of `rows` rows and m columns.
pub fn launch(
    ctx: &GpuContext,
    kernel: MatmulKernel,
    format: crate::quant::WeightFormat,
    rows: u32,
    m: u32,
    norm: bool,
    glu: bool,
) -> Result<(KernelKey, [u32; 3])> {
    match kernel {
        MatmulKernel::Gemv { ncols, shape, q8 } => {
            if q8 && (ncols > crate::plan::GEMV_Q8_MAX_COLS || !format.is_quantized()) {
                return Err(KilnError::invalid(
                    "matmul",
                    format!("no int8-activation GEMV for {format} with {ncols} columns"),
                ));
            }
            if m > ncols {
                return Err(KilnError::invalid("matmul", format!("GEMV for {ncols} columns given m={m}")));
            }
            let key = KernelKey::Gemv {
                format,
                ncols: ncols as u8,
                rows: shape.rows as u8,
                wg: shape.wg as u16,
                subgroups: ctx.caps.subgroups,
                norm,
                glu,
                q8,
            };
            Ok((key, grid(rows.div_ceil(shape.rows))))
        }
        MatmulKernel::Gemm { tile } => {
            if norm || glu {
                return Err(KilnError::invalid("matmul", "a fused RMSNorm or SwiGLU needs the GEMV kernel (m <= 8)"));
            }
            let (bm, bn, ..) = tile.dims();
            let (gx, gy) = (rows.div_ceil(bn), m.div_ceil(bm));
            if gx > ctx.limits.max_compute_workgroups_per_dimension
                || gy > ctx.limits.max_compute_workgroups_per_dimension
            {
                return Err(KilnError::invalid("matmul", format!("grid {gx}x{gy} exceeds the adapter's limit")));
            }
            Ok((KernelKey::Gemm { format, tile }, [gx, gy, 1]))
        }
    }
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
}

impl BoundMatmul {
    pub fn new(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<BoundMatmul> {
        if mm.x_stride < mm.w.k || mm.y_stride < mm.w.rows {
            return Err(KilnError::invalid(
                "matmul",
                format!("strides x={} y={} are smaller than k={} n={}", mm.x_stride, mm.y_stride, mm.w.k, mm.w.rows),
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
        // Any matmul key has the same bindings; the pipeline is chosen per step.
        let key = KernelKey::Gemm { format: mm.w.format, tile: crate::plan::GemmTile::T32 };
        let chunks =
            mm.w.chunks
                .iter()
                .map(|c| {
                    let b = Bound::new::<MatmulParams>(ctx, &key, stage, &[&c.buffer, mm.x, mm.y, bias, norm_w])?;
                    Ok((b, c.row_start, c.rows))
                })
                .collect::<Result<Vec<_>>>()?;
        Ok(BoundMatmul {
            stage,
            format: mm.w.format,
            k: mm.w.k,
            n: mm.w.rows,
            chunks,
            x_stride: mm.x_stride,
            y_stride: mm.y_stride,
            has_bias: mm.bias.is_some(),
            accumulate: mm.accumulate,
            norm_eps: mm.norm.map(|(_, e)| e),
            glu: mm.glu.is_some(),
        })
    }

    /// The parameters of one weight chunk's dispatch over m columns.
    fn params(&self, m: u32, row_start: u32, rows: u32) -> MatmulParams {
        MatmulParams {
            m,
            k: self.k,
            n_rows: rows,
            row_offset: row_start,
            x_stride: self.x_stride,
            y_stride: self.y_stride,
            has_bias: self.has_bias as u32,
            accumulate: self.accumulate as u32,
            eps: self.norm_eps.unwrap_or(0.0),
            _pad: [0; 3],
        }
    }

    /// The kernel the planner picks for m columns.
    pub fn plan(&self, ctx: &GpuContext, m: u32) -> MatmulKernel {
        let fused = self.norm_eps.is_some() || self.glu;
        crate::plan::plan_matmul_input(m, self.n, self.k, self.format, &ctx.caps, fused)
    }

    /// What one call over m columns does, for the profile: the kernel the planner picks,
    /// the shape, and the bytes (weights, X, Y) and flops it needs at the least.
    pub fn work(&self, ctx: &GpuContext, m: u32) -> crate::profile::StageWork {
        let fused = match (self.norm_eps.is_some(), self.glu) {
            (true, _) => "+norm",
            (_, true) => "+swiglu",
            _ => "",
        };
        let w_bytes = self.format.gpu_tensor_bytes(self.n as usize, self.k as usize).unwrap_or(0) as f64;
        let (m64, k64, n64) = (m as f64, self.k as f64, self.n as f64);
        let x_bytes = m64 * k64 * 4.0 * if self.glu { 2.0 } else { 1.0 };
        let y_bytes = m64 * n64 * 4.0 * if self.accumulate { 2.0 } else { 1.0 };
        crate::profile::StageWork {
            kernel: format!("{}{fused} {}", self.plan(ctx, m), self.format.name()),
            shape: format!("{m}x{}·{}", self.k, self.n),
            bytes: w_bytes + x_bytes + y_bytes,
            flops: 2.0 * m64 * k64 * n64,
        }
    }

    /// Records Y[0..m] = X[0..m] · Wᵀ with `kernel` (or the planner's choice).
    pub fn record(
        &self,
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        m: u32,
        kernel: Option<MatmulKernel>,
    ) -> Result<()> {
        let kernel = kernel.unwrap_or_else(|| self.plan(ctx, m));
        for (b, row_start, rows) in &self.chunks {
            let (key, grid) = launch(ctx, kernel, self.format, *rows, m, self.norm_eps.is_some(), self.glu)?;
            b.set(ctx, &self.params(m, *row_start, *rows));
            b.record_with(pass, &*ctx.pipeline(&key)?, grid);
        }
        Ok(())
    }
}

/// One-off dispatches for `mm` with the kernel the planner picks (tests, tools).
pub fn prepare(ctx: &GpuContext, mm: &Matmul, stage: &'static str) -> Result<Vec<Dispatch>> {
    let fused = mm.norm.is_some() || mm.glu.is_some();
    let kernel = crate::plan::plan_matmul_input(mm.m, mm.w.rows, mm.w.k, mm.w.format, &ctx.caps, fused);
    prepare_with(ctx, mm, kernel, stage)
}

/// As `prepare`, with the kernel chosen by the caller (benchmarks, tests of each variant).
pub fn prepare_with(ctx: &GpuContext, mm: &Matmul, kernel: MatmulKernel, stage: &'static str) -> Result<Vec<Dispatch>> {
    let mut bm = BoundMatmul::new(ctx, mm, stage)?;
    let chunks = std::mem::take(&mut bm.chunks);
    chunks
        .into_iter()
        .map(|(b, row_start, rows)| {
            let (key, grid) = launch(ctx, kernel, bm.format, rows, mm.m, bm.norm_eps.is_some(), bm.glu)?;
            b.set(ctx, &bm.params(mm.m, row_start, rows));
            Ok(Dispatch {
                label: stage,
                pipeline: ctx.pipeline(&key)?,
                bind_group: b.bind_group,
                workgroups: grid,
                params: Some(b.params),
            })
        })
        .collect()
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
