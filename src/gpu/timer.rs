//! GPU time from timestamp queries: two queries per timed pass, resolved once per submit.

use crate::error::{KilnError, Result};
use crate::gpu::GpuContext;

pub struct PassTimer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    capacity: u32,
    labels: Vec<&'static str>,
    period_ns: f64,
}

impl PassTimer {
    /// Room for `passes` timed passes per submit. Fails when the adapter has no timestamps.
    pub fn new(ctx: &GpuContext, passes: u32) -> Result<PassTimer> {
        if !ctx.caps.timestamps {
            return Err(KilnError::AdapterUnusable {
                adapter: ctx.info.name.clone(),
                reason: "GPU timing needs TIMESTAMP_QUERY, which this adapter does not offer".into(),
            });
        }
        let capacity = passes * 2;
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kiln timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp resolve"),
            size: capacity as u64 * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok(PassTimer { set, resolve, capacity, labels: Vec::new(), period_ns: ctx.queue.get_timestamp_period() as f64 })
    }

    /// Timestamp writes for the next pass (None once the set is full).
    pub fn pass(&mut self, label: &'static str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = self.labels.len() as u32 * 2;
        if i + 2 > self.capacity {
            return None;
        }
        self.labels.push(label);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        })
    }

    /// Records the resolve of every query written since the last `read`.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        let n = self.labels.len() as u32 * 2;
        if n > 0 {
            enc.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
        }
    }

    /// Waits for the submitted work and returns (label, nanoseconds) per timed pass.
    pub fn read(&mut self, ctx: &GpuContext) -> Result<Vec<(&'static str, f64)>> {
        let n = self.labels.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = ctx.read_bytes(&self.resolve, 0, n as u64 * 16)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let out = self
            .labels
            .drain(..)
            .enumerate()
            .map(|(i, l)| (l, ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * self.period_ns))
            .collect();
        Ok(out)
    }
}
