//! Buffers: storage and uniforms, readback for tests, and quantized weights split across
//! bindings when a tensor is larger than the adapter's storage-binding limit.

use bytemuck::Pod;
use wgpu::util::DeviceExt;

use crate::error::{KilnError, Result};
use crate::gpu::GpuContext;
use crate::quant::WeightFormat;

/// Extra bytes after every storage buffer: vector loads of a ragged row's last chunk stay
/// inside the allocation.
const TAIL_PAD: u64 = 64;

/// The bytes kiln allocates for a storage buffer holding `bytes`, tail pad included. Every
/// allocation and every size check (buffer and binding limits, memory estimates) goes
/// through this one function, so a check can never pass a buffer the device then refuses.
pub fn storage_size(bytes: u64) -> u64 {
    (bytes + TAIL_PAD + 3) & !3
}

/// The bytes kiln allocates for one layer's K or V cache holding `bytes`: no tail pad, its
/// kernels index whole rows. Padded, Llama-7B's 32 MiB layers at 4096 tokens each took a
/// 64 MiB block of wgpu's allocator to itself (2 GB of the H200 unused); exact, two share one.
/// Every KV-cache allocation and size check goes through this function.
pub fn kv_storage_size(bytes: u64) -> u64 {
    (bytes + 3) & !3
}

