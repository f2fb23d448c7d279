//! Settings read from the environment, in one place (kernels never call `std::env`).

use std::collections::BTreeSet;

/// Capabilities a user can switch off to force the portable fallbacks
/// (`KILN_DISABLE=subgroup,f16,coopmat,int8dot`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Disabled {
    pub subgroup: bool,
    pub f16: bool,
    pub coopmat: bool,
    /// Packed 4x8-bit integer dot products (the int8-activation GEMV).
    pub int8dot: bool,
    /// Workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2; the device is then
    /// opened as wgpu opens it).
    pub cm2: bool,
}

impl Disabled {
    pub const NONE: Disabled = Disabled { subgroup: false, f16: false, coopmat: false, int8dot: false, cm2: false };
    pub const ALL: Disabled = Disabled { subgroup: true, f16: true, coopmat: true, int8dot: true, cm2: true };

    /// Parses a comma-separated list; unknown words are returned as an error so typos surface.
    pub fn parse(list: &str) -> Result<Disabled, String> {
        let mut d = Disabled::default();
        let words: BTreeSet<&str> = list.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
        for w in words {
            match w.to_ascii_lowercase().as_str() {
                "subgroup" | "subgroups" => d.subgroup = true,
                "f16" | "shader-f16" | "shader_f16" => d.f16 = true,
                "coopmat" | "cooperative-matrix" => d.coopmat = true,
                "int8dot" | "int8" | "dp4a" => d.int8dot = true,
                "cm2" | "coopmat2" => d.cm2 = true,
                "all" => d = Disabled::ALL,
                other => {
                    return Err(format!(
                    "KILN_DISABLE: unknown capability {other:?} (expected subgroup, f16, coopmat, int8dot, cm2 or all)"
                ))
                }
            }
        }
        Ok(d)
    }

    pub fn from_env() -> Result<Disabled, String> {
        match std::env::var("KILN_DISABLE") {
            Ok(v) => Disabled::parse(&v),
            Err(_) => Ok(Disabled::default()),
        }
    }
}

/// `PROFILE=1` turns on per-stage GPU timing.
pub fn profile_from_env() -> bool {
    matches!(std::env::var("PROFILE").as_deref(), Ok("1") | Ok("true") | Ok("yes"))
}

/// `KILN_MAX_BINDING=<bytes>` lowers the storage-binding limit kiln plans with, to exercise
/// tensor splitting on adapters with large limits (tests use it).
pub fn max_binding_from_env() -> Option<u64> {
    std::env::var("KILN_MAX_BINDING").ok().and_then(|v| v.trim().parse().ok())
}

/// `KILN_GEMV_MAX_COLS=N`: run matmuls of at most N columns on the GEMV, more on the GEMM
/// (measuring where one overtakes the other; `Caps::gemv_max_cols`).
pub fn gemv_max_cols_from_env() -> Option<u32> {
    std::env::var("KILN_GEMV_MAX_COLS").ok().and_then(|v| v.trim().parse().ok())
}

/// `KILN_GPU_MEMORY=<bytes>[K|M|G]`: the device memory kiln assumes when it checks that a
/// model fits (for adapters that report none, or to reserve memory for other programs).
pub fn gpu_memory_from_env() -> Option<u64> {
    std::env::var("KILN_GPU_MEMORY").ok().and_then(|v| parse_size(&v))
}

/// Where downloaded models live: `KILN_CACHE`, else the platform's cache directory
/// (`$XDG_CACHE_HOME/kiln` or `~/.cache/kiln` on Linux, `~/Library/Caches/kiln` on macOS,
/// `%LOCALAPPDATA%\kiln` on Windows).
pub fn cache_dir_from_env() -> Option<std::path::PathBuf> {
    match std::env::var_os("KILN_CACHE") {
        Some(d) if !d.is_empty() => Some(d.into()),
        _ => dirs::cache_dir().map(|d| d.join("kiln")),
    }
}

/// Where compiled pipelines are kept between runs: `KILN_PIPELINE_CACHE` (a directory, or
/// `off`), else `pipelines/` in the cache directory.
pub fn pipeline_cache_from_env() -> Option<std::path::PathBuf> {
    match std::env::var_os("KILN_PIPELINE_CACHE") {
        Some(v) if v == "off" || v == "0" => None,
        Some(d) if !d.is_empty() => Some(d.into()),
        _ => cache_dir_from_env().map(|d| d.join("pipelines")),
    }
}

