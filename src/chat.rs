//! Chat templates: the model's own `tokenizer.chat_template` (Jinja, rendered with
//! minijinja and Python-compatible string methods), or a built-in one.

use serde::Serialize;

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;

/// One message of a conversation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.to_string(), content: content.to_string() }
    }
}

/// The built-in templates, by the names `--chat-template` accepts.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "chatml",
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    ),
    (
        "llama2",
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    ),
    (
        "llama3",
        "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    ),
    (
        "zephyr",
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
    ),
];

/// Instructions a template may execute per rendering: ample for a conversation of thousands
/// of turns, and a bound on a template that loops without end.
const TEMPLATE_FUEL: u64 = 50_000_000;

/// A compiled chat template with the special-token strings it may use.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    /// "model" or the built-in's name.
    pub source: String,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// The template named `name`, or the model's own, or ChatML when the model has none.
    pub fn select(file: &GgufFile, name: Option<&str>, bos: String, eos: String) -> Result<ChatTemplate> {
        let (source, text) = match name {
            Some(n) => {
                let t = BUILTIN.iter().find(|(b, _)| *b == n).ok_or_else(|| {
                    let names: Vec<&str> = BUILTIN.iter().map(|(b, _)| *b).collect();
                    KilnError::invalid(
                        "--chat-template",
                        format!("unknown template {n:?} (built-in: {})", names.join(", ")),
                    )
                })?;
                (n.to_string(), t.1.to_string())
            }
            None => match file.get_str("tokenizer.chat_template")? {
                Some(t) => ("model".to_string(), t.to_string()),
                None => ("chatml".to_string(), BUILTIN[0].1.to_string()),
            },
        };
        Self::from_source(&source, &text, bos, eos)
    }

    pub fn from_source(source: &str, text: &str, bos: String, eos: String) -> Result<ChatTemplate> {
        let mut env = minijinja::Environment::new();
        // A template comes from the model file, which is untrusted: bound the work it may do.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Templates call raise_exception() on bad conversations (e.g. roles out of order).
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", text.to_string())
            .map_err(|e| KilnError::invalid("chat template", format!("{source}: {e}")))?;
        Ok(ChatTemplate { env, source: source.to_string(), bos, eos })
    }

    /// The prompt text for `messages`, ending with the assistant's turn header when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let t = self.env.get_template("chat").map_err(|e| KilnError::invalid("chat template", e.to_string()))?;
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| KilnError::invalid("chat template", format!("{}: {e}", self.source)))
    }
}

/// Tokens of the conversation rendered for the model, ending with the assistant's turn
/// header; BOS is added when the tokenizer wants one and the template did not write it.
pub fn render_tokens(tmpl: &ChatTemplate, tok: &crate::tokenizer::Tokenizer, messages: &[Message]) -> Result<Vec<u32>> {
    let text = tmpl.render(messages, true)?;
    let mut ids = tok.encode(&text, false)?;
    if tok.add_bos_default() {
        if let Some(b) = tok.bos() {
            if ids.first() != Some(&b) {
                ids.insert(0, b);
            }
        }
    }
    Ok(ids)
}

/// What a session whose cache holds `cached` still has to be fed to hold `ids`: rewinds to
/// their longest common prefix and returns the rest (at least one token, so the step
/// produces logits).
pub fn new_part(session: &mut crate::model::Session, cached: &mut Vec<u32>, ids: &[u32]) -> Vec<u32> {
    let common = cached.iter().zip(ids).take_while(|(a, b)| a == b).count();
    let keep = common.min(ids.len().saturating_sub(1));
    session.truncate(keep as u32);
    cached.truncate(keep);
    ids[keep..].to_vec()
}

/// A conversation on a session: the KV cache carries over between turns (only the new part
/// of the rendered conversation is prefilled); when the context fills up, the oldest turns
/// are dropped (the system prompt stays) and the rest is prefilled again.
pub struct Conversation {
    system: Vec<Message>,
    pub messages: Vec<Message>,
    /// The tokens in the session's cache.
    cached: Vec<u32>,
}

/// What one turn did.
#[derive(Debug, Clone)]
pub struct Turn {
    pub answer: String,
    pub stats: crate::generate::GenStats,
    /// Oldest turns dropped to make room.
    pub dropped: usize,
}

