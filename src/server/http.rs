//! The HTTP side: routes, authentication, limits and the handlers. Handlers parse and check
//! a request, tokenize its prompt (on a blocking thread), take a place in the server's
//! capacity or answer 503, hand the engine a `Job` and turn its events into a response or a
//! stream of server-sent events. They never touch the GPU.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

use crate::server::api::{self, GenRequest, PromptInput};
use crate::server::engine::{Event, Finish, Job};
use crate::server::reply::{ApiError, Endpoint, ReplyHead};
use crate::server::{AppState, Ready};

/// The server's routes and layers.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let limit = state.cfg.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        // The body limit is tower-http's (413 before the body is read where the length is
        // declared); axum's own default limit would be a second, smaller one.
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, state.cfg.timeout))
        .layer(CatchPanicLayer::custom(|_| ApiError::internal("the request handler panicked").into_response()))
        .layer(middleware::map_response(move |r: Response| async move { openai_error(r, limit) }))
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        // 5xx answers are expected (503 while loading or full); failures that matter are
        // logged where they happen (the engine logs GPU faults), not once more per response.
        .layer(TraceLayer::new_for_http().on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)))
        .with_state(state)
}

async fn chat_completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let result = async {
        let req = api::parse_chat(&body_bytes(body, st.cfg.body_limit)?)?;
        generate(&st, req, Endpoint::Chat, received).await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let result = async {
        let req = api::parse_completion(&body_bytes(body, st.cfg.body_limit)?)?;
        generate(&st, req, Endpoint::Completions, received).await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(limit),
        _ => ApiError::invalid("body", e.body_text()),
    })
}

/// Tokenizes, checks the sizes, queues the job and answers (streamed or whole).
async fn generate(
    st: &Arc<AppState>,
    req: GenRequest,
    endpoint: Endpoint,
    received: Instant,
) -> Result<Response, ApiError> {
    let ready = st.ready()?;
    let prompt = tokenize(ready, req.prompt).await?;
    check_fits(prompt.len(), req.generation.max_tokens, ready.n_ctx as usize, endpoint)?;
    let permit = ready.capacity.clone().try_acquire_owned().map_err(|_| ApiError::overloaded(ready.capacity_total))?;
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    st.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
    let job = Job { prompt, generation: req.generation, events, received, permit: Some(permit) };
    if st.jobs.send(job).is_err() {
        st.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::unavailable("the engine has stopped; this server cannot generate"));
    }
    let head = ReplyHead::new(endpoint, &st.cfg.model_id);
    if req.stream {
        Ok(stream(head, rx, req.include_usage))
    } else {
        collect(head, rx).await
    }
}

/// The prompt's token ids: the conversation rendered with the chat template, or the text,
/// or the ids as given (checked against the vocabulary).
async fn tokenize(ready: &Ready, prompt: PromptInput) -> Result<Vec<u32>, ApiError> {
    let (tok, template) = (ready.tokenizer.clone(), ready.template.clone());
    let ids = tokio::task::spawn_blocking(move || match prompt {
        PromptInput::Chat(messages) => crate::chat::render_tokens(&template, &tok, &messages)
            .map_err(|e| ApiError::invalid("messages", format!("the chat template cannot render them: {e}"))),
        PromptInput::Text(text) => tok
            .encode(&text, tok.add_bos_default())
            .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize it: {e}"))),
        PromptInput::Tokens(ids) => match ids.iter().position(|&t| t as usize >= tok.vocab_size()) {
            Some(i) => Err(ApiError::invalid(
                &format!("prompt[{i}]"),
                format!("token id {} is outside the vocabulary of {}", ids[i], tok.vocab_size()),
            )),
            None => Ok(ids),
        },
    })
    .await
    .map_err(|_| ApiError::internal("tokenizing the prompt failed"))??;
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "is empty (and the model adds no BOS token)"));
    }
    Ok(ids)
}

/// 400 when the prompt and `max_tokens` do not fit one slot's context.
fn check_fits(prompt: usize, max_tokens: Option<usize>, n_ctx: usize, endpoint: Endpoint) -> Result<(), ApiError> {
    let what = match endpoint {
        Endpoint::Chat => "the messages take",
        Endpoint::Completions => "the prompt takes",
    };
    let err = |m: String| {
        let mut e = ApiError::context_exceeded(m);
        if endpoint == Endpoint::Completions {
            e.param = Some("prompt".into());
        }
        e
    };
    match max_tokens {
        Some(m) if prompt.saturating_add(m) > n_ctx => Err(err(format!(
            "{what} {prompt} tokens and max_tokens asks for {m}: {} tokens, more than a slot's context of {n_ctx} tokens; shorten the prompt or lower max_tokens",
            prompt.saturating_add(m)
        ))),
        None if prompt >= n_ctx => Err(err(format!(
            "{what} {prompt} tokens, and a slot's context holds {n_ctx} (with room for at least one generated token); shorten the prompt"
        ))),
        _ => Ok(()),
    }
}

