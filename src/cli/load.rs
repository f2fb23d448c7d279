//! Loading a model from the command line: adapter flags, context and batch sizing, a
//! progress bar for the upload.

use std::path::PathBuf;

use crate::cli::GpuArgs;
use crate::engine::Model;
use crate::gpu::GpuContext;
use crate::model::sizes::{fit_request, SessionRequest};
use crate::model::{Session, SessionSizes};
use crate::tokenizer::Tokenizer;
use crate::{KilnError, Result};

/// Flags shared by every command that runs a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Context length (default: the model's, capped by memory).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<u32>,
    /// Most tokens per forward pass during prompt processing.
    #[arg(long, default_value_t = 512)]
    pub ubatch: u32,
    /// KV cache element type: f16 or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// Per-stage GPU timing of prefill and decode, printed at the end (also PROFILE=1).
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

/// Checks the model file and builds its tokenizer (no GPU needed, so a broken file fails
/// fast), then opens the GPU and uploads the model, with a progress bar on stderr.
pub fn load_model(args: &ModelArgs) -> Result<(Model, Tokenizer)> {
    let (file, cfg) = Model::check(&args.model)?;
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
    bar.set_message(args.model.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default());
    let model = Model::upload(ctx, file, cfg, &mut |b| bar.set_position(b));
    bar.finish_and_clear();
    let model = model?;
    let mib = model.weights.bytes as f64 / (1 << 20) as f64;
    tracing::info!(
        "loaded {mib:.1} MiB of weights in {:.2} s ({:.2} GB/s){}",
        model.load_secs,
        model.weights.bytes as f64 / model.load_secs.max(1e-9) / 1e9,
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
    let request = SessionRequest { ctx_size: args.ctx_size, min_ctx, ubatch: args.ubatch, f16_kv, all_logits };
    let fitted = fit_request(ctx, c, model.weight_gpu_bytes, &request)?;
    for note in &fitted.notes {
        eprintln!("kiln: {note}");
    }
    let before = ctx.buffers_alive().bytes;
    let mut session = model.session(fitted.opts)?;
    let (n_ctx, ubatch) = (session.opts.n_ctx, session.opts.ubatch);
    let session_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
    let kv_bytes = SessionSizes::new(c, &session.opts).kv_bytes();
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
