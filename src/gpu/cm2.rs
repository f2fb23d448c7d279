//! Workgroup-scope cooperative matrices with tensor addressing (VK_NV_cooperative_matrix2,
//! NVIDIA's Vulkan driver), which wgpu neither reports nor enables: whether the adapter's
//! driver offers what `kernels::gemm_cm2` needs, and opening the device with the extension on
//! (through wgpu-hal's `open_with_callback`). Everywhere else, and wherever any step of this
//! fails, kiln opens the device as usual and the planner keeps to the other GEMMs.

/// The extension's feature flags (VkPhysicalDeviceCooperativeMatrix2FeaturesNV; ash 0.38
/// predates it): workgroup scope, flexible dimensions, reductions, conversions, per-element
/// operations, tensor addressing, block loads.
#[repr(C)]
pub struct Features {
    pub s_type: i32,
    pub p_next: *mut std::ffi::c_void,
    pub enabled: [u32; 7],
}

const FEATURES_S_TYPE: i32 = 1_000_593_000;
const FLEXIBLE_S_TYPE: i32 = 1_000_593_001;
const PROPERTIES_S_TYPE: i32 = 1_000_593_002;
/// Of `Features::enabled`, those the kernel uses: workgroup scope, flexible dimensions,
/// tensor addressing.
const NEEDED: [usize; 3] = [0, 1, 5];

impl Features {
    fn new(enabled: [u32; 7]) -> Features {
        Features { s_type: FEATURES_S_TYPE, p_next: std::ptr::null_mut(), enabled }
    }
}

/// VkPhysicalDeviceCooperativeMatrix2PropertiesNV.
#[repr(C)]
pub struct Properties {
    pub s_type: i32,
    pub p_next: *mut std::ffi::c_void,
    pub workgroup_scope_max_workgroup_size: u32,
    pub flexible_dimensions_max_dimension: u32,
    pub workgroup_scope_reserved_shared_memory: u32,
}

/// One entry of vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV: the sizes
/// (multiples of the granularity) a workgroup of that many invocations may use.
#[repr(C)]
pub struct Flexible {
    pub s_type: i32,
    pub p_next: *mut std::ffi::c_void,
    pub granularity_mnk: [u32; 3],
    /// VkComponentTypeKHR of A, B, C and the result.
    pub types_abcr: [i32; 4],
    pub saturating: u32,
    /// VkScopeKHR.
    pub scope: i32,
    pub workgroup_invocations: u32,
}

/// What a device's driver says of the extension: its features, properties and flexible sizes.
pub struct Offer {
    pub features: Features,
    pub properties: Properties,
    pub flexible: Vec<Flexible>,
}

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
mod vulkan {
    use super::*;
    use ash::vk;
    use wgpu::hal::api::Vulkan;

    pub const EXTENSION: &std::ffi::CStr = c"VK_NV_cooperative_matrix2";

