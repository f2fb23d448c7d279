//! `kiln bench`: llama-bench's flags and tables, on model files or on synthetic models built
//! in memory (no download needed).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::bench::{bench_model, csv_row, markdown_header, markdown_row, BenchOptions, BenchRecord, Test, CSV_HEADER};
use crate::cli::llama_flags::{parse_flash_attn, parse_gpu_layers, FlashAttn};
use crate::cli::pull::HubArgs;
use crate::cli::GpuArgs;
use crate::engine::Model;
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::{KilnError, Result};

/// The synthetic model `kiln bench` runs when given none.
pub const DEFAULT_SYNTHETIC: &str = "tinyllama-1.1b:q4_k_m";
/// What it runs instead on a CPU adapter, where the default would take many minutes.
pub const CPU_SYNTHETIC: &str = "mini-llama:q4_k_m";
/// The sizes of that run: prompt, generation and repetitions, so that it takes about a minute
/// on two cores with lavapipe.
pub const CPU_SIZES: (u32, u32, u32) = (128, 32, 3);

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// GGUF model files (repeatable or comma-separated).
    #[arg(short = 'm', long = "model", value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// Models from Hugging Face, OWNER/NAME[:QUANT] (repeatable; llama.cpp's -hf), downloaded
    /// once into KILN_CACHE.
    #[arg(long = "hf-repo", value_name = "REPO[:QUANT]")]
    pub hf_repo: Vec<String>,
    /// Hugging Face access token (default: HF_TOKEN).
    #[arg(long = "hf-token", value_name = "TOKEN")]
    pub hf_token: Option<String>,
    /// Synthetic models built in memory, PRESET:FORMAT (repeatable or comma-separated), e.g.
    /// tinyllama-1.1b:q4_k_m. Presets: tinyllama-1.1b, llama-7b, qwen3-0.6b, mini-llama,
    /// tiny-test; formats: q4_k_m, q5_k_m, q6_k, q8_0, f16. Default when no -m is given:
    /// tinyllama-1.1b:q4_k_m (mini-llama:q4_k_m on a CPU adapter).
    #[arg(long, value_delimiter = ',')]
    pub synthetic: Vec<String>,
    /// Prompt sizes to test (comma-separated; 0 skips; default 512, 128 for the default run
    /// on a CPU adapter).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',')]
    pub n_prompt: Vec<u32>,
    /// Generation sizes to test (comma-separated; 0 skips; default 128, 32 for the default
    /// run on a CPU adapter).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',')]
    pub n_gen: Vec<u32>,
    /// A prompt of PP tokens then TG generated, timed together (llama-bench's -pg; repeatable).
    #[arg(long = "pg", value_name = "PP,TG", value_parser = parse_pg)]
    pub pg: Vec<(u32, u32)>,
    /// Run each test after this many tokens are already in the KV cache (comma-separated;
    /// the test is then named e.g. "tg128 @ d4096", as llama-bench's -d).
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    pub n_depth: Vec<u32>,
    /// Also run every generation test with this many sequences decoded together, one token
    /// of each per step as `kiln serve --parallel` steps its slots (comma-separated; the test
    /// is then named e.g. "tg128 x8" and its t/s counts every sequence's tokens, as
    /// llama-batched-bench's -npl). 1: one sequence stepped as the server steps it.
    #[arg(long = "parallel", value_delimiter = ',')]
    pub parallel: Vec<u32>,
    /// Repetitions of each test (default 5; 3 for the default run on a CPU adapter).
    #[arg(short = 'r', long = "repetitions")]
    pub repetitions: Option<u32>,
    /// Tokens per prompt-processing call (llama-bench's -b, comma-separated): caps -ub.
    #[arg(short = 'b', long = "batch-size", value_delimiter = ',', default_value = "2048")]
    pub batch: Vec<u32>,
    /// Most tokens per forward pass during prompt processing (llama-bench's -ub,
    /// comma-separated: each value is its own set of tests; default: the planner's, as `kiln
    /// run`'s, 2048 on GPUs with cooperative matrices and memory to spare, else 512).
    #[arg(long = "ubatch-size", visible_alias = "ubatch", value_delimiter = ',')]
    pub ubatch: Vec<u32>,
    /// Layers on the GPU (llama-bench's -ngl). Accepted; kiln keeps every layer on the GPU.
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_delimiter = ',', allow_hyphen_values = true, value_parser = parse_gpu_layers)]
    pub n_gpu_layers: Vec<String>,
    /// Flash attention, 0|1 or on|off|auto (llama-bench's -fa). Accepted; kiln's attention
    /// kernels are the same either way.
    #[arg(long = "flash-attn", value_delimiter = ',', value_parser = parse_flash_attn)]
    pub flash_attn: Vec<FlashAttn>,
    /// KV cache element type: f16 or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// Output format: md, json, jsonl or csv; rows are printed as their tests finish.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
    /// Progress lines on stderr (instead of a progress bar), as llama-bench's --progress.
    #[arg(long)]
    pub progress: bool,
    /// Skip the untimed warm-up: a third of a second of prefills before the first timed test (GPUs), and a run of each test before its repetitions.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Per-stage GPU profile of every test (also PROFILE=1).
    #[arg(long)]
    pub profile: bool,
    /// Also time every generation test without each decode stage in turn: what each stage
    /// costs the step, its launch and barrier included; then without the int8 GEMVs' quantize
    /// dispatches, what fusing them would save (the results of those runs are wrong).
    #[arg(long)]
    pub ablate: bool,
    /// Generation tests sample on the GPU at this temperature, with llama.cpp's default
    /// top-k 40, top-p 0.95, min-p 0.05 (0, the default: greedy, as llama-bench).
    #[arg(long = "temp", default_value_t = 0.0)]
    pub temp: f32,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

