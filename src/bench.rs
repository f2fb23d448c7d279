//! `kiln bench` in the manner of llama-bench: prompt processing (ppN) and generation (tgN)
//! throughput over repetitions, as records that carry everything needed to compare machines
//! later (adapter, driver, features, limits, kiln version and commit, date, every figure).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::engine::Model;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::model::{Output, SessionOptions};
use crate::profile::{Peak, PhaseProfile};

/// The adapter a record was measured on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AdapterRecord {
    pub name: String,
    pub vendor_id: u32,
    pub vendor: String,
    pub device_type: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    /// Features kiln uses on it (after KILN_DISABLE).
    pub features: Vec<String>,
    pub limits: BTreeMap<String, u64>,
}

impl AdapterRecord {
    pub fn of(ctx: &GpuContext) -> AdapterRecord {
        let i = &ctx.info;
        let c = &ctx.caps;
        let mut features = Vec::new();
        if c.f16 {
            features.push("shader-f16".to_string());
        }
        if c.subgroups {
            features.push(format!("subgroups({}..{})", c.subgroup_min, c.subgroup_max));
        }
        if c.timestamps {
            features.push("timestamp-query".into());
        }
        if c.timestamps_in_passes {
            features.push("timestamp-query-inside-passes".into());
        }
        if c.coopmat {
            features.push("cooperative-matrix".into());
        }
        if c.int8_dot {
            features.push("int8-dot-product".into());
        }
        let l = &ctx.limits;
        let limits = BTreeMap::from([
            ("max_buffer_size".to_string(), l.max_buffer_size),
            ("max_storage_buffer_binding_size".to_string(), l.max_storage_buffer_binding_size as u64),
            ("max_compute_workgroup_storage_size".to_string(), l.max_compute_workgroup_storage_size as u64),
            ("max_compute_invocations_per_workgroup".to_string(), l.max_compute_invocations_per_workgroup as u64),
            ("subgroup_min_size".to_string(), c.subgroup_min as u64),
            ("subgroup_max_size".to_string(), c.subgroup_max as u64),
        ]);
        AdapterRecord {
            name: i.name.clone(),
            vendor_id: i.vendor,
            vendor: vendor_name(i.vendor).to_string(),
            device_type: format!("{:?}", i.device_type),
            backend: format!("{:?}", i.backend),
            driver: i.driver.clone(),
            driver_info: i.driver_info.clone(),
            features,
            limits,
        }
    }
}

/// PCI (or Khronos) vendor id → name.
pub fn vendor_name(id: u32) -> &'static str {
    match id {
        0x10de => "NVIDIA",
        0x1002 | 0x1022 => "AMD",
        0x8086 => "Intel",
        0x106b => "Apple",
        0x13b5 => "ARM",
        0x5143 => "Qualcomm",
        0x10005 => "Mesa",
        0x1414 => "Microsoft",
        _ => "unknown",
    }
}

/// The model a record was measured on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelRecord {
    /// File name, or `preset:format (synthetic)`.
    pub name: String,
    /// The path of a file, or None for a synthetic model.
    pub path: Option<String>,
    /// `preset:format` of a synthetic model.
    pub synthetic: Option<String>,
    pub arch: String,
    pub size_bytes: u64,
    pub params: u64,
    /// Tensor count per ggml type.
    pub formats: BTreeMap<String, u64>,
}

impl ModelRecord {
    pub fn of(model: &Model, synthetic: Option<&str>) -> ModelRecord {
        let f = &model.file;
        let mut formats = BTreeMap::new();
        for t in &f.tensors {
            *formats.entry(t.type_name()).or_insert(0) += 1;
        }
        let name = match synthetic {
            Some(s) => format!("{s} (synthetic)"),
            None => f.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default(),
        };
        ModelRecord {
            name,
            path: synthetic.is_none().then(|| f.path.display().to_string()),
            synthetic: synthetic.map(String::from),
            arch: format!("{:?}", model.cfg.arch).to_lowercase(),
            size_bytes: f.tensors.iter().map(|t| t.bytes).sum(),
            params: f.tensors.iter().map(|t| t.n_elements()).sum(),
            formats,
        }
    }

    /// "q4_K:155 q6_K:23 f32:45", most common first.
    pub fn formats_label(&self) -> String {
        let mut v: Vec<_> = self.formats.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(" ")
    }
}

/// One test (ppN or tgN) on one model: every repetition's tokens per second.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchRecord {
    pub kiln_version: String,
    pub git_commit: String,
    /// UTC, ISO 8601.
    pub date: String,
    pub adapter: AdapterRecord,
    pub model: ModelRecord,
    /// "pp512" or "tg128".
    pub test: String,
    pub n_prompt: u32,
    pub n_gen: u32,
    pub ubatch: u32,
    pub n_ctx: u32,
    pub kv_type: String,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    /// The device's measured peaks, when profiling.
    pub peak: Option<Peak>,
    /// Per-stage profile of the test's phase, when profiling: from extra runs with
    /// timestamps, after the timed repetitions (which run without).
    pub profile: Option<PhaseProfile>,
    /// Tokens per second of the profiled runs: what the timestamps cost.
    pub profiled_ts: Option<f64>,
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Now as "YYYY-MM-DDTHH:MM:SSZ" (civil-from-days, no time zone database needed).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// One test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    Prompt(u32),
    Gen(u32),
}

impl Test {
    pub fn name(self) -> String {
        match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n) => format!("tg{n}"),
        }
    }
}

/// How to run the tests on one model.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub tests: Vec<Test>,
    pub repetitions: u32,
    pub ubatch: u32,
    pub f16_kv: bool,
    pub warmup: bool,
    pub profile: bool,
    pub peak: Option<Peak>,
}

