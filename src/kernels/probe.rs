//! Device probes: the read bandwidth of one large dispatch, f32 FMA throughput, and the cost
//! of a dispatch that must wait for the previous one. The first and last bound decode speed
//! (weights streamed once per token, a few hundred dependent dispatches per token); the
//! profile measures each stage against them.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::timer::PassTimer;
use crate::gpu::{bind, GpuContext};
use crate::kernels::{KernelKey, ProbeKind, WG_ELT};
use crate::profile::Peak;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
struct ProbeParams {
    n: u32,
    iters: u32,
    _pad: [u32; 2],
}

/// What was probed, with the sizes used.
#[derive(Debug, Clone, Copy)]
pub struct ProbeReport {
    pub peak: Peak,
    pub read_bytes: u64,
    pub dependent_dispatches: u32,
}

/// GPU time of `dispatches` in one timed pass; the best of `reps`.
fn best_time(
    ctx: &GpuContext,
    timer: &mut PassTimer,
    key: &KernelKey,
    params: ProbeParams,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    workgroups: u32,
    dispatches: u32,
    reps: u32,
) -> Result<f64> {
    let pipeline = ctx.pipeline(key)?;
    let ub = ctx.uniform(&params, "probe");
    let bg = bind(ctx, &pipeline, "probe", &[&ub, src, dst]);
    let mut best = f64::MAX;
    for _ in 0..reps {
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("probe") });
        {
            let tw = timer.pass("probe");
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("probe"), timestamp_writes: tw });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bg, &[]);
            for _ in 0..dispatches {
                pass.dispatch_workgroups(workgroups, 1, 1);
            }
        }
        timer.resolve(&mut enc);
        ctx.queue.submit([enc.finish()]);
        let ns: f64 = timer.read(ctx)?.iter().map(|(_, ns)| ns).sum();
        if ns > 0.0 {
            best = best.min(ns * 1e-9);
        }
    }
    Ok(if best == f64::MAX { 0.0 } else { best })
}

/// Runs the three probes (about a second on a GPU; sizes shrink on CPU adapters).
pub fn run(ctx: &GpuContext) -> Result<ProbeReport> {
    let mut timer = PassTimer::new(ctx, 1)?;
    let cpu = ctx.caps.cpu_adapter;
    // Larger than any GPU cache, within one binding.
    let want: u64 = if cpu { 64 << 20 } else { 1 << 30 };
    let bytes = want
        .min(ctx.limits.max_storage_buffer_binding_size as u64)
        .min(ctx.limits.max_buffer_size)
        .min(u32::MAX as u64 * 16)
        / 16
        * 16;
    let src = ctx.storage(bytes, "probe source")?;
    let dst = ctx.storage(256, "probe sink")?;
    let n = (bytes / 16) as u32;
    // About 16 vec4 loads per invocation.
    let wgs = (n / (WG_ELT * 16)).clamp(1, ctx.limits.max_compute_workgroups_per_dimension);
    let read_key = KernelKey::Probe { kind: ProbeKind::ReadBandwidth };
    let params = ProbeParams { n, iters: 0, _pad: [0; 2] };
    // One warm-up, then the best of five.
    best_time(ctx, &mut timer, &read_key, params, &src, &dst, wgs, 1, 1)?;
    let t = best_time(ctx, &mut timer, &read_key, params, &src, &dst, wgs, 1, 5)?;
    let read_gbs = if t > 0.0 { bytes as f64 / t * 1e-9 } else { 0.0 };

    let fma_key = KernelKey::Probe { kind: ProbeKind::Fma };
    let (fma_wgs, iters) = if cpu { (64, 256) } else { (4096, 4096) };
    let params = ProbeParams { n: 0, iters, _pad: [0; 2] };
    best_time(ctx, &mut timer, &fma_key, params, &src, &dst, fma_wgs, 1, 1)?;
    let t = best_time(ctx, &mut timer, &fma_key, params, &src, &dst, fma_wgs, 1, 5)?;
    let flops = (fma_wgs * WG_ELT) as f64 * iters as f64 * 64.0;
    let gflops = if t > 0.0 { flops / t * 1e-9 } else { 0.0 };

    let chain_key = KernelKey::Probe { kind: ProbeKind::DependentDispatch };
    let chain = if cpu { 200 } else { 2000 };
    let params = ProbeParams { n: 0, iters: 0, _pad: [0; 2] };
    best_time(ctx, &mut timer, &chain_key, params, &src, &dst, 1, chain, 1)?;
    let t = best_time(ctx, &mut timer, &chain_key, params, &src, &dst, 1, chain, 3)?;
    let dispatch_us = t / chain as f64 * 1e6;
    Ok(ProbeReport { peak: Peak { read_gbs, gflops, dispatch_us }, read_bytes: bytes, dependent_dispatches: chain })
}
