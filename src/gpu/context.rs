//! Adapter discovery, the capability ladder, and the device kiln runs on.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Disabled;
use crate::error::{KilnError, Result};
use crate::gpu::pipelines::PipelineCache;

/// What the kernels may use on this device, after `KILN_DISABLE` has been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caps {
    pub f16: bool,
    pub subgroups: bool,
    pub timestamps: bool,
    pub timestamps_in_passes: bool,
    /// Cooperative matrices kiln's GEMM can run: EXPERIMENTAL_COOPERATIVE_MATRIX with 16x16x16
    /// f16 -> f32 multiply-adds, SHADER_F16, subgroups of exactly 32 invocations (each
    /// subgroup of gemm_coop.wgsl owns one block of the tile) with subgroup barriers
    /// (SUBGROUP_BARRIER) and 48 KiB of workgroup memory.
    pub coopmat: bool,
    /// Workgroup-scope cooperative matrices with tensor-addressed loads (VK_NV_cooperative_matrix2
    /// on NVIDIA's Vulkan driver, the device opened with it: `gpu::cm2`), with `coopmat`: the
    /// F16 GEMM's `GemmTile::Cm2` (kernels/gemm_cm2.rs, passed through as SPIR-V).
    pub cm2: bool,
    /// Packed 4x8-bit integer dot products run natively: Vulkan, where wgpu turns on
    /// VK_KHR_shader_integer_dot_product (core in 1.3) and naga emits OpSDot. Elsewhere naga
    /// writes them out in plain integer arithmetic, slower than the float GEMV.
    pub int8_dot: bool,
    /// Plan the int8-activation GEMV for every quantized GEMV it can run, whatever the size
    /// or adapter (tests of the models' int8 path with small models on CPU adapters).
    pub int8_gemv_always: bool,
    /// Where one-token decode steps run the FFN's gate/up projection on the int8 GEMV, the
    /// workgroup shape with which it also writes the down projection's int8 input
    /// (`kernels::Epi::SwiGluQ8`), so that the down projection needs no quantize dispatch;
    /// None: the quantize dispatch (`plan::gemv_q8_swiglu_shape`). Which models take it:
    /// `plan::q8_swiglu_takes`.
    pub q8_swiglu: Option<crate::plan::GemvShape>,
    /// Where one-token decode steps run the projections added to the residual stream (the
    /// output and down projections) on the int8 GEMV, the workgroup shape with which they also
    /// write the next GEMV's int8 input through its RMSNorm (`kernels::Epi::AddQ8Norm`), so that
    /// the Q/K/V, gate/up and LM-head GEMVs after them need no quantize dispatch; None: the
    /// quantize dispatches (`plan::gemv_q8_add_norm_shape`). With `quantize_lanes` only (the
    /// blocks' layout through the norm is its).
    pub q8_add_norm: Option<crate::plan::GemvShape>,
    /// `q8_swiglu` was asked for (a context option or `KILN_GEMV_Q8_SWIGLU`): every model
    /// takes it, whatever the size of its gate/up projection.
    pub q8_swiglu_any_size: bool,
    /// With `q8_swiglu`, that gate/up projection also quantizes its own input through the
    /// RMSNorm in each workgroup, so that it needs no quantize dispatch either
    /// (`plan::gemv_q8_swiglu_norm`; 20 KiB of workgroup memory).
    pub q8_swiglu_norm: bool,
    /// One-token steps' int8 GEMV inputs quantized 8 invocations a block, the RMSNorm's
    /// 1 / rms left to the GEMV (quantize_q8_lanes.wgsl, common/q8_in_global.wgsl; subgroups):
    /// no pass over the whole row before the blocks (`plan::quantize_lanes`).
    pub quantize_lanes: bool,
    /// The sampler's first pass keeps each slice's candidates in order and the second merges
    /// them instead of reading the row again (`plan::sample_tops`).
    pub sample_tops: bool,
    /// Prefill's RMSNorms write the cooperative GEMM's f16 input themselves where it runs
    /// (no to_half dispatch after them; `plan::prefill_f16_inputs`).
    pub prefill_f16_inputs: bool,
    /// Prefill's GEMMs over K-quant weights whose tokens times row length (m·k) reach this read
    /// an f16 copy of the weights decoded before each one (dequant_f16.wgsl,
    /// `kernels::matmul::dequant_f16_bytes`): by default where the cooperative GEMM runs, from
    /// `plan::DEQUANT_F16_FROM` (`plan::prefill_dequant_f16`); the context option sets it
    /// wherever SHADER_F16 is (tests on adapters without matrix cores). None: never.
    pub dequant_f16_from: Option<u64>,
    /// Whether those f16 copies stay in GPU memory, one per matrix, decoded once: Some(yes or
    /// no) as the context option or `KILN_PREFILL_RESIDENT` says; None: where they take at most
    /// a quarter of the memory left (`plan::resident_f16_copies`).
    pub resident_f16_copies: Option<bool>,
    /// One-token decode attention also writes its output as the output projection's int8
    /// input, which then runs on the int8 GEMV whatever its size, with no quantize dispatch
    /// (`plan::attn_q8_out`; where the int8 GEMV runs: `int8_dot`, and on CPU adapters only
    /// with `int8_gemv_always`).
    pub attn_q8_out: bool,
    /// One sequence's decode attention takes wide workgroups where the usual ones would split a
    /// context and those need not (`plan::attn_decode_wide`; `AttnShape::decode_wide_takes`):
    /// where workgroups of `kernels::ATTN_WG_DECODE_WIDE` invocations run.
    pub attn_decode_wide: bool,
    /// One sequence's split decode attention merges its splits in the last workgroup of each
    /// block to finish instead of a combine pass (common/decode_merge.wgsl; `plan::decode_merge`):
    /// where the adapter binds storage `@coherent` (MEMORY_DECORATION_COHERENT), has subgroups
    /// (the int8 output's blocks are quantized through shuffles) and binds the merging kernels'
    /// `kernels::attention::DECODE_MERGE_STORAGE_BUFFERS` storage buffers.
    pub decode_merge: bool,
    /// With `decode_merge`, the merging workgroup fences (device-scope acquire) after its
    /// count, before it reads the other workgroups' partials (`plan::decode_merge_acquire`).
    pub decode_merge_acquire: bool,
    /// The most columns (tokens) a matmul runs on the GEMV rather than a GEMM:
    /// `plan::GEMV_DEFAULT_COLS` on GPUs, one workgroup's (`plan::GEMV_GROUP_COLS`) on CPU
    /// adapters, whose GEMM tiles suit them better; `KILN_GEMV_MAX_COLS` (or the context
    /// option, in tests) sets it.
    pub gemv_max_cols: u32,
    pub subgroup_min: u32,
    pub subgroup_max: u32,
    /// A CPU adapter (lavapipe, llvmpipe, WARP): smaller tiles and workloads suit it better.
    pub cpu_adapter: bool,
    /// Workgroups of 1024 invocations run here, and subgroups are at least 16 wide (so a
    /// workgroup's subgroup partial sums fit the reductions' 64 slots).
    pub wide_workgroups: bool,
}

