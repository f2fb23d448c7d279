//! Loading a model from the command line: adapter flags, context and batch sizing, a
//! progress bar for the upload.

use std::path::PathBuf;
use std::time::Instant;

use crate::cli::GpuArgs;
use crate::engine::Model;
use crate::gpu::GpuContext;
use crate::model::{Session, SessionOptions};
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

/// Opens the GPU and uploads the model, with a progress bar on stderr.
pub fn load_model(args: &ModelArgs) -> Result<Model> {
    let ctx = GpuContext::new(&args.gpu.options()?)?;
    tracing::info!("adapter: {}", ctx.describe());
    let total = std::fs::metadata(&args.model).map(|m| m.len()).unwrap_or(0);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(args.model.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default());
    let t = Instant::now();
    let model = Model::load(ctx, &args.model, &mut |b| bar.set_position(b));
    bar.finish_and_clear();
    let model = model?;
    tracing::info!(
        "uploaded {:.1} MiB in {:.2} s",
        model.weights.bytes as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    Ok(model)
}

/// Sizes a session: context from -c or the model (capped by what fits), the batch so the
/// attention scratch fits one binding.
pub fn open_session(model: &Model, args: &ModelArgs, min_ctx: u32, all_logits: bool) -> Result<Session> {
    let f16_kv = match args.kv_type.as_str() {
        "f16" => true,
        "f32" => false,
        other => return Err(KilnError::invalid("--kv-type", format!("{other:?} (expected f16 or f32)"))),
    };
    let c = &model.cfg;
    let ctx = &model.ctx;
    let mut n_ctx = args.ctx_size.unwrap_or(c.n_ctx_train).max(min_ctx).max(1);
    // Cap the KV cache at half of the largest buffer times the layer count, a proxy for
    // memory the adapter can give.
    let per_pos = 2 * c.n_layer as u64 * c.kv_dim() as u64 * if f16_kv { 2 } else { 4 };
    let kv_limit = (ctx.limits.max_buffer_size / 2).saturating_mul(c.n_layer as u64);
    if n_ctx as u64 * per_pos > kv_limit {
        let capped = (kv_limit / per_pos) as u32;
        if args.ctx_size.is_some() || capped < min_ctx {
            return Err(KilnError::TooLarge {
                what: format!("a KV cache of {n_ctx} positions"),
                needed: n_ctx as u64 * per_pos,
                limit: kv_limit,
            });
        }
        eprintln!("kiln: context capped at {capped} positions (the model's {n_ctx} would not fit); use -c to choose");
        n_ctx = capped;
    }
    let scores_per_token = c.n_head as u64 * n_ctx as u64 * 4;
    let mut ubatch = args.ubatch.max(1);
    let fit = (ctx.max_binding / scores_per_token.max(1)) as u32;
    if fit == 0 {
        return Err(KilnError::TooLarge {
            what: format!("attention over {n_ctx} positions"),
            needed: scores_per_token,
            limit: ctx.max_binding,
        });
    }
    if ubatch > fit {
        tracing::info!("ubatch lowered from {ubatch} to {fit} so attention scores fit one binding");
        ubatch = fit;
    }
    let mut session = model.session(SessionOptions { n_ctx, ubatch, f16_kv, all_logits })?;
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