    type GetFlexible = unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut Flexible) -> vk::Result;

    /// What the driver of physical device `pd` offers of the extension; None where it does not
    /// list it (or a query fails).
    ///
    /// # Safety
    /// `pd` is a physical device of `instance`, which `entry` loaded.
    pub unsafe fn query(entry: &ash::Entry, instance: &ash::Instance, pd: vk::PhysicalDevice) -> Option<Offer> {
        // SAFETY: every structure passed to the driver is initialized with its sType, and the
        // entry point is the extension's own, with its signature.
        unsafe {
            let exts = instance.enumerate_device_extension_properties(pd).ok()?;
            if !exts.iter().any(|e| e.extension_name_as_c_str() == Ok(EXTENSION)) {
                return None;
            }
            let mut features = Features::new([0; 7]);
            let mut f2 =
                vk::PhysicalDeviceFeatures2 { p_next: (&mut features as *mut Features).cast(), ..Default::default() };
            instance.get_physical_device_features2(pd, &mut f2);
            let mut properties = Properties {
                s_type: PROPERTIES_S_TYPE,
                p_next: std::ptr::null_mut(),
                workgroup_scope_max_workgroup_size: 0,
                flexible_dimensions_max_dimension: 0,
                workgroup_scope_reserved_shared_memory: 0,
            };
            let mut p2 = vk::PhysicalDeviceProperties2 {
                p_next: (&mut properties as *mut Properties).cast(),
                ..Default::default()
            };
            instance.get_physical_device_properties2(pd, &mut p2);
            let name = c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV";
            let get: GetFlexible = std::mem::transmute(entry.get_instance_proc_addr(instance.handle(), name.as_ptr())?);
            let mut n = 0u32;
            if get(pd, &mut n, std::ptr::null_mut()) != vk::Result::SUCCESS {
                return None;
            }
            let mut flexible: Vec<Flexible> = (0..n)
                .map(|_| Flexible {
                    s_type: FLEXIBLE_S_TYPE,
                    p_next: std::ptr::null_mut(),
                    granularity_mnk: [0; 3],
                    types_abcr: [0; 4],
                    saturating: 0,
                    scope: 0,
                    workgroup_invocations: 0,
                })
                .collect();
            if get(pd, &mut n, flexible.as_mut_ptr()) != vk::Result::SUCCESS {
                return None;
            }
            flexible.truncate(n as usize);
            Some(Offer { features, properties, flexible })
        }
    }

    /// Whether the driver offers the extension with the features `gemm_cm2` uses, and its tile
    /// (f16 x f16 -> f32 at workgroup scope, `WG` invocations, sizes in its granularity).
    pub fn offered(adapter: &wgpu::Adapter) -> bool {
        use crate::kernels::gemm_cm2::{BK, BM, BN, WG};
        // SAFETY: the handles come from wgpu-hal's live adapter.
        let Some(offer) = (unsafe {
            adapter.as_hal::<Vulkan>().and_then(|hal| {
                let shared = hal.shared_instance();
                query(shared.entry(), shared.raw_instance(), hal.raw_physical_device())
            })
        }) else {
            return false;
        };
        let (f16, f32) = (vk::ComponentTypeKHR::FLOAT16.as_raw(), vk::ComponentTypeKHR::FLOAT32.as_raw());
        NEEDED.iter().all(|&i| offer.features.enabled[i] != 0)
            && offer.properties.workgroup_scope_max_workgroup_size >= WG
            && offer.properties.flexible_dimensions_max_dimension >= BN
            && offer.flexible.iter().any(|x| {
                let [gm, gn, gk] = x.granularity_mnk;
                x.types_abcr == [f16, f16, f32, f32]
                    && x.scope == vk::ScopeKHR::WORKGROUP.as_raw()
                    && x.workgroup_invocations == WG
                    && gm > 0
                    && gn > 0
                    && gk > 0
                    && BM % gm == 0
                    && BN % gn == 0
                    && BK % gk == 0
            })
    }

    /// The device with the extension and the features `gemm_cm2` uses enabled, and what
    /// `desc` asks; None where opening it so fails (the caller opens it as usual).
    pub fn open(adapter: &wgpu::Adapter, desc: &wgpu::DeviceDescriptor) -> Option<(wgpu::Device, wgpu::Queue)> {
        let mut features = Features::new([0; 7]);
        for i in NEEDED {
            features.enabled[i] = 1;
        }
        let chain = &mut features as *mut Features as *const std::ffi::c_void;
        // SAFETY: the callback only adds the extension (offered: `offered`) and puts the feature
        // structure, which outlives the call, in front of the create info's chain (wgpu-hal
        // appends its own after it); the device is handed to wgpu with the features it was
        // opened with.
        let opened = unsafe {
            let hal = adapter.as_hal::<Vulkan>()?;
            let callback = move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs| {
                args.extensions.push(EXTENSION);
                args.create_info.p_next = chain;
            };
            hal.open_with_callback(
                desc.required_features,
                &desc.required_limits,
                &desc.memory_hints,
                Some(Box::new(callback)),
            )
        };
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                tracing::debug!("device with {EXTENSION:?} not opened: {e}");
                return None;
            }
        };
        // SAFETY: `opened` is this adapter's device, opened with `desc`'s features and limits.
        match unsafe { adapter.create_device_from_hal::<Vulkan>(opened, desc) } {
            Ok(pair) => Some(pair),
            Err(e) => {
                tracing::debug!("device with {EXTENSION:?} not taken by wgpu: {e}");
                None
            }
        }
    }
}

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
pub use vulkan::{offered, open, query, EXTENSION};

/// No Vulkan backend on this platform.
#[cfg(not(any(windows, all(unix, not(target_vendor = "apple")))))]
pub fn offered(_adapter: &wgpu::Adapter) -> bool {
    false
}

#[cfg(not(any(windows, all(unix, not(target_vendor = "apple")))))]
pub fn open(_adapter: &wgpu::Adapter, _desc: &wgpu::DeviceDescriptor) -> Option<(wgpu::Device, wgpu::Queue)> {
    None
}
