//! Loading a model from the command line: adapter flags, context and batch sizing, a
//! progress bar for the upload.

use std::path::PathBuf;
use std::time::Instant;

use crate::cli::llama_flags::LlamaArgs;
use crate::cli::pull::{model_path, HubArgs};
use crate::cli::GpuArgs;
use crate::engine::Model;
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::model::{ModelConfig, Session, SessionOptions};
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
    /// Most tokens per forward pass during prompt processing (llama.cpp's -ub).
    #[arg(long = "ubatch-size", visible_alias = "ubatch", default_value_t = 512)]
    pub ubatch: u32,
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
        self.ubatch = self.ubatch.min(self.batch);
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
    let t = Instant::now();
    let model = Model::upload(ctx, file, cfg, &mut |b| bar.set_position(b));
    bar.finish_and_clear();
    let model = model?;
    tracing::info!(
        "uploaded {:.1} MiB in {:.2} s",
        model.weights.bytes as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    Ok((model, tok))
}

/// GPU memory of a session's activations (everything but the KV cache), as `Session::new`
/// allocates them, for a context of `n_ctx` and batches of `ubatch` tokens.
pub fn activation_bytes(c: &ModelConfig, n_ctx: u32, ubatch: u32, all_logits: bool) -> u64 {
    let (b, n_ctx) = (ubatch.max(1) as u64, n_ctx as u64);
    let pad4 = |n: u32| (n as u64).div_ceil(4) * 4;
    let (e, q, kv, ff, v) = (pad4(c.n_embd), c.q_dim() as u64, c.kv_dim() as u64, pad4(c.n_ff), c.n_vocab as u64);
    let logit_rows = if all_logits { b } else { 1 };
    let per_batch = b * (1 + 2 * e + 3 * q + 3 * kv + 3 * ff);
    let scores = c.n_head as u64 * b * n_ctx;
    let partials = c.n_head as u64 * n_ctx.div_ceil(32) * (c.head_dim as u64 + 2);
    4 * (per_batch + scores + partials + e + 2 * logit_rows * v)
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
    let mut n_ctx = args.ctx_size.unwrap_or(c.n_ctx_train).max(min_ctx).max(1);
    let mut ubatch = args.ubatch.max(1);
    // One KV buffer per layer (K and V) must fit the largest buffer.
    let per_pos = 2 * c.n_layer as u64 * c.kv_dim() as u64 * if f16_kv { 2 } else { 4 };
    let layer_per_pos = c.kv_dim() as u64 * if f16_kv { 2 } else { 4 };
    let kv_limit = (ctx.limits.max_buffer_size / 2).saturating_mul(c.n_layer as u64);
    if n_ctx as u64 * per_pos > kv_limit {
        let capped = (kv_limit / per_pos) as u32;
        if args.ctx_size.is_some() || capped < min_ctx {
            return Err(KilnError::TooLarge {
                what: format!("a KV cache of {n_ctx} positions"),
                needed: n_ctx as u64 * layer_per_pos,
                limit: ctx.limits.max_buffer_size,
            });
        }
        eprintln!("kiln: context capped at {capped} positions (the model's {n_ctx} would not fit one buffer); use -c to choose");
        n_ctx = capped;
    }
    // The KV cache and activations must fit the memory the weights left.
    if let Some(total) = ctx.device_memory {
        let left = total.saturating_sub(model.weight_gpu_bytes);
        let needed = |n: u32, b: u32| n as u64 * per_pos + activation_bytes(c, n, b, all_logits);
        if needed(n_ctx, ubatch) > left {
            // Smaller batches first (they only cost prompt speed), then a shorter context.
            while ubatch > 32 && needed(n_ctx, ubatch) > left {
                ubatch /= 2;
            }
            let mut fit = n_ctx;
            while fit > 0 && needed(fit, ubatch) > left {
                fit = fit.saturating_sub((fit / 8).max(1));
            }
            if fit < n_ctx {
                if args.ctx_size.is_some() || fit < min_ctx.max(1) {
                    return Err(KilnError::OutOfMemory {
                        what: format!("a context of {n_ctx} tokens (weights, KV cache and activations)"),
                        needed: needed(n_ctx, ubatch) + model.weight_gpu_bytes,
                        available: total,
                        hint: if fit > 0 { format!("use -c {fit} or less") } else { "use a smaller model".into() },
                    });
                }
                eprintln!(
                    "kiln: context reduced to {fit} tokens: the model's {n_ctx} would need {:.1} MiB of GPU memory, the adapter has {:.1} MiB; use -c to choose",
                    (needed(n_ctx, ubatch) + model.weight_gpu_bytes) as f64 / MIB,
                    total as f64 / MIB
                );
                n_ctx = fit;
            }
        }
    }
    let scores_per_token = c.n_head as u64 * n_ctx as u64 * 4;
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
    let before = ctx.buffers_alive().bytes;
    let mut session = model.session(SessionOptions { n_ctx, ubatch, f16_kv, all_logits })?;
    let session_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
    let kv_bytes = n_ctx as u64 * 2 * c.n_layer as u64 * c.kv_dim() as u64 * session.kv_bytes_per_elem();
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
