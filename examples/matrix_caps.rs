//! What each Vulkan device offers for matrix cores, by the driver's own account: the shared
//! memory a workgroup may have, the extensions about cooperative matrices and shaders, the
//! VK_KHR_cooperative_matrix sizes, and VK_NV_cooperative_matrix2's features, properties and
//! flexible (workgroup-scope) sizes, none of which wgpu reports.
//! `cargo run --release --example matrix_caps`. A diagnostic tool: it opens only an instance.
//! (H200, driver 580.159.04, run 485: workgroup-scope matrices of f16 with f32 accumulators in
//! multiples of 32x32x16 at 256 invocations, 8,192 bytes of shared memory reserved for them.)

#![cfg_attr(not(any(windows, all(unix, not(target_vendor = "apple")))), allow(unused))]

use std::ffi::CStr;

use ash::vk;

/// Platforms without Vulkan in kiln's build (`kiln::gpu::cm2` is Vulkan's).
#[cfg(not(any(windows, all(unix, not(target_vendor = "apple")))))]
fn main() {
    eprintln!("matrix_caps: Vulkan platforms only (Linux, Windows)");
}

fn scope(s: i32) -> &'static str {
    match s {
        1 => "device",
        2 => "workgroup",
        3 => "subgroup",
        _ => "other",
    }
}

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
fn main() -> Result<(), String> {
    use kiln::gpu::cm2::query;
    // SAFETY: loading the system's Vulkan loader; every call below follows the spec's rules
    // for the handles it uses, and every structure passed is initialized with its sType.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("no Vulkan loader: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    let instance = unsafe { entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None) }
        .map_err(|e| format!("vkCreateInstance: {e}"))?;
    let devices = unsafe { instance.enumerate_physical_devices() }.map_err(|e| format!("no devices: {e}"))?;
    for pd in devices {
        let props = unsafe { instance.get_physical_device_properties(pd) };
        let name = props.device_name_as_c_str().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        println!("device {name}: driver {:#x}, Vulkan {:#x}", props.driver_version, props.api_version);
        println!("  shared memory a workgroup: {} bytes", props.limits.max_compute_shared_memory_size);
        let exts = unsafe { instance.enumerate_device_extension_properties(pd) }.map_err(|e| e.to_string())?;
        let has = |n: &CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(n));
        for e in &exts {
            let n = e.extension_name_as_c_str().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            if n.contains("cooperative") || n.contains("shader") {
                println!("  extension {n} (revision {})", e.spec_version);
            }
        }
        if has(ash::khr::cooperative_matrix::NAME) {
            let cm = ash::khr::cooperative_matrix::Instance::new(&entry, &instance);
            let list =
                unsafe { cm.get_physical_device_cooperative_matrix_properties(pd) }.map_err(|e| e.to_string())?;
            for p in list {
                println!(
                    "  KHR matrix {}x{}x{} A {:?} B {:?} C {:?} result {:?} at {:?} scope",
                    p.m_size, p.n_size, p.k_size, p.a_type, p.b_type, p.c_type, p.result_type, p.scope
                );
            }
        }
        // SAFETY: pd is a physical device of this instance, which `entry` loaded.
        let Some(offer) = (unsafe { query(&entry, &instance, pd) }) else { continue };
        println!(
            "  NV cooperative_matrix2 features (workgroup scope, flexible dimensions, reductions, conversions, \
             per-element operations, tensor addressing, block loads): {:?}",
            offer.features.enabled
        );
        let p = &offer.properties;
        println!(
            "  NV workgroup scope: at most {} invocations, {} bytes of shared memory reserved; flexible sizes up to {}",
            p.workgroup_scope_max_workgroup_size,
            p.workgroup_scope_reserved_shared_memory,
            p.flexible_dimensions_max_dimension
        );
        for x in &offer.flexible {
            let [m, n, k] = x.granularity_mnk;
            let t = x.types_abcr.map(vk::ComponentTypeKHR::from_raw);
            println!(
                "  NV flexible sizes in multiples of {m}x{n}x{k}: A {:?} B {:?} C {:?} result {:?} at {} scope, {} invocations",
                t[0],
                t[1],
                t[2],
                t[3],
                scope(x.scope),
                x.workgroup_invocations
            );
        }
    }
    Ok(())
}