/// "512,128" → (512, 128).
fn parse_pg(s: &str) -> std::result::Result<(u32, u32), String> {
    let parse = |x: &str| x.trim().parse::<u32>().map_err(|_| format!("{s:?} is not PP,TG (two token counts)"));
    match s.split_once(',') {
        Some((p, g)) => Ok((parse(p)?, parse(g)?)),
        None => Err(format!("{s:?} is not PP,TG (two token counts)")),
    }
}

enum Source {
    File(PathBuf),
    Synthetic(String),
}

/// Where the records go as their tests finish.
struct Output {
    format: &'static str,
    show_ubatch: bool,
    rows: usize,
}

impl Output {
    fn header(&self) -> String {
        match self.format {
            "md" => markdown_header(self.show_ubatch),
            "csv" => CSV_HEADER.to_string(),
            "json" => "[\n".to_string(),
            _ => String::new(),
        }
    }

    fn row(&mut self, r: &BenchRecord) -> Result<String> {
        let json = |pretty: bool| {
            let s = if pretty { serde_json::to_string_pretty(r) } else { serde_json::to_string(r) };
            s.map_err(|e| KilnError::invalid("bench", format!("cannot serialize results: {e}")))
        };
        let first = self.rows == 0;
        self.rows += 1;
        Ok(match self.format {
            "md" => markdown_row(r, self.show_ubatch),
            "csv" => csv_row(r),
            "json" => format!("{}{}", if first { "" } else { ",\n" }, json(true)?),
            _ => format!("{}\n", json(false)?),
        })
    }