/// `KILN_DUMP_WGSL=<dir>`: where each kernel's composed WGSL is written as it is compiled
/// (gpu/dump.rs); unset or empty, nowhere.
pub fn dump_wgsl_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("KILN_DUMP_WGSL").filter(|d| !d.is_empty()).map(Into::into)
}

/// The Hugging Face endpoint: `HF_ENDPOINT` (a mirror, or a test server), else the hub.
pub fn hf_endpoint_from_env() -> String {
    match std::env::var("HF_ENDPOINT") {
        Ok(e) if !e.trim().is_empty() => e.trim().trim_end_matches('/').to_string(),
        _ => "https://huggingface.co".to_string(),
    }
}

/// `HF_TOKEN`: the access token for gated and private repositories.
pub fn hf_token_from_env() -> Option<String> {
    std::env::var("HF_TOKEN").ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// `KILN_API_KEY`: the key `kiln serve` requires on /v1 when `--api-key` is not given.
pub fn api_key_from_env() -> Option<String> {
    std::env::var("KILN_API_KEY").ok().map(|k| k.trim().to_string()).filter(|k| !k.is_empty())
}

/// `KILN_DOCTOR_PERTURB=<check>`: `kiln doctor` makes the CPU reference of the checks whose
/// name contains this text deliberately wrong, so a test can see it fail (never set otherwise).
pub fn doctor_perturb_from_env() -> Option<String> {
    std::env::var("KILN_DOCTOR_PERTURB").ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// "1234", "512K", "300M", "2G" (binary multiples).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_disable_lists() {
        assert_eq!(Disabled::parse("").unwrap(), Disabled::NONE);
        let d = Disabled::parse("subgroup, f16").unwrap();
        assert!(d.subgroup && d.f16 && !d.coopmat && !d.int8dot);
        assert!(Disabled::parse("int8dot").unwrap().int8dot);
        assert_eq!(Disabled::parse("all").unwrap(), Disabled::ALL);
        assert!(Disabled::parse("subgrup").is_err());
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("3M"), Some(3 << 20));
        assert_eq!(parse_size(" 2g "), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999G"), None);
    }

    #[test]
    fn parses_gemv_shapes() {
        assert_eq!(parse_gemv_shape(" 256x4x4"), Some(crate::plan::GemvShape::grouped(256, 4, 4)));
        assert_eq!(parse_gemv_shape("128x2x1"), Some(crate::plan::GemvShape::new(128, 2)));
        // Groups that do not divide the workgroup, no rows, or not three numbers.
        for bad in ["128x2x3", "128x0x1", "128x2", "axbxc"] {
            assert_eq!(parse_gemv_shape(bad), None, "{bad}");
        }
    }
}

/// `KILN_DECODE_BLOCK=<n>`: query heads per decode-attention workgroup, overriding the
/// planner's choice (a tuning knob for measurements; n must divide the GQA group).
pub fn decode_block_from_env() -> Option<u32> {
    static BLOCK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *BLOCK.get_or_init(|| std::env::var("KILN_DECODE_BLOCK").ok().and_then(|v| v.trim().parse().ok()))
}

/// `KILN_DECODE_PER_LANE=8|16|32`: K dimensions and V positions each decode-attention
/// invocation holds (`plan::attn_decode_per_lane`; a knob for measurements).
pub fn decode_per_lane_from_env() -> Option<u32> {
    static PER: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *PER.get_or_init(|| one_of("KILN_DECODE_PER_LANE", &[8, 16, 32]))
}

/// `KILN_DECODE_WG=128|256|512`: invocations of a decode-attention workgroup
/// (`plan::attn_decode_wg`; a knob for measurements).
pub fn decode_wg_from_env() -> Option<u32> {
    static WG: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *WG.get_or_init(|| one_of("KILN_DECODE_WG", &[128, 256, 512]))
}

/// `KILN_SAMPLE_WG=256|512|1024`: invocations of the sampler's second pass for sampled
/// (not greedy) configurations (`kernels::sample::second_pass_wg`; a knob for measurements).
pub fn sample_wg_from_env() -> Option<u32> {
    static WG: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *WG.get_or_init(|| one_of("KILN_SAMPLE_WG", &[256, 512, 1024]))
}

/// `KILN_DECODE_WIDE=0|1`: whether one sequence's decode attention takes wide workgroups
/// where the usual ones would split the context and those need not (`plan::attn_decode_wide`;
/// a knob for measurements).
pub fn decode_wide_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_DECODE_WIDE"))
}

