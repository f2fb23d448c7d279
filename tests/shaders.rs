//! Every composed shader variant parses and validates with naga, and translates to SPIR-V
//! (Vulkan), MSL (Metal) and HLSL (DX12): a shader another backend would reject fails here,
//! on CI, without that hardware.

use kiln::gpu::shader::validate;
use kiln::gpu::Caps;
use kiln::kernels::KernelKey;

/// The naga capabilities a variant validates under: what it declares it needs, and no more.
fn validation_caps(key: &KernelKey) -> naga::valid::Capabilities {
    let (needs_f16, needs_subgroup) = key.needs();
    // Every adapter kiln accepts unpacks halves (wgpu's SHADER_F16_IN_F32 downlevel flag,
    // checked when the context opens); SHADER_F16 and SUBGROUP are what the ladder varies.
    let mut vcaps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if needs_f16 {
        vcaps |= naga::valid::Capabilities::SHADER_FLOAT16;
    }
    if needs_subgroup {
        vcaps |= naga::valid::Capabilities::SUBGROUP;
    }
    // Cooperative-matrix variants may use subgroup barriers too (`Caps::coopmat`).
    if key.needs_coopmat() {
        vcaps |= naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SUBGROUP_BARRIER;
    }
    // Decode attention that merges its own splits binds its partials @coherent.
    if key.needs_coherent() {
        vcaps |= naga::valid::Capabilities::MEMORY_DECORATION_COHERENT;
    }
    vcaps
}

#[test]
fn every_variant_validates_and_translates() {
    let caps = Caps::baseline();
    let mut failures = Vec::new();
    let variants = KernelKey::all_variants();
    assert!(variants.len() > 100, "expected every format x variant, got {}", variants.len());
    for key in &variants {
        let src = key.source(&caps).expect("compose");
        // Fallback variants must validate without the capability they avoid.
        let (module, info) = match validate(&src, validation_caps(key)) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{key:?}: {e}"));
                continue;
            }
        };
        let entry = key.entry();

        let spv_opts = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
        let spv_pipe = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.to_string(),
        };
        if let Err(e) = naga::back::spv::write_vec(&module, &info, &spv_opts, Some(&spv_pipe)) {
            failures.push(format!("{key:?}: SPIR-V: {e}"));
        }
        // Cooperative-matrix variants run where kiln plans them: Vulkan (16x16 f16 tiles,
        // which Metal's 8x8 SIMD-group matrices and naga's HLSL writer do not offer).
        if key.needs_coopmat() {
            continue;
        }

        // `coherent` device memory is Metal 3.2's (wgpu offers MEMORY_DECORATION_COHERENT there).
        let msl_version = if key.needs_coherent() { (3, 2) } else { (2, 4) };
        let msl_opts = naga::back::msl::Options { lang_version: msl_version, ..Default::default() };
        let msl_pipe = naga::back::msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
            ..Default::default()
        };
        if let Err(e) = naga::back::msl::write_string(&module, &info, &msl_opts, &msl_pipe) {
            failures.push(format!("{key:?}: MSL: {e}"));
        }

        let hlsl_opts =
            naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_2, ..Default::default() };
        let hlsl_pipe =
            naga::back::hlsl::PipelineOptions { entry_point: Some((naga::ShaderStage::Compute, entry.to_string())) };
        let mut hlsl = String::new();
        if let Err(e) = naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_opts, &hlsl_pipe).write(&module, &info, None) {
            failures.push(format!("{key:?}: HLSL: {e}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} variants failed:\n{}", failures.len(), variants.len(), failures.join("\n"));
}

/// Variants that take the adapter's subgroup size as a constant (the int8 GEMV's lane groups)
/// also compose and validate at the fixed sizes of NVIDIA (32) and AMD (64) GPUs, not only at
/// the baseline's: a grouped GEMV of 8-lane groups once divided by zero at 32 (H200, run 379).
#[test]
fn subgroup_sized_variants_validate_at_32_and_64_lanes() {
    for size in [32, 64] {
        let caps = Caps { subgroups: true, subgroup_min: size, subgroup_max: size, ..Caps::baseline() };
        let mut failures = Vec::new();
        let variants: Vec<KernelKey> = KernelKey::all_variants()
            .into_iter()
            .filter(|k| matches!(k, KernelKey::Gemv { subgroups: true, .. }))
            .collect();
        assert!(!variants.is_empty());
        for key in &variants {
            let src = key.source(&caps).expect("compose");
            if let Err(e) = validate(&src, validation_caps(key)) {
                failures.push(format!("{key:?} at {size} lanes: {e}"));
            }
        }
        assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), variants.len(), failures.join("\n"));
    }
}

