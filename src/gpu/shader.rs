//! Shader composition: a kernel's WGSL is a few whitelisted files (a format prelude, common
//! helpers, the op's body) behind a header of typed constants generated from its key.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{KilnError, Result};

/// Every WGSL file kiln ships, embedded at build time. Composition can only name these.
pub const FILES: &[(&str, &str)] = &[
    ("common/quant.wgsl", include_str!("../../wgsl/common/quant.wgsl")),
    ("common/quant_words.wgsl", include_str!("../../wgsl/common/quant_words.wgsl")),
    ("common/reduce_subgroup.wgsl", include_str!("../../wgsl/common/reduce_subgroup.wgsl")),
    ("common/reduce_shared.wgsl", include_str!("../../wgsl/common/reduce_shared.wgsl")),
    ("common/kv_f32.wgsl", include_str!("../../wgsl/common/kv_f32.wgsl")),
    ("common/kv_f16_native.wgsl", include_str!("../../wgsl/common/kv_f16_native.wgsl")),
    ("common/kv_f16_packed.wgsl", include_str!("../../wgsl/common/kv_f16_packed.wgsl")),
    ("common/kv_rows_vec.wgsl", include_str!("../../wgsl/common/kv_rows_vec.wgsl")),
    ("common/kv_rows_scalar.wgsl", include_str!("../../wgsl/common/kv_rows_scalar.wgsl")),
    ("formats/f32.wgsl", include_str!("../../wgsl/formats/f32.wgsl")),
    ("formats/f16.wgsl", include_str!("../../wgsl/formats/f16.wgsl")),
    ("common/half8.wgsl", include_str!("../../wgsl/common/half8.wgsl")),
    ("common/gemm_x_f32.wgsl", include_str!("../../wgsl/common/gemm_x_f32.wgsl")),
    ("common/gemm_x_f16.wgsl", include_str!("../../wgsl/common/gemm_x_f16.wgsl")),
    ("common/gemm_w_decode.wgsl", include_str!("../../wgsl/common/gemm_w_decode.wgsl")),
    ("common/coop_w_decode.wgsl", include_str!("../../wgsl/common/coop_w_decode.wgsl")),
    ("common/coop_w_half.wgsl", include_str!("../../wgsl/common/coop_w_half.wgsl")),
    ("formats/bf16.wgsl", include_str!("../../wgsl/formats/bf16.wgsl")),
    ("formats/q8_0.wgsl", include_str!("../../wgsl/formats/q8_0.wgsl")),
    ("formats/q4_k.wgsl", include_str!("../../wgsl/formats/q4_k.wgsl")),
    ("formats/q5_k.wgsl", include_str!("../../wgsl/formats/q5_k.wgsl")),
    ("formats/q6_k.wgsl", include_str!("../../wgsl/formats/q6_k.wgsl")),
    ("common/weights_words.wgsl", include_str!("../../wgsl/common/weights_words.wgsl")),
    ("common/weights_vec4.wgsl", include_str!("../../wgsl/common/weights_vec4.wgsl")),
    ("common/matmul_params.wgsl", include_str!("../../wgsl/common/matmul_params.wgsl")),
    ("common/gemv_input.wgsl", include_str!("../../wgsl/common/gemv_input.wgsl")),
    ("common/gemv_output.wgsl", include_str!("../../wgsl/common/gemv_output.wgsl")),
    ("common/inv_rms.wgsl", include_str!("../../wgsl/common/inv_rms.wgsl")),
    ("common/gemv_rows.wgsl", include_str!("../../wgsl/common/gemv_rows.wgsl")),
    ("common/gemv_q8_rows.wgsl", include_str!("../../wgsl/common/gemv_q8_rows.wgsl")),
    ("common/gemv_one_format.wgsl", include_str!("../../wgsl/common/gemv_one_format.wgsl")),
    ("common/gemv_two_formats.wgsl", include_str!("../../wgsl/common/gemv_two_formats.wgsl")),
    ("common/gemm_io.wgsl", include_str!("../../wgsl/common/gemm_io.wgsl")),
    ("common/matmul_epilogue.wgsl", include_str!("../../wgsl/common/matmul_epilogue.wgsl")),
    ("common/epilogue_qkv.wgsl", include_str!("../../wgsl/common/epilogue_qkv.wgsl")),
    ("common/step_one.wgsl", include_str!("../../wgsl/common/step_one.wgsl")),
    ("common/step_columns.wgsl", include_str!("../../wgsl/common/step_columns.wgsl")),
    ("common/flash_segment.wgsl", include_str!("../../wgsl/common/flash_segment.wgsl")),
    ("common/flash_one.wgsl", include_str!("../../wgsl/common/flash_one.wgsl")),
    ("common/flash_segments.wgsl", include_str!("../../wgsl/common/flash_segments.wgsl")),
    ("common/sample_common.wgsl", include_str!("../../wgsl/common/sample_common.wgsl")),
    ("common/sample_one.wgsl", include_str!("../../wgsl/common/sample_one.wgsl")),
    ("common/sample_columns.wgsl", include_str!("../../wgsl/common/sample_columns.wgsl")),
    ("common/sample_chain.wgsl", include_str!("../../wgsl/common/sample_chain.wgsl")),
    ("common/sample_no_chain.wgsl", include_str!("../../wgsl/common/sample_no_chain.wgsl")),
    ("common/epilogue_none.wgsl", include_str!("../../wgsl/common/epilogue_none.wgsl")),
    ("gemv.wgsl", include_str!("../../wgsl/gemv.wgsl")),
    ("gemv_q8.wgsl", include_str!("../../wgsl/gemv_q8.wgsl")),
    ("quantize_q8.wgsl", include_str!("../../wgsl/quantize_q8.wgsl")),
    ("quantize_q8_lanes.wgsl", include_str!("../../wgsl/quantize_q8_lanes.wgsl")),
    ("common/q8_block.wgsl", include_str!("../../wgsl/common/q8_block.wgsl")),
    ("common/coop_out.wgsl", include_str!("../../wgsl/common/coop_out.wgsl")),
    ("common/decode_coop_direct.wgsl", include_str!("../../wgsl/common/decode_coop_direct.wgsl")),
    ("common/decode_coop_staged.wgsl", include_str!("../../wgsl/common/decode_coop_staged.wgsl")),
    ("common/decode_merge.wgsl", include_str!("../../wgsl/common/decode_merge.wgsl")),
    ("common/decode_merge_none.wgsl", include_str!("../../wgsl/common/decode_merge_none.wgsl")),
    ("common/decode_merge_acquire.wgsl", include_str!("../../wgsl/common/decode_merge_acquire.wgsl")),
    ("common/decode_merge_acquire_none.wgsl", include_str!("../../wgsl/common/decode_merge_acquire_none.wgsl")),
    ("common/q8_out.wgsl", include_str!("../../wgsl/common/q8_out.wgsl")),
    ("common/q8_out_none.wgsl", include_str!("../../wgsl/common/q8_out_none.wgsl")),
    ("common/q8_out_norm.wgsl", include_str!("../../wgsl/common/q8_out_norm.wgsl")),
    ("common/q8_out_unweighted.wgsl", include_str!("../../wgsl/common/q8_out_unweighted.wgsl")),
    ("common/q8_in_global.wgsl", include_str!("../../wgsl/common/q8_in_global.wgsl")),
    ("common/q8_in_local.wgsl", include_str!("../../wgsl/common/q8_in_local.wgsl")),
    ("common/q8_prepare_lanes.wgsl", include_str!("../../wgsl/common/q8_prepare_lanes.wgsl")),
    ("common/q8_prepare_subgroups.wgsl", include_str!("../../wgsl/common/q8_prepare_subgroups.wgsl")),
    ("common/q8_lanes8.wgsl", include_str!("../../wgsl/common/q8_lanes8.wgsl")),
    ("common/norm_out_f32.wgsl", include_str!("../../wgsl/common/norm_out_f32.wgsl")),
    ("common/norm_out_f16.wgsl", include_str!("../../wgsl/common/norm_out_f16.wgsl")),
    ("common/epilogue_f16_out.wgsl", include_str!("../../wgsl/common/epilogue_f16_out.wgsl")),
    ("to_half.wgsl", include_str!("../../wgsl/to_half.wgsl")),
    ("dequant_f16.wgsl", include_str!("../../wgsl/dequant_f16.wgsl")),
    ("common/chunk_half8.wgsl", include_str!("../../wgsl/common/chunk_half8.wgsl")),
    ("probe_coop.wgsl", include_str!("../../wgsl/probe_coop.wgsl")),
    ("flash_attention_coop.wgsl", include_str!("../../wgsl/flash_attention_coop.wgsl")),
    ("flash_combine.wgsl", include_str!("../../wgsl/flash_combine.wgsl")),
    ("gemm.wgsl", include_str!("../../wgsl/gemm.wgsl")),
    ("gemm_reduce.wgsl", include_str!("../../wgsl/gemm_reduce.wgsl")),
    ("gemm_micro_4x4.wgsl", include_str!("../../wgsl/gemm_micro_4x4.wgsl")),
    ("gemm_micro_8x8.wgsl", include_str!("../../wgsl/gemm_micro_8x8.wgsl")),
    ("gemm_coop.wgsl", include_str!("../../wgsl/gemm_coop.wgsl")),
    ("embed.wgsl", include_str!("../../wgsl/embed.wgsl")),
    ("attention_prefill.wgsl", include_str!("../../wgsl/attention_prefill.wgsl")),
    ("softmax.wgsl", include_str!("../../wgsl/softmax.wgsl")),
    ("flash_attention.wgsl", include_str!("../../wgsl/flash_attention.wgsl")),
    ("attention_decode.wgsl", include_str!("../../wgsl/attention_decode.wgsl")),
    ("attention_decode_coop.wgsl", include_str!("../../wgsl/attention_decode_coop.wgsl")),
    ("attention_combine.wgsl", include_str!("../../wgsl/attention_combine.wgsl")),
    ("rope.wgsl", include_str!("../../wgsl/rope.wgsl")),
    ("rms_norm.wgsl", include_str!("../../wgsl/rms_norm.wgsl")),
    ("reduce_norm.wgsl", include_str!("../../wgsl/reduce_norm.wgsl")),
    ("elementwise.wgsl", include_str!("../../wgsl/elementwise.wgsl")),
    ("argmax.wgsl", include_str!("../../wgsl/argmax.wgsl")),
    ("sample.wgsl", include_str!("../../wgsl/sample.wgsl")),
    ("sample_prune.wgsl", include_str!("../../wgsl/sample_prune.wgsl")),
    ("nll.wgsl", include_str!("../../wgsl/nll.wgsl")),
    ("probe.wgsl", include_str!("../../wgsl/probe.wgsl")),
];

