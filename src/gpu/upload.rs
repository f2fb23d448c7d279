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
    stats: UploadStats,
}

/// Where the time of the uploads since the belt was set up went (`-v` reports it).
#[derive(Default, Clone, Copy, Debug)]
pub struct UploadStats {
    pub bytes: u64,
    /// Filling staging memory (copying, gathering and repacking on the host).
    pub fill_secs: f64,
    /// Waiting for a staging buffer whose copies to the GPU were still running.
    pub wait_secs: f64,
    /// Threads that fill one staging buffer.
    pub threads: usize,
}

/// Produces bytes `[at, at + out.len())` of a write into `out`.
pub type Fill<'a> = dyn Fn(usize, wgpu::WriteOnly<'_, [u8]>) + Sync + 'a;

/// Bytes one filling thread takes at a time.
const FILL_PART: usize = 1 << 20;

/// Threads that fill staging memory: the machine's cores, at most 8 (copies out of the page
/// cache stop scaling before that); `KILN_LOAD_THREADS` overrides it.
fn fill_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("KILN_LOAD_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8))
            .max(1)
    })
}

/// Runs `fill` over `out` (bytes `[base, base + out.len())` of a write), split into parts of
/// `FILL_PART` bytes shared among `fill_threads()` threads when it is large enough.
fn fill_parallel(out: wgpu::WriteOnly<'_, [u8]>, base: usize, fill: &Fill) {
    let threads = fill_threads();
    if threads == 1 || out.len() < 2 * FILL_PART {
        fill(base, out);
        return;
    }
    let (parts, rest) = out.into_chunks::<FILL_PART>();
    let rest_at = base + parts.len() * FILL_PART;
    // Each part is a write-only array, which (unlike a write-only slice) can go to a thread.
    let mut parts: Vec<(usize, wgpu::WriteOnly<'_, [u8; FILL_PART]>)> =
        parts.into_iter().enumerate().map(|(i, p)| (base + i * FILL_PART, p)).collect();
    let per_thread = parts.len().div_ceil(threads);
    std::thread::scope(|s| {
        while parts.len() > per_thread {
            let mine: Vec<_> = parts.drain(parts.len() - per_thread..).collect();
            s.spawn(move || {
                for (at, p) in mine {
                    fill(at, p.into());
                }
            });
        }
        for (at, p) in parts.drain(..) {
            fill(at, p.into());
        }
        fill(rest_at, rest);
    });
}

pub type UploadQueue = Mutex<Belt>;

impl GpuContext {
    /// Writes `data` into `buf` at `offset` (a multiple of 4). A length that is not a multiple
    /// of 4 is padded with zeros, which must fit in `buf` (kiln's storage buffers have a tail
    /// pad). The copies are submitted when a staging buffer is full or at `flush_uploads`
    /// or `finish_uploads` (loading calls it once at the end).
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        self.write_with(buf, offset, data.len(), &|at, mut out| {
            let n = out.len();
            out.copy_from_slice(&data[at..at + n]);
        })
    }

    /// `write` of `len` bytes that `fill` produces straight into staging memory:
    /// `fill(at, out)` writes bytes `[at, at + out.len())` of the data. Large pieces are
    /// filled by several threads at once (one thread copying out of the page cache into
    /// staging memory ran at 3.4-5 GB/s on an H200 machine); the ranges they get are
    /// disjoint, in any order.
    pub fn write_with(&self, buf: &wgpu::Buffer, offset: u64, len: usize, fill: &Fill) -> Result<()> {
        let padded = (len as u64).div_ceil(4) * 4;
        if offset % 4 != 0 || offset + padded > buf.size() {
            return Err(KilnError::Gpu {
                context: "uploading".into(),
                message: format!("a write of {len} bytes at {offset} does not fit a {}-byte buffer", buf.size()),
            });
        }
        let mut belt = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = 0usize;
        while at < len {
            if belt.used >= STAGING_BYTES {
                self.flush_slot(&mut belt)?;
            }
            let waited = std::time::Instant::now();
            let slot = self.ready_slot(&mut belt)?;
            belt.stats.wait_secs += waited.elapsed().as_secs_f64();
            let start = belt.used;
            let n = ((STAGING_BYTES - start) as usize).min(len - at);
            let size = (n as u64).div_ceil(4) * 4;
            let filled = std::time::Instant::now();
            {
                let buffer = &belt.slots[slot].buffer;
                let mut view = buffer.get_mapped_range_mut(start..start + size).map_err(|e| KilnError::Gpu {
                    context: "uploading".into(),
                    message: format!("staging buffer: {e}"),
                })?;
                let (head, mut tail) = view.slice(..).split_at(n);
                tail.fill(0);
                fill_parallel(head, at, fill);
            }
            belt.stats.fill_secs += filled.elapsed().as_secs_f64();
            belt.stats.bytes += n as u64;
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
        let waited = std::time::Instant::now();
        self.wait_idle("uploading weights")?;
        belt.stats.wait_secs += waited.elapsed().as_secs_f64();
        for slot in belt.slots.drain(..) {
            slot.buffer.destroy();
        }
        let stats = UploadStats { threads: fill_threads(), ..belt.stats };
        *belt = Belt::default();
        *self.last_uploads.lock().unwrap_or_else(|p| p.into_inner()) = stats;
        Ok(())
    }

    /// Where the time of the uploads up to the last `finish_uploads` went.
    pub fn upload_stats(&self) -> UploadStats {
        *self.last_uploads.lock().unwrap_or_else(|p| p.into_inner())
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
