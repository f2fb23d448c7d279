//! Requests as OpenAI's API defines them (`/v1/chat/completions`, `/v1/completions`), with
//! llama.cpp's sampling extensions, read field by field from the JSON so that a wrong field
//! gets a 400 that names it, and checked into what the engine needs.

use serde_json::{Map, Value};

use crate::chat::Message;
use crate::sample::SamplerConfig;
use crate::server::engine::Generation;
use crate::server::reply::ApiError;

/// Most stop strings a request may give (each is searched for in every piece of text).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_LEN: usize = 1024;

/// What a request asks the model to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// A conversation, rendered with the chat template.
    Chat(Vec<Message>),
    /// Raw text (BOS added when the model's tokenizer adds one).
    Text(String),
    /// Token ids, as given.
    Tokens(Vec<u32>),
}

/// A generation request, checked.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt: PromptInput,
    pub generation: Generation,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
}

/// A `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<GenRequest, ApiError> {
    let obj = parse_object(body)?;
    let f = Fields(&obj);
    let messages = parse_messages(f.get("messages"))?;
    // max_completion_tokens replaces max_tokens in OpenAI's current API; either is accepted.
    let max_tokens = match f.positive("max_completion_tokens")? {
        Some(n) => Some(n),
        None => f.positive("max_tokens")?,
    };
    f.unsupported_when("tools", |v| v.as_array().is_some_and(|a| !a.is_empty()), "kiln has no tool calling")?;
    f.unsupported_when("tool_choice", |v| v.as_str() != Some("none"), "kiln has no tool calling")?;
    f.unsupported_when("functions", |_| true, "kiln has no tool calling")?;
    f.unsupported_when("top_logprobs", |v| v.as_u64() != Some(0), "kiln returns no log-probabilities")?;
    f.unsupported_when(
        "response_format",
        |v| v.get("type").and_then(Value::as_str) != Some("text"),
        "kiln has no constrained sampling (only {\"type\": \"text\"})",
    )?;
    common(f, PromptInput::Chat(messages), max_tokens)
}

/// A `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<GenRequest, ApiError> {
    let obj = parse_object(body)?;
    let f = Fields(&obj);
    let prompt = parse_prompt(f.get("prompt"))?;
    let max_tokens = f.positive("max_tokens")?;
    f.unsupported_when("echo", |v| v.as_bool() != Some(false), "kiln does not echo the prompt")?;
    f.unsupported_when("suffix", |v| v.as_str() != Some(""), "kiln has no fill-in-the-middle")?;
    f.unsupported_when("best_of", |v| v.as_u64() != Some(1), "kiln generates one completion per request")?;
    common(f, prompt, max_tokens)
}

/// The fields both endpoints share: sampling, stop strings, streaming.
fn common(f: Fields, prompt: PromptInput, max_tokens: Option<usize>) -> Result<GenRequest, ApiError> {
    match f.integer("n")? {
        None | Some(1) => {}
        Some(n) => {
            return Err(ApiError::invalid("n", format!("kiln generates one choice per request; n must be 1, got {n}")))
        }
    }
    f.unsupported_when("logprobs", |v| !matches!(v, Value::Bool(false)), "kiln returns no log-probabilities")?;
    f.unsupported_when(
        "logit_bias",
        |v| v.as_object().is_none_or(|m| !m.is_empty()),
        "kiln has no logit bias (llama.cpp's ignore_eos is supported)",
    )?;
    let d = SamplerConfig::default();
    let sampling = SamplerConfig {
        temperature: f.number("temperature", 0.0, 2.0)?.unwrap_or(d.temperature),
        top_p: f.number("top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        top_k: match f.integer("top_k")? {
            None => d.top_k,
            Some(k) if k >= 0 => k as usize,
            Some(k) => return Err(ApiError::invalid("top_k", format!("must be 0 (off) or more, got {k}"))),
        },
        min_p: f.number("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repeat_penalty: match f.number("repeat_penalty", 0.0, f32::MAX)? {
            Some(p) if p <= 0.0 => return Err(ApiError::invalid("repeat_penalty", "must be more than 0 (1 = off)")),
            p => p.unwrap_or(d.repeat_penalty),
        },
        repeat_last_n: match f.integer("repeat_last_n")? {
            None => d.repeat_last_n,
            Some(n) if n >= 0 => n as usize,
            Some(n) => return Err(ApiError::invalid("repeat_last_n", format!("must be 0 or more, got {n}"))),
        },
        frequency_penalty: f.number("frequency_penalty", -2.0, 2.0)?.unwrap_or(d.frequency_penalty),
        presence_penalty: f.number("presence_penalty", -2.0, 2.0)?.unwrap_or(d.presence_penalty),
        seed: match f.integer("seed")? {
            Some(s) if s >= 0 => s as u64,
            // Absent or negative (llama.cpp's -1): a fresh seed per request.
            _ => random_seed(),
        },
    };
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            Fields(o).boolean("include_usage").map_err(|e| e.within("stream_options"))?.unwrap_or(false)
        }
        Some(v) => return Err(ApiError::invalid("stream_options", format!("must be an object, got {}", kind(v)))),
    };
    let generation = Generation {
        max_tokens,
        sampling,
        ignore_eos: f.boolean("ignore_eos")?.unwrap_or(false),
        stop: parse_stop(f.get("stop"))?,
    };
    Ok(GenRequest { prompt, generation, stream, include_usage })
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("the request body is not valid JSON: {e}")))?;
    match value {
        Value::Object(o) => Ok(o),
        v => Err(ApiError::invalid("body", format!("the request body must be a JSON object, got {}", kind(&v)))),
    }
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let list = match v {
        None => return Err(ApiError::invalid("messages", "is required")),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::invalid("messages", format!("must be an array, got {}", kind(v)))),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "must contain at least one message"));
    }
    list.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect()
}

