//! Elementwise ops: SiLU·mul (SwiGLU) and residual add.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::{bind, grid, Dispatch, GpuContext};
use crate::kernels::{KernelKey, WG_ELT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EltOp {
    /// out = silu(a) * b
    SiluMul = 0,
    /// out = a + b
    Add = 1,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct EltParams {
    pub n: u32,
    pub _pad: [u32; 3],
}

pub fn prepare(
    ctx: &GpuContext,
    op: EltOp,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
    stage: &'static str,
) -> Result<Dispatch> {
    let pipeline = ctx.pipeline(&KernelKey::Elementwise { op })?;
    let ub = ctx.uniform(&EltParams { n, _pad: [0; 3] }, stage);
    let bg = bind(ctx, &pipeline, stage, &[&ub, a, b, out]);
    Ok(Dispatch { label: stage, pipeline, bind_group: bg, workgroups: grid(n.div_ceil(WG_ELT)), params: Some(ub) })
}

pub fn reference(op: EltOp, a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| match op {
            EltOp::SiluMul => x / (1.0 + (-x).exp()) * y,
            EltOp::Add => x + y,
        })
        .collect()
}

/// Runs one tiny add and checks the answer: whether this device really executes compute.
pub fn self_test(ctx: &GpuContext) -> Result<bool> {
    let a = ctx.upload_f32(&[1.0, 2.0, 3.0, 4.0], "self-test a")?;
    let b = ctx.upload_f32(&[10.0, 20.0, 30.0, 40.0], "self-test b")?;
    let out = ctx.storage(16, "self-test out")?;
    let d = prepare(ctx, EltOp::Add, &a, &b, &out, 4, "self-test")?;
    crate::gpu::run_dispatches(ctx, &[&d])?;
    Ok(ctx.read_f32(&out, 4)? == [11.0, 22.0, 33.0, 44.0])
}
