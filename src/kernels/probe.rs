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

/// What every probe kernel binds and how it is timed.
struct Prober<'a> {
    ctx: &'a GpuContext,
    timer: PassTimer,
    src: &'a wgpu::Buffer,
    dst: &'a wgpu::Buffer,
}

impl Prober<'_> {
    /// GPU time of `dispatches` dispatches of `workgroups` workgroups of `key` in one timed
    /// pass, after one untimed warm-up pass: the best of `reps`.
    fn time(
        &mut self,
        key: &KernelKey,
        params: ProbeParams,
        workgroups: u32,
        dispatches: u32,
        reps: u32,
    ) -> Result<f64> {
        let pipeline = self.ctx.pipeline(key)?;
        let ub = self.ctx.uniform(&params, "probe");
        let bg = bind(self.ctx, &pipeline, "probe", &[&ub, self.src, self.dst]);
        let mut best = f64::MAX;
        for rep in 0..=reps {
            let mut enc =
                self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("probe") });
            {
                let tw = self.timer.pass("probe");
                let mut pass =
                    enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("probe"), timestamp_writes: tw });
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bg, &[]);
                for _ in 0..dispatches {
                    pass.dispatch_workgroups(workgroups, 1, 1);
                }
            }
            self.timer.resolve(&mut enc);
            self.ctx.queue.submit([enc.finish()]);
            let ns: f64 = self.timer.read(self.ctx)?.iter().map(|(_, ns)| ns).sum();
            // Pass 0 warms the pipeline and the caches up.
            if rep > 0 && ns > 0.0 {
                best = best.min(ns * 1e-9);
            }
        }
        Ok(if best == f64::MAX { 0.0 } else { best })
    }
}

/// Runs the three probes (about a second on a GPU; sizes shrink on CPU adapters).
pub fn run(ctx: &GpuContext) -> Result<ProbeReport> {
    let cpu = ctx.caps.cpu_adapter;
    // Larger than any GPU cache, within one binding.
    let want: u64 = if cpu { 64 << 20 } else { 1 << 30 };
    let bytes =
        want.min(ctx.limits.max_storage_buffer_binding_size).min(ctx.limits.max_buffer_size).min(u32::MAX as u64 * 16)
            / 16
            * 16;
    let src = ctx.storage(bytes, "probe source")?;
    let dst = ctx.storage(256, "probe sink")?;
    let mut probe = Prober { ctx, timer: PassTimer::new(ctx, 1)?, src: &src, dst: &dst };
    let n = (bytes / 16) as u32;
    // About 16 vec4 loads per invocation.
    let wgs = (n / (WG_ELT * 16)).clamp(1, ctx.limits.max_compute_workgroups_per_dimension);
    let read_key = KernelKey::Probe { kind: ProbeKind::ReadBandwidth };
    let params = ProbeParams { n, iters: 0, _pad: [0; 2] };
    let t = probe.time(&read_key, params, wgs, 1, 5)?;
    let read_gbs = if t > 0.0 { bytes as f64 / t * 1e-9 } else { 0.0 };

    let fma_key = KernelKey::Probe { kind: ProbeKind::Fma };
    let (fma_wgs, iters) = if cpu { (64, 256) } else { (4096, 4096) };
    let params = ProbeParams { n: 0, iters, _pad: [0; 2] };
    let t = probe.time(&fma_key, params, fma_wgs, 1, 5)?;
    let flops = (fma_wgs * WG_ELT) as f64 * iters as f64 * 64.0;
    let gflops = if t > 0.0 { flops / t * 1e-9 } else { 0.0 };

    let chain_key = KernelKey::Probe { kind: ProbeKind::DependentDispatch };
    let chain = if cpu { 200 } else { 2000 };
    let params = ProbeParams { n: 0, iters: 0, _pad: [0; 2] };
    let t = probe.time(&chain_key, params, 1, chain, 3)?;
    let dispatch_us = t / chain as f64 * 1e6;
    let timed_dispatch_us = if ctx.caps.timestamps_in_passes {
        timed_chain(ctx, &chain_key, &src, &dst, chain.min(1000))? * 1e6
    } else {
        0.0
    };
    // Matrix cores: 4 subgroups per workgroup, 8 multiply-adds of 8192 flops per round.
    let mma_gflops = if ctx.caps.coopmat {
        let key = KernelKey::Probe { kind: ProbeKind::CoopMma };
        let (wgs, iters) = (2048u32, 2048u32);
        let params = ProbeParams { n: 0, iters, _pad: [0; 2] };
        let t = probe.time(&key, params, wgs, 1, 5)?;
        let flops = wgs as f64 * 4.0 * iters as f64 * 8.0 * 8192.0;
        if t > 0.0 {
            flops / t * 1e-9
        } else {
            0.0
        }
    } else {
        0.0
    };
    Ok(ProbeReport {
        peak: Peak { read_gbs, gflops, dispatch_us, timed_dispatch_us, mma_gflops },
        read_bytes: bytes,
        dependent_dispatches: chain,
    })
}

/// Seconds per dependent dispatch with a timestamp written after each (the profiler's
/// floor for one stage): the span of `n` such dispatches, best of three.
fn timed_chain(ctx: &GpuContext, key: &KernelKey, src: &wgpu::Buffer, dst: &wgpu::Buffer, n: u32) -> Result<f64> {
    let pipeline = ctx.pipeline(key)?;
    let ub = ctx.uniform(&ProbeParams { n: 0, iters: 0, _pad: [0; 2] }, "probe");
    let bg = bind(ctx, &pipeline, "probe", &[&ub, src, dst]);
    let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("probe timestamps"),
        ty: wgpu::QueryType::Timestamp,
        count: n + 1,
    });
    let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("probe resolve"),
        size: (n as u64 + 1) * 8,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let period = ctx.queue.get_timestamp_period() as f64;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("probe") });
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("probe"), timestamp_writes: None });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.write_timestamp(&set, 0);
            for i in 0..n {
                pass.dispatch_workgroups(1, 1, 1);
                pass.write_timestamp(&set, i + 1);
            }
        }
        enc.resolve_query_set(&set, 0..n + 1, &resolve, 0);
        ctx.queue.submit([enc.finish()]);
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&resolve, 0, (n as u64 + 1) * 8)?);
        let span = ticks[n as usize].saturating_sub(ticks[0]) as f64 * period * 1e-9;
        if span > 0.0 {
            best = best.min(span / n as f64);
        }
    }
    Ok(if best == f64::MAX { 0.0 } else { best })
}