fn parse_message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Value::Object(o) = m else {
        return Err(ApiError::invalid(&format!("messages[{i}]"), format!("must be an object, got {}", kind(m))));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) => r.as_str(),
        None | Some(Value::Null) => return Err(ApiError::invalid(&at("role"), "is required")),
        Some(v) => return Err(ApiError::invalid(&at("role"), format!("must be a string, got {}", kind(v)))),
    };
    let role = match role {
        "system" | "user" | "assistant" => role,
        // OpenAI's newer name for system instructions; templates know "system".
        "developer" => "system",
        "tool" | "function" => {
            return Err(ApiError::invalid(
                &at("role"),
                format!("{role:?} messages are not supported (kiln has no tool calling)"),
            ))
        }
        other => {
            return Err(ApiError::invalid(
                &at("role"),
                format!("unknown role {other:?} (expected system, developer, user or assistant)"),
            ))
        }
    };
    let content = match o.get("content") {
        Some(Value::String(s)) => s.clone(),
        // An assistant turn may have no content (OpenAI sends null with tool calls).
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => return Err(ApiError::invalid(&at("content"), "is required")),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("messages[{i}].content[{j}]");
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => return Err(ApiError::invalid(&format!("{at}.text"), "must be a string")),
                    (Some(other), _) => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            format!("only text parts are supported, not {other:?}"),
                        ))
                    }
                    (None, _) => return Err(ApiError::invalid(&format!("{at}.type"), "is required")),
                }
            }
            text
        }
        Some(v) => {
            return Err(ApiError::invalid(
                &at("content"),
                format!("must be a string or an array of parts, got {}", kind(v)),
            ))
        }
    };
    Ok(Message::new(role, &content))
}

fn parse_prompt(v: Option<&Value>) -> Result<PromptInput, ApiError> {
    let token = |(i, t): (usize, &Value)| -> Result<u32, ApiError> {
        t.as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| ApiError::invalid(&format!("prompt[{i}]"), format!("must be a token id, got {t}")))
    };
    match v {
        None => Err(ApiError::invalid("prompt", "is required")),
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(a)) => match a.first() {
            None => Err(ApiError::invalid("prompt", "must not be empty")),
            Some(Value::String(s)) if a.len() == 1 => Ok(PromptInput::Text(s.clone())),
            Some(Value::Number(_)) => {
                Ok(PromptInput::Tokens(a.iter().enumerate().map(token).collect::<Result<_, _>>()?))
            }
            Some(Value::Array(ids)) if a.len() == 1 => {
                Ok(PromptInput::Tokens(ids.iter().enumerate().map(token).collect::<Result<_, _>>()?))
            }
            Some(Value::String(_)) | Some(Value::Array(_)) => {
                Err(ApiError::invalid("prompt", "kiln completes one prompt per request; send them one at a time"))
            }
            Some(v) => Err(ApiError::invalid("prompt[0]", format!("must be a string or a token id, got {}", kind(v)))),
        },
        Some(v) => {
            Err(ApiError::invalid("prompt", format!("must be a string, or an array of token ids, got {}", kind(v))))
        }
    }
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let stops = match v {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Value::String(s) => Ok(s.clone()),
                v => Err(ApiError::invalid(&format!("stop[{i}]"), format!("must be a string, got {}", kind(v)))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::invalid("stop", format!("must be a string or an array of strings, got {}", kind(v))))
        }
    };
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid("stop", format!("at most {MAX_STOP_STRINGS} stop strings, got {}", stops.len())));
    }
    if let Some(long) = stops.iter().find(|s| s.len() > MAX_STOP_LEN) {
        return Err(ApiError::invalid(
            "stop",
            format!("a stop string is {} bytes; at most {MAX_STOP_LEN}", long.len()),
        ));
    }
    Ok(stops)
}