/// The text of one of kiln's WGSL files. `KILN_WGSL_DIR`: a file of the same name in that
/// directory replaces the built-in one (to try a kernel variant on a GPU machine without
/// rebuilding; the pipeline cache is keyed by the compiled code, so it never serves a stale one).
fn file(name: &str) -> Result<Cow<'static, str>> {
    static DIR: OnceLock<std::result::Result<Option<PathBuf>, (PathBuf, String)>> = OnceLock::new();
    let dir = DIR.get_or_init(|| match std::env::var_os("KILN_WGSL_DIR").map(PathBuf::from) {
        Some(dir) => stray_replacement(&dir).map_or(Ok(Some(dir)), Err),
        None => Ok(None),
    });
    let dir =
        dir.as_ref().map_err(|(path, message)| KilnError::File { path: path.clone(), message: message.clone() })?;
    if let Some(dir) = dir {
        if let Some(text) = replacement(dir, name)? {
            return Ok(Cow::Owned(text));
        }
    }
    FILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| Cow::Borrowed(*text))
        .ok_or_else(|| KilnError::Shader { label: name.to_string(), message: "no such WGSL file".into() })
}

/// The first WGSL file under `dir` that replaces none of kiln's, with a message naming kiln's
/// file of that name where there is one: a replacement at the wrong path would leave the
/// built-in kernel running while its figures were read as the variant's.
fn stray_replacement(dir: &Path) -> Option<(PathBuf, String)> {
    fn walk(dir: &Path, rel: &str, depth: u32, found: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            let path = e.path();
            if path.is_dir() && depth < 4 {
                walk(&path, &rel, depth + 1, found);
            } else if name.ends_with(".wgsl") {
                found.push(rel);
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, "", 0, &mut found);
    found.sort();
    let stray = found.into_iter().find(|rel| !kiln_has(rel))?;
    let base = stray.rsplit('/').next().unwrap_or(&stray);
    let kiln_own = FILES.iter().map(|(n, _)| *n).find(|n| n.rsplit('/').next() == Some(base));
    let message = match kiln_own {
        Some(own) => format!(
            "in KILN_WGSL_DIR, replaces none of kiln's WGSL files: kiln's {base} is {own}, so put it at {}",
            dir.join(own).display()
        ),
        None => "in KILN_WGSL_DIR, replaces none of kiln's WGSL files (named as under wgsl/)".to_string(),
    };
    Some((dir.join(&stray), message))
}

/// Whether `name` (a path under wgsl/) is one of kiln's WGSL files.
fn kiln_has(name: &str) -> bool {
    FILES.iter().any(|(n, _)| *n == name)
}

/// `dir/name` where it exists (a file kiln has: a replacement, not an addition).
fn replacement(dir: &Path, name: &str) -> Result<Option<String>> {
    if !kiln_has(name) {
        return Ok(None);
    }
    let path = dir.join(name);
    if !path.is_file() {
        return Ok(None);
    }
    std::fs::read_to_string(&path).map(Some).map_err(|e| KilnError::Shader {
        label: name.to_string(),
        message: format!("cannot read {} (KILN_WGSL_DIR): {e}", path.display()),
    })
}

/// A composed shader, ready for naga or wgpu.
#[derive(Debug, Clone)]
pub struct ShaderSource {
    pub label: String,
    pub text: String,
    /// `override` constants set at pipeline creation (workgroup sizes and other knobs).
    pub overrides: Vec<(&'static str, f64)>,
}

/// What a composed shader is made of after its header.
#[derive(Debug)]
enum Part {
    File(&'static str),
    /// Files composed a second time under other names (`Composer::include_renamed`).
    Renamed {
        files: Vec<&'static str>,
        suffix: &'static str,
        binding: u32,
    },
}

/// Builds a shader from a header of constants and a list of files.
#[derive(Debug, Default)]
pub struct Composer {
    label: String,
    enable_f16: bool,
    enable_coopmat: bool,
    header: Vec<String>,
    files: Vec<Part>,
    overrides: Vec<(&'static str, f64)>,
}

impl Composer {
    pub fn new(label: impl Into<String>) -> Composer {
        Composer { label: label.into(), ..Default::default() }
    }
    pub fn enable_f16(mut self, on: bool) -> Self {
        self.enable_f16 = on;
        self
    }
    /// wgpu's cooperative-matrix extension (EXPERIMENTAL_COOPERATIVE_MATRIX).
    pub fn enable_coopmat(mut self, on: bool) -> Self {
        self.enable_coopmat = on;
        self
    }
    /// A compile-time constant: for what WGSL needs as a `const` (array sizes, unrolled loops).
    pub fn const_u32(mut self, name: &str, v: u32) -> Self {
        self.header.push(format!("const {name}: u32 = {v}u;"));
        self
    }
    pub fn const_bool(mut self, name: &str, v: bool) -> Self {
        self.header.push(format!("const {name}: bool = {v};"));
        self
    }
    /// A pipeline-overridable constant (`override NAME: u32 = …;` in the file).
    pub fn override_u32(mut self, name: &'static str, v: u32) -> Self {
        self.overrides.push((name, v as f64));
        self
    }
    pub fn include(mut self, name: &'static str) -> Self {
        self.files.push(Part::File(name));
        self
    }
    /// `files` once more, every name they declare at module scope given `suffix` and their
    /// weights binding (1) moved to `binding`: a second copy of a format's decoding and of a
    /// body over another weights buffer (a GEMV over two formats). The files must declare
    /// module-scope items unindented and bind nothing but the weights.
    pub fn include_renamed(mut self, files: &[&'static str], suffix: &'static str, binding: u32) -> Self {
        self.files.push(Part::Renamed { files: files.to_vec(), suffix, binding });
        self
    }
    pub fn build(self) -> Result<ShaderSource> {
        let mut text = String::new();
        if self.enable_f16 {
            text.push_str("enable f16;\n");
        }
        if self.enable_coopmat {
            text.push_str("enable wgpu_cooperative_matrix;\n");
        }
        text.push_str(&format!("// kiln shader: {}\n", self.label));
        for line in &self.header {
            text.push_str(line);
            text.push('\n');
        }
        for part in &self.files {
            match part {
                Part::File(name) => {
                    text.push_str(&format!("\n// ---- {name} ----\n"));
                    text.push_str(&file(name)?);
                }
                Part::Renamed { files, suffix, binding } => {
                    let texts = files.iter().map(|n| file(n)).collect::<Result<Vec<_>>>()?;
                    let names: std::collections::HashSet<String> =
                        texts.iter().flat_map(|t| declared_names(t)).collect();
                    for (name, t) in files.iter().zip(&texts) {
                        text.push_str(&format!("\n// ---- {name} (names{suffix}, binding {binding}) ----\n"));
                        let t = t.replace("@binding(1)", &format!("@binding({binding})"));
                        text.push_str(&rename(&t, &names, suffix));
                    }
                }
            }
        }
        Ok(ShaderSource { label: self.label, text, overrides: self.overrides })
    }
}

/// The names a WGSL file declares at module scope (unindented `fn`, `const`, `struct`,
/// `alias`, `override` and `var` items, after any attributes).
fn declared_names(text: &str) -> Vec<String> {
    let ident = |s: &str| -> Option<String> {
        let s = s.trim_start();
        let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
        (end > 0).then(|| s[..end].to_string())
    };
    text.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|l| {
            let mut rest = l.trim_end();
            // Attributes: @group(0) @binding(1) ...
            while let Some(r) = rest.strip_prefix('@') {
                rest = r.split_once(char::is_whitespace).map(|(_, r)| r.trim_start()).unwrap_or("");
            }
            for kw in ["fn ", "const ", "struct ", "alias ", "override "] {
                if let Some(r) = rest.strip_prefix(kw) {
                    return ident(r);
                }
            }
            let r = rest.strip_prefix("var")?;
            let r = match r.strip_prefix('<') {
                Some(r) => r.split_once('>')?.1,
                None => r,
            };
            ident(r)
        })
        .collect()
}

/// `text` with every identifier in `names` given `suffix` (not field names after a `.`).
fn rename(text: &str, names: &std::collections::HashSet<String>, suffix: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut word = String::new();
    let mut prev = ' ';
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let flush = |word: &mut String, out: &mut String, after_dot: bool| {
        if !word.is_empty() {
            out.push_str(word);
            if !after_dot && names.contains(word.as_str()) {
                out.push_str(suffix);
            }
            word.clear();
        }
    };
    let mut word_after_dot = false;
    for c in text.chars() {
        if is_ident(c) {
            if word.is_empty() {
                // Digits start no identifier (1u, 0x10).
                if c.is_ascii_digit() || is_ident(prev) {
                    out.push(c);
                    prev = c;
                    continue;
                }
                word_after_dot = prev == '.';
            }
            word.push(c);
        } else {
            flush(&mut word, &mut out, word_after_dot);
            out.push(c);
        }
        prev = c;
    }
    flush(&mut word, &mut out, word_after_dot);
    out
}

/// Parses and validates a composed shader with naga, as every backend would.
pub fn validate(
    src: &ShaderSource,
    caps: naga::valid::Capabilities,
) -> Result<(naga::Module, naga::valid::ModuleInfo)> {
    validate_text(&src.label, &src.text, caps)
}

/// `validate` for WGSL text under a label (a shader read back from `KILN_DUMP_WGSL`, gpu/dump.rs).
pub fn validate_text(
    label: &str,
    text: &str,
    caps: naga::valid::Capabilities,
) -> Result<(naga::Module, naga::valid::ModuleInfo)> {
    let module = naga::front::wgsl::parse_str(text)
        .map_err(|e| KilnError::Shader { label: label.to_string(), message: e.emit_to_string(text) })?;
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module).map_err(|e| {
            // The span says where; the chain of causes says what (an invalid entry point's
            // function, then its expression).
            let mut message = e.emit_to_string(text);
            let mut cause = std::error::Error::source(e.as_inner());
            while let Some(c) = cause {
                message.push_str(&format!("\ncaused by: {c}"));
                cause = c.source();
            }
            KilnError::Shader { label: label.to_string(), message }
        })?;
    Ok((module, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_at_no_kiln_path_is_refused() {
        let dir = std::env::temp_dir().join(format!("kiln-wgsl-stray-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("common")).unwrap();
        // Replacements at kiln's own paths, and files that are not WGSL: accepted.
        std::fs::write(dir.join("common/decode_merge.wgsl"), "").unwrap();
        std::fs::write(dir.join("gemm_coop.wgsl"), "").unwrap();
        std::fs::write(dir.join("notes.txt"), "").unwrap();
        assert_eq!(stray_replacement(&dir), None);
        // A common/ file at the top: refused, naming where kiln's is.
        std::fs::write(dir.join("decode_merge.wgsl"), "").unwrap();
        let (path, err) = stray_replacement(&dir).expect("refused");
        assert_eq!(path, dir.join("decode_merge.wgsl"));
        assert!(err.contains("kiln's decode_merge.wgsl is common/decode_merge.wgsl"), "{err}");
        std::fs::remove_file(dir.join("decode_merge.wgsl")).unwrap();
        // A name kiln has nowhere.
        std::fs::write(dir.join("common/my_variant.wgsl"), "").unwrap();
        let (path, err) = stray_replacement(&dir).expect("refused");
        assert_eq!(path, dir.join("common/my_variant.wgsl"));
        assert!(err.contains("replaces none") && !err.contains("so put it"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn renamed_files_rename_their_own_declarations_only() {
        let text =
            "const N: u32 = 4u;\n@group(0) @binding(1) var<storage, read> wq: array<u32>;\nstruct H { n: u32 }\n\
                    fn w32(i: u32) -> u32 { return wq[i]; }\n\
                    fn f(h: H) -> u32 {\n    let w32x = 1u;\n    return w32(h.n + N) + w32x + other(0x1u);\n}\n";
        let names: std::collections::HashSet<String> = declared_names(text).into_iter().collect();
        let want: std::collections::HashSet<String> = ["N", "wq", "H", "w32", "f"].map(String::from).into();
        assert_eq!(names, want);
        let out = rename(text, &names, "_b");
        assert!(out.contains("const N_b: u32 = 4u;"), "{out}");
        assert!(out.contains("var<storage, read> wq_b: array<u32>;"), "{out}");
        assert!(out.contains("fn f_b(h: H_b) -> u32"), "{out}");
        // Fields, other names, longer names and numbers stay.
        assert!(out.contains("return w32_b(h.n + N_b) + w32x + other(0x1u);"), "{out}");
    }

    #[test]
    fn a_wgsl_dir_replaces_only_files_kiln_has() {
        let dir = std::env::temp_dir().join(format!("kiln-wgsl-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rope.wgsl"), "// a variant\n").unwrap();
        std::fs::write(dir.join("extra.wgsl"), "// not kiln's\n").unwrap();
        assert_eq!(replacement(&dir, "rope.wgsl").unwrap().as_deref(), Some("// a variant\n"));
        assert_eq!(replacement(&dir, "extra.wgsl").unwrap(), None);
        assert_eq!(replacement(&dir, "gemm.wgsl").unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