impl GpuContext {
    /// The largest storage buffer this device can create and bind whole (kiln binds every
    /// storage buffer whole).
    pub fn max_storage(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// Whether one layer's KV cache of `bytes` can be created and bound on this device.
    pub fn fits_kv_storage(&self, bytes: u64) -> bool {
        kv_storage_size(bytes) <= self.max_storage()
    }

    /// A storage buffer for `size` bytes (zeroed by wgpu before first use); refused with its
    /// label and sizes when the device cannot bind it.
    pub fn storage(&self, size: u64, label: &str) -> Result<wgpu::Buffer> {
        self.storage_of(storage_size(size), label)
    }

    /// One layer's K or V cache of `size` bytes (`kv_storage_size`), as `storage`.
    pub fn kv_storage(&self, size: u64, label: &str) -> Result<wgpu::Buffer> {
        self.storage_of(kv_storage_size(size), label)
    }

    fn storage_of(&self, size: u64, label: &str) -> Result<wgpu::Buffer> {
        if size > self.max_storage() {
            return Err(KilnError::TooLarge { what: label.to_string(), needed: size, limit: self.max_storage() });
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// A storage buffer holding `bytes`, written before the next submit (tests, small
    /// vectors). Weights go through the staging belt instead (`write`, gpu/upload.rs).
    pub fn upload(&self, bytes: &[u8], label: &str) -> Result<wgpu::Buffer> {
        let buf = self.storage(bytes.len() as u64, label)?;
        if !bytes.is_empty() {
            // write_buffer needs a multiple of 4 bytes.
            if bytes.len() % 4 == 0 {
                self.queue.write_buffer(&buf, 0, bytes);
            } else {
                let mut v = bytes.to_vec();
                v.resize(bytes.len().div_ceil(4) * 4, 0);
                self.queue.write_buffer(&buf, 0, &v);
            }
        }
        Ok(buf)
    }

    pub fn upload_f32(&self, data: &[f32], label: &str) -> Result<wgpu::Buffer> {
        self.upload(bytemuck::cast_slice(data), label)
    }

    pub fn uniform<T: Pod>(&self, value: &T, label: &str) -> wgpu::Buffer {
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::bytes_of(value),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// Copies `size` bytes from `buf` to the host. Waits for the GPU (bounded by the poll
    /// timeout); for tests, tools and the one sampled token per step, never inside a step.
    pub fn read_bytes(&self, buf: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        let size4 = size.div_ceil(4) * 4;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size4.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size4);
        self.queue.submit([enc.finish()]);
        let data = self.read_mapped(&staging, size4, None, "reading a buffer back")?;
        Ok(data[..size as usize].to_vec())
    }

    /// The first `bytes` of `buf` (a MAP_READ buffer) once submission `index` is done (None:
    /// everything submitted): every readback of kiln's steps waits here. A fault, a failed
    /// wait or a map that never completes is an error naming `what`; a failed wait is also
    /// recorded as the context's fault (a submission the lost device refused reports no error
    /// of its own, and every later wait would fail alike).
    pub fn read_mapped(
        &self,
        buf: &wgpu::Buffer,
        bytes: u64,
        index: Option<wgpu::SubmissionIndex>,
        what: &str,
    ) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        buf.map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
            let _ = tx.send(r);
        });
        self.check_fault(what)?;
        let polled =
            self.device.poll(wgpu::PollType::Wait { submission_index: index, timeout: Some(self.poll_timeout) });
        // A lost device or failed submission explains a failed poll best.
        self.check_fault(what)?;
        match polled {
            Ok(_) => {}
            Err(wgpu::PollError::Timeout) => {
                return Err(KilnError::GpuTimeout { what: what.to_string(), seconds: self.poll_timeout.as_secs() })
            }
            Err(e) => {
                self.record_fault(&format!("a GPU wait failed: {e}"));
                return Err(KilnError::Gpu { context: what.to_string(), message: e.to_string() });
            }
        }
        // Another thread's poll may be the one running the callback: wait for it, bounded.
        match rx.recv_timeout(self.poll_timeout) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(KilnError::Gpu { context: what.to_string(), message: e.to_string() }),
            Err(_) => {
                return Err(KilnError::GpuTimeout { what: what.to_string(), seconds: self.poll_timeout.as_secs() })
            }
        }
        let data = buf
            .get_mapped_range(0..bytes)
            .map_err(|e| KilnError::Gpu { context: what.to_string(), message: e.to_string() })?
            .to_vec();
        buf.unmap();
        Ok(data)
    }

    pub fn read_f32(&self, buf: &wgpu::Buffer, n: usize) -> Result<Vec<f32>> {
        let bytes = self.read_bytes(buf, 0, (n * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    pub fn read_u32(&self, buf: &wgpu::Buffer, n: usize) -> Result<Vec<u32>> {
        let bytes = self.read_bytes(buf, 0, (n * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}

/// Where a weight matrix's rows come from when it is created.
enum Rows<'a> {
    /// Left unwritten (wgpu zero-fills the buffers before first use).
    Unwritten,
    /// GGUF bytes of every row, back to back.
    Contiguous(&'a [u8]),
    /// Row r's GGUF bytes, wherever they are.
    Each(&'a (dyn Fn(usize) -> &'a [u8] + Sync)),
}

/// Rows `[row_start, row_start + rows)` of a weight matrix in one buffer (one binding).
pub struct WeightChunk {
    pub buffer: wgpu::Buffer,
    pub row_start: u32,
    pub rows: u32,
}

/// A weight matrix `[rows, k]` kept in its block format on the GPU (GPU layout: Q8_0 and
/// Q6_K blocks padded to whole words), split by rows so no chunk exceeds the binding limit.
pub struct WeightTensor {
    pub name: String,
    pub format: WeightFormat,
    pub rows: u32,
    pub k: u32,
    pub chunks: Vec<WeightChunk>,
}

impl WeightTensor {
    /// Uploads `gguf_bytes` (GGUF block layout, `rows * row_bytes(k)` bytes): the data is on
    /// the GPU for any later submit.
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        format: WeightFormat,
        rows: usize,
        k: usize,
        gguf_bytes: &[u8],
    ) -> Result<WeightTensor> {
        let w = Self::upload_deferred(ctx, name, format, rows, k, gguf_bytes)?;
        ctx.flush_uploads()?;
        Ok(w)
    }

    /// `upload` with the copies left in the staging belt until it fills or the caller
    /// flushes it (`GpuContext::finish_uploads`): loading a model submits once per
    /// staging buffer rather than once per tensor.
    pub fn upload_deferred(
        ctx: &GpuContext,
        name: &str,
        format: WeightFormat,
        rows: usize,
        k: usize,
        gguf_bytes: &[u8],
    ) -> Result<WeightTensor> {
        let row_bytes = format.row_bytes(k).unwrap_or(0);
        if gguf_bytes.len() < rows * row_bytes {
            return Err(KilnError::invalid(
                format!("tensor {name}"),
                format!("has {} bytes, expected {}", gguf_bytes.len(), rows * row_bytes),
            ));
        }
        Self::create(ctx, name, format, rows, k, Rows::Contiguous(gguf_bytes))
    }

    /// `upload_deferred` of a matrix whose rows come from elsewhere (rows of several tensors
    /// stacked or interleaved): `row(r)` is row r's GGUF bytes.
    pub fn upload_rows_deferred<'a>(
        ctx: &GpuContext,
        name: &str,
        format: WeightFormat,
        rows: usize,
        k: usize,
        row: &'a (dyn Fn(usize) -> &'a [u8] + Sync),
    ) -> Result<WeightTensor> {
        Self::create(ctx, name, format, rows, k, Rows::Each(row))
    }

    /// The tensor's buffers, split as `upload` splits them, left unwritten (wgpu zero-fills
    /// them before first use): what depends only on shapes, e.g. whether sessions fit.
    pub fn allocate(ctx: &GpuContext, name: &str, format: WeightFormat, rows: usize, k: usize) -> Result<WeightTensor> {
        Self::create(ctx, name, format, rows, k, Rows::Unwritten)
    }

    fn create(
        ctx: &GpuContext,
        name: &str,
        format: WeightFormat,
        rows: usize,
        k: usize,
        data: Rows,
    ) -> Result<WeightTensor> {
        let bad = |m: String| KilnError::invalid(format!("tensor {name}"), m);
        let row_bytes = format
            .row_bytes(k)
            .ok_or_else(|| bad(format!("row length {k} is not a whole number of {} blocks", format.name())))?;
        let gpu_row = format.gpu_row_bytes(k).ok_or_else(|| bad("row too large".into()))? as u64;
        if storage_size(gpu_row) > ctx.max_binding {
            return Err(KilnError::TooLarge {
                what: format!("one row of tensor {name}"),
                needed: storage_size(gpu_row),
                limit: ctx.max_binding,
            });
        }
        // Rows per chunk: the most whose buffer (tail pad included) fits one binding.
        // (storage_size rounds n * gpu_row + pad + 3 down to a multiple of 4.)
        let room = ctx.max_binding.saturating_sub(storage_size(0) + 3);
        // An even count, so fused epilogues always find both rows of a pair in one chunk.
        let rows_per_chunk = (room / gpu_row.max(1)).max(1).min(rows.max(1) as u64) as usize;
        let rows_per_chunk = if rows_per_chunk >= 2 { rows_per_chunk & !1 } else { rows_per_chunk };
        let mut chunks = Vec::new();
        let mut r0 = 0usize;
        while r0 < rows || (rows == 0 && chunks.is_empty()) {
            let n = rows_per_chunk.min(rows - r0);
            let buffer = ctx.storage(n as u64 * gpu_row, &format!("{name}[{r0}..{}]", r0 + n))?;
            let len = n * gpu_row as usize;
            let first = r0;
            match &data {
                Rows::Unwritten => {}
                Rows::Contiguous(bytes) if format.gpu_block_bytes() == format.block_bytes() => {
                    ctx.write(&buffer, 0, &bytes[first * row_bytes..(first + n) * row_bytes])?
                }
                Rows::Contiguous(bytes) => {
                    let row = |r: usize| &bytes[r * row_bytes..(r + 1) * row_bytes];
                    ctx.write_with(&buffer, 0, len, &|at, out| fill_gpu_rows(format, &row, first, row_bytes, at, out))?
                }
                Rows::Each(row) => {
                    ctx.write_with(&buffer, 0, len, &|at, out| fill_gpu_rows(format, row, first, row_bytes, at, out))?
                }
            }
            chunks.push(WeightChunk { buffer, row_start: r0 as u32, rows: n as u32 });
            r0 += n;
            if rows == 0 {
                break;
            }
        }
        Ok(WeightTensor { name: name.to_string(), format, rows: rows as u32, k: k as u32, chunks })
    }
}

/// Bytes `[at, at + out.len())` of rows `first, first + 1, …` of a matrix in the GPU
/// layout, where `row(r)` is row r's GGUF bytes (`row_bytes` each): rows gathered from
/// several tensors and blocks repacked (`quant::repack_block_for_gpu`) on their way into
/// staging memory, with no host copy in between.
fn fill_gpu_rows<'r>(
    format: WeightFormat,
    row: &dyn Fn(usize) -> &'r [u8],
    first: usize,
    row_bytes: usize,
    at: usize,
    mut out: wgpu::WriteOnly<'_, [u8]>,
) {
    let (block, gpu_block) = (format.block_bytes(), format.gpu_block_bytes());
    let blocks_per_row = row_bytes / block;
    let gpu_row = blocks_per_row * gpu_block;
    let end = at + out.len();
    if block == gpu_block {
        // Whole runs of a row at a time.
        let mut pos = at;
        while pos < end {
            let (r, off) = (first + pos / gpu_row, pos % gpu_row);
            let take = (gpu_row - off).min(end - pos);
            out.slice(pos - at..pos - at + take).copy_from_slice(&row(r)[off..off + take]);
            pos += take;
        }
        return;
    }
    // Repacked blocks, assembled a few KiB at a time on the stack.
    let mut buf = [0u8; 8192];
    let mut g = at / gpu_block;
    let mut pos = at;
    while pos < end {
        let mut filled = 0;
        let start = pos;
        while filled + gpu_block <= buf.len() && pos < end {
            let (r, j) = (first + g / blocks_per_row, g % blocks_per_row);
            let src = &row(r)[j * block..(j + 1) * block];
            let b0 = g * gpu_block;
            let mut one = [0u8; 256];
            crate::quant::repack_block_for_gpu(format, src, &mut one[..gpu_block]);
            let (lo, hi) = (pos - b0, (end - b0).min(gpu_block));
            buf[filled..filled + hi - lo].copy_from_slice(&one[lo..hi]);
            filled += hi - lo;
            pos = b0 + hi;
            g += 1;
        }
        out.slice(start - at..start - at + filled).copy_from_slice(&buf[..filled]);
    }
}

