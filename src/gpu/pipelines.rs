//! One pipeline per typed kernel key, built on first use and reused for the process lifetime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{KilnError, Result};
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

impl GpuContext {
    /// The pipeline for `key`, compiling it the first time it is asked for.
    pub fn pipeline(&self, key: &KernelKey) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.pipelines.map.lock().ok().and_then(|m| m.get(key).cloned()) {
            return Ok(p);
        }
        let src = key.source(&self.caps)?;
        let layout = self.pipeline_layout(key.bindings());
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // A driver that cannot compile the translated shader (GL below 4.3) reports an
        // internal error, not a validation error.
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        // SAFETY: kiln's kernels guard every index against the shapes in their parameters,
        // so wgpu's extra bounds checks would only cost time on the hot path.
        let module = unsafe {
            self.device.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor {
                    label: Some(&src.label),
                    source: wgpu::ShaderSource::Wgsl(src.text.as_str().into()),
                },
                wgpu::ShaderRuntimeChecks::unchecked(),
            )
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
            cache: None,
        });
        let internal = pollster::block_on(internal.pop());
        if let Some(err) = pollster::block_on(scope.pop()).or(internal) {
            return Err(KilnError::Shader { label: src.label, message: innermost_cause(&err) });
        }
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
