//! One pipeline per typed kernel key, built on first use and reused for the process lifetime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{KilnError, Result};
use crate::gpu::shader::ShaderSource;
use crate::gpu::GpuContext;
use crate::kernels::{Binding, KernelKey};

#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<KernelKey, Arc<wgpu::ComputePipeline>>>,
    layouts: Mutex<HashMap<&'static [Binding], (wgpu::BindGroupLayout, wgpu::PipelineLayout)>>,
}

impl PipelineCache {
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The driver's compiled pipelines, kept in a file per adapter between runs (wgpu's
/// PIPELINE_CACHE, Vulkan only): a second start compiles from the cache instead of from
/// scratch. The file is rewritten when pipelines were compiled that it did not hold.
pub struct DiskCache {
    pub(crate) cache: wgpu::PipelineCache,
    path: std::path::PathBuf,
    /// Pipelines compiled since the file was read or written.
    compiled: std::sync::atomic::AtomicUsize,
    /// The file's contents as last read or written (nothing to write while they match).
    on_disk: std::sync::Mutex<Vec<u8>>,
}

impl DiskCache {
    /// The cache for this adapter in `dir`, seeded from its file when there is one (a file
    /// the driver does not accept, e.g. from an older driver, is ignored). None where wgpu
    /// has no cache key for the backend.
    pub fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo, dir: &std::path::Path) -> Option<DiskCache> {
        let path = dir.join(wgpu::util::pipeline_cache_key(info)?);
        let data = std::fs::read(&path).ok();
        // SAFETY: the data is only ever what `get_data` returned for this adapter key, and
        // with `fallback` wgpu and the driver validate it (header, device, driver version)
        // and start empty where it does not match.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("kiln pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        tracing::debug!(
            "pipeline cache {}: {}",
            path.display(),
            data.as_ref().map(|d| format!("{} bytes read", d.len())).unwrap_or_else(|| "new".into())
        );
        Some(DiskCache {
            cache,
            path,
            compiled: Default::default(),
            on_disk: std::sync::Mutex::new(data.unwrap_or_default()),
        })
    }

    /// Writes the cache to its file if pipelines were compiled since it was read (through a
    /// temporary file and a rename, so concurrent runs never see half a file). Failing to
    /// write costs only the next start's time, so it is logged, not returned.
    pub fn save(&self) {
        use std::sync::atomic::Ordering;
        if self.compiled.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        let Some(data) = self.cache.get_data() else { return };
        let mut on_disk = match self.on_disk.lock() {
            Ok(d) => d,
            Err(poisoned) => poisoned.into_inner(),
        };
        if *on_disk == data {
            return;
        }
        let tmp = self.path.with_extension(format!("tmp{}", std::process::id()));
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(&tmp, &data))
            .and_then(|_| std::fs::rename(&tmp, &self.path));
        match written {
            Ok(()) => {
                tracing::debug!("pipeline cache {}: {} bytes written", self.path.display(), data.len());
                *on_disk = data;
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                tracing::debug!("pipeline cache {} not written: {e}", self.path.display());
            }
        }
    }

    /// The file the cache is kept in.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl GpuContext {
    /// Saves the driver's pipeline cache to disk where there is one and it grew (see
    /// `DiskCache`); also done when the context is dropped.
    pub fn save_pipeline_cache(&self) {
        if let Some(d) = &self.disk_cache {
            d.save();
        }
    }

    /// The file compiled pipelines are kept in between runs, where there is one.
    pub fn pipeline_cache_file(&self) -> Option<&std::path::Path> {
        self.disk_cache.as_ref().map(|d| d.path())
    }

    /// The pipeline for `key`, compiling it the first time it is asked for: composed from
    /// WGSL, or for the kernels written as SPIR-V (`KernelKey::spirv`) passed through to the
    /// driver as they are (wgpu's PASSTHROUGH_SHADERS: no naga, no validation of the module).
    pub fn pipeline(&self, key: &KernelKey) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.pipelines.map.lock().ok().and_then(|m| m.get(key).cloned()) {
            return Ok(p);
        }
        let spirv = key.spirv().transpose()?;
        let src = match &spirv {
            Some(_) if !self.caps.cm2 => {
                return Err(KilnError::Shader {
                    label: format!("{key:?}"),
                    message: "SPIR-V kernels run only on a device opened for them (Caps::cm2)".into(),
                })
            }
            Some(_) => ShaderSource { label: format!("{key:?}"), text: String::new(), overrides: Vec::new() },
            None => key.source(&self.caps)?,
        };
        if let (None, Some(dir)) = (&spirv, &self.dump_wgsl) {
            crate::gpu::dump::write(dir, key, &src);
        }
        let layout = self.pipeline_layout(key.bindings());
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // A driver that cannot compile the translated shader (GL below 4.3) reports an
        // internal error, not a validation error.
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let module = match &spirv {
            // SAFETY: the module is kiln's own (kernels/gemm_cm2.rs), for a device that enabled
            // every capability it declares (`Caps::cm2`); its entry point and workgroup size
            // are given here.
            Some(words) => unsafe {
                self.device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                    label: Some(&src.label),
                    entry_points: std::borrow::Cow::Owned(vec![wgpu::PassthroughShaderEntryPoint {
                        name: key.entry().into(),
                        workgroup_size: (crate::kernels::gemm_cm2::WG, 1, 1),
                    }]),
                    spirv: Some(std::borrow::Cow::Borrowed(words)),
                    ..Default::default()
                })
            },
            // SAFETY: kiln's kernels guard every index against the shapes in their parameters,
            // so wgpu's extra bounds checks would only cost time on the hot path.
            None => unsafe {
                self.device.create_shader_module_trusted(
                    wgpu::ShaderModuleDescriptor {
                        label: Some(&src.label),
                        source: wgpu::ShaderSource::Wgsl(src.text.as_str().into()),
                    },
                    wgpu::ShaderRuntimeChecks::unchecked(),
                )
            },
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&src.label),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(key.entry()),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &src.overrides,
                zero_initialize_workgroup_memory: false,
            },
            cache: self.disk_cache.as_ref().map(|d| &d.cache),
        });
        if let Some(d) = &self.disk_cache {
            d.compiled.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let internal = pollster::block_on(internal.pop());
        if let Some(err) = pollster::block_on(scope.pop()).or(internal) {
            return Err(KilnError::Shader { label: src.label, message: innermost_cause(&err) });
        }
        tracing::debug!("pipeline compiled{}: {}", if spirv.is_some() { " (SPIR-V)" } else { "" }, src.label);
        let pipeline = Arc::new(pipeline);
        if let Ok(mut m) = self.pipelines.map.lock() {
            m.insert(*key, pipeline.clone());
        }
        Ok(pipeline)
    }

    /// One layout per distinct binding list, shared by every kernel that uses it.
    fn pipeline_layout(&self, bindings: &'static [Binding]) -> wgpu::PipelineLayout {
        let mut layouts = match self.pipelines.layouts.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((_, pl)) = layouts.get(bindings) {
            return pl.clone();
        }
        let entries: Vec<wgpu::BindGroupLayoutEntry> = bindings
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match b {
                        Binding::Uniform => wgpu::BufferBindingType::Uniform,
                        Binding::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Binding::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some("kiln"), entries: &entries });
        let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("kiln"),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        layouts.insert(bindings, (bgl, pl.clone()));
        pl
    }
}

/// The innermost cause of an error, on one line: wgpu's own message is only "Validation
/// Error", and its display repeats every cause over several lines.
pub fn innermost_cause(e: &dyn std::error::Error) -> String {
    let mut last = e;
    while let Some(c) = last.source() {
        last = c;
    }
    last.to_string().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

impl Drop for GpuContext {
    fn drop(&mut self) {
        self.save_pipeline_cache();
    }
}
