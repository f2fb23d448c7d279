//! `kiln bench`: llama-bench's flags and tables, on model files or on synthetic models built
//! in memory (no download needed).

use std::io::Write;
use std::path::PathBuf;

use crate::bench::{bench_model, csv, markdown, BenchOptions, BenchRecord, Test};
use crate::cli::GpuArgs;
use crate::engine::Model;
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::{KilnError, Result};

/// The synthetic model `kiln bench` runs when given none.
pub const DEFAULT_SYNTHETIC: &str = "tinyllama-1.1b:q4_k_m";
/// What it runs instead on a CPU adapter, where the default would take many minutes.
pub const CPU_SYNTHETIC: &str = "mini-llama:q4_k_m";

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// GGUF model files (repeatable or comma-separated).
    #[arg(short = 'm', long = "model", value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// Synthetic models built in memory, PRESET:FORMAT (repeatable or comma-separated), e.g.
    /// tinyllama-1.1b:q4_k_m. Presets: tinyllama-1.1b, llama-7b, qwen3-0.6b, mini-llama,
    /// tiny-test; formats: q4_k_m, q5_k_m, q6_k, q8_0, f16. Default when no -m is given:
    /// tinyllama-1.1b:q4_k_m (mini-llama:q4_k_m on a CPU adapter).
    #[arg(long, value_delimiter = ',')]
    pub synthetic: Vec<String>,
    /// Prompt sizes to test (comma-separated; 0 skips).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    pub n_prompt: Vec<u32>,
    /// Generation sizes to test (comma-separated; 0 skips).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    pub n_gen: Vec<u32>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: u32,
    /// Most tokens per forward pass during prompt processing.
    #[arg(long, default_value_t = 512)]
    pub ubatch: u32,
    /// KV cache element type: f16 or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// Output format: md, json or csv.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
    /// Skip the untimed warm-up run of each test.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Per-stage GPU profile of every test (also PROFILE=1).
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