/// A non-streamed answer: every event, then the whole response.
async fn collect(head: ReplyHead, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done(finish) => return Ok(Json(head.complete(&text, &finish)).into_response()),
            Event::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    Err(ApiError::internal("the engine stopped before the request finished"))
}

/// Where a stream is.
enum Phase {
    /// Chat streams open with the assistant's role.
    Role,
    Text,
    Usage(Finish),
    Done,
    End,
}

struct StreamState {
    head: ReplyHead,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    phase: Phase,
}

/// Server-sent events: chunks of text, the finish reason, the usage if asked for, then
/// `data: [DONE]`. A failure after the stream began is sent as an error object (no [DONE]).
fn stream(head: ReplyHead, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let state = StreamState { head, rx, include_usage, phase: Phase::Role };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let data = next_data(&mut s).await?;
        Some((Ok::<_, Infallible>(SseEvent::default().data(data)), s))
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

async fn next_data(s: &mut StreamState) -> Option<String> {
    let chunk = |s: &StreamState, mut v: Value| {
        if s.include_usage {
            v["usage"] = Value::Null;
        }
        v.to_string()
    };
    loop {
        match std::mem::replace(&mut s.phase, Phase::End) {
            Phase::Role => {
                s.phase = Phase::Text;
                if s.head.endpoint == Endpoint::Chat {
                    return Some(chunk(s, s.head.chunk(true, None, None)));
                }
            }
            Phase::Text => match s.rx.recv().await {
                Some(Event::Text(t)) => {
                    s.phase = Phase::Text;
                    return Some(chunk(s, s.head.chunk(false, Some(&t), None)));
                }
                Some(Event::Done(finish)) => {
                    s.phase = if s.include_usage { Phase::Usage(finish) } else { Phase::Done };
                    return Some(chunk(s, s.head.chunk(false, None, Some(&finish))));
                }
                Some(Event::Failed(message)) => return Some(ApiError::internal(message).body().to_string()),
                None => {
                    return Some(
                        ApiError::internal("the engine stopped before the request finished").body().to_string(),
                    )
                }
            },
            Phase::Usage(finish) => {
                s.phase = Phase::Done;
                return Some(s.head.usage_chunk(&finish).to_string());
            }
            Phase::Done => return Some("[DONE]".to_string()),
            Phase::End => return None,
        }
    }
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let meta = st.ready.get().map(|r| {
        json!({"n_ctx_slot": r.n_ctx, "n_ctx_train": r.n_ctx_train, "n_vocab": r.tokenizer.vocab_size(), "slots": r.slots})
    });
    Json(json!({"object": "list", "data": [{"id": st.cfg.model_id, "object": "model", "created": st.started,
                                            "owned_by": "kiln", "meta": meta}]}))
}

/// 200 when requests can be served (what a load balancer polls); 503 while loading, after
/// an engine failure and while shutting down.
async fn health(State(st): State<Arc<AppState>>) -> Response {
    let status = st.status();
    let busy = st.metrics.slots_busy.load(Ordering::Relaxed);
    let slots = st.metrics.slots_total.load(Ordering::Relaxed);
    let body = json!({"status": status, "slots_idle": slots.saturating_sub(busy), "slots_processing": busy});
    let code = if status == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut resp = (code, Json(body)).into_response();
    if code != StatusCode::OK {
        resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(1));
    }
    resp
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], st.metrics.render()).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

/// `Authorization: Bearer KEY` on /v1 when the server has a key.
async fn authenticate(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares without stopping at the first difference (no timing hint about the key).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every response by route and status for /metrics.
async fn count_requests(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = match req.uri().path() {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/models" => "/v1/models",
        "/health" => "/health",
        "/metrics" => "/metrics",
        _ => "other",
    };
    let resp = next.run(req).await;
    st.metrics.count_http(route, resp.status().as_u16());
    resp
}

/// The layers' own errors (413 from the body limit, 408 from the timeout) as OpenAI error
/// objects.
fn openai_error(resp: Response, limit: usize) -> Response {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    match resp.status() {
        StatusCode::PAYLOAD_TOO_LARGE if !is_json => ApiError::too_large(limit).into_response(),
        StatusCode::REQUEST_TIMEOUT if !is_json => ApiError::timeout().into_response(),
        _ => resp,
    }
}
