//! Detokenization one token at a time, for printing text as it is generated.

use super::Tokenizer;
use crate::error::Result;

/// Past this many held tokens the text is released even if it still ends in U+FFFD: no
/// UTF-8 character needs more than 4 bytes, so the model produced invalid bytes (or a real
/// U+FFFD), and holding on would make every push slower.
const MAX_PENDING: usize = 16;

/// Past this many ids of context that decoded to nothing (special tokens), the oldest go.
const MAX_CONTEXT: usize = 16;

/// Turns token ids into text as they come, emitting only whole UTF-8 characters.
///
/// Each push decodes the ids not yet emitted behind a little context (the last emitted
/// ones), so decoders that depend on neighbours (SentencePiece's dropped first space, bytes
/// that only form a character together) see what a decode of the whole sequence would see,
/// and a push costs O(1) however long the text.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Ids already emitted, kept as left context.
    context: Vec<u32>,
    /// `decode(context)`: the prefix to cut from the next decode.
    context_text: String,
    /// Ids whose text has not been emitted yet.
    pending: Vec<u32>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        StreamDecoder { tokenizer, context: Vec::new(), context_text: String::new(), pending: Vec::new() }
    }

    /// Adds one token; returns the text it completes (often empty inside a multi-byte
    /// character or after a special token).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending.push(id);
        let text = self.decode_window()?;
        if text.ends_with(char::REPLACEMENT_CHARACTER) && self.pending.len() < MAX_PENDING {
            // Most likely a character whose remaining bytes are still to come.
            return Ok(String::new());
        }
        self.emit(text)
    }

    /// Flushes whatever is held back, incomplete characters included (as U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        if self.pending.is_empty() {
            return Ok(String::new());
        }
        let text = self.decode_window()?;
        self.emit(text)
    }

    fn decode_window(&self) -> Result<String> {
        let mut window = Vec::with_capacity(self.context.len() + self.pending.len());
        window.extend_from_slice(&self.context);
        window.extend_from_slice(&self.pending);
        self.tokenizer.decode(&window)
    }

    /// Emits `text` (the decode of context + pending) past the context's own text.
    fn emit(&mut self, text: String) -> Result<String> {
        let new_text = match text.strip_prefix(self.context_text.as_str()) {
            Some(rest) => rest.to_owned(),
            // Only invalid byte sequences change earlier text (byte fallback turns a whole
            // run of bytes into U+FFFD); what was printed stays printed.
            None => {
                let common = common_prefix_len(&text, &self.context_text);
                text[common..].to_owned()
            }
        };
        if new_text.is_empty() {
            // Special tokens decode to nothing: keep them as context together with the
            // text-bearing ids before them.
            self.context.append(&mut self.pending);
            self.context_text = text;
            if self.context.len() > MAX_CONTEXT {
                self.context.drain(..self.context.len() - MAX_CONTEXT);
                self.context_text = self.tokenizer.decode(&self.context)?;
            }
        } else {
            self.context = std::mem::take(&mut self.pending);
            self.context_text = self.tokenizer.decode(&self.context)?;
        }
        Ok(new_text)
    }
}

/// Length in bytes of the longest common prefix of whole characters.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}