impl Caps {
    /// The plain ladder rung every adapter can run: no f16, no subgroups.
    pub fn baseline() -> Caps {
        Caps {
            f16: false,
            subgroups: false,
            timestamps: false,
            timestamps_in_passes: false,
            coopmat: false,
            cm2: false,
            int8_dot: false,
            int8_gemv_always: false,
            q8_swiglu: None,
            q8_add_norm: None,
            q8_swiglu_any_size: false,
            q8_swiglu_norm: false,
            quantize_lanes: false,
            sample_tops: false,
            prefill_f16_inputs: false,
            dequant_f16_from: None,
            resident_f16_copies: None,
            attn_q8_out: false,
            attn_decode_wide: false,
            decode_merge: false,
            decode_merge_acquire: true,
            gemv_max_cols: crate::plan::GEMV_GROUP_COLS,
            subgroup_min: 0,
            subgroup_max: 0,
            cpu_adapter: false,
            wide_workgroups: false,
        }
    }
}

/// NVIDIA's PCI vendor ID (`wgpu::AdapterInfo::vendor`; `bench::vendor_name` names the others).
pub const NVIDIA_VENDOR: u32 = 0x10de;

/// How to pick and open an adapter.
#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    /// `--gpu`: an index into `kiln info`'s list or a substring of the adapter name.
    pub gpu: Option<String>,
    /// `--backend`: restrict to one backend.
    pub backend: Option<wgpu::Backend>,
    pub disable: Disabled,
    /// Plan with a smaller storage-binding limit than the adapter's (tests of tensor splitting).
    pub max_binding_override: Option<u64>,
    /// Assume this much device memory instead of what the driver reports (tests of the
    /// memory checks, `KILN_GPU_MEMORY`).
    pub memory_override: Option<u64>,
    /// Plan the int8-activation GEMV wherever it can run (`Caps::int8_gemv_always`; tests).
    pub int8_gemv_always: bool,
    /// The int8 SwiGLU epilogue's shape (`Caps::q8_swiglu`): Some(None) off, Some(shape) on;
    /// None: `KILN_GEMV_Q8_SWIGLU` or the planner's default (tests of both paths).
    pub q8_swiglu: Option<Option<crate::plan::GemvShape>>,
    /// `Caps::q8_add_norm`: Some(None) off, Some(shape) on; None: `KILN_GEMV_Q8_ADD_NORM` or the
    /// planner's default.
    pub q8_add_norm: Option<Option<crate::plan::GemvShape>>,
    /// `Caps::q8_swiglu_norm`; None: `KILN_GEMV_Q8_SWIGLU_NORM` or the planner's default.
    pub q8_swiglu_norm: Option<bool>,
    /// `Caps::quantize_lanes`; None: `KILN_QUANTIZE_LANES` or the planner's default.
    pub quantize_lanes: Option<bool>,
    /// `Caps::sample_tops`; None: `KILN_SAMPLE_TOPS` or the planner's default.
    pub sample_tops: Option<bool>,
    /// `Caps::prefill_f16_inputs`; None: `KILN_PREFILL_F16_INPUTS` or the planner's default.
    pub prefill_f16_inputs: Option<bool>,
    /// `Caps::dequant_f16_from`: Some(None) off, Some(Some(mk)) from m·k = mk; None:
    /// `KILN_PREFILL_DEQUANT` and `KILN_DEQUANT_FROM` or the planner's default.
    pub dequant_f16_from: Option<Option<u64>>,
    /// `Caps::resident_f16_copies`; None: `KILN_PREFILL_RESIDENT` or the planner's choice.
    pub resident_f16_copies: Option<bool>,
    /// `Caps::attn_q8_out`; None: `KILN_ATTN_Q8_OUT` or the planner's default.
    pub attn_q8_out: Option<bool>,
    /// `Caps::attn_decode_wide`; None: `KILN_DECODE_WIDE` or the planner's default.
    pub attn_decode_wide: Option<bool>,
    /// `Caps::decode_merge`; None: `KILN_DECODE_MERGE` or the planner's default.
    pub decode_merge: Option<bool>,
    /// `Caps::decode_merge_acquire`; None: `KILN_DECODE_MERGE_ACQUIRE` or the planner's default.
    pub decode_merge_acquire: Option<bool>,
    /// At most this many columns on the GEMV (`Caps::gemv_max_cols`, `KILN_GEMV_MAX_COLS`).
    pub gemv_max_cols: Option<u32>,
    /// Open the device with these limits instead of the adapter's (tests that stand in for
    /// small adapters, e.g. `wgpu::Limits::default()`: WebGPU's 128 MiB binding).
    pub limits: Option<wgpu::Limits>,
    /// Directory for the driver's compiled pipelines between runs (`KILN_PIPELINE_CACHE`),
    /// used where the adapter offers PIPELINE_CACHE; None keeps them in memory only.
    pub pipeline_cache: Option<std::path::PathBuf>,
    /// Write each kernel's composed WGSL here as it is compiled (`KILN_DUMP_WGSL`, gpu/dump.rs).
    pub dump_wgsl: Option<std::path::PathBuf>,
}

