//! What each Vulkan device offers for matrix cores, by the driver's own account: the shared
//! memory a workgroup may have, the extensions about cooperative matrices and shaders, the
//! VK_KHR_cooperative_matrix sizes, and VK_NV_cooperative_matrix2's features, properties and
//! flexible (workgroup-scope) sizes, none of which wgpu reports.
//! `cargo run --release --example matrix_caps`. A diagnostic tool: it opens only an instance.
//! (H200, driver 580.159.04, run 485: workgroup-scope matrices of f16 with f32 accumulators in
//! multiples of 32x32x16 at 256 invocations, 8,192 bytes of shared memory reserved for them.)

use std::ffi::{c_void, CStr};

use ash::vk;

const NV_CM2: &CStr = c"VK_NV_cooperative_matrix2";

/// VK_NV_cooperative_matrix2's structures (ash 0.38 predates the extension).
#[repr(C)]
struct Cm2Features {
    s_type: i32,
    p_next: *mut c_void,
    /// workgroup scope, flexible dimensions, reductions, conversions, per-element operations,
    /// tensor addressing, block loads
    enabled: [u32; 7],
}

#[repr(C)]
struct Cm2Properties {
    s_type: i32,
    p_next: *mut c_void,
    workgroup_scope_max_workgroup_size: u32,
    flexible_dimensions_max_dimension: u32,
    workgroup_scope_reserved_shared_memory: u32,
}

#[repr(C)]
struct FlexibleDimensions {
    s_type: i32,
    p_next: *mut c_void,
    granularity_mnk: [u32; 3],
    types_abcr: [i32; 4],
    saturating: u32,
    scope: i32,
    workgroup_invocations: u32,
}

type GetFlexible = unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexibleDimensions) -> vk::Result;

fn scope(s: i32) -> &'static str {
    match s {
        1 => "device",
        2 => "workgroup",
        3 => "subgroup",
        _ => "other",
    }
}

fn main() -> Result<(), String> {
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
        if !has(NV_CM2) {
            continue;
        }
        let mut features = Cm2Features { s_type: 1000593000, p_next: std::ptr::null_mut(), enabled: [0; 7] };
        let mut f2 =
            vk::PhysicalDeviceFeatures2 { p_next: (&mut features as *mut Cm2Features).cast(), ..Default::default() };
        unsafe { instance.get_physical_device_features2(pd, &mut f2) };
        println!(
            "  NV cooperative_matrix2 features (workgroup scope, flexible dimensions, reductions, conversions, \
             per-element operations, tensor addressing, block loads): {:?}",
            features.enabled
        );
        let mut cm2 = Cm2Properties {
            s_type: 1000593002,
            p_next: std::ptr::null_mut(),
            workgroup_scope_max_workgroup_size: 0,
            flexible_dimensions_max_dimension: 0,
            workgroup_scope_reserved_shared_memory: 0,
        };
        let mut p2 =
            vk::PhysicalDeviceProperties2 { p_next: (&mut cm2 as *mut Cm2Properties).cast(), ..Default::default() };
        unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
        println!(
            "  NV workgroup scope: at most {} invocations, {} bytes of shared memory reserved; flexible sizes up to {}",
            cm2.workgroup_scope_max_workgroup_size,
            cm2.workgroup_scope_reserved_shared_memory,
            cm2.flexible_dimensions_max_dimension
        );
        let f = c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV";
        let Some(f) = (unsafe { entry.get_instance_proc_addr(instance.handle(), f.as_ptr()) }) else { continue };
        // SAFETY: the entry point of that name has this signature (VK_NV_cooperative_matrix2).
        let f: GetFlexible = unsafe { std::mem::transmute(f) };
        let mut n = 0u32;
        unsafe { f(pd, &mut n, std::ptr::null_mut()) }.result().map_err(|e| e.to_string())?;
        let mut list: Vec<FlexibleDimensions> = (0..n)
            .map(|_| FlexibleDimensions {
                s_type: 1000593001,
                p_next: std::ptr::null_mut(),
                granularity_mnk: [0; 3],
                types_abcr: [0; 4],
                saturating: 0,
                scope: 0,
                workgroup_invocations: 0,
            })
            .collect();
        unsafe { f(pd, &mut n, list.as_mut_ptr()) }.result().map_err(|e| e.to_string())?;
        for x in list.iter().take(n as usize) {
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
