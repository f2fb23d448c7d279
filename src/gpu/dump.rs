//! `KILN_DUMP_WGSL=<dir>`: each kernel's composed WGSL written as it is compiled, with what a
//! tool needs to build the same pipeline outside wgpu (`examples/pipeline_stats.rs` asks the
//! Vulkan driver for each kernel's registers and spills, which wgpu does not expose). Four
//! comment lines come first: the entry point, the bindings in order, the override constants,
//! the label.

use std::path::Path;

use crate::error::{KilnError, Result};
use crate::gpu::shader::ShaderSource;
use crate::kernels::{Binding, KernelKey};

/// One dumped kernel, read back.
#[derive(Debug, Clone)]
pub struct Dump {
    pub label: String,
    pub entry: String,
    pub bindings: Vec<Binding>,
    pub overrides: Vec<(String, f64)>,
    /// The whole file: the header lines are WGSL comments.
    pub text: String,
}

fn binding_name(b: Binding) -> &'static str {
    match b {
        Binding::Uniform => "uniform",
        Binding::Read => "read",
        Binding::ReadWrite => "read_write",
    }
}

/// The file name for a kernel's label: its characters outside `[A-Za-z0-9._-]` as `_`.
pub fn file_name(label: &str) -> String {
    let stem: String =
        label.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    format!("{stem}.wgsl")
}

/// Writes `src` (the kernel `key`'s) into `dir`; a failure is logged, never fatal (a debugging aid).
pub fn write(dir: &Path, key: &KernelKey, src: &ShaderSource) {
    let bindings: Vec<&str> = key.bindings().iter().map(|&b| binding_name(b)).collect();
    let overrides: Vec<String> = src.overrides.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let text = format!(
        "// kiln-dump entry: {}\n// kiln-dump bindings: {}\n// kiln-dump overrides: {}\n// kiln-dump label: {}\n{}",
        key.entry(),
        bindings.join(" "),
        overrides.join(" "),
        src.label,
        src.text
    );
    let name = file_name(&src.label);
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(dir.join(&name), text)) {
        tracing::warn!("KILN_DUMP_WGSL: could not write {name} to {}: {e}", dir.display());
    }
}

/// Reads a file `write` wrote.
pub fn read(path: &Path) -> Result<Dump> {
    let bad = |what: String| KilnError::invalid("WGSL dump", format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let field = |name: &str| {
        text.lines()
            .take(4)
            .find_map(|l| l.strip_prefix(&format!("// kiln-dump {name}:")))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| bad(format!("no `// kiln-dump {name}:` line (not a KILN_DUMP_WGSL file)")))
    };
    let bindings = field("bindings")?
        .split_whitespace()
        .map(|b| match b {
            "uniform" => Ok(Binding::Uniform),
            "read" => Ok(Binding::Read),
            "read_write" => Ok(Binding::ReadWrite),
            other => Err(bad(format!("unknown binding {other}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let overrides = field("overrides")?
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(format!("bad override {kv}")))?;
            let v: f64 = v.parse().map_err(|_| bad(format!("bad override {kv}")))?;
            Ok((k.to_string(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Dump { label: field("label")?, entry: field("entry")?, bindings, overrides, text })
}

impl Dump {
    /// The kernel as SPIR-V 1.6 (Vulkan 1.3), as wgpu writes a trusted module's
    /// (`ShaderRuntimeChecks::unchecked`: no bounds checks, loop bounding or integer-division
    /// checks; workgroup memory not zeroed), its override constants applied; and its
    /// workgroup size.
    pub fn spirv(&self) -> Result<(Vec<u32>, [u32; 3])> {
        let bad = |what: String| KilnError::Shader { label: self.label.clone(), message: what };
        let (module, info) =
            crate::gpu::shader::validate_text(&self.label, &self.text, naga::valid::Capabilities::all())?;
        let mut constants = naga::back::PipelineConstants::default();
        for (k, v) in &self.overrides {
            constants.insert(k.clone(), *v);
        }
        let stage = naga::ShaderStage::Compute;
        let (module, info) =
            naga::back::pipeline_constants::process_overrides(&module, &info, Some((stage, &self.entry)), &constants)
                .map_err(|e| bad(format!("override constants: {e}")))?;
        let size = module
            .entry_points
            .iter()
            .find(|e| e.name == self.entry)
            .map(|e| e.workgroup_size)
            .ok_or_else(|| bad(format!("no entry point {}", self.entry)))?;
        let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
        let options = naga::back::spv::Options {
            lang_version: (1, 6),
            flags: naga::back::spv::WriterFlags::empty(),
            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                index: unchecked,
                buffer: unchecked,
                image_load: unchecked,
                binding_array: unchecked,
            },
            zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
            force_loop_bounding: false,
            emit_int_div_checks: false,
            ..Default::default()
        };
        let pipeline = naga::back::spv::PipelineOptions { shader_stage: stage, entry_point: self.entry.clone() };
        let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
            .map_err(|e| bad(format!("SPIR-V: {e}")))?;
        Ok((words, size))
    }
}