impl ContextOptions {
    /// Options from the environment (`KILN_DISABLE`, `KILN_MAX_BINDING`).
    pub fn from_env() -> Result<ContextOptions> {
        let disable = Disabled::from_env().map_err(|m| KilnError::invalid("KILN_DISABLE", m))?;
        Ok(ContextOptions {
            disable,
            max_binding_override: crate::config::max_binding_from_env(),
            memory_override: crate::config::gpu_memory_from_env(),
            pipeline_cache: crate::config::pipeline_cache_from_env(),
            dump_wgsl: crate::config::dump_wgsl_from_env(),
            gemv_max_cols: crate::config::gemv_max_cols_from_env(),
            ..Default::default()
        })
    }
}

/// One adapter as `kiln info` shows it.
#[derive(Debug, Clone)]
pub struct AdapterReport {
    pub index: usize,
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    /// Why kiln cannot use this adapter, if it cannot.
    pub unusable: Option<String>,
    /// The driver offers what the workgroup-scope GEMM needs (VK_NV_cooperative_matrix2 with
    /// its features and tile, `gpu::cm2::offered`) and wgpu passes SPIR-V through.
    pub cm2: bool,
}

pub fn parse_backend(s: &str) -> Option<wgpu::Backend> {
    match s.to_ascii_lowercase().as_str() {
        "vulkan" | "vk" => Some(wgpu::Backend::Vulkan),
        "metal" | "mtl" => Some(wgpu::Backend::Metal),
        "dx12" | "d3d12" => Some(wgpu::Backend::Dx12),
        "gl" | "gles" | "opengl" => Some(wgpu::Backend::Gl),
        _ => None,
    }
}

