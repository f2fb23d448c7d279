//! Greedy sampling on the GPU: the index of each row's largest logit.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::{bind, Dispatch, GpuContext};
use crate::kernels::KernelKey;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct ArgmaxParams {
    pub n: u32,
    pub stride: u32,
    pub _pad: [u32; 2],
}

pub fn prepare(
    ctx: &GpuContext,
    logits: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    rows: u32,
    n: u32,
    stride: u32,
) -> Result<Dispatch> {
    let pipeline = ctx.pipeline(&KernelKey::Argmax { subgroups: ctx.caps.subgroups })?;
    let ub = ctx.uniform(&ArgmaxParams { n, stride, _pad: [0; 2] }, "sample");
    let bg = bind(ctx, &pipeline, "sample", &[&ub, logits, ids]);
    Ok(Dispatch { label: "sample", pipeline, bind_group: bg, workgroups: [rows, 1, 1], params: Some(ub) })
}

/// Lowest index of the maximum, per row.
pub fn reference(logits: &[f32], n: usize) -> Vec<u32> {
    logits
        .chunks(n)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}