/// The decode attention variants that merge their own splits also compose and validate
/// without the merge's fence after its count (`Caps::decode_merge_acquire`, NVIDIA's default;
/// the baseline keeps it).
#[test]
fn merging_decode_variants_validate_without_the_acquire() {
    let caps = Caps { decode_merge_acquire: false, ..Caps::baseline() };
    let variants: Vec<KernelKey> = KernelKey::all_variants()
        .into_iter()
        .filter(|k| {
            matches!(k, KernelKey::AttnDecode { merge: true, .. } | KernelKey::AttnDecodeCoop { merge: true, .. })
        })
        .collect();
    assert!(!variants.is_empty());
    let mut failures = Vec::new();
    for key in &variants {
        let src = key.source(&caps).expect("compose");
        assert!(src.text.contains("fn merge_acquire(last: bool) {}"), "{key:?}: the fence left out");
        if let Err(e) = validate(&src, validation_caps(key)) {
            failures.push(format!("{key:?}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), variants.len(), failures.join("\n"));
}

/// Compiled pipelines are kept on disk between runs where the adapter offers PIPELINE_CACHE
/// (Vulkan): the file appears when a context that compiled pipelines is dropped, the next
/// context starts from it, and a file the driver does not accept (corrupt, another driver's)
/// is replaced rather than failing the start.
#[test]
fn pipeline_cache_is_kept_on_disk() {
    use kiln::gpu::{ContextOptions, GpuContext};
    let dir = std::env::temp_dir().join(format!("kiln-pipeline-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = ContextOptions {
        backend: Some(wgpu::Backend::Vulkan),
        pipeline_cache: Some(dir.clone()),
        ..Default::default()
    };
    let key = KernelKey::RmsNorm { subgroups: false, halves: false };
    let file = {
        let ctx = GpuContext::new(&opts).expect("a Vulkan adapter");
        assert!(
            ctx.device.features().contains(wgpu::Features::PIPELINE_CACHE),
            "Vulkan adapters offer PIPELINE_CACHE in wgpu"
        );
        let file = ctx.pipeline_cache_file().expect("a cache file for a Vulkan adapter").to_path_buf();
        assert!(!file.exists(), "nothing is written before a pipeline is compiled");
        ctx.pipeline(&key).expect("compile");
        file
    };
    let saved = std::fs::read(&file).expect("the cache was written when the context was dropped");
    assert!(!saved.is_empty());
    {
        let ctx = GpuContext::new(&opts).expect("reopen");
        ctx.pipeline(&key).expect("compile from the cache");
    }
    // A corrupt file: the start succeeds and the file is replaced by the driver's own data.
    let garbage = vec![0xA5u8; 64];
    std::fs::write(&file, &garbage).unwrap();
    {
        let ctx = GpuContext::new(&opts).expect("a corrupt cache file must not stop the start");
        ctx.pipeline(&key).expect("compile past a corrupt cache");
    }
    let replaced = std::fs::read(&file).unwrap();
    assert_ne!(replaced, garbage, "the corrupt file is replaced");
    // Off: no file is written.
    let _ = std::fs::remove_dir_all(&dir);
    {
        let ctx = GpuContext::new(&ContextOptions { pipeline_cache: None, ..opts.clone() }).unwrap();
        assert!(ctx.pipeline_cache_file().is_none());
        ctx.pipeline(&key).unwrap();
    }
    assert!(!dir.exists());
}

/// `ContextOptions::dump_wgsl` (`KILN_DUMP_WGSL`): each kernel a context compiles is written
/// with its entry point, bindings and override constants, and reads back as a SPIR-V module
/// of that entry point and workgroup size (what `examples/pipeline_stats.rs` hands the
/// driver); a file without that header is refused.
#[test]
fn compiled_kernels_dump_their_wgsl() {
    use kiln::gpu::{dump, ContextOptions, GpuContext};
    let dir = std::env::temp_dir().join(format!("kiln-dump-wgsl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ctx = GpuContext::new(&ContextOptions { dump_wgsl: Some(dir.clone()), ..Default::default() }).unwrap();
    // Kernels this adapter runs, a few of each kind.
    let runs = |k: &KernelKey| {
        let (f16, subgroup) = k.needs();
        !k.needs_coopmat() && (!f16 || ctx.caps.f16) && (!subgroup || ctx.caps.subgroups)
    };
    let mut keys: Vec<KernelKey> = Vec::new();
    for k in KernelKey::all_variants().into_iter().filter(runs) {
        if !keys.iter().any(|o| o.name() == k.name()) && keys.len() < 6 {
            keys.push(k);
        }
    }
    assert_eq!(keys.len(), 6, "six kinds of kernel");
    for key in &keys {
        ctx.pipeline(key).unwrap();
        let src = key.source(&ctx.caps).unwrap();
        let d = dump::read(&dir.join(dump::file_name(&src.label))).unwrap();
        assert_eq!((d.label.as_str(), d.entry.as_str()), (src.label.as_str(), key.entry()));
        assert_eq!(d.bindings, key.bindings());
        let want: Vec<(String, f64)> = src.overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(d.overrides, want, "{}", src.label);
        let (words, size) = d.spirv().unwrap();
        assert_eq!(words.first(), Some(&0x0723_0203), "{}: SPIR-V magic", src.label);
        assert!(size.iter().all(|&s| s >= 1) && size[0] > 1, "{}: workgroup size {size:?}", src.label);
    }
    // Override constants are applied before translation (kiln's kernels set none today).
    let with_override = dir.join("override.wgsl");
    std::fs::write(
        &with_override,
        "// kiln-dump entry: main\n// kiln-dump bindings: read_write\n// kiln-dump overrides: WG=64\n\
         // kiln-dump label: override test\n\
         override WG: u32 = 1u;\n@group(0) @binding(0) var<storage, read_write> y: array<u32>;\n\
         @compute @workgroup_size(WG) fn main(@builtin(local_invocation_index) i: u32) { y[i] = i; }\n",
    )
    .unwrap();
    let d = dump::read(&with_override).unwrap();
    assert_eq!(d.overrides, vec![("WG".to_string(), 64.0)]);
    assert_eq!(d.spirv().unwrap().1, [64, 1, 1]);
    let plain = dir.join("plain.wgsl");
    std::fs::write(&plain, "@compute @workgroup_size(1) fn main() {}\n").unwrap();
    let err = dump::read(&plain).unwrap_err().to_string();
    assert!(err.contains("not a KILN_DUMP_WGSL file"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
