//! `kiln info`: every adapter wgpu can reach, and what kiln would use on each.

use crate::cli::GpuArgs;
use crate::gpu::{list_adapters, GpuContext};
use crate::Result;
use std::io::Write;

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Also measure the chosen adapter: read bandwidth of one large dispatch, f32 FMA
    /// throughput, and the cost of a dependent dispatch (the peaks profiles compare against).
    #[arg(long)]
    pub probe: bool,
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn mib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", b >> 20)
    }
}

pub fn run(args: &InfoArgs) -> Result<()> {
    let mut o = std::io::stdout().lock();
    let opts = args.gpu.options()?;
    let (_inst, list) = list_adapters(opts.backend);
    if list.is_empty() {
        return Err(crate::KilnError::NoAdapter { detail: String::new() });
    }
    // Which adapter `kiln run` would pick with these flags.
    let chosen = GpuContext::new(&opts);
    let chosen_name = chosen.as_ref().ok().map(|c| (c.info.name.clone(), c.info.backend));
    let chosen_hint = chosen.as_ref().ok().and_then(|c| gl_software_hint(c));
    for (_, r) in &list {
        let i = &r.info;
        let mark =
            if chosen_name.as_ref() == Some(&(i.name.clone(), i.backend)) { "  <- kiln uses this one" } else { "" };
        writeln!(o, "[{}] {}{}", r.index, i.name, mark)?;
        writeln!(
            o,
            "    vendor 0x{:04x}, device 0x{:04x}, {:?}, backend {:?}",
            i.vendor, i.device, i.device_type, i.backend
        )?;
        writeln!(o, "    driver: {} {}", i.driver, i.driver_info)?;
        let f = r.features;
        let off = &opts.disable;
        let used = |feat: wgpu::Features, disabled: bool| {
            if !f.contains(feat) {
                "no"
            } else if disabled {
                "offered, disabled by KILN_DISABLE"
            } else {
                "yes"
            }
        };
        writeln!(o, "    SHADER_F16: {}", used(wgpu::Features::SHADER_F16, off.f16))?;
        // kiln takes subgroups of 8 invocations or more (`Caps::subgroups`).
        let subgroup = match used(wgpu::Features::SUBGROUP, off.subgroup) {
            "yes" if i.subgroup_min_size < 8 => "offered, unused (kiln needs subgroups of 8 or more)",
            u => u,
        };
        writeln!(o, "    SUBGROUP: {} (subgroup size {}..{})", subgroup, i.subgroup_min_size, i.subgroup_max_size)?;
        writeln!(
            o,
            "    TIMESTAMP_QUERY: {}, inside passes: {}",
            yes(f.contains(wgpu::Features::TIMESTAMP_QUERY)),
            yes(f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES))
        )?;
        writeln!(
            o,
            "    COOPERATIVE_MATRIX: {} (prefill GEMM on 16x16 f16 tiles where subgroups are 32 wide, with 48 KiB of workgroup storage and 512 invocations)",
            used(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX, off.coopmat)
        )?;
        let cm2 = match (r.cm2, off.cm2 || off.coopmat) {
            (false, _) => "no",
            (true, true) => "offered, disabled by KILN_DISABLE",
            (true, false) => "yes",
        };
        writeln!(
            o,
            "    VK_NV_cooperative_matrix2: {cm2} (workgroup-scope F16 GEMM with tensor-addressed loads, for large prefill GEMMs)"
        )?;
        let int8 = match (i.backend == wgpu::Backend::Vulkan, off.int8dot, i.device_type == wgpu::DeviceType::Cpu) {
            (false, ..) => "not native on this backend (int8-activation GEMV off)",
            (true, true, _) => "disabled by KILN_DISABLE",
            (true, false, true) => "yes (unused: CPU adapters keep the float GEMV)",
            (true, false, false) => "yes (int8-activation GEMV for large quantized matrices)",
        };
        writeln!(o, "    INTEGER_DOT_PRODUCT: {int8}")?;
        // Split decode attention merges its splits in its last workgroup (`Caps::decode_merge`).
        let coherent = match used(wgpu::Features::MEMORY_DECORATION_COHERENT, off.subgroup) {
            "yes" if subgroup != "yes" => "offered, unused (kiln merges decode splits there only with subgroups)",
            "yes" => "yes (split decode attention merged by its last workgroup, no combine pass)",
            u => u,
        };
        writeln!(o, "    MEMORY_DECORATION_COHERENT: {coherent}")?;
        let l = &r.limits;
        writeln!(
            o,
            "    max buffer {}, max storage binding {}, workgroup storage {} KiB, invocations {}, storage buffers/stage {}",
            mib(l.max_buffer_size),
            mib(l.max_storage_buffer_binding_size),
            l.max_compute_workgroup_storage_size / 1024,
            l.max_compute_invocations_per_workgroup,
            l.max_storage_buffers_per_shader_stage
        )?;
        // GL drivers can claim compute and not run it: open the adapter and try one dispatch.
        let mut unusable = r.unusable.clone();
        if unusable.is_none() && i.backend == wgpu::Backend::Gl {
            let probe = crate::gpu::ContextOptions { gpu: Some(r.index.to_string()), ..opts.clone() };
            match GpuContext::new(&probe) {
                Err(crate::KilnError::AdapterUnusable { reason, .. }) => unusable = Some(reason),
                Err(e) => unusable = Some(e.to_string()),
                Ok(_) => {}
            }
        }
        match unusable {
            Some(why) => writeln!(o, "    kiln cannot use this adapter: {why}")?,
            None => writeln!(o, "    usable by kiln")?,
        }
    }
    match chosen {
        Err(e) => {
            writeln!(o, "no adapter selected: {e}")?;
            if args.probe {
                return Err(e);
            }
        }
        Ok(ctx) if args.probe => {
            o.flush()?;
            let r = crate::kernels::probe::run(&ctx)?;
            writeln!(o, "probe of {}:", ctx.describe())?;
            writeln!(
                o,
                "    read bandwidth: {:.1} GB/s (one dispatch reading {} MiB, best of 5)",
                r.peak.read_gbs,
                r.read_bytes >> 20
            )?;
            writeln!(o, "    f32 FMA: {:.1} GFLOP/s", r.peak.gflops)?;
            if r.peak.mma_gflops > 0.0 {
                writeln!(
                    o,
                    "    f16 matrix multiply-add (cooperative matrices, 16x16x16 into f32): {:.1} GFLOP/s",
                    r.peak.mma_gflops
                )?;
            }
            writeln!(
                o,
                "    dependent dispatch: {:.2} µs each ({} back-to-back dispatches, each waiting for the last)",
                r.peak.dispatch_us, r.dependent_dispatches
            )?;
            if r.peak.timed_dispatch_us > 0.0 {
                writeln!(
                    o,
                    "    dependent dispatch with a timestamp after it: {:.2} µs (the least a profiled stage takes)",
                    r.peak.timed_dispatch_us
                )?;
            }
        }
        Ok(_) => {}
    }
    if let Some(hint) = chosen_hint {
        writeln!(o, "note: {hint}")?;
    }
    Ok(())
}

/// On OpenGL over Mesa's llvmpipe on a machine with no Vulkan driver, the advice to install
/// Mesa's Vulkan driver, which runs kiln faster on the same CPU.
pub fn gl_software_hint(ctx: &GpuContext) -> Option<String> {
    let gl_on_cpu = ctx.info.backend == wgpu::Backend::Gl && ctx.caps.cpu_adapter;
    (gl_on_cpu && crate::gpu::list_adapters(Some(wgpu::Backend::Vulkan)).1.is_empty()).then(|| {
        format!(
            "{} is OpenGL on the CPU (llvmpipe); Mesa's Vulkan driver lavapipe runs kiln faster on the same CPU: \
             install it (Debian/Ubuntu: apt-get install mesa-vulkan-drivers; Fedora: dnf install mesa-vulkan-drivers) \
             and kiln will use it",
            ctx.info.name
        )
    })
}