/// `KILN_DECODE_MERGE=0|1`: whether split decode attention's last workgroup merges the
/// splits instead of a combine pass (`plan::decode_merge`; a knob for measurements).
pub fn decode_merge_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_DECODE_MERGE"))
}

/// `KILN_DECODE_MERGE_ACQUIRE=0|1`: whether the last workgroup of a merging decode launch
/// fences (device-scope acquire) after its count before it reads the partials
/// (`plan::decode_merge_acquire`; a knob for measurements).
pub fn decode_merge_acquire_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_DECODE_MERGE_ACQUIRE"))
}

/// `KILN_DECODE_MERGE_SPLITS=<n>`: the most splits a decode launch merges in its last
/// workgroups (`kernels::attention::DECODE_MERGE_MOST_SPLITS`; a knob for measurements).
pub fn decode_merge_splits_from_env() -> Option<u32> {
    static MOST: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *MOST.get_or_init(|| {
        std::env::var("KILN_DECODE_MERGE_SPLITS").ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n >= 2)
    })
}

/// `KILN_DECODE_COOP_FROM=N|off`: the context from which one sequence's decode attention runs
/// on cooperative matrices (`attention::decode_coop_from`; a knob for measurements). Some(None):
/// off.
pub fn decode_coop_from_env() -> Option<Option<u32>> {
    static FROM: std::sync::OnceLock<Option<Option<u32>>> = std::sync::OnceLock::new();
    *FROM.get_or_init(|| {
        let v = std::env::var("KILN_DECODE_COOP_FROM").ok()?;
        match v.trim() {
            "off" => Some(None),
            n => n.parse().ok().map(Some),
        }
    })
}

/// `KILN_DECODE_COOP_KEYS=16|32|64`: keys of a cooperative decode subgroup's tile
/// (`attention::decode_coop_keys`; a knob for measurements).
pub fn decode_coop_keys_from_env() -> Option<u32> {
    static KEYS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| one_of("KILN_DECODE_COOP_KEYS", &[16, 32, 64]))
}

/// `KILN_DECODE_WO_AHEAD=0|1`: whether the cooperative decode kernel's workgroups that do not
/// merge read the output projection's weights into L2 while the last ones merge
/// (`attention::decode_wo_ahead`; on by default).
pub fn decode_wo_ahead_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_DECODE_WO_AHEAD"))
}

/// A knob set to one of `allowed`; None where unset or anything else.
fn one_of(name: &str, allowed: &[u32]) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).filter(|v| allowed.contains(v))
}

/// `KILN_SPLIT_K=<n>`: K ranges of every GEMM on a GPU (1: no split-K), overriding the
/// planner (`plan::gemm_splits`; a knob for measurements).
pub fn split_k_from_env() -> Option<u32> {
    static SPLITS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *SPLITS.get_or_init(|| std::env::var("KILN_SPLIT_K").ok().and_then(|v| v.trim().parse().ok()).filter(|&s| s >= 1))
}

/// `KILN_GEMV_Q8_MIN_COLS=<n>`: columns from which the int8 GEMV takes every quantized matrix
/// (`plan::GEMV_Q8_MIN_COLS`; a knob for measurements).
pub fn gemv_q8_min_cols_from_env() -> Option<u32> {
    static COLS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *COLS.get_or_init(|| {
        std::env::var("KILN_GEMV_Q8_MIN_COLS").ok().and_then(|v| v.trim().parse().ok()).filter(|&c| c >= 1)
    })
}

/// `KILN_GEMV_Q8_MIN_WEIGHTS=<n>`: weights (rows x k) from which one column's quantized
/// matrices run on the int8 GEMV (`plan::GEMV_Q8_MIN_WEIGHTS`, for every quantized format; a
/// knob for measurements).
pub fn gemv_q8_min_weights_from_env() -> Option<u64> {
    static W: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *W.get_or_init(|| std::env::var("KILN_GEMV_Q8_MIN_WEIGHTS").ok().and_then(|v| v.trim().parse().ok()))
}

/// A GEMV launch shape written `<wg>x<rows>x<groups>` (the knobs below, the kernels bench):
/// `groups` groups of `wg / groups` invocations, each its own `rows` rows. `None` where it does
/// not read as one.
pub fn parse_gemv_shape(s: &str) -> Option<crate::plan::GemvShape> {
    let n: Vec<u32> = s.trim().split('x').filter_map(|d| d.trim().parse().ok()).collect();
    match n[..] {
        [wg, rows, groups] if groups >= 1 && wg % groups == 0 && rows >= 1 => {
            Some(crate::plan::GemvShape::grouped(wg, rows, groups))
        }
        _ => None,
    }
}