thread_local! {
    /// Dispatches recorded on this thread (profiles count them per stage).
    static DISPATCHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Dispatches recorded on this thread so far, through `Bound` and `Dispatch`.
pub fn dispatches_recorded() -> u64 {
    DISPATCHES.with(|d| d.get())
}

fn count_dispatch() {
    DISPATCHES.with(|d| d.set(d.get() + 1));
}

/// A kernel whose dispatches `Bound` leaves out of every step (`kiln bench --ablate`: what
/// a kernel costs, e.g. the int8 GEMVs' quantize dispatches). Results are wrong meanwhile.
static LEFT_OUT: std::sync::RwLock<Option<&'static str>> = std::sync::RwLock::new(None);
static ANY_LEFT_OUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Leaves the kernel named `name` (`KernelKey::name`) out of what is recorded from now on;
/// None records everything again.
pub fn leave_out_kernel(name: Option<&'static str>) {
    if let Ok(mut k) = LEFT_OUT.write() {
        *k = name;
    }
    ANY_LEFT_OUT.store(name.is_some(), std::sync::atomic::Ordering::Relaxed);
}

fn left_out(kernel: &'static str) -> bool {
    ANY_LEFT_OUT.load(std::sync::atomic::Ordering::Relaxed) && LEFT_OUT.read().is_ok_and(|k| *k == Some(kernel))
}

/// A kernel bound to its buffers once. Its parameter buffer is rewritten before each step
/// that uses it (queue writes land before the step's commands), so a step creates nothing.
pub struct Bound {
    pub label: &'static str,
    /// Its kernel's name (`KernelKey::name`).
    pub kernel: &'static str,
    pub bind_group: wgpu::BindGroup,
    pub params: wgpu::Buffer,
    /// The parameters last written: decode steps mostly repeat them, and an unchanged
    /// buffer needs no queue write.
    last: std::cell::RefCell<Vec<u8>>,
}

impl Bound {
    /// Binds a parameter buffer of `P` at binding 0 and `buffers` at 1, 2, … for `key`'s layout.
    pub fn new<P: bytemuck::Pod>(
        ctx: &GpuContext,
        key: &crate::kernels::KernelKey,
        label: &'static str,
        buffers: &[&wgpu::Buffer],
    ) -> crate::Result<Bound> {
        let pipeline = ctx.pipeline(key)?;
        let params = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: std::mem::size_of::<P>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut all: Vec<&wgpu::Buffer> = vec![&params];
        all.extend_from_slice(buffers);
        let bind_group = bind(ctx, &pipeline, label, &all);
        Ok(Bound { label, kernel: key.name(), bind_group, params, last: Default::default() })
    }

    /// Writes the parameters for the next submit, unless they are what the buffer holds.
    pub fn set<P: bytemuck::Pod>(&self, ctx: &GpuContext, params: &P) {
        let bytes = bytemuck::bytes_of(params);
        let mut last = self.last.borrow_mut();
        if last.as_slice() != bytes {
            ctx.queue.write_buffer(&self.params, 0, bytes);
            last.clear();
            last.extend_from_slice(bytes);
        }
    }

    pub fn record_with(&self, pass: &mut wgpu::ComputePass<'_>, pipeline: &wgpu::ComputePipeline, grid: [u32; 3]) {
        if left_out(self.kernel) {
            return;
        }
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        count_dispatch();
    }
}

/// A recorded-once kernel launch: pipeline, bind group, grid and a stage name for profiles.
#[derive(Clone)]
pub struct Dispatch {
    pub label: &'static str,
    pub pipeline: std::sync::Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    /// Keeps the parameter buffer alive with the bind group that refers to it.
    pub params: Option<wgpu::Buffer>,
}

impl Dispatch {
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let [x, y, z] = self.workgroups;
        pass.dispatch_workgroups(x, y, z);
        count_dispatch();
    }
}

/// Workgroup grid for `n` workgroups: spills into y past the 65535 limit of one dimension.
/// Kernels recover the linear index as `wid.x + wid.y * nwg.x`.
pub fn grid(n: u32) -> [u32; 3] {
    const MAX: u32 = 65535;
    if n <= MAX {
        [n.max(1), 1, 1]
    } else {
        [MAX, n.div_ceil(MAX), 1]
    }
}

/// Builds a bind group whose entries are `buffers` at bindings 0, 1, 2, … in order.
pub fn bind(
    ctx: &GpuContext,
    pipeline: &wgpu::ComputePipeline,
    label: &str,
    buffers: &[&wgpu::Buffer],
) -> wgpu::BindGroup {
    let layout = pipeline.get_bind_group_layout(0);
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
        .collect();
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &layout, entries: &entries })
}

/// Records dispatches into one compute pass and submits them (tests, tools).
pub fn run_dispatches(ctx: &GpuContext, dispatches: &[&Dispatch]) -> Result<()> {
    let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln") });
    {
        let mut pass =
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("kiln"), timestamp_writes: None });
        for d in dispatches {
            d.record(&mut pass);
        }
    }
    ctx.queue.submit([enc.finish()]);
    Ok(())
}