/// Runs every test on `model`; `progress` hears (test, repetition or None for warm-up).
pub fn bench_model(
    model: &Model,
    synthetic: Option<&str>,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(&str, Option<u32>),
) -> Result<Vec<BenchRecord>> {
    let ctx: &Arc<GpuContext> = &model.ctx;
    let max_p = opts.tests.iter().filter_map(|t| if let Test::Prompt(n) = t { Some(*n) } else { None }).max();
    let max_g = opts.tests.iter().filter_map(|t| if let Test::Gen(n) = t { Some(*n) } else { None }).max();
    let n_ctx = max_p.unwrap_or(0).max(max_g.unwrap_or(0) + 1).max(1);
    let mut s = model.session(SessionOptions { n_ctx, ubatch: opts.ubatch, f16_kv: opts.f16_kv, all_logits: false })?;
    // A fixed prompt: token ids spread over the vocabulary (not the specials at 0..3).
    let v = model.cfg.n_vocab as usize;
    let prompt: Vec<u32> = (0..n_ctx as usize).map(|i| (3 + (i * 7919) % (v - 3)) as u32).collect();
    let adapter = AdapterRecord::of(ctx);
    let model_rec = ModelRecord::of(model, synthetic);
    let mut out = Vec::new();
    for &test in &opts.tests {
        let name = test.name();
        let run = |s: &mut crate::model::Session| -> Result<f64> {
            s.reset();
            match test {
                Test::Prompt(n) => {
                    let t = Instant::now();
                    s.forward(&prompt[..n as usize], Output::Argmax)?;
                    Ok(n as f64 / t.elapsed().as_secs_f64())
                }
                Test::Gen(n) => {
                    let t = Instant::now();
                    let got = s.generate_greedy_chained(prompt[0], n as usize, &mut |_| true)?;
                    Ok(got.len() as f64 / t.elapsed().as_secs_f64())
                }
            }
        };
        if opts.warmup {
            progress(&name, None);
            run(&mut s)?;
        }
        let mut samples = Vec::new();
        for r in 0..opts.repetitions {
            progress(&name, Some(r));
            samples.push(run(&mut s)?);
        }
        // The profile comes from runs of their own, so the timed figures carry no timestamps.
        let (mut profile, mut profiled_ts) = (None, None);
        if opts.profile {
            s.enable_profiling()?;
            let mut ts = Vec::new();
            for _ in 0..opts.repetitions.min(3) {
                progress(&name, None);
                ts.push(run(&mut s)?);
            }
            profiled_ts = Some(mean_sd(&ts).0);
            profile = s.take_profile().map(|p| if matches!(test, Test::Gen(_)) { p.decode } else { p.prefill });
            s.disable_profiling();
        }
        let (avg, sd) = mean_sd(&samples);
        let (n_prompt, n_gen) = match test {
            Test::Prompt(n) => (n, 0),
            Test::Gen(n) => (0, n),
        };
        out.push(BenchRecord {
            kiln_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: env!("KILN_GIT_COMMIT").into(),
            date: utc_now(),
            adapter: adapter.clone(),
            model: model_rec.clone(),
            test: name,
            n_prompt,
            n_gen,
            ubatch: opts.ubatch,
            n_ctx,
            kv_type: if opts.f16_kv { "f16" } else { "f32" }.into(),
            samples_ts: samples,
            avg_ts: avg,
            stddev_ts: sd,
            peak: opts.peak,
            profile,
            profiled_ts,
        });
    }
    Ok(out)
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn human_params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 * 1e-9)
    } else {
        format!("{:.2} M", n as f64 * 1e-6)
    }
}

/// llama-bench's markdown table.
pub fn markdown(records: &[BenchRecord]) -> String {
    let mut o = String::from("| model | size | params | formats | backend | GPU | test | t/s |\n");
    o.push_str("| --- | ---: | ---: | --- | --- | --- | ---: | ---: |\n");
    for r in records {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} |\n",
            r.model.name,
            human_bytes(r.model.size_bytes),
            human_params(r.model.params),
            r.model.formats_label(),
            r.adapter.backend,
            r.adapter.name,
            r.test,
            r.avg_ts,
            r.stddev_ts
        ));
    }
    o
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One line per record; repetitions joined with ';'.
pub fn csv(records: &[BenchRecord]) -> String {
    let mut o = String::from(
        "kiln_version,git_commit,date,adapter,vendor,device_type,backend,driver,driver_info,features,model,arch,size_bytes,params,formats,test,n_prompt,n_gen,ubatch,n_ctx,kv_type,samples_ts,avg_ts,stddev_ts\n",
    );
    for r in records {
        let samples = r.samples_ts.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(";");
        let fields = [
            r.kiln_version.clone(),
            r.git_commit.clone(),
            r.date.clone(),
            r.adapter.name.clone(),
            r.adapter.vendor.clone(),
            r.adapter.device_type.clone(),
            r.adapter.backend.clone(),
            r.adapter.driver.clone(),
            r.adapter.driver_info.clone(),
            r.adapter.features.join(";"),
            r.model.name.clone(),
            r.model.arch.clone(),
            r.model.size_bytes.to_string(),
            r.model.params.to_string(),
            r.model.formats_label(),
            r.test.clone(),
            r.n_prompt.to_string(),
            r.n_gen.to_string(),
            r.ubatch.to_string(),
            r.n_ctx.to_string(),
            r.kv_type.clone(),
            samples,
            format!("{:.3}", r.avg_ts),
            format!("{:.3}", r.stddev_ts),
        ];
        o.push_str(&fields.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(","));
        o.push('\n');
    }
    o
}