/// `KILN_GEMV_Q8_WIDE=off|<wg>x<rows>x<groups>`: the int8 GEMV's shape past 4 columns
/// (`plan::gemv_q8_wide_shape`; a knob for measurements): `off` for groups of 4 columns on
/// the ungrouped shapes. `None` where unset or unreadable.
pub fn gemv_q8_wide_from_env() -> Option<Option<crate::plan::GemvShape>> {
    static SHAPE: std::sync::OnceLock<Option<Option<crate::plan::GemvShape>>> = std::sync::OnceLock::new();
    *SHAPE.get_or_init(|| {
        let v = std::env::var("KILN_GEMV_Q8_WIDE").ok()?;
        match v.trim() {
            "off" => return Some(None),
            "auto" => return None,
            _ => {}
        }
        parse_gemv_shape(&v).map(Some)
    })
}

/// A matrix's shape rule: `[<n>x<k>=]<wg>x<rows>x<groups>` (every matrix, without `<n>x<k>=`).
type ShapeRule = (Option<(u32, u32)>, crate::plan::GemvShape);

/// The comma-separated shape rules of `var`.
fn shape_rules(var: &str) -> Vec<ShapeRule> {
    let Ok(v) = std::env::var(var) else { return Vec::new() };
    v.split(',')
        .filter_map(|rule| {
            let Some((matrix, shape)) = rule.split_once('=') else {
                return Some((None, parse_gemv_shape(rule)?));
            };
            let (n, k) = matrix.trim().split_once('x')?;
            Some((Some((n.trim().parse().ok()?, k.trim().parse().ok()?)), parse_gemv_shape(shape)?))
        })
        .collect()
}

/// The first of `rules` that applies to a matrix of n rows of k.
fn shape_for(rules: &[ShapeRule], n: u32, k: u32) -> Option<crate::plan::GemvShape> {
    rules.iter().find(|(m, _)| m.is_none_or(|m| m == (n, k))).map(|&(_, shape)| shape)
}

/// `KILN_GEMV_FLOAT=[<n>x<k>=]<wg>x<rows>x<groups>,...`: the float GEMV's shape over one
/// column (decode steps), for matrices of n rows of k (or every matrix, without `<n>x<k>=`);
/// a knob for measurements. The first entry that applies wins; `None` where none does.
pub fn gemv_float_from_env(n: u32, k: u32) -> Option<crate::plan::GemvShape> {
    static RULES: std::sync::OnceLock<Vec<ShapeRule>> = std::sync::OnceLock::new();
    shape_for(RULES.get_or_init(|| shape_rules("KILN_GEMV_FLOAT")), n, k)
}

/// `KILN_GEMV_Q8=[<n>x<k>=]<wg>x<rows>x<groups>,...`: as `KILN_GEMV_FLOAT`, for the int8
/// GEMV over one column (its SwiGLU epilogue's shape aside: `KILN_GEMV_Q8_SWIGLU`).
pub fn gemv_q8_from_env(n: u32, k: u32) -> Option<crate::plan::GemvShape> {
    static RULES: std::sync::OnceLock<Vec<ShapeRule>> = std::sync::OnceLock::new();
    shape_for(RULES.get_or_init(|| shape_rules("KILN_GEMV_Q8")), n, k)
}

/// `KILN_GEMV_Q8_ADD_NORM=off|on|<wg>x<rows>x<groups>`: whether one-token decode steps run the
/// projections added to the residual stream with the int8 residual epilogue (writing the next
/// GEMV's int8 input through its RMSNorm), and its shape (`on`: `plan::GEMV_Q8_ADD_NORM`; a
/// knob for measurements). `None` where unset or unreadable.
pub fn gemv_q8_add_norm_from_env() -> Option<Option<crate::plan::GemvShape>> {
    static SHAPE: std::sync::OnceLock<Option<Option<crate::plan::GemvShape>>> = std::sync::OnceLock::new();
    *SHAPE.get_or_init(|| {
        epilogue_shape("KILN_GEMV_Q8_ADD_NORM", crate::plan::GEMV_Q8_ADD_NORM, crate::plan::covers_q8_rows)
    })
}