fn backends_for(backend: Option<wgpu::Backend>) -> wgpu::Backends {
    match backend {
        Some(wgpu::Backend::Vulkan) => wgpu::Backends::VULKAN,
        Some(wgpu::Backend::Metal) => wgpu::Backends::METAL,
        Some(wgpu::Backend::Dx12) => wgpu::Backends::DX12,
        Some(wgpu::Backend::Gl) => wgpu::Backends::GL,
        _ => wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12 | wgpu::Backends::GL,
    }
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        wgpu::Backend::Gl => 1,
        _ => 2,
    }
}

/// The minimum kiln needs: compute with storage buffers large enough for real tensors.
fn unusable_reason(
    limits: &wgpu::Limits,
    info: &wgpu::AdapterInfo,
    downlevel: &wgpu::DownlevelCapabilities,
) -> Option<String> {
    if !downlevel.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
        return Some(format!(
            "no compute shaders ({} {}); kiln needs OpenGL 4.3+ or ES 3.1+ on GL, or a Vulkan, Metal or DX12 driver",
            info.driver, info.driver_info
        ));
    }
    // unpack2x16float decodes every f16 weight and block scale.
    if !downlevel.flags.contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32) {
        return Some(format!(
            "no f16 packing builtins in shaders ({} {}); kiln needs OpenGL 4.3+ or ES 3.1+ on GL, or a Vulkan, Metal or DX12 driver",
            info.driver, info.driver_info
        ));
    }
    if limits.max_storage_buffers_per_shader_stage < 6 {
        return Some(format!(
            "only {} storage buffers per shader stage (kiln needs 6){}",
            limits.max_storage_buffers_per_shader_stage,
            if info.backend == wgpu::Backend::Gl { "; this GL driver lacks compute storage buffers" } else { "" }
        ));
    }
    if limits.max_compute_invocations_per_workgroup < 256 {
        return Some(format!(
            "only {} invocations per workgroup (kiln needs 256)",
            limits.max_compute_invocations_per_workgroup
        ));
    }
    if limits.max_compute_workgroup_storage_size < 16384 {
        return Some(format!(
            "only {} bytes of workgroup storage (kiln needs 16384)",
            limits.max_compute_workgroup_storage_size
        ));
    }
    None
}

fn instance(backend: Option<wgpu::Backend>) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends_for(backend);
    desc.flags = wgpu::InstanceFlags::empty();
    // Where the driver reports a memory budget (Vulkan, D3D12), fail allocations near it with
    // an out-of-memory error kiln reports, instead of paging or losing the device.
    desc.memory_budget_thresholds =
        wgpu::MemoryBudgetThresholds { for_resource_creation: Some(95), for_device_loss: None };
    wgpu::Instance::new(desc)
}

/// Every adapter on every backend, best first: discrete, integrated, virtual, CPU; native
/// APIs before GL for the same device.
pub fn list_adapters(backend: Option<wgpu::Backend>) -> (wgpu::Instance, Vec<(wgpu::Adapter, AdapterReport)>) {
    let inst = instance(backend);
    let mut adapters: Vec<wgpu::Adapter> = pollster::block_on(inst.enumerate_adapters(backends_for(backend)));
    adapters.sort_by_key(|a| {
        let i = a.get_info();
        (type_rank(i.device_type), backend_rank(i.backend))
    });
    let list = adapters
        .into_iter()
        .enumerate()
        .map(|(index, a)| {
            let info = a.get_info();
            let limits = a.limits();
            let unusable = unusable_reason(&limits, &info, &a.get_downlevel_capabilities());
            let features = a.features();
            let cm2 = info.backend == wgpu::Backend::Vulkan
                && features.contains(wgpu::Features::PASSTHROUGH_SHADERS)
                && crate::gpu::cm2::offered(&a);
            let report = AdapterReport { index, info, features, limits, unusable, cm2 };
            (a, report)
        })
        .collect();
    (inst, list)
}

