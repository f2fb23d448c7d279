//! `kiln serve`: an OpenAI-compatible HTTP server. One engine thread owns the GPU (the
//! sequence slots) and runs the scheduling loop (`engine.rs`); the HTTP handlers (`http.rs`,
//! on tokio and axum) parse requests (`api.rs`), send the engine jobs over a channel and turn
//! its events into responses (`reply.rs`). `/metrics` renders `metrics.rs`.

pub mod api;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod reply;
pub mod slots;
pub mod stop;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::chat::ChatTemplate;
use crate::error::{KilnError, Result};
use crate::server::engine::Job;
use crate::server::metrics::Metrics;
use crate::server::reply::ApiError;
use crate::server::slots::Slots;
use crate::tokenizer::Tokenizer;

/// How the server behaves (the model aside).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The model's name in responses and /v1/models.
    pub model_id: String,
    /// Requests to /v1 need `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot; past them, 503.
    pub queue_size: usize,
    /// Longest a request may take until its response starts (a whole non-streamed answer).
    pub timeout: Duration,
    /// Largest request body, in bytes.
    pub body_limit: usize,
}

/// What loading produces, on the engine thread.
pub struct Loaded {
    pub slots: Box<dyn Slots>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub n_ctx_train: u32,
}

/// Loads the model and opens the slots (run on the engine thread, which then owns them).
pub type Loader = Box<dyn FnOnce() -> Result<Loaded> + Send>;

/// What handlers need once the model is loaded.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// Context of each slot.
    pub n_ctx: u32,
    pub n_ctx_train: u32,
    pub slots: usize,
    /// Places for requests in slots or waiting for one.
    pub capacity: Arc<Semaphore>,
    pub capacity_total: usize,
}

pub struct AppState {
    pub cfg: ServeConfig,
    pub ready: OnceLock<Ready>,
    pub jobs: std::sync::mpsc::Sender<Job>,
    pub metrics: Arc<Metrics>,
    /// Unix time the server started (`created` of /v1/models).
    pub started: u64,
    /// Set when the engine thread ended unexpectedly.
    engine_down: Arc<AtomicBool>,
    /// Set once shutdown began.
    draining: AtomicBool,
}

impl AppState {
    /// The loaded model, or the 503 that says why there is none.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        match self.status() {
            "ok" => self.ready.get().ok_or_else(|| ApiError::unavailable("the model is loading")),
            "loading model" => Err(ApiError::unavailable("the model is loading; retry when /health says ok")),
            "shutting down" => Err(ApiError::unavailable("the server is shutting down")),
            "gpu fault" => Err(ApiError::unavailable(format!(
                "this server cannot generate after a GPU fault ({}); restart it",
                self.metrics.gpu_fault.get().map_or("", String::as_str)
            ))),
            _ => Err(ApiError::unavailable("the engine has stopped; this server cannot generate")),
        }
    }

    /// "ok", "loading model", "shutting down", "gpu fault" or "engine stopped".
    pub fn status(&self) -> &'static str {
        if self.engine_down.load(Ordering::Relaxed) {
            "engine stopped"
        } else if self.metrics.gpu_fault.get().is_some() {
            "gpu fault"
        } else if self.draining.load(Ordering::Relaxed) {
            "shutting down"
        } else if self.ready.get().is_none() {
            "loading model"
        } else {
            "ok"
        }
    }
}

/// Serves on `listener` until `shutdown` completes: loads the model on the engine thread
/// (/health answers 503 meanwhile), then answers requests. On shutdown it stops accepting
/// connections, lets the requests in flight finish (streams end with `[DONE]`) and returns.
/// A model that fails to load ends it with that error.
pub async fn serve(
    listener: TcpListener,
    cfg: ServeConfig,
    load: Loader,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (jobs, job_rx) = std::sync::mpsc::channel::<Job>();
    let metrics = Arc::new(Metrics::default());
    let engine_down = Arc::new(AtomicBool::new(false));
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let queue_size = cfg.queue_size;
    let state = Arc::new(AppState {
        cfg,
        ready: OnceLock::new(),
        jobs,
        metrics: metrics.clone(),
        started,
        engine_down: engine_down.clone(),
        draining: AtomicBool::new(false),
    });
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<Ready>>();
    let engine = std::thread::Builder::new()
        .name("kiln-engine".into())
        .spawn(move || engine_thread(load, job_rx, metrics, engine_down, queue_size, ready_tx))?;

    // Loading ends in the ready state, or in an error that stops the server.
    let load_error: Arc<Mutex<Option<KilnError>>> = Arc::new(Mutex::new(None));
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let (state, load_error) = (state.clone(), load_error.clone());
        tokio::spawn(async move {
            let error = match ready_rx.await {
                Ok(Ok(ready)) => {
                    tracing::info!("ready: {} slots of {} tokens", ready.slots, ready.n_ctx);
                    let _ = state.ready.set(ready);
                    return;
                }
                Ok(Err(e)) => e,
                Err(_) => KilnError::invalid("model", "the engine thread ended while loading"),
            };
            if let Ok(mut slot) = load_error.lock() {
                *slot = Some(error);
            }
            let _ = failed_tx.send(());
        });
    }
    let signal = {
        let state = state.clone();
        async move {
            // The sender is dropped without a send once the model is ready.
            let load_failed = async {
                if failed_rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = shutdown => {}
                _ = load_failed => {}
            }
            state.draining.store(true, Ordering::Relaxed);
            let busy = state.metrics.slots_busy.load(Ordering::Relaxed);
            tracing::info!("shutting down: no new connections; finishing the requests in flight ({busy} generating)");
        }
    };
    let app = http::router(state.clone());
    axum::serve(listener, app).with_graceful_shutdown(signal).await?;
    let ready = state.ready.get().is_some();
    // The last sender goes with the state: the engine ends once its requests have.
    drop(state);
    if ready {
        let _ = tokio::task::spawn_blocking(move || engine.join()).await;
    }
    match load_error.lock().ok().and_then(|mut e| e.take()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn engine_thread(
    load: Loader,
    jobs: std::sync::mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
    engine_down: Arc<AtomicBool>,
    queue_size: usize,
    ready_tx: tokio::sync::oneshot::Sender<Result<Ready>>,
) {
    let loaded = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)) {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            let _ = ready_tx.send(Err(e));
            return;
        }
        Err(_) => {
            let _ = ready_tx.send(Err(KilnError::invalid("model", "loading panicked")));
            return;
        }
    };
    let Loaded { mut slots, tokenizer, template, n_ctx_train } = loaded;
    let tokenizer = Arc::new(tokenizer);
    let capacity_total = slots.count() + queue_size;
    let ready = Ready {
        tokenizer: tokenizer.clone(),
        template: Arc::new(template),
        n_ctx: slots.n_ctx(),
        n_ctx_train,
        slots: slots.count(),
        capacity: Arc::new(Semaphore::new(capacity_total)),
        capacity_total,
    };
    if ready_tx.send(Ok(ready)).is_err() {
        return;
    }
    let run = std::panic::AssertUnwindSafe(|| engine::run(&mut *slots, &tokenizer, jobs, &metrics));
    if std::panic::catch_unwind(run).is_err() {
        // The requests in flight get 500 (their channels close); /health turns 503 so that a
        // load balancer stops sending here.
        engine_down.store(true, Ordering::Relaxed);
        tracing::error!("the engine panicked: this server can no longer generate (restart it)");
    }
}