/// `KILN_GEMV_Q8_SWIGLU=off|on|<wg>x<rows>x<groups>`: whether one-token decode steps run the
/// gate/up projection with the int8 SwiGLU epilogue, and its shape (`on`: the planner's,
/// `plan::GEMV_Q8_SWIGLU`; a knob for measurements). `None` where unset or unreadable.
pub fn gemv_q8_swiglu_from_env() -> Option<Option<crate::plan::GemvShape>> {
    static SHAPE: std::sync::OnceLock<Option<Option<crate::plan::GemvShape>>> = std::sync::OnceLock::new();
    *SHAPE.get_or_init(|| {
        epilogue_shape("KILN_GEMV_Q8_SWIGLU", crate::plan::GEMV_Q8_SWIGLU, crate::plan::covers_q8_blocks)
    })
}

/// An int8 epilogue's knob, `off|on|<wg>x<rows>x<groups>`: Some(None) off, Some(shape) for `on`
/// (`on_shape`) or a shape whose workgroups cover the epilogue's blocks (`covers`); None where
/// unset or unreadable.
fn epilogue_shape(
    var: &str,
    on_shape: crate::plan::GemvShape,
    covers: fn(crate::plan::GemvShape) -> bool,
) -> Option<Option<crate::plan::GemvShape>> {
    let v = std::env::var(var).ok()?;
    match v.trim() {
        "off" | "0" => return Some(None),
        "on" | "1" => return Some(Some(on_shape)),
        _ => {}
    }
    let shape = parse_gemv_shape(&v)?;
    covers(shape).then_some(Some(shape))
}

/// `KILN_GEMV_Q8_SWIGLU_NORM=0|1`: whether the int8 SwiGLU epilogue's gate/up projection
/// also quantizes its own input (`plan::gemv_q8_swiglu_norm`; a knob for measurements).
pub fn gemv_q8_swiglu_norm_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_GEMV_Q8_SWIGLU_NORM"))
}

/// `KILN_SAMPLE_TOPS=0|1`: whether the sampler's first pass keeps each slice's candidates in
/// order for the second to merge (`plan::sample_tops`; a knob for measurements).
pub fn sample_tops_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_SAMPLE_TOPS"))
}

/// `KILN_QUANTIZE_LANES=0|1`: whether one-token steps quantize the int8 GEMV's input 8
/// invocations a block with the RMSNorm's 1 / rms left to the GEMV (`plan::quantize_lanes`;
/// a knob for measurements).
pub fn quantize_lanes_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_QUANTIZE_LANES"))
}

/// A knob set on (`1`, `on`) or off (`0`, `off`); None where unset or unreadable.
fn switch(name: &str) -> Option<bool> {
    match std::env::var(name).ok()?.trim() {
        "1" | "on" => Some(true),
        "0" | "off" => Some(false),
        _ => None,
    }
}

/// `KILN_COOP_256=0|1`: whether F16 GEMMs that take 128x128 cooperative tiles take 256x128 ones
/// instead, never or always (`plan::coop_256_takes`; a knob for measurements).
pub fn coop_256_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_COOP_256"))
}

/// `KILN_COOP_LOAD_AHEAD=0|1|2`: K steps the cooperative GEMM's loaders hold loaded across the
/// barriers, for every weight format (`plan::coop_loads_ahead`; a knob for measurements).
pub fn coop_load_ahead_from_env() -> Option<u32> {
    static STEPS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *STEPS.get_or_init(|| std::env::var("KILN_COOP_LOAD_AHEAD").ok()?.trim().parse().ok().filter(|&n: &u32| n <= 2))
}

/// `KILN_PREFILL_RESIDENT=0|1`: whether prefill's f16 copies of block-format weights stay in GPU
/// memory, decoded once, whatever the memory left (`plan::resident_f16_copies`).
pub fn prefill_resident_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_PREFILL_RESIDENT"))
}

/// `KILN_PREFILL_DEQUANT=0|1`: whether prefill decodes K-quant weights to an f16 copy
/// before their GEMMs (`plan::prefill_dequant_f16`; a knob for measurements).
pub fn prefill_dequant_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_PREFILL_DEQUANT"))
}

/// `KILN_DEQUANT_FROM=<m·k>`: tokens times row length from which a prefill GEMM over K-quant
/// weights reads an f16 copy of them (`plan::DEQUANT_F16_FROM`; a knob for measurements).
pub fn dequant_from_env() -> Option<u64> {
    static FROM: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *FROM
        .get_or_init(|| std::env::var("KILN_DEQUANT_FROM").ok().and_then(|v| v.trim().parse().ok()).filter(|&c| c >= 1))
}

