//! Chat-template rendering of arbitrary conversations with each built-in template, and of
//! an arbitrary template (model files carry their own) with a fixed conversation.
#![no_main]

use kiln::chat::{ChatTemplate, Message, BUILTIN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if sel & 0x80 != 0 {
        // The input is a template.
        if let Ok(t) = ChatTemplate::from_source("fuzz", &text, "<s>".into(), "</s>".into()) {
            let conv = [Message::new("system", "sys"), Message::new("user", "hi"), Message::new("assistant", "yo")];
            let _ = t.render(&conv, sel & 1 != 0);
        }
        return;
    }
    // The input is a conversation: parts separated by 0x1f; role, content, role, content…
    let parts: Vec<&str> = text.split('\u{1f}').collect();
    let messages: Vec<Message> = parts.chunks(2).map(|c| Message::new(c[0], c.get(1).copied().unwrap_or(""))).collect();
    let (_, src) = BUILTIN[sel as usize % BUILTIN.len()];
    let t = ChatTemplate::from_source("builtin", src, "<s>".into(), "</s>".into()).expect("built-in template");
    let _ = t.render(&messages, sel & 1 != 0);
});