    fn footer(&self) -> &'static str {
        if self.format == "json" {
            "\n]\n"
        } else {
            ""
        }
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let format = match args.output.as_str() {
        "md" => "md",
        "json" => "json",
        "jsonl" => "jsonl",
        "csv" => "csv",
        other => {
            return Err(KilnError::invalid("-o", format!("unknown output format {other:?} (md, json, jsonl or csv)")))
        }
    };
    let f16_kv = match args.kv_type.as_str() {
        "f16" => true,
        "f32" => false,
        other => return Err(KilnError::invalid("--kv-type", format!("{other:?} (expected f16 or f32)"))),
    };
    if args.repetitions == Some(0) {
        return Err(KilnError::invalid("-r", "at least one repetition is needed"));
    }
    // The tests are decided once the adapter is known (a CPU adapter's default run is smaller).
    let tests_of = |n_prompt: &[u32], n_gen: &[u32]| -> Vec<Test> {
        let mut tests: Vec<Test> = n_prompt.iter().filter(|&&n| n > 0).map(|&n| Test::Prompt(n)).collect();
        tests.extend(n_gen.iter().filter(|&&n| n > 0).map(|&n| Test::Gen(n)));
        tests.extend(args.pg.iter().filter(|(p, g)| p + g > 0).map(|&(p, g)| Test::PromptGen(p, g)));
        tests
    };
    let or = |v: &[u32], default: u32| if v.is_empty() { vec![default] } else { v.to_vec() };
    let mut tests = tests_of(&or(&args.n_prompt, 512), &or(&args.n_gen, 128));
    if tests.is_empty() {
        return Err(KilnError::invalid("-p/-n/-pg", "no test to run (every size is 0)"));
    }
    // (-b, effective ubatch) pairs: llama.cpp caps the ubatch at the batch; None: the
    // planner's, chosen per model.
    let ubatches: Vec<Option<u32>> =
        if args.ubatch.is_empty() { vec![None] } else { args.ubatch.iter().map(|&u| Some(u)).collect() };
    let mut batches: Vec<(u32, Option<u32>)> = Vec::new();
    for &b in &args.batch {
        for &ub in &ubatches {
            if b == 0 || ub == Some(0) {
                return Err(KilnError::invalid("-b/-ub", "batch sizes must be at least 1"));
            }
            let pair = (b, ub.map(|u| u.min(b)));
            if !batches.contains(&pair) {
                batches.push(pair);
            }
        }
    }
    if !args.n_gpu_layers.is_empty() {
        tracing::info!("-ngl {}: kiln keeps every layer on the GPU", args.n_gpu_layers.join(","));
    }
    if !args.flash_attn.is_empty() {
        tracing::info!("-fa {:?}: kiln's attention kernels are the same either way", args.flash_attn);
    }
    for spec in &args.synthetic {
        crate::synth::parse_spec(spec)?;
    }
    let ctx = GpuContext::new(&args.gpu.options()?)?;
    if let Some(hint) = crate::cli::info::gl_software_hint(&ctx) {
        eprintln!("kiln: {hint}");
    }
    let mut sources: Vec<Source> = args.models.iter().cloned().map(Source::File).collect();
    for spec in &args.hf_repo {
        let hub = HubArgs { hf_repo: Some(spec.clone()), hf_file: None, hf_token: args.hf_token.clone() };
        sources.extend(hub.model_file()?.map(Source::File));
    }
    sources.extend(args.synthetic.iter().cloned().map(Source::Synthetic));
    let mut repetitions = args.repetitions.unwrap_or(5);
    if sources.is_empty() {
        let spec = if ctx.caps.cpu_adapter {
            let (p, n, r) = CPU_SIZES;
            repetitions = args.repetitions.unwrap_or(r);
            tests = tests_of(&or(&args.n_prompt, p), &or(&args.n_gen, n));
            let names: Vec<String> = tests.iter().map(|t| t.name(0)).collect();
            eprintln!(
                "kiln: {} is a CPU adapter: benchmarking the small synthetic model {CPU_SYNTHETIC} instead of \
                 {DEFAULT_SYNTHETIC} ({}, {repetitions} repetitions) so the run takes about a minute \
                 (choose with --synthetic or -m, -p, -n, -r)",
                ctx.info.name,
                names.join(", ")
            );
            CPU_SYNTHETIC
        } else {
            DEFAULT_SYNTHETIC
        };
        sources.push(Source::Synthetic(spec.into()));
    }
    let profile = args.profile || crate::profile::profile_env();
    let peak = if profile { Some(crate::kernels::probe::run(&ctx)?.peak) } else { None };
    let warmup = !args.no_warmup;
    let profiled_runs = if profile { repetitions.min(3) as u64 } else { 0 };
    let depths = args.n_depth.len().max(1) as u64;
    if args.parallel.contains(&0) {
        return Err(KilnError::invalid("--parallel", "at least one sequence is needed"));
    }
    let gen_tests = tests.iter().filter(|t| matches!(t, Test::Gen(_))).count();
    let mut widths = args.parallel.clone();
    widths.sort_unstable();
    widths.dedup();
    let parallel_tests = gen_tests * widths.len();
    let runs_per_model = (tests.len() + parallel_tests) as u64
        * depths
        * batches.len() as u64
        * (repetitions as u64 + warmup as u64 + profiled_runs);
    let bar = if args.progress {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(runs_per_model * sources.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("bench [{bar:25}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut out = Output { format, show_ubatch: batches.iter().any(|&(_, ub)| ub != Some(512)), rows: 0 };
    let mut stdout = std::io::stdout();
    let mut emit = |text: &str| -> Result<()> {
        bar.suspend(|| -> Result<()> {
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
            Ok(())
        })
    };
    emit(&out.header())?;
    let mut records: Vec<BenchRecord> = Vec::new();
    for src in &sources {
        let (label, model, synthetic, load_secs) = match src {
            Source::File(p) => {
                bar.set_message(format!("loading {}", p.display()));
                let t = Instant::now();
                let model = Model::load(ctx.clone(), p, &mut |_| {})?;
                (p.display().to_string(), model, None, t.elapsed().as_secs_f64())
            }
            Source::Synthetic(spec) => {
                bar.set_message(format!("building {spec}"));
                let (preset, ft) = crate::synth::parse_spec(spec)?;
                check_host_memory(&ctx, spec, &preset, ft)?;
                let file: GgufFile = crate::synth::build(&preset, ft)?.into_gguf(spec)?;
                // Load time counts from the GGUF image in memory, as from a file in the page cache.
                let t = Instant::now();
                let model = Model::load_file(ctx.clone(), file, &mut |_| {})?;
                (spec.clone(), model, Some(spec.as_str()), t.elapsed().as_secs_f64())
            }
        };
        for &(n_batch, ubatch) in &batches {
            let opts = BenchOptions {
                tests: tests.clone(),
                depths: args.n_depth.clone(),
                repetitions,
                n_batch,
                ubatch,
                f16_kv,
                warmup,
                profile,
                peak,
                ablate: args.ablate,
                parallel: args.parallel.clone(),
                sampling: (args.temp > 0.0).then(|| crate::sample::SamplerConfig {
                    temperature: args.temp,
                    seed: 1,
                    ..Default::default()
                }),
            };
            let mut progress = |test: &str, rep: Option<u32>| {
                let what = match rep {
                    None => format!("{label} {test} warm-up"),
                    Some(r) => format!("{label} {test} run {}/{repetitions}", r + 1),
                };
                if args.progress {
                    eprintln!("kiln bench: {what}");
                }
                bar.set_message(what);
                bar.inc(1);
            };
            bench_model(&model, synthetic, Some(load_secs), &opts, &mut progress, &mut |r| {
                emit(&out.row(&r)?)?;
                records.push(r);
                Ok(())
            })?;
        }
    }
    bar.finish_and_clear();
    emit(out.footer())?;
    if format == "md" {
        let mut o = std::io::stdout().lock();
        if let Some(p) = &peak {
            writeln!(
                o,
                "\nmeasured peaks on {}: read {:.1} GB/s, f32 FMA {:.1} GFLOP/s{}, dependent dispatch {:.2} µs ({:.2} µs with a timestamp)",
                ctx.info.name,
                p.read_gbs,
                p.gflops,
                mma_peak_text(p),
                p.dispatch_us,
                p.timed_dispatch_us
            )?;
        }
        for r in &records {
            if let Some(h) = &r.host_us_per_step {
                writeln!(
                    o,
                    "{} {}: host per step (no timestamps) record {:.1} µs, submit {:.1} µs, wait {:.1} µs",
                    r.model.name, r.test, h.encode, h.submit, h.wait
                )?;
            }
            if let Some(t) = &r.ttft {
                if r.test == records.iter().find(|x| x.model.path == r.model.path).map_or("", |x| x.test.as_str()) {
                    writeln!(
                        o,
                        "{}: time to first token of a {}-token prompt {:.1} ms (best {:.1} ms){}",
                        r.model.name,
                        t.prompt_tokens,
                        t.first_ms,
                        t.best_ms,
                        r.load_secs.map(|l| format!("; loaded in {l:.2} s")).unwrap_or_default()
                    )?;
                }
            }
            if let Some(b) = &r.back_to_back {
                writeln!(
                    o,
                    "{} {}: steps back to back (one submit per 64): GPU {:.1} µs per step ({:.0} t/s at the GPU's pace); host record {:.1} µs, submit {:.1} µs per step",
                    r.model.name, r.test, b.gpu_us, 1e6 / b.gpu_us.max(1e-9), b.record_us, b.submit_us
                )?;
            }
            if let Some(costs) = &r.ablation {
                writeln!(
                    o,
                    "\n{} {}: what each stage costs a step (the step without it is that much faster)\n",
                    r.model.name, r.test
                )?;
                writeln!(
                    o,
                    "| stage | µs per token | share of the step | GPU µs per token (back to back) |\n|---|---:|---:|---:|"
                )?;
                let step = 1e6 / r.avg_ts;
                let gpu = |v: Option<f64>| v.map(|g| format!("{g:.1}")).unwrap_or_else(|| "-".into());
                let row = |o: &mut dyn std::io::Write, c: &crate::bench::StageCost| {
                    let name = if c.kernel { format!("{} (every stage's)", c.stage) } else { c.stage.clone() };
                    let share = 100.0 * c.us_per_token / step;
                    writeln!(o, "| {name} | {:.1} | {share:.1}% | {} |", c.us_per_token, gpu(c.gpu_us_per_token))
                };
                let stages: Vec<_> = costs.iter().filter(|c| !c.kernel).collect();
                for c in &stages {
                    row(&mut o, c)?;
                }
                let sum: f64 = stages.iter().map(|c| c.us_per_token).sum();
                let gsum = stages.iter().map(|c| c.gpu_us_per_token).sum::<Option<f64>>();
                writeln!(
                    o,
                    "| (all stages) | {sum:.1} | {:.1}% of {step:.1} µs | {} of {} |",
                    100.0 * sum / step,
                    gpu(gsum),
                    gpu(r.back_to_back.map(|b| b.gpu_us))
                )?;
                // Kernels left out of every stage at once: part of the stages above.
                for c in costs.iter().filter(|c| c.kernel) {
                    row(&mut o, c)?;
                }
            }
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

/// ", f16 matrix multiply-add N GFLOP/s" where the adapter has cooperative matrices.
fn mma_peak_text(p: &crate::profile::Peak) -> String {
    if p.mma_gflops > 0.0 {
        format!(", f16 matrix multiply-add {:.1} GFLOP/s", p.mma_gflops)
    } else {
        String::new()
    }
}
