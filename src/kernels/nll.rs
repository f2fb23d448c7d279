//! Scoring on the GPU: the negative log-likelihood of a target token under the softmax of
//! each row of logits (log-softmax at one index), so that evaluation reads back one float
//! per scored token instead of a row of the vocabulary's size.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::{bind, grid, Dispatch, GpuContext};
use crate::kernels::KernelKey;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
pub struct NllParams {
    /// Vocabulary size: values per row.
    pub n: u32,
    /// Floats from one row of logits to the next.
    pub stride: u32,
    /// First row scored; targets are indexed by row too.
    pub row0: u32,
    pub n_rows: u32,
    /// Where row0's result goes in the output.
    pub out0: u32,
    pub _pad: [u32; 3],
}

/// The kernel's grid: one workgroup per scored row.
pub fn launch(p: &NllParams) -> [u32; 3] {
    grid(p.n_rows)
}

/// nll[out0 + i] = -log softmax(logits[row0 + i])[targets[row0 + i]], for i < n_rows.
pub fn prepare(
    ctx: &GpuContext,
    logits: &wgpu::Buffer,
    targets: &wgpu::Buffer,
    nll: &wgpu::Buffer,
    params: NllParams,
) -> Result<Dispatch> {
    let pipeline = ctx.pipeline(&KernelKey::Nll { subgroups: ctx.caps.subgroups })?;
    let ub = ctx.uniform(&params, "score");
    let bg = bind(ctx, &pipeline, "score", &[&ub, logits, targets, nll]);
    Ok(Dispatch { label: "score", pipeline, bind_group: bg, workgroups: launch(&params), params: Some(ub) })
}

/// The negative log-likelihood of `target` under the softmax of `row`, in f64 (as llama.cpp's
/// perplexity sums the exponentials in double precision).
pub fn nll_of(row: &[f32], target: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - row[target as usize] as f64
}

/// What the kernel computes, for rows of `n` logits laid out `stride` apart.
pub fn reference(logits: &[f32], targets: &[u32], p: &NllParams) -> Vec<f32> {
    let (n, stride) = (p.n as usize, p.stride as usize);
    (p.row0..p.row0 + p.n_rows)
        .map(|row| {
            let row = row as usize;
            nll_of(&logits[row * stride..row * stride + n], targets[row]) as f32
        })
        .collect()
}