/// `KILN_DEQUANT_PER=1|4`: chunks each invocation of the f16 decoder takes
/// (`plan::dequant_chunks_per_invocation`; a knob for measurements).
pub fn dequant_per_from_env() -> Option<u32> {
    static PER: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *PER.get_or_init(|| std::env::var("KILN_DEQUANT_PER").ok().and_then(|v| v.trim().parse().ok()))
}

/// `KILN_ATTN_Q8_OUT=0|1`: whether one-token decode attention writes the output projection's
/// int8 input (`plan::attn_q8_out`; a knob for measurements).
pub fn attn_q8_out_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_ATTN_Q8_OUT"))
}

/// `KILN_PREFILL_F16_INPUTS=0|1`: whether prefill's RMSNorms write the cooperative GEMM's f16
/// input themselves (`plan::prefill_f16_inputs`; a knob for measurements).
pub fn prefill_f16_inputs_from_env() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch("KILN_PREFILL_F16_INPUTS"))
}

/// `KILN_GEMV_Q8_WIDE_MIN_COLS=<n>`: columns from which the int8 GEMV takes its grouped shape
/// (`plan::gemv_q8_wide_min_cols`; a knob for measurements).
pub fn gemv_q8_wide_min_cols_from_env() -> Option<u32> {
    static COLS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *COLS.get_or_init(|| {
        std::env::var("KILN_GEMV_Q8_WIDE_MIN_COLS").ok().and_then(|v| v.trim().parse().ok()).filter(|&c| c >= 1)
    })
}

/// `KILN_PREFILL_BUDGET=<tokens>`: prompt tokens `kiln serve` prefills per engine tick
/// (`server::engine::PREFILL_BUDGET`; a knob for measurements).
pub fn prefill_budget_from_env() -> Option<usize> {
    static TOKENS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *TOKENS.get_or_init(|| {
        std::env::var("KILN_PREFILL_BUDGET").ok().and_then(|v| v.trim().parse().ok()).filter(|&t| t >= 1)
    })
}

/// `KILN_FLASH_COOP=0`: prefill attention stays on the f32 flash kernel where the
/// cooperative-matrix one would run (comparisons). Read once.
pub fn flash_coop_disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("KILN_FLASH_COOP").as_deref() == Ok("0"))
}

/// `KILN_FLASH_SPLIT=<n>`: splits of a cooperative flash attention's keys, forced (1: none;
/// `flash_attention::split_of` plans them otherwise; a knob for measurements). Read once.
pub fn flash_split() -> Option<u32> {
    static N: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("KILN_FLASH_SPLIT").ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n >= 1))
}

/// `KILN_PREFILL_TOGETHER=0`: a server prefills each prompt's chunk in a step of its own
/// instead of several prompts in one step (comparisons). Read once.
pub fn prefill_together_disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("KILN_PREFILL_TOGETHER").as_deref() == Ok("0"))
}

/// How prefill computes attention (`KILN_PREFILL_ATTENTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefillAttention {
    /// One kernel with an online softmax, no score matrix (`flash`, the default).
    Flash,
    /// Scores materialized: Q·Kᵀ, a softmax dispatch, P·V (`gemm`), kept to compare against;
    /// its score matrix (heads x ubatch x context) shrinks the ubatch on small adapters.
    Gemm,
}

/// `KILN_PREFILL_ATTENTION=flash|gemm`, read once per process (sizing and binding a session
/// must agree); anything else is flash, with a warning.
pub fn prefill_attention_from_env() -> PrefillAttention {
    static CHOICE: std::sync::OnceLock<PrefillAttention> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| match std::env::var("KILN_PREFILL_ATTENTION").as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("flash") => PrefillAttention::Flash,
        Ok("gemm") => PrefillAttention::Gemm,
        Ok(other) => {
            tracing::warn!("KILN_PREFILL_ATTENTION={other:?} is neither flash nor gemm: using flash");
            PrefillAttention::Flash
        }
    })
}

/// `KILN_SERVE_SLOTS=sessions`: `kiln serve` runs one session per slot, stepped one after
/// another (the server before batching, kept to compare against); anything else, or unset,
/// the batched slots of one shared session.
pub fn serve_session_slots_from_env() -> bool {
    matches!(std::env::var("KILN_SERVE_SLOTS").as_deref().map(str::trim), Ok("sessions"))
}