/// The device, its queue, what it can do, and the pipelines built on it.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: Caps,
    pub limits: wgpu::Limits,
    /// Largest storage binding kiln plans with (adapter limit, or a test override).
    pub max_binding: u64,
    pub pipelines: PipelineCache,
    /// Bound on every wait for the GPU, so a lost device becomes an error, not a hang.
    pub poll_timeout: Duration,
    /// The first fatal GPU fault (device lost, a failed command), if any: every wait checks
    /// it, so a fault ends generation with an error instead of wrong results or a hang.
    fault: Arc<std::sync::Mutex<Option<String>>>,
    /// Device-local memory the driver reports (the largest device-local heap), where the
    /// backend tells it (Vulkan); `KILN_GPU_MEMORY` overrides it.
    pub device_memory: Option<u64>,
    /// Queue writes not yet submitted (bounded staging, gpu/upload.rs).
    pub(crate) uploads: crate::gpu::upload::UploadQueue,
    /// What the last `finish_uploads` measured (loading reports it).
    pub(crate) last_uploads: std::sync::Mutex<crate::gpu::upload::UploadStats>,
    /// The driver's pipeline cache, loaded from and saved to disk (gpu/pipelines.rs).
    pub(crate) disk_cache: Option<crate::gpu::pipelines::DiskCache>,
    /// Where each kernel's WGSL is written as it is compiled (`ContextOptions::dump_wgsl`).
    pub(crate) dump_wgsl: Option<std::path::PathBuf>,
}

/// GPU buffers alive on a device, from wgpu's internal counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferCount {
    pub buffers: u64,
    pub bytes: u64,
}

/// Memory for a model on this adapter: the largest device-local heap of a Vulkan adapter
/// (wgpu has no portable query of memory size, so other backends report none); on a CPU
/// adapter, whose "heap" is a nominal figure (lavapipe says 2 GiB), the host's available
/// memory when that is larger.
fn device_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    let heap = device_heap(adapter);
    if adapter.get_info().device_type != wgpu::DeviceType::Cpu {
        return heap;
    }
    let available = host_available_memory();
    match (heap, available) {
        (Some(h), Some(a)) => Some(h.max(a)),
        (h, a) => h.or(a),
    }
}

/// This process's resident memory now and at its peak (Linux's VmRSS and VmHWM), in bytes.
pub fn host_resident_memory() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The host memory available now (Linux's MemAvailable), where the OS says.
pub fn host_available_memory() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

fn device_heap(adapter: &wgpu::Adapter) -> Option<u64> {
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android", target_os = "freebsd"))]
    {
        // SAFETY: only reads the physical device's memory properties; nothing is created or
        // destroyed through the raw handles.
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
        let instance = hal.shared_instance().raw_instance();
        let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
        const DEVICE_LOCAL: u32 = 0x1;
        props.memory_heaps[..props.memory_heap_count.min(16) as usize]
            .iter()
            .filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0)
            .map(|h| h.size)
            .max()
    }
    #[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android", target_os = "freebsd")))]
    {
        let _ = adapter;
        None
    }
}