enum Source {
    File(PathBuf),
    Synthetic(String),
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let format = args.output.as_str();
    if !["md", "json", "csv"].contains(&format) {
        return Err(KilnError::invalid("-o", format!("unknown output format {format:?} (md, json or csv)")));
    }
    let f16_kv = match args.kv_type.as_str() {
        "f16" => true,
        "f32" => false,
        other => return Err(KilnError::invalid("--kv-type", format!("{other:?} (expected f16 or f32)"))),
    };
    if args.repetitions == 0 {
        return Err(KilnError::invalid("-r", "at least one repetition is needed"));
    }
    let mut tests: Vec<Test> = args.n_prompt.iter().filter(|&&n| n > 0).map(|&n| Test::Prompt(n)).collect();
    tests.extend(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| Test::Gen(n)));
    if tests.is_empty() {
        return Err(KilnError::invalid("-p/-n", "no test to run (every size is 0)"));
    }
    for spec in &args.synthetic {
        crate::synth::parse_spec(spec)?;
    }
    let ctx = GpuContext::new(&args.gpu.options()?)?;
    let mut sources: Vec<Source> = args.models.iter().cloned().map(Source::File).collect();
    sources.extend(args.synthetic.iter().cloned().map(Source::Synthetic));
    if sources.is_empty() {
        let spec = if ctx.caps.cpu_adapter {
            eprintln!(
                "kiln: {} is a CPU adapter: benchmarking the small synthetic model {CPU_SYNTHETIC} instead of \
                 {DEFAULT_SYNTHETIC} so the run takes about a minute (choose with --synthetic or -m)",
                ctx.info.name
            );
            CPU_SYNTHETIC
        } else {
            DEFAULT_SYNTHETIC
        };
        sources.push(Source::Synthetic(spec.into()));
    }
    let profile = args.profile || crate::profile::profile_env();
    let peak = if profile { Some(crate::kernels::probe::run(&ctx)?.peak) } else { None };
    let opts = BenchOptions {
        tests: tests.clone(),
        repetitions: args.repetitions,
        ubatch: args.ubatch,
        f16_kv,
        warmup: !args.no_warmup,
        profile,
        peak,
    };
    let profiled_runs = if profile { args.repetitions.min(3) as u64 } else { 0 };
    let runs_per_model = tests.len() as u64 * (args.repetitions as u64 + opts.warmup as u64 + profiled_runs);
    let bar = indicatif::ProgressBar::new(runs_per_model * sources.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("bench [{bar:25}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut records: Vec<BenchRecord> = Vec::new();
    for src in &sources {
        let (label, model, synthetic) = match src {
            Source::File(p) => {
                bar.set_message(format!("loading {}", p.display()));
                (p.display().to_string(), Model::load(ctx.clone(), p, &mut |_| {})?, None)
            }
            Source::Synthetic(spec) => {
                bar.set_message(format!("building {spec}"));
                let (preset, ft) = crate::synth::parse_spec(spec)?;
                check_host_memory(&ctx, spec, &preset, ft)?;
                let file: GgufFile = crate::synth::build(&preset, ft)?.into_gguf(spec)?;
                (spec.clone(), Model::load_file(ctx.clone(), file, &mut |_| {})?, Some(spec.as_str()))
            }
        };
        let reps = args.repetitions;
        let recs = bench_model(&model, synthetic, &opts, &mut |test, rep| {
            match rep {
                None => bar.set_message(format!("{label} {test} warm-up")),
                Some(r) => bar.set_message(format!("{label} {test} run {}/{reps}", r + 1)),
            }
            bar.inc(1);
        })?;
        records.extend(recs);
    }
    bar.finish_and_clear();
    let mut o = std::io::stdout().lock();
    match format {
        "json" => {
            let s = serde_json::to_string_pretty(&records)
                .map_err(|e| KilnError::invalid("bench", format!("cannot serialize results: {e}")))?;
            writeln!(o, "{s}")?;
        }
        "csv" => write!(o, "{}", csv(&records))?,
        _ => {
            write!(o, "{}", markdown(&records))?;
            if let Some(p) = &peak {
                writeln!(
                    o,
                    "\nmeasured peaks on {}: read {:.1} GB/s, f32 FMA {:.1} GFLOP/s, dependent dispatch {:.2} µs ({:.2} µs with a timestamp)",
                    ctx.info.name, p.read_gbs, p.gflops, p.dispatch_us, p.timed_dispatch_us
                )?;
            }
            for r in &records {
                if let Some(p) = &r.profile {
                    write!(o, "{}", p.table(&format!("{} {}", r.model.name, r.test), peak.as_ref()))?;
                    if let Some(pts) = r.profiled_ts {
                        writeln!(
                            o,
                            "with timestamps {pts:.2} t/s, without {:.2} t/s (the profile's times include the difference)",
                            r.avg_ts
                        )?;
                    }
                }
            }
            writeln!(o, "\nkiln {} ({}), {}", env!("CARGO_PKG_VERSION"), env!("KILN_GIT_COMMIT"), ctx.describe())?;
        }
    }
    Ok(())
}

/// A synthetic model is built in host memory (its image, plus one tensor while copying; on a
/// CPU adapter the "GPU" copy is host memory too): refuse one that cannot fit, with the sizes,
/// instead of being killed by the OS.
fn check_host_memory(
    ctx: &GpuContext,
    spec: &str,
    preset: &crate::synth::Preset,
    ft: crate::synth::FileType,
) -> Result<()> {
    let (total, largest) = crate::synth::data_bytes(preset, ft)?;
    let needed = total + largest + if ctx.caps.cpu_adapter { total } else { 0 };
    match crate::gpu::host_available_memory() {
        Some(available) if needed > available => Err(KilnError::invalid(
            "--synthetic",
            format!(
                "building {spec} in memory needs {:.1} GiB of host memory and {:.1} GiB are available; \
                 choose a smaller preset or format, or benchmark a model file with -m",
                needed as f64 / (1u64 << 30) as f64,
                available as f64 / (1u64 << 30) as f64
            ),
        )),
        _ => Ok(()),
    }
}
