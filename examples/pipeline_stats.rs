//! What the driver made of each kernel: registers, shared and local (spilled) memory per
//! invocation, as the Vulkan driver reports them through VK_KHR_pipeline_executable_properties,
//! which wgpu does not enable. Occupancy follows from them: an NVIDIA SM holds 64K registers,
//! so a workgroup of 512 invocations at 128 registers is one workgroup an SM, and a grid of
//! more workgroups than the GPU holds at once runs its last ones as a second round.
//!
//! 1. `KILN_DUMP_WGSL=/tmp/wgsl kiln bench -m model.gguf -p 512 -n 16`: every kernel the run
//!    compiles, composed, with its entry point, bindings and override constants (gpu/dump.rs).
//! 2. `cargo run --release --example pipeline_stats -- /tmp/wgsl [--ir OUT_DIR]`: each file
//!    translated to SPIR-V as wgpu translates kiln's kernels (gpu/dump.rs: `Dump::spirv`),
//!    compiled by the driver on the first Vulkan device (`KILN_STATS_DEVICE=<index>` for
//!    another), one line each: the driver's statistics by their own names (NVIDIA: Register
//!    Count, Binary Size, Stack Size, Local Memory Size, Shared Memory Size; its local memory
//!    reads 2^36 plus the spilled bytes). `--ir` writes the internal representations the
//!    driver offers to OUT_DIR (NVIDIA's 580 driver offers none); `--cache-blobs OUT_DIR`
//!    compiles each kernel through a pipeline cache of its own and writes the cache's data
//!    there (the driver's binary in its own format: NVIDIA's holds the machine code as ELF
//!    images that CUDA's `nvdisasm` reads). `--spirv-only`: translate only, no device
//!    (lavapipe does not offer the extension). `KILN_STATS_PIPELINE_ROBUSTNESS=0` compiles
//!    every pipeline with VK_EXT_pipeline_robustness's buffer behaviour DISABLED where the
//!    driver offers it: NVIDIA's driver bounds-checks every storage-buffer access otherwise,
//!    robustBufferAccess on or off (H200, runs 524 and 529: the cooperative decode kernel 2,712
//!    -> 2,360 SASS instructions without them), and wgpu cannot ask for it.
//!
//! A diagnostic tool: it opens its own Vulkan instance and device through `ash` and never runs
//! a kernel.

use std::ffi::CStr;
use std::path::{Path, PathBuf};

use ash::vk;

use kiln::gpu::dump::Dump;
use kiln::kernels::Binding;

type Res<T> = std::result::Result<T, String>;

struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    exec: ash::khr::pipeline_executable_properties::Device,
    name: String,
    /// `KILN_STATS_PIPELINE_ROBUSTNESS=0`: pipelines compiled with VK_EXT_pipeline_robustness's
    /// buffer behaviour DISABLED, which wgpu cannot ask for.
    no_robust: bool,
}

fn open() -> Res<Vulkan> {
    // SAFETY: loading the system's Vulkan loader; every call below follows the spec's rules
    // for the handles it creates.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("no Vulkan loader: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    let instance = unsafe { entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None) }
        .map_err(|e| format!("vkCreateInstance: {e}"))?;
    let devices = unsafe { instance.enumerate_physical_devices() }.map_err(|e| format!("no devices: {e}"))?;
    let index: usize = std::env::var("KILN_STATS_DEVICE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let pd = *devices.get(index).ok_or_else(|| format!("no Vulkan device {index} ({} found)", devices.len()))?;
    let props = unsafe { instance.get_physical_device_properties(pd) };
    let name = props.device_name_as_c_str().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    let exts = unsafe { instance.enumerate_device_extension_properties(pd) }.map_err(|e| e.to_string())?;
    let has = |n: &CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(n));
    if !has(ash::khr::pipeline_executable_properties::NAME) {
        return Err(format!("{name}: the driver does not offer VK_KHR_pipeline_executable_properties"));
    }
    let mut enabled = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
    let coop = has(ash::khr::cooperative_matrix::NAME);
    if coop {
        enabled.push(ash::khr::cooperative_matrix::NAME.as_ptr());
    }
    let family = unsafe { instance.get_physical_device_queue_family_properties(pd) }
        .iter()
        .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or_else(|| format!("{name}: no compute queue"))? as u32;
    // Every feature the device has among those kiln's SPIR-V may need, switched on as found.
    let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut cm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut pe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut pr = vk::PhysicalDevicePipelineRobustnessFeaturesEXT::default();
    let no_robust = std::env::var("KILN_STATS_PIPELINE_ROBUSTNESS").is_ok_and(|v| v == "0")
        && has(ash::ext::pipeline_robustness::NAME);
    if no_robust {
        enabled.push(ash::ext::pipeline_robustness::NAME.as_ptr());
    }
    let mut f2 = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut v11)
        .push_next(&mut v12)
        .push_next(&mut v13)
        .push_next(&mut pe);
    if coop {
        f2 = f2.push_next(&mut cm);
    }
    if no_robust {
        f2 = f2.push_next(&mut pr);
    }
    unsafe { instance.get_physical_device_features2(pd, &mut f2) };
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priorities)];
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&enabled)
        .push_next(&mut f2);
    let device = unsafe { instance.create_device(pd, &info, None) }.map_err(|e| format!("vkCreateDevice: {e}"))?;
    let exec = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
    Ok(Vulkan { _entry: entry, instance, device, exec, name, no_robust })
}

