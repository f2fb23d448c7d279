//! The GPU layer: device and capabilities, buffers, shader composition, pipelines, timing.

pub mod buffers;
pub mod cm2;
pub mod context;
pub mod dump;
pub mod pipelines;
pub mod shader;
pub mod timer;
pub mod upload;

pub use buffers::{
    bind, grid, kv_storage_size, leave_out_kernel, run_dispatches, storage_size, Bound, Dispatch, WeightChunk,
    WeightTensor,
};
pub use context::{
    host_available_memory, host_resident_memory, list_adapters, parse_backend, AdapterReport, BufferCount, Caps,
    ContextOptions, GpuContext,
};