impl Conversation {
    pub fn new(system: Option<&str>) -> Conversation {
        let system: Vec<Message> = system.iter().map(|s| Message::new("system", s)).collect();
        Conversation { messages: system.clone(), system, cached: Vec::new() }
    }

    /// Forgets every turn but the system prompt.
    pub fn reset(&mut self, session: &mut crate::model::Session) {
        self.messages = self.system.clone();
        self.cached.clear();
        session.reset();
    }

    /// Adds the user's message and generates the answer (at most `max_new` tokens; None:
    /// until the model ends its turn or the context is full), streaming its text to `on_text`.
    /// A message that alone does not fit the context is an error and leaves no trace.
    #[allow(clippy::too_many_arguments)]
    pub fn turn(
        &mut self,
        session: &mut crate::model::Session,
        tmpl: &ChatTemplate,
        tok: &crate::tokenizer::Tokenizer,
        input: &str,
        max_new: Option<usize>,
        sampler: &mut crate::sample::Sampler,
        stop: &std::sync::atomic::AtomicBool,
        on_text: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<Turn> {
        let n_ctx = session.opts.n_ctx as usize;
        let mut messages = self.messages.clone();
        messages.push(Message::new("user", input));
        let mut ids = render_tokens(tmpl, tok, &messages)?;
        // Drop the oldest turns (keeping the system prompt) until the prompt and some room
        // for the answer fit.
        let reserve = max_new.unwrap_or(256).min(n_ctx / 4);
        let mut dropped = 0;
        while ids.len() + reserve > n_ctx && messages.len() > self.system.len() + 1 {
            messages.remove(self.system.len());
            dropped += 1;
            ids = render_tokens(tmpl, tok, &messages)?;
        }
        if ids.len() >= n_ctx {
            return Err(KilnError::invalid(
                "message",
                format!("it does not fit the context of {n_ctx} tokens by itself; try a shorter one or raise -c"),
            ));
        }
        self.messages = messages;
        let feed = new_part(session, &mut self.cached, &ids);
        let mut answer = String::new();
        let mut history = self.cached.clone();
        let room = n_ctx - session.position() as usize - feed.len();
        let limit = Some(max_new.unwrap_or(room).min(room));
        let stats = crate::generate::generate(session, tok, &feed, &mut history, limit, sampler, stop, &mut |s| {
            answer.push_str(s);
            on_text(s)
        })?;
        // The cache now holds the prompt and the answer (the end-of-turn token, if any, was
        // not fed); the next render is compared against exactly that.
        self.cached.extend_from_slice(&feed);
        self.cached.extend_from_slice(&history[history.len() - stats.generated..]);
        self.cached.truncate(session.position() as usize);
        self.messages.push(Message::new("assistant", answer.trim()));
        Ok(Turn { answer, stats, dropped })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpl(name: &str) -> ChatTemplate {
        let text = BUILTIN.iter().find(|(n, _)| *n == name).unwrap().1;
        ChatTemplate::from_source(name, text, "<s>".into(), "</s>".into()).unwrap()
    }

    fn conv() -> Vec<Message> {
        vec![
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello!"),
            Message::new("user", "Who are you?"),
        ]
    }

    #[test]
    fn chatml() {
        assert_eq!(
            tmpl("chatml").render(&conv(), true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama2() {
        assert_eq!(
            tmpl("llama2").render(&conv(), true).unwrap(),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Who are you? [/INST]"
        );
    }

    #[test]
    fn llama3() {
        assert_eq!(
            tmpl("llama3").render(&conv()[1..2], true).unwrap(),
            "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn zephyr() {
        assert_eq!(
            tmpl("zephyr").render(&conv()[..2], true).unwrap(),
            "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
        );
    }

    #[test]
    fn model_templates_with_python_methods_and_errors() {
        let text = "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{{ m.content.strip().upper() }}|{% endfor %}";
        let t = ChatTemplate::from_source("model", text, String::new(), String::new()).unwrap();
        assert_eq!(t.render(&[Message::new("user", "  hi  ")], false).unwrap(), "HI|");
        let err = t.render(&[Message::new("tool", "x")], false).unwrap_err().to_string();
        assert!(err.contains("bad role tool"), "{err}");
        assert!(ChatTemplate::from_source("model", "{% for %}", String::new(), String::new()).is_err());
    }
}