/// A seed from the clock, different for requests in the same nanosecond too.
fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A JSON value's kind, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed access to an object's fields; null counts as absent (as OpenAI treats it).
#[derive(Clone, Copy)]
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::invalid(name, format!("must be a boolean, got {}", kind(v)))),
        }
    }

    fn integer(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) => Ok(Some(i)),
                // 4.0 is an integer too (some clients send floats).
                None => match n.as_f64() {
                    Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Ok(Some(x as i64)),
                    _ => Err(ApiError::invalid(name, format!("must be an integer, got {n}"))),
                },
            },
            Some(v) => Err(ApiError::invalid(name, format!("must be an integer, got {}", kind(v)))),
        }
    }

    /// An integer of at least 1.
    fn positive(&self, name: &str) -> Result<Option<usize>, ApiError> {
        match self.integer(name)? {
            None => Ok(None),
            Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            Some(n) => Err(ApiError::invalid(name, format!("must be at least 1, got {n}"))),
        }
    }

    /// A number within [lo, hi].
    fn number(&self, name: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x >= lo as f64 && x <= hi as f64 => Ok(Some(x as f32)),
                _ if hi == f32::MAX => Err(ApiError::invalid(name, format!("must be at least {lo}, got {n}"))),
                _ => Err(ApiError::invalid(name, format!("must be between {lo} and {hi}, got {n}"))),
            },
            Some(v) => Err(ApiError::invalid(name, format!("must be a number, got {}", kind(v)))),
        }
    }

    /// A 400 when `name` is present and `used` says it asks for something kiln lacks.
    fn unsupported_when(&self, name: &str, used: impl Fn(&Value) -> bool, why: &str) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if used(v) => Err(ApiError::invalid(name, format!("not supported: {why}"))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenRequest, ApiError> {
        parse_chat(body.as_bytes())
    }

    /// The field a 400 names.
    fn param(r: Result<GenRequest, ApiError>) -> String {
        let e = r.expect_err("accepted a bad request");
        assert_eq!(e.status.as_u16(), 400, "{}", e.message);
        assert!(e.message.starts_with(e.param.as_deref().unwrap_or("?")), "{}", e.message);
        e.param.unwrap_or_default()
    }

    #[test]
    fn reads_a_chat_request() {
        let r = chat(
            r#"{"model":"x","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"!"}]},{"role":"assistant","content":null}],
            "max_tokens":9,"max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,"repeat_penalty":1.1,
            "presence_penalty":-1,"frequency_penalty":0.5,"seed":42,"stop":"\n","stream":true,"stream_options":{"include_usage":true},
            "n":1,"logprobs":false,"tools":[],"user":"ignored"}"#,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            PromptInput::Chat(vec![
                Message::new("system", "Be brief."),
                Message::new("user", "Hi!"),
                Message::new("assistant", "")
            ])
        );
        let g = &r.generation;
        assert_eq!(g.max_tokens, Some(7));
        assert_eq!(g.stop, ["\n"]);
        let s = g.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.seed), (0.0, 0.5, 3, 0.1, 42));
        assert_eq!((s.repeat_penalty, s.presence_penalty, s.frequency_penalty), (1.1, -1.0, 0.5));
        assert!(r.stream && r.include_usage && !g.ignore_eos);
    }

    #[test]
    fn defaults_are_llama_cpps() {
        let r = chat(r#"{"messages":[{"role":"user","content":"Hi"}]}"#).unwrap();
        let d = SamplerConfig::default();
        let s = r.generation.sampling;
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p), (d.temperature, d.top_k, d.top_p, d.min_p));
        assert_eq!(r.generation.max_tokens, None);
        assert!(!r.stream && r.generation.stop.is_empty());
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(param(chat("{")), "body");
        assert_eq!(param(chat("[1]")), "body");
        assert_eq!(param(chat(r#"{"messages":[]}"#)), "messages");
        assert_eq!(param(chat(r#"{"messages":"hi"}"#)), "messages");
        assert_eq!(param(chat(r#"{}"#)), "messages");
        assert_eq!(param(chat(r#"{"messages":[{"role":"wizard","content":"x"}]}"#)), "messages[0].role");
        assert_eq!(
            param(chat(r#"{"messages":[{"role":"user","content":"a"},{"role":"tool","content":"x"}]}"#)),
            "messages[1].role"
        );
        assert_eq!(param(chat(r#"{"messages":[{"role":"user"}]}"#)), "messages[0].content");
        assert_eq!(param(chat(r#"{"messages":[{"role":"user","content":5}]}"#)), "messages[0].content");
        assert_eq!(
            param(chat(r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#)),
            "messages[0].content[0].type"
        );
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        for (body, field) in [
            (format!(r#"{{{m},"n":2}}"#), "n"),
            (format!(r#"{{{m},"max_tokens":"ten"}}"#), "max_tokens"),
            (format!(r#"{{{m},"max_tokens":0}}"#), "max_tokens"),
            (format!(r#"{{{m},"max_completion_tokens":-3}}"#), "max_completion_tokens"),
            (format!(r#"{{{m},"temperature":"hot"}}"#), "temperature"),
            (format!(r#"{{{m},"temperature":3}}"#), "temperature"),
            (format!(r#"{{{m},"top_p":1.5}}"#), "top_p"),
            (format!(r#"{{{m},"top_k":-1}}"#), "top_k"),
            (format!(r#"{{{m},"top_k":2.5}}"#), "top_k"),
            (format!(r#"{{{m},"min_p":-0.1}}"#), "min_p"),
            (format!(r#"{{{m},"repeat_penalty":0}}"#), "repeat_penalty"),
            (format!(r#"{{{m},"presence_penalty":9}}"#), "presence_penalty"),
            (format!(r#"{{{m},"frequency_penalty":[]}}"#), "frequency_penalty"),
            (format!(r#"{{{m},"seed":"x"}}"#), "seed"),
            (format!(r#"{{{m},"stop":5}}"#), "stop"),
            (format!(r#"{{{m},"stop":["a",1]}}"#), "stop[1]"),
            (format!(r#"{{{m},"stream":"yes"}}"#), "stream"),
            (format!(r#"{{{m},"stream_options":{{"include_usage":1}}}}"#), "stream_options.include_usage"),
            (format!(r#"{{{m},"logprobs":true}}"#), "logprobs"),
            (format!(r#"{{{m},"tools":[{{"type":"function"}}]}}"#), "tools"),
            (format!(r#"{{{m},"response_format":{{"type":"json_object"}}}}"#), "response_format"),
            (format!(r#"{{{m},"logit_bias":{{"5":1}}}}"#), "logit_bias"),
        ] {
            assert_eq!(param(chat(&body)), field, "{body}");
        }
        // Nulls are absent.
        assert!(chat(&format!(r#"{{{m},"temperature":null,"stop":null,"n":null}}"#)).is_ok());
    }

    #[test]
    fn reads_completion_prompts() {
        let p = |body: &str| parse_completion(body.as_bytes()).map(|r| r.prompt);
        assert_eq!(p(r#"{"prompt":"Once"}"#).unwrap(), PromptInput::Text("Once".into()));
        assert_eq!(p(r#"{"prompt":["Once"]}"#).unwrap(), PromptInput::Text("Once".into()));
        assert_eq!(p(r#"{"prompt":[1,2,3]}"#).unwrap(), PromptInput::Tokens(vec![1, 2, 3]));
        assert_eq!(p(r#"{"prompt":[[1,2]]}"#).unwrap(), PromptInput::Tokens(vec![1, 2]));
        let bad = |body: &str| param(parse_completion(body.as_bytes()));
        assert_eq!(bad(r#"{"prompt":["a","b"]}"#), "prompt");
        assert_eq!(bad(r#"{"prompt":[1,-2]}"#), "prompt[1]");
        assert_eq!(bad(r#"{"prompt":{}}"#), "prompt");
        assert_eq!(bad(r#"{}"#), "prompt");
        assert_eq!(bad(r#"{"prompt":"x","echo":true}"#), "echo");
        assert_eq!(bad(r#"{"prompt":"x","best_of":3}"#), "best_of");
    }
}
