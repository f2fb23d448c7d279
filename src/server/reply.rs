//! Responses in OpenAI's shapes: completions, streamed chunks, usage, and the error object
//! `{"error": {"message", "type", "param", "code"}}` with its HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::server::engine::Finish;

/// An error as OpenAI's API reports it.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// Starts with the field's name where one field is at fault.
    pub message: String,
    /// OpenAI's `type`: invalid_request_error, authentication_error, server_error, …
    pub kind: &'static str,
    pub code: Option<&'static str>,
    /// The request field at fault.
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, code, param: None, retry_after: None }
    }

    /// 400 for one field: the message starts with its name.
    pub fn invalid(param: &str, message: impl std::fmt::Display) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_value"),
                format!("{param}: {message}"),
            )
        }
    }

    /// The same error for a field inside the object `parent`.
    pub fn within(mut self, parent: &str) -> Self {
        if let Some(p) = &self.param {
            self.param = Some(format!("{parent}.{p}"));
            self.message = format!("{parent}.{}", self.message);
        }
        self
    }

    /// 400: the prompt and the tokens asked for exceed a slot's context.
    pub fn context_exceeded(message: String) -> Self {
        ApiError {
            param: Some("messages".into()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("context_length_exceeded"), message)
        }
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            Some("invalid_api_key"),
            "missing or wrong API key: send it as 'Authorization: Bearer KEY'",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
    }

    /// 503: every slot busy and the queue full.
    pub fn overloaded(capacity: usize) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("server_busy"),
                format!(
                    "the server is busy: all slots are generating and {capacity} requests are in hand; retry later"
                ),
            )
        }
    }

    /// 503 while the model loads, or after the engine stopped.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("unavailable"), message)
        }
    }

    pub fn timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "server_error",
            Some("timeout"),
            "the request took longer than the server's --timeout",
        )
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("not_found"), format!("no route {path}"))
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            Some("method_not_allowed"),
            "method not allowed",
        )
    }

    /// 500: the server failed (a GPU fault); the message says what failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", Some("internal_error"), message)
    }

    /// The error object.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// What every response object of one request repeats.
#[derive(Debug, Clone)]
pub struct ReplyHead {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ReplyHead {
    pub fn new(endpoint: Endpoint, model: &str) -> ReplyHead {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        ReplyHead { endpoint, id: format!("{prefix}-{created:x}{n:06x}"), created, model: model.to_string() }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model,
               "system_fingerprint": FINGERPRINT, "choices": choices})
    }

    /// The whole response of a non-streamed request.
    pub fn complete(&self, text: &str, finish: &Finish) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                     "logprobs": null, "finish_reason": finish.reason.as_str()}),
            Endpoint::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.reason.as_str()})
            }
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = usage(finish);
        v
    }

    /// A streamed chunk: the assistant's role (chat's first chunk), a piece of text, or the
    /// finish reason (with no text).
    pub fn chunk(&self, role: bool, text: Option<&str>, finish: Option<&Finish>) -> Value {
        let reason = finish.map(|f| f.reason.as_str());
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                    delta["content"] = json!("");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason})
            }
        };
        self.envelope(true, json!([choice]))
    }

    /// The last chunk of a stream with `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, finish: &Finish) -> Value {
        let mut v = self.envelope(true, json!([]));
        v["usage"] = usage(finish);
        v
    }
}

/// kiln's version, as OpenAI's `system_fingerprint`.
const FINGERPRINT: &str = concat!("kiln-", env!("CARGO_PKG_VERSION"));

fn usage(f: &Finish) -> Value {
    json!({"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
           "total_tokens": f.prompt_tokens + f.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": f.cached_tokens}})
}
