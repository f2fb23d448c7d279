//! `kiln serve`: the OpenAI-compatible server (`crate::server`) from the command line: binds
//! the address first (so /health answers 503 while the model loads), loads the model on the
//! engine thread, and stops cleanly on SIGTERM or Ctrl-C.

use std::time::Duration;

use crate::chat::ChatTemplate;
use crate::cli::load::{load_model, ModelArgs};
use crate::server::engine::prefill_budget;
use crate::server::slots::{plan_slots, BatchedSlots, SessionSlots, Slots};
use crate::server::{serve, Loaded, ServeConfig};
use crate::{KilnError, Result};

/// Default largest request body: 8 MiB (a long conversation in JSON).
const BODY_LIMIT: usize = 8 << 20;

#[derive(clap::Args, Debug)]
#[command(mut_arg("ctx_size", |a| a.help("Total KV cache budget in tokens, split evenly over the slots (default: the model's context for each slot, capped by memory)")))]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequence slots: requests generated at the same time (llama-server's -np).
    #[arg(long = "parallel", default_value_t = 4)]
    pub parallel: u32,
    /// Requests that may wait for a free slot; past them the server answers 503.
    #[arg(long = "queue-size", default_value_t = 32)]
    pub queue_size: usize,
    /// Require `Authorization: Bearer KEY` on /v1 (default: KILN_API_KEY, else none).
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,
    /// Chat template: chatml, llama2, llama3 or zephyr (default: the model's own).
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// The model's name in responses and /v1/models (default: the file's name).
    #[arg(long = "alias")]
    pub alias: Option<String>,
    /// Seconds a request may take until its response starts (a whole non-streamed answer).
    #[arg(long = "timeout", default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body in bytes.
    #[arg(long = "body-limit", default_value_t = BODY_LIMIT)]
    pub body_limit: usize,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if args.parallel == 0 {
        return Err(KilnError::invalid("--parallel", "at least one slot is needed"));
    }
    let mut margs = args.model.clone();
    // Resolve (and download, for -hf) before binding: a bad model path fails at once.
    let path = margs.resolve()?;
    let model_id = args
        .alias
        .clone()
        .unwrap_or_else(|| path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "model".into()));
    let cfg = ServeConfig {
        model_id,
        api_key: args.api_key.clone().or_else(crate::config::api_key_from_env),
        queue_size: args.queue_size,
        timeout: Duration::from_secs(args.timeout.max(1)),
        body_limit: args.body_limit,
    };
    let (parallel, template_name) = (args.parallel, args.chat_template.clone());
    let load = Box::new(move || load_slots(margs, parallel, template_name.as_deref()));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await.map_err(|e| {
            KilnError::invalid("--host/--port", format!("cannot listen on {}:{}: {e}", args.host, args.port))
        })?;
        let addr = listener.local_addr()?;
        eprintln!("kiln serve: listening on http://{addr} (loading the model; /health says when it is ready)");
        serve(listener, cfg, load, shutdown_signal()).await
    })?;
    eprintln!("kiln serve: stopped");
    Ok(())
}

/// Loads the model and opens `parallel` slots (on the engine thread).
fn load_slots(mut margs: ModelArgs, parallel: u32, template: Option<&str>) -> Result<Loaded> {
    let f16_kv = match margs.kv_type.as_str() {
        "f16" => true,
        "f32" => false,
        other => return Err(KilnError::invalid("--kv-type", format!("{other:?} (expected f16 or f32)"))),
    };
    if margs.profile || crate::profile::profile_env() {
        eprintln!(
            "kiln serve: --profile (PROFILE=1) is not supported by the server; use kiln run or kiln bench to profile"
        );
    }
    let (model, tokenizer) = load_model(&mut margs)?;
    let bos = tokenizer.bos().and_then(|b| tokenizer.token_str(b)).unwrap_or("").to_string();
    let eos = tokenizer.eos().and_then(|b| tokenizer.token_str(b)).unwrap_or("").to_string();
    let template = ChatTemplate::select(&model.file, template, bos, eos)?;
    // The engine feeds at most prefill_budget() tokens per step: a larger ubatch would only
    // take memory. Without -ub, llama.cpp's default, within -b as an explicit -ub is.
    let ubatch = margs.ubatch.unwrap_or(crate::plan::DEFAULT_UBATCH.min(margs.batch)).min(prefill_budget() as u32);
    // Batched slots (one KV cache, decode steps over every generating slot at once) unless
    // KILN_SERVE_SLOTS=sessions asks for a session per slot.
    let batched = !crate::config::serve_session_slots_from_env();
    let plan = plan_slots(&model, margs.ctx_size, parallel, ubatch, f16_kv, batched)?;
    for note in &plan.notes {
        eprintln!("kiln serve: {note}");
    }
    let t = std::time::Instant::now();
    let (slots, how): (Box<dyn Slots>, String) = if batched {
        let mut slots = BatchedSlots::open(&model, plan.opts, plan.count)?;
        slots.warm_up()?;
        let cols = slots.session().batch_columns();
        (Box::new(slots), format!("one shared KV cache, up to {cols} per decode step"))
    } else {
        let mut slots = SessionSlots::open(&model, plan.opts, plan.count)?;
        slots.warm_up()?;
        (Box::new(slots), "a session each, stepped one after another".into())
    };
    tracing::info!("warm-up (compiling the kernels) took {:.2} s", t.elapsed().as_secs_f64());
    eprintln!(
        "kiln serve: {} ({} template), {} slot{} of {} tokens ({how}); ready",
        model.cfg.name,
        template.source,
        plan.count,
        if plan.count == 1 { "" } else { "s" },
        plan.opts.n_ctx
    );
    Ok(Loaded { slots, tokenizer, template, n_ctx_train: model.cfg.n_ctx_train })
}

/// SIGTERM or Ctrl-C; a second one exits at once (the requests in flight are cut off).
async fn shutdown_signal() {
    first_signal().await;
    tokio::spawn(async {
        first_signal().await;
        eprintln!("kiln serve: second signal, exiting now");
        std::process::exit(130);
    });
}

async fn first_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
