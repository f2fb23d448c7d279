//! Loading a model from the command line: adapter flags, context and batch sizing, a
//! progress bar for the upload.

use std::path::PathBuf;

use crate::cli::llama_flags::LlamaArgs;
use crate::cli::pull::{model_path, HubArgs};
use crate::cli::GpuArgs;
use crate::engine::Model;
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::model::sizes::{fit_request, SessionRequest};
use crate::model::{ModelConfig, Session, SessionSizes};
use crate::tokenizer::Tokenizer;
use crate::{KilnError, Result};

/// Flags shared by every command that runs a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file.
    #[arg(short = 'm', long = "model", required_unless_present = "hf_repo", conflicts_with = "hf_repo")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// Context length (default: the model's, capped by memory).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<u32>,
    /// Most tokens per forward pass during prompt processing (llama.cpp's -ub; default: the
    /// planner's, 2048 on GPUs with cooperative matrices and memory to spare, else 512).
    #[arg(long = "ubatch-size", visible_alias = "ubatch")]
    pub ubatch: Option<u32>,
    /// Most tokens per prompt-processing call (llama.cpp's -b); kiln feeds the prompt in
    /// ubatches, so this only caps -ub, as in llama.cpp.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch: u32,
    /// KV cache element type: f16 or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// Per-stage GPU timing of prefill and decode, printed at the end (also PROFILE=1).
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub llama: LlamaArgs,
}

impl ModelArgs {
    /// Resolves the flags into what loading uses: the model file (downloaded for -hf), the
    /// ubatch capped by -b, and the effect of llama.cpp's flags. Call once, before loading.
    pub fn resolve(&mut self) -> Result<PathBuf> {
        self.llama.apply();
        if self.batch == 0 {
            return Err(KilnError::invalid("-b", "the batch size must be at least 1"));
        }
        self.ubatch = self.ubatch.map(|u| u.min(self.batch));
        let path = model_path(self.model.as_ref(), &self.hub)?;
        self.model = Some(path.clone());
        Ok(path)
    }
}

/// Checks the model file and builds its tokenizer (no GPU needed, so a broken file fails
/// fast), then opens the GPU and uploads the model, with a progress bar on stderr.
pub fn load_model(args: &mut ModelArgs) -> Result<(Model, Tokenizer)> {
    let path = args.resolve()?;
    let (file, cfg) = if args.llama.no_mmap {
        let bytes = std::fs::read(&path)
            .map_err(|e| KilnError::File { path: path.clone(), message: format!("cannot read: {e}") })?;
        let file = GgufFile::from_bytes(&path, bytes)?;
        let cfg = ModelConfig::from_gguf(&file)?;
        cfg.validate_tensors(&file)?;
        (file, cfg)
    } else {
        Model::check(&path)?
    };
    let tok = Tokenizer::from_gguf(&file)?;
    let ctx = GpuContext::new(&args.gpu.options()?)?;
    tracing::info!("adapter: {}", ctx.describe());
    let total = file.file_len();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default());
    let model = Model::upload(ctx, file, cfg, &mut |b| bar.set_position(b));
    bar.finish_and_clear();
    let model = model?;
    let mib = model.weights.bytes as f64 / (1 << 20) as f64;
    let staging = model.ctx.upload_stats();
    tracing::info!(
        "loaded {mib:.1} MiB of weights in {:.2} s ({:.2} GB/s; staging filled by {} threads in {:.2} s, {:.2} s waiting for the GPU's copies){}",
        model.load_secs,
        model.weights.bytes as f64 / model.load_secs.max(1e-9) / 1e9,
        staging.threads,
        staging.fill_secs,
        staging.wait_secs,
        match crate::gpu::host_resident_memory() {
            Some((now, peak)) =>
                format!("; host memory {:.1} MiB, peak {:.1} MiB", now as f64 / MIB, peak as f64 / MIB),
            None => String::new(),
        }
    );
    Ok((model, tok))
}

/// Sizes a session: context from -c or the model's, capped by the largest buffer and by the
/// adapter's memory (with a warning, or an error when -c asked for more); the batch so the
/// attention scratch fits one binding. `-v` reports the GPU memory it takes.
pub fn open_session(model: &Model, args: &ModelArgs, min_ctx: u32, all_logits: bool) -> Result<Session> {
    let f16_kv = match args.kv_type.as_str() {
        "f16" => true,
        "f32" => false,
        other => return Err(KilnError::invalid("--kv-type", format!("{other:?} (expected f16 or f32)"))),
    };
    let c = &model.cfg;
    let ctx = &model.ctx;
    let request =
        SessionRequest { ctx_size: args.ctx_size, min_ctx, ubatch: args.ubatch, batch: args.batch, f16_kv, all_logits };
    let fitted = fit_request(ctx, c, model.weight_gpu_bytes, &request)?;
    for note in &fitted.notes {
        eprintln!("kiln: {note}");
    }
    let before = ctx.buffers_alive().bytes;
    let mut session = model.session(fitted.opts)?;
    let (n_ctx, ubatch) = (session.opts.n_ctx, session.opts.ubatch);
    let session_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
    let kv_bytes = SessionSizes::new(c, &session.opts, &ctx.caps).kv_bytes();
    tracing::info!(
        "GPU memory: weights {:.1} MiB, KV cache {:.1} MiB ({n_ctx} tokens), activations {:.1} MiB (batch {ubatch}); total {:.1} MiB{}",
        model.weight_gpu_bytes as f64 / MIB,
        kv_bytes as f64 / MIB,
        session_bytes.saturating_sub(kv_bytes) as f64 / MIB,
        (model.weight_gpu_bytes + session_bytes) as f64 / MIB,
        match ctx.device_memory {
            Some(m) => format!(" of {:.1} MiB", m as f64 / MIB),
            None => String::new(),
        }
    );
    let t = std::time::Instant::now();
    session.build_pipelines()?;
    tracing::info!("pipelines built in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    if args.profile || crate::profile::profile_env() {
        session.enable_profiling()?;
    }
    Ok(session)
}

/// Prints the session's per-stage profile to stderr (when profiling), against the device
/// peaks measured now.
pub fn report_profile(session: &Session) -> Result<()> {
    let Some(profile) = session.profile() else {
        return Ok(());
    };
    let peak = crate::kernels::probe::run(session.context())?.peak;
    eprintln!(
        "\nprofile on {}: measured peaks read {:.1} GB/s, f32 FMA {:.1} GFLOP/s, dependent dispatch {:.2} µs ({:.2} µs with a timestamp)",
        session.context().info.name,
        peak.read_gbs,
        peak.gflops,
        peak.dispatch_us,
        peak.timed_dispatch_us
    );
    eprint!("{}", profile.tables(Some(&peak)));
    Ok(())
}

const MIB: f64 = (1 << 20) as f64;
