//! Uploads through a fixed staging belt. `queue.write_buffer` stages every write in new
//! host-visible memory until the next submit, so writing a whole model before the first submit
//! held a second copy of it (nvidia-smi counted it: a 3.8 GiB model peaked at 8.6 GiB), and the
//! staging memory freed afterwards stayed in the process's heap on CPU adapters. Here two
//! staging buffers of `STAGING_BYTES` are created once: the host fills one (mapped) while the
//! copies out of the other run, so staging never exceeds two buffers and is reused, not
//! reallocated.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{KilnError, Result};
use crate::gpu::GpuContext;

/// Bytes of one staging buffer.
pub const STAGING_BYTES: u64 = 32 << 20;

/// One staging buffer: mapped for writing while `used` grows, then unmapped and copied out.
struct Slot {
    buffer: wgpu::Buffer,
    /// Set by the map callback once the buffer can be written again.
    mapped: Arc<AtomicBool>,
    /// The submit whose copies read it last.
    submitted: Option<wgpu::SubmissionIndex>,
}

/// The belt: two slots, the one being filled, and the copies recorded out of it.
#[derive(Default)]
pub struct Belt {
    slots: Vec<Slot>,
    current: usize,
    used: u64,
    encoder: Option<wgpu::CommandEncoder>,
}

pub type UploadQueue = Mutex<Belt>;

impl GpuContext {
    /// Writes `data` into `buf` at `offset` (a multiple of 4). A length that is not a multiple
    /// of 4 is padded with zeros, which must fit in `buf` (kiln's storage buffers have a tail
    /// pad). The copies are submitted when a staging buffer is full or at `flush_uploads`
    /// or `finish_uploads` (loading calls it once at the end).
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        let padded = (data.len() as u64).div_ceil(4) * 4;
        if offset % 4 != 0 || offset + padded > buf.size() {
            return Err(KilnError::Gpu {
                context: "uploading".into(),
                message: format!(
                    "a write of {} bytes at {offset} does not fit a {}-byte buffer",
                    data.len(),
                    buf.size()
                ),
            });
        }
        let mut belt = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = 0usize;
        while at < data.len() {
            if belt.used >= STAGING_BYTES {
                self.flush_slot(&mut belt)?;
            }
            let slot = self.ready_slot(&mut belt)?;
            let start = belt.used;
            let n = ((STAGING_BYTES - start) as usize).min(data.len() - at);
            let size = (n as u64).div_ceil(4) * 4;
            {
                let buffer = &belt.slots[slot].buffer;
                let mut view = buffer.get_mapped_range_mut(start..start + size).map_err(|e| KilnError::Gpu {
                    context: "uploading".into(),
                    message: format!("staging buffer: {e}"),
                })?;
                let (mut head, mut tail) = view.slice(..).split_at(n);
                head.copy_from_slice(&data[at..at + n]);
                tail.fill(0);
            }
            let staging = belt.slots[slot].buffer.clone();
            let enc = belt.encoder.get_or_insert_with(|| {
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("upload") })
            });
            enc.copy_buffer_to_buffer(&staging, start, buf, offset + at as u64, size);
            // Mapped ranges start at multiples of 8.
            belt.used = (start + size).div_ceil(8) * 8;
            at += n;
        }
        Ok(())
    }

    /// The index of the current slot, created or waited for until it is mapped.
    fn ready_slot(&self, belt: &mut Belt) -> Result<usize> {
        if belt.slots.is_empty() {
            for i in 0..2 {
                let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(if i == 0 { "staging 0" } else { "staging 1" }),
                    size: STAGING_BYTES,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                });
                belt.slots.push(Slot { buffer, mapped: Arc::new(AtomicBool::new(true)), submitted: None });
            }
        }
        let i = belt.current;
        if !belt.slots[i].mapped.load(Ordering::Acquire) {
            if let Some(index) = belt.slots[i].submitted.take() {
                self.wait_for(index, "uploading weights")?;
            }
            // The map callback runs in a poll once the copies are done.
            for _ in 0..1000 {
                if belt.slots[i].mapped.load(Ordering::Acquire) {
                    break;
                }
                self.wait_idle("uploading weights")?;
            }
            if !belt.slots[i].mapped.load(Ordering::Acquire) {
                return Err(KilnError::Gpu {
                    context: "uploading weights".into(),
                    message: "a staging buffer did not become writable".into(),
                });
            }
        }
        Ok(i)
    }

    /// Submits the copies out of the current slot, maps it again for later, and moves on
    /// to the other slot.
    fn flush_slot(&self, belt: &mut Belt) -> Result<()> {
        let Some(enc) = belt.encoder.take() else {
            return Ok(());
        };
        let i = belt.current;
        let slot = &mut belt.slots[i];
        slot.buffer.unmap();
        slot.mapped.store(false, Ordering::Release);
        let index = self.queue.submit([enc.finish()]);
        let flag = slot.mapped.clone();
        slot.buffer.map_async(wgpu::MapMode::Write, .., move |r| {
            if r.is_ok() {
                flag.store(true, Ordering::Release);
            }
        });
        slot.submitted = Some(index);
        belt.current = 1 - i;
        belt.used = 0;
        Ok(())
    }

    /// Submits the copies recorded so far: they land before any later submit reads the
    /// buffers. The staging buffers stay for more writes.
    pub fn flush_uploads(&self) -> Result<()> {
        let mut belt = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        self.flush_slot(&mut belt)
    }

    /// Submits every recorded copy and waits for them, then releases the staging buffers:
    /// after this the written buffers hold their data and no staging memory is left.
    pub fn finish_uploads(&self) -> Result<()> {
        let mut belt = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        if belt.slots.is_empty() {
            return Ok(());
        }
        self.flush_slot(&mut belt)?;
        self.wait_idle("uploading weights")?;
        for slot in belt.slots.drain(..) {
            slot.buffer.destroy();
        }
        *belt = Belt::default();
        Ok(())
    }

    /// Blocks until submission `index` is done (bounded by the poll timeout).
    pub fn wait_for(&self, index: wgpu::SubmissionIndex, what: &str) -> Result<()> {
        self.check_fault(what)?;
        let polled =
            self.device.poll(wgpu::PollType::Wait { submission_index: Some(index), timeout: Some(self.poll_timeout) });
        self.check_fault(what)?;
        polled.map(|_| ()).map_err(|e| match e {
            wgpu::PollError::Timeout => {
                KilnError::GpuTimeout { what: what.to_string(), seconds: self.poll_timeout.as_secs() }
            }
            other => KilnError::Gpu { context: what.to_string(), message: other.to_string() },
        })
    }
}