fn text(c: &[std::ffi::c_char]) -> String {
    // SAFETY: Vulkan's fixed-size strings are NUL-terminated.
    unsafe { CStr::from_ptr(c.as_ptr()) }.to_string_lossy().into_owned()
}

fn value(s: &vk::PipelineExecutableStatisticKHR) -> String {
    // SAFETY: the union's member is the one `format` names.
    unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
            _ => "?".into(),
        }
    }
}

/// Compiles one kernel (its SPIR-V `words`) and returns its statistics (name, value) per
/// executable; with `ir`, writes the internal representations there.
fn stats(vk_: &Vulkan, d: &Dump, words: &[u32], ir: Option<&Path>, blobs: Option<&Path>) -> Res<Vec<(String, String)>> {
    let file = kiln::gpu::dump::file_name(&d.label);
    let dev = &vk_.device;
    unsafe {
        let module = dev
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)
            .map_err(|e| format!("{}: vkCreateShaderModule: {e}", file))?;
        let bindings: Vec<_> = d
            .bindings
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let ty = match b {
                    Binding::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
                    Binding::Read | Binding::ReadWrite => vk::DescriptorType::STORAGE_BUFFER,
                };
                vk::DescriptorSetLayoutBinding::default()
                    .binding(i as u32)
                    .descriptor_type(ty)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let set = dev
            .create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)
            .map_err(|e| e.to_string())?;
        let sets = [set];
        let layout = dev
            .create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&sets), None)
            .map_err(|e| e.to_string())?;
        let entry = std::ffi::CString::new(d.entry.clone()).map_err(|e| e.to_string())?;
        // As wgpu-hal sets it where the SUBGROUP feature is on.
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .flags(vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE)
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry);
        let mut info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(layout).flags(
            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
        );
        let mut rob = vk::PipelineRobustnessCreateInfoEXT::default()
            .storage_buffers(vk::PipelineRobustnessBufferBehaviorEXT::DISABLED)
            .uniform_buffers(vk::PipelineRobustnessBufferBehaviorEXT::DISABLED);
        if vk_.no_robust {
            info = info.push_next(&mut rob);
        }
        // With `blobs`, the pipeline goes through a cache of its own, whose data (the driver's
        // compiled binary in its own format) is written out.
        let cache = match blobs {
            Some(_) => dev
                .create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)
                .map_err(|e| format!("{file}: vkCreatePipelineCache: {e}"))?,
            None => vk::PipelineCache::null(),
        };
        let pipeline = dev
            .create_compute_pipelines(cache, &[info], None)
            .map_err(|(_, e)| format!("{}: vkCreateComputePipelines: {e}", file))?[0];
        if let Some(dir) = blobs {
            let data = dev.get_pipeline_cache_data(cache).map_err(|e| format!("{file}: cache data: {e}"))?;
            let path = dir.join(format!("{}.cache", file.trim_end_matches(".wgsl")));
            std::fs::write(&path, data).map_err(|e| format!("{}: {e}", path.display()))?;
            dev.destroy_pipeline_cache(cache, None);
        }
        let pinfo = vk::PipelineInfoKHR::default().pipeline(pipeline);
        let execs = vk_.exec.get_pipeline_executable_properties(&pinfo).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for (i, e) in execs.iter().enumerate() {
            let einfo = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i as u32);
            out.push(("executable".into(), text(&e.name)));
            out.push(("subgroup".into(), e.subgroup_size.to_string()));
            for s in vk_.exec.get_pipeline_executable_statistics(&einfo).map_err(|e| e.to_string())? {
                out.push((text(&s.name), value(&s)));
            }
            if let Some(dir) = ir {
                let get = vk_.exec.fp().get_pipeline_executable_internal_representations_khr;
                let mut n = 0u32;
                get(dev.handle(), &einfo, &mut n, std::ptr::null_mut()).result().map_err(|e| e.to_string())?;
                let mut reps = vec![vk::PipelineExecutableInternalRepresentationKHR::default(); n as usize];
                get(dev.handle(), &einfo, &mut n, reps.as_mut_ptr()).result().map_err(|e| e.to_string())?;
                let mut bufs: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
                for (r, b) in reps.iter_mut().zip(bufs.iter_mut()) {
                    r.p_data = b.as_mut_ptr().cast();
                }
                get(dev.handle(), &einfo, &mut n, reps.as_mut_ptr()).result().map_err(|e| e.to_string())?;
                for (j, (r, b)) in reps.iter().zip(&bufs).enumerate() {
                    let ext = if r.is_text != 0 { "txt" } else { "bin" };
                    let stem = file.trim_end_matches(".wgsl");
                    let path = dir.join(format!("{stem}.{i}.{j}.{}.{ext}", text(&r.name).replace(' ', "_")));
                    let bytes = if r.is_text != 0 { b.split(|&c| c == 0).next().unwrap_or(b) } else { &b[..] };
                    std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                }
            }
        }
        dev.destroy_pipeline(pipeline, None);
        dev.destroy_pipeline_layout(layout, None);
        dev.destroy_descriptor_set_layout(set, None);
        dev.destroy_shader_module(module, None);
        Ok(out)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().map(PathBuf::from) else {
        eprintln!("usage: pipeline_stats <KILN_DUMP_WGSL dir> [--ir OUT_DIR]  (see the file's header)");
        std::process::exit(2);
    };
    let dir_arg = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let (ir, blobs) = (dir_arg("--ir"), dir_arg("--cache-blobs"));
    for d in ir.iter().chain(blobs.iter()) {
        if let Err(e) = std::fs::create_dir_all(d) {
            eprintln!("{}: {e}", d.display());
            std::process::exit(1);
        }
    }
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(r) => {
            r.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "wgsl")).collect()
        }
        Err(e) => {
            eprintln!("{}: {e}", dir.display());
            std::process::exit(1);
        }
    };
    files.sort();
    let dumps: Vec<Dump> = match files.iter().map(|f| kiln::gpu::dump::read(f)).collect() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    // Without a device (`validate`): translate every kernel to SPIR-V only.
    if args.iter().any(|a| a == "--spirv-only") {
        for d in &dumps {
            match d.spirv() {
                Ok((w, size)) => println!("{} {:?} {} words", d.label, size, w.len()),
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
            }
        }
        return;
    }
    let vk_ = match open() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!("# {} ({} kernels from {})", vk_.name, dumps.len(), dir.display());
    let mut failed = 0;
    for d in &dumps {
        let compiled = d
            .spirv()
            .map_err(|e| e.to_string())
            .and_then(|(words, size)| Ok((stats(&vk_, d, &words, ir.as_deref(), blobs.as_deref())?, size)));
        match compiled {
            Ok((s, size)) => {
                let line: Vec<String> = s.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("{} wg={}x{}x{} | {}", d.label, size[0], size[1], size[2], line.join(" | "));
            }
            Err(e) => {
                failed += 1;
                println!("{} FAILED: {e}", d.label);
            }
        }
    }
    unsafe {
        vk_.device.destroy_device(None);
        vk_.instance.destroy_instance(None);
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