impl GpuContext {
    /// Opens the adapter the options select (best one by default).
    pub fn new(opts: &ContextOptions) -> Result<Arc<GpuContext>> {
        let (_inst, list) = list_adapters(opts.backend);
        if list.is_empty() {
            let detail = match opts.backend {
                Some(b) => format!(" on backend {b:?}"),
                None => String::new(),
            };
            return Err(KilnError::NoAdapter { detail });
        }
        let names = || {
            list.iter()
                .map(|(_, r)| format!("{}: {} ({:?})", r.index, r.info.name, r.info.backend))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let chosen = match &opts.gpu {
            Some(want) => {
                let by_index = want.trim().parse::<usize>().ok().and_then(|i| list.iter().find(|(_, r)| r.index == i));
                let lower = want.to_ascii_lowercase();
                let by_name = || list.iter().find(|(_, r)| r.info.name.to_ascii_lowercase().contains(&lower));
                match by_index.or_else(by_name) {
                    Some(c) => c,
                    None => return Err(KilnError::AdapterNotFound { wanted: want.clone(), available: names() }),
                }
            }
            None => match list.iter().find(|(_, r)| r.unusable.is_none()) {
                Some(c) => c,
                None => {
                    let why = list
                        .iter()
                        .map(|(_, r)| format!("{}: {}", r.info.name, r.unusable.clone().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join("; ");
                    return Err(KilnError::NoAdapter { detail: format!(" (none is usable: {why})") });
                }
            },
        };
        let (adapter, report) = chosen;
        if let Some(reason) = &report.unusable {
            return Err(KilnError::AdapterUnusable { adapter: report.info.name.clone(), reason: reason.clone() });
        }
        Self::open(adapter, report, opts)
    }

    fn open(adapter: &wgpu::Adapter, report: &AdapterReport, opts: &ContextOptions) -> Result<Arc<GpuContext>> {
        let offered = report.features;
        let mut wanted = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        if !opts.disable.f16 {
            wanted |= wgpu::Features::SHADER_F16;
        }
        if !opts.disable.subgroup {
            wanted |= wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER;
        }
        if !opts.disable.coopmat {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        if opts.pipeline_cache.is_some() {
            wanted |= wgpu::Features::PIPELINE_CACHE;
        }
        if !opts.disable.subgroup {
            wanted |= wgpu::Features::MEMORY_DECORATION_COHERENT;
        }
        // The workgroup-scope GEMM's device: the extension wgpu does not know, and modules
        // passed through to the driver.
        let cm2_wanted = !opts.disable.coopmat
            && !opts.disable.cm2
            && report.cm2
            && offered.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
            && wanted.contains(wgpu::Features::SHADER_F16);
        if cm2_wanted {
            wanted |= wgpu::Features::PASSTHROUGH_SHADERS;
        }
        let features = wanted & offered;
        let limits = opts.limits.clone().unwrap_or_else(|| adapter.limits());
        let desc = wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: the only experimental feature kiln requests is cooperative matrices,
            // used only when offered and never on a path the fallbacks do not also cover.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            // Smaller memory blocks (8-64 MiB): less allocated beyond what the buffers use,
            // which is what decides whether a model fits a small GPU.
            memory_hints: wgpu::MemoryHints::MemoryUsage,
            trace: wgpu::Trace::Off,
        };
        let with_cm2 = if cm2_wanted { crate::gpu::cm2::open(adapter, &desc) } else { None };
        let cm2 = with_cm2.is_some();
        // Modules are passed through only on the device opened for them.
        let features = if cm2 { features } else { features - wgpu::Features::PASSTHROUGH_SHADERS };
        let (device, queue) = match with_cm2 {
            Some(pair) => pair,
            None => pollster::block_on(
                adapter.request_device(&wgpu::DeviceDescriptor { required_features: features, ..desc }),
            )
            .map_err(|e| KilnError::RequestDevice { adapter: report.info.name.clone(), reason: e.to_string() })?,
        };
        let info = report.info.clone();
        // Subgroups of 8 invocations or more: the reductions' slots (512 invocations, 64
        // subgroups) and the int8 input's 8-invocation blocks (common/q8_prepare_subgroups.wgsl).
        let subgroups = features.contains(wgpu::Features::SUBGROUP) && info.subgroup_min_size >= 8;
        let int8_dot = info.backend == wgpu::Backend::Vulkan && !opts.disable.int8dot;
        let mut caps = Caps {
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_in_passes: features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            coopmat: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
                && features.contains(wgpu::Features::SHADER_F16)
                // The cooperative attention kernels pass a subgroup's tiles through workgroup
                // memory behind subgroup barriers.
                && features.contains(wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER)
                && info.subgroup_min_size == 32
                && info.subgroup_max_size == 32
                // gemm_coop.wgsl's largest tile takes 48 KiB of workgroup memory.
                && limits.max_compute_workgroup_storage_size >= 48 * 1024
                && limits.max_compute_invocations_per_workgroup >= crate::plan::COOP_MAX_INVOCATIONS
                && limits.max_compute_workgroup_size_x >= crate::plan::COOP_MAX_INVOCATIONS
                && has_f16_16x16x16(adapter),
            cm2: false,
            int8_dot,
            int8_gemv_always: opts.int8_gemv_always,
            // Int8 dot products in hardware, and workgroups as large as the shape's.
            q8_swiglu: opts.q8_swiglu.unwrap_or_else(crate::plan::gemv_q8_swiglu_shape).filter(|s| {
                info.backend == wgpu::Backend::Vulkan && limits.max_compute_invocations_per_workgroup >= s.wg
            }),
            q8_swiglu_any_size: opts.q8_swiglu.is_some() || crate::config::gemv_q8_swiglu_from_env().is_some(),
            q8_add_norm: opts.q8_add_norm.unwrap_or_else(crate::plan::gemv_q8_add_norm_shape).filter(|s| {
                info.backend == wgpu::Backend::Vulkan
                    && subgroups
                    && opts.quantize_lanes.unwrap_or_else(crate::plan::quantize_lanes)
                    && limits.max_compute_invocations_per_workgroup >= s.wg
                    && limits.max_compute_workgroup_size_x >= s.wg
            }),
            q8_swiglu_norm: opts.q8_swiglu_norm.unwrap_or_else(crate::plan::gemv_q8_swiglu_norm)
                && limits.max_compute_workgroup_storage_size >= crate::plan::GEMV_Q8_LOCAL_INPUT_BYTES,
            quantize_lanes: opts.quantize_lanes.unwrap_or_else(crate::plan::quantize_lanes) && subgroups,
            sample_tops: opts.sample_tops.unwrap_or_else(crate::plan::sample_tops),
            prefill_f16_inputs: opts.prefill_f16_inputs.unwrap_or_else(crate::plan::prefill_f16_inputs)
                && features.contains(wgpu::Features::SHADER_F16),
            dequant_f16_from: None,
            resident_f16_copies: None,
            attn_q8_out: opts.attn_q8_out.unwrap_or_else(crate::plan::attn_q8_out)
                && int8_dot
                && (info.device_type != wgpu::DeviceType::Cpu || opts.int8_gemv_always),
            attn_decode_wide: opts.attn_decode_wide.unwrap_or_else(crate::plan::attn_decode_wide)
                && limits.max_compute_invocations_per_workgroup >= crate::kernels::ATTN_WG_DECODE_WIDE
                && limits.max_compute_workgroup_size_x >= crate::kernels::ATTN_WG_DECODE_WIDE,
            decode_merge: opts.decode_merge.unwrap_or_else(crate::plan::decode_merge)
                && features.contains(wgpu::Features::MEMORY_DECORATION_COHERENT)
                && subgroups
                && limits.max_storage_buffers_per_shader_stage
                    >= crate::kernels::attention::DECODE_MERGE_STORAGE_BUFFERS,
            decode_merge_acquire: opts
                .decode_merge_acquire
                .unwrap_or_else(|| crate::plan::decode_merge_acquire(info.vendor)),
            gemv_max_cols: opts
                .gemv_max_cols
                .unwrap_or(if info.device_type == wgpu::DeviceType::Cpu {
                    crate::plan::GEMV_GROUP_COLS
                } else {
                    crate::plan::GEMV_DEFAULT_COLS
                })
                .clamp(1, crate::plan::GEMV_MAX_COLS),
            subgroup_min: if subgroups { info.subgroup_min_size } else { 0 },
            subgroup_max: if subgroups { info.subgroup_max_size } else { 0 },
            cpu_adapter: info.device_type == wgpu::DeviceType::Cpu,
            wide_workgroups: subgroups
                && info.subgroup_min_size >= 16
                && info.device_type != wgpu::DeviceType::Cpu
                && limits.max_compute_invocations_per_workgroup >= 1024
                && limits.max_compute_workgroup_size_x >= 1024,
        };
        caps.cm2 = cm2 && caps.coopmat;
        caps.dequant_f16_from = match opts.dequant_f16_from {
            Some(from) => from,
            None if caps.coopmat && !caps.cpu_adapter => crate::plan::prefill_dequant_f16(),
            None => None,
        }
        .filter(|_| caps.f16);
        caps.resident_f16_copies = opts.resident_f16_copies.or_else(crate::config::prefill_resident_from_env);
        let adapter_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let max_binding = match opts.max_binding_override {
            Some(v) => v.min(adapter_binding).max(256),
            None => adapter_binding,
        };
        // Device errors are reported through error scopes where kiln can act on them; any
        // other one (a failed submission) and a lost device are recorded as the context's
        // fault, which the next wait reports, instead of aborting the process.
        let fault: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let f = fault.clone();
        // Only the first such error is worth a log line: the rest follow from it.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut f) = f.lock() {
                if f.is_none() {
                    tracing::debug!("uncaptured GPU error: {e}");
                    *f = Some(format!("a GPU command failed: {}", one_line(&e.to_string())));
                } else {
                    tracing::trace!("uncaptured GPU error: {e}");
                }
            }
        }));
        let f = fault.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut f) = f.lock() {
                let detail = if message.is_empty() { String::new() } else { format!(": {message}") };
                f.get_or_insert_with(|| format!("the GPU device was lost ({reason:?}{detail})"));
            }
        });
        let disk_cache = match &opts.pipeline_cache {
            Some(dir) if features.contains(wgpu::Features::PIPELINE_CACHE) => {
                crate::gpu::pipelines::DiskCache::open(&device, &info, dir)
            }
            _ => None,
        };
        let mut ctx = GpuContext {
            device,
            queue,
            info,
            caps,
            limits,
            max_binding,
            pipelines: PipelineCache::default(),
            disk_cache: None,
            dump_wgsl: opts.dump_wgsl.clone(),
            poll_timeout: Duration::from_secs(120),
            device_memory: opts.memory_override.or_else(|| device_memory(adapter)),
            fault,
            uploads: Default::default(),
            last_uploads: Default::default(),
        };
        ctx.disk_cache = disk_cache;
        let ctx = Arc::new(ctx);
        // Some GL drivers accept compute pipelines but never run them (NVIDIA's EGL gives a
        // GL 3.3 context): check one dispatch before trusting the adapter.
        // The dispatch runs in an error scope: a driver that cannot compile compute shaders
        // (GLSL 3.30) fails every step of it, and that is one reason, not a log record each.
        if ctx.info.backend == wgpu::Backend::Gl {
            let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let ran = crate::kernels::elementwise::self_test(&ctx);
            let error = pollster::block_on(scope.pop());
            let reason = match (error, ran) {
                (Some(e), _) => Some(format!(
                    "the GL driver cannot run kiln's compute shaders ({})",
                    crate::gpu::pipelines::innermost_cause(&e)
                )),
                (None, Ok(true)) => None,
                (None, Ok(false)) => Some("a test dispatch produced no result on this GL driver".to_string()),
                (None, Err(KilnError::Shader { message, .. })) => {
                    Some(format!("the GL driver cannot compile kiln's compute shaders ({message})"))
                }
                (None, Err(e)) => Some(format!("a test dispatch failed on this GL driver ({e})")),
            };
            if let Some(reason) = reason {
                return Err(KilnError::AdapterUnusable {
                    adapter: ctx.info.name.clone(),
                    reason: format!("{reason}; use --backend vulkan"),
                });
            }
        }
        Ok(ctx)
    }

    /// Records `message` as the context's fault unless one is recorded already (a wait that
    /// failed: e.g. on a submission the device refused once it was lost, which reports no
    /// error of its own).
    pub fn record_fault(&self, message: &str) {
        if let Ok(mut f) = self.fault.lock() {
            f.get_or_insert_with(|| message.to_string());
        }
    }

    /// The recorded fault (device lost, failed command) as an error naming `what`.
    pub fn check_fault(&self, what: &str) -> Result<()> {
        match self.fault.lock().ok().and_then(|f| f.clone()) {
            None => Ok(()),
            Some(m) => Err(KilnError::Gpu {
                context: what.to_string(),
                message: format!("{m}; restart kiln (and check the GPU driver if it happens again)"),
            }),
        }
    }

    /// Blocks until all submitted work is done, or fails after `poll_timeout` or on a fault.
    pub fn wait_idle(&self, what: &str) -> Result<()> {
        self.check_fault(what)?;
        let polled =
            self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: Some(self.poll_timeout) });
        self.check_fault(what)?;
        polled.map(|_| ()).map_err(|e| match e {
            wgpu::PollError::Timeout => {
                KilnError::GpuTimeout { what: what.to_string(), seconds: self.poll_timeout.as_secs() }
            }
            other => KilnError::Gpu { context: what.to_string(), message: other.to_string() },
        })
    }

    /// Runs `f` (buffer, bind group and pipeline creation, uploads) with the device's
    /// validation and out-of-memory errors captured, so that a failure is one error instead of
    /// a log line per failed call: out of memory becomes `oom` (what to do), the first
    /// validation error its own message (which buffer, how large, which limit) and `hint`.
    pub fn capture<T>(&self, what: &str, oom: &str, hint: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let oom_scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation_scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let result = f();
        let validation = pollster::block_on(validation_scope.pop());
        let out_of_memory = pollster::block_on(oom_scope.pop());
        if let Some(e) = out_of_memory {
            return Err(KilnError::Gpu {
                context: what.to_string(),
                message: format!("{oom} ({})", one_line(&e.to_string())),
            });
        }
        if let Some(e) = validation {
            let hint = if hint.is_empty() { String::new() } else { format!("; {hint}") };
            return Err(KilnError::Gpu {
                context: what.to_string(),
                message: format!("{}{hint}", one_line(&e.to_string())),
            });
        }
        result
    }

    /// Buffers alive on the device now and their memory (wgpu's counters).
    /// Bytes come from the memory allocator's report where the backend has one (Vulkan,
    /// DX12): wgpu's buffer-memory counter goes wrong once staging buffers (uploads) are
    /// freed, which it subtracts without having added them.
    pub fn buffers_alive(&self) -> BufferCount {
        let c = self.device.get_internal_counters();
        let bytes = match self.device.generate_allocator_report() {
            Some(r) => r.total_allocated_bytes,
            None => c.hal.buffer_memory.read().max(0) as u64,
        };
        BufferCount { buffers: c.hal.buffers.read().max(0) as u64, bytes }
    }

    /// Short adapter description for logs and reports.
    pub fn describe(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.backend, self.info.device_type)
    }
}

/// A wgpu error message (often several indented lines, "Caused by: …") as one line.
pub fn one_line(message: &str) -> String {
    message.split('\n').map(str::trim).filter(|l| !l.is_empty() && *l != "Caused by:").collect::<Vec<_>>().join(": ")
}

/// Whether the adapter multiplies 16x16x16 f16 cooperative matrices into f32 (gemm_coop.wgsl).
fn has_f16_16x16x16(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType::{F16, F32};
    adapter
        .cooperative_matrix_properties()
        .iter()
        .any(|p| (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == F16 && p.cr_type == F32)
}
