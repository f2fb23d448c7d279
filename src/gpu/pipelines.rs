//! One pipeline per typed kernel key, built on first use and reused for the process lifetime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{KilnError, Result};
use crate::gpu::GpuContext;
use crate::kernels::KernelKey;

#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<KernelKey, Arc<wgpu::ComputePipeline>>>,
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
        if let Some(p) = self
            .pipelines
            .map
            .lock()
            .ok()
            .and_then(|m| m.get(key).cloned())
        {
            return Ok(p);
        }
        let src = key.source(&self.caps)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
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
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&src.label),
                layout: None,
                module: &module,
                entry_point: Some(key.entry()),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &src.overrides,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(KilnError::Shader {
                label: src.label,
                message: err.to_string(),
            });
        }
        let pipeline = Arc::new(pipeline);
        if let Ok(mut m) = self.pipelines.map.lock() {
            m.insert(*key, pipeline.clone());
        }
        Ok(pipeline)
    }
}
