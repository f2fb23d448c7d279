//! Text ↔ token ids, built from a GGUF file's `tokenizer.ggml.*` metadata so that kiln
//! tokenizes exactly as llama.cpp does. Two vocabulary kinds are supported, each assembled in
//! code around a HF `tokenizers` pipeline (special tokens, normalization, decoding):
//! - `llama`: SentencePiece BPE (Llama 1/2, TinyLlama, Mistral…), merged by kiln's own
//!   port of llama.cpp's SentencePiece tokenizer, see [`spm`];
//! - `gpt2`: byte-level BPE (GPT-2, Llama 3, Qwen, DeepSeek, Falcon…), see [`bpe`].

mod bpe;
mod pretok;
mod spm;
mod stream;

pub use stream::StreamDecoder;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::Value;
use tokenizers::{AddedToken, OffsetReferential, OffsetType};

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// GGUF token types (llama.cpp's `LLAMA_TOKEN_TYPE_*`).
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// Token texts that end a turn in chat models whose file names no EOT id.
const EOT_NAMES: [&str; 3] = ["<|eot_id|>", "<|im_end|>", "<|end|>"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VocabKind {
    SentencePiece,
    ByteLevel,
}

/// A vocabulary with its encoder and decoder.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: VocabKind,
    /// SentencePiece vocabularies: the merges (`inner` then only splits off special tokens,
    /// normalizes and decodes).
    spm: Option<spm::SpmModel>,
    tokens: Vec<String>,
    /// User-defined tokens: matched whole in text and printed as they are.
    user_defined: HashSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

impl Tokenizer {
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        Self::from_metadata(&file.path, &file.metadata)
    }

    /// Builds the tokenizer from GGUF metadata; `path` only names the file in errors.
    pub fn from_metadata(path: &Path, metadata: &BTreeMap<String, Value>) -> Result<Tokenizer> {
        let meta = Meta { path, metadata };
        let model = meta.str(KEY_MODEL)?.ok_or_else(|| meta.err(KEY_MODEL, "is missing; the file has no tokenizer"))?;
        let tokens = meta.tokens()?;
        let n_tokens = tokens.len();
        let types = match meta.ints(KEY_TOKEN_TYPE)? {
            Some(types) => meta.same_len(KEY_TOKEN_TYPE, types, n_tokens)?,
            None => vec![TYPE_NORMAL; n_tokens],
        };

        let (mut inner, spm, kind, add_bos_fallback) = match model {
            "llama" => {
                let (inner, spm) = meta.spm(&tokens, &types)?;
                (inner, Some(spm), VocabKind::SentencePiece, true)
            }
            "gpt2" => {
                let pre = pretok::Pre::from_name(meta.str(KEY_PRE)?);
                (meta.bpe(&tokens, pre)?, None, VocabKind::ByteLevel, pre.add_bos)
            }
            other => {
                return Err(meta.err(
                    KEY_MODEL,
                    format!(
                        "{other:?} is not supported; kiln reads \"llama\" (SentencePiece) \
                         and \"gpt2\" (byte-level BPE) vocabularies"
                    ),
                ))
            }
        };

        let (bos_default, eos_default) = match kind {
            // llama.cpp's defaults for SentencePiece vocabularies that name no ids.
            VocabKind::SentencePiece => (Some(1), Some(2)),
            VocabKind::ByteLevel => (None, None),
        };
        let in_vocab = |id: Option<u32>| id.filter(|&id| (id as usize) < n_tokens);
        let bos = meta.id(KEY_BOS, n_tokens)?.or(in_vocab(bos_default));
        let eos = meta.id(KEY_EOS, n_tokens)?.or(in_vocab(eos_default));
        let eot = match meta.id(KEY_EOT, n_tokens)? {
            Some(id) => Some(id),
            None => tokens.iter().position(|t| EOT_NAMES.contains(&t.as_str())).map(|i| i as u32),
        };
        let add_bos = meta.bool(KEY_ADD_BOS)?.unwrap_or(add_bos_fallback) && bos.is_some();

        let user_defined = add_whole_tokens(&mut inner, &tokens, &types).map_err(|e| meta.err(KEY_TOKEN_TYPE, e))?;
        Ok(Tokenizer { inner, kind, spm, tokens, user_defined, bos, eos, eot, add_bos })
    }

    /// Token ids of `text`, after a BOS token when `add_bos` is set.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_bos {
            let bos = self.bos.ok_or_else(|| KilnError::invalid("add_bos", "this vocabulary has no BOS token"))?;
            ids.push(bos);
        }
        match &self.spm {
            Some(spm) => self.encode_spm(spm, text, &mut ids)?,
            None => {
                let encoding = self
                    .inner
                    .encode_fast(text, false)
                    .map_err(|e| KilnError::invalid("text to tokenize", e.to_string()))?;
                ids.extend_from_slice(encoding.get_ids());
            }
        }
        Ok(ids)
    }

    /// SentencePiece: the HF pipeline cuts out the special tokens and normalizes each run of
    /// text between them (dummy prefix, "▁" for spaces) as `encode_fast` would; kiln's merges
    /// tokenize the runs.
    fn encode_spm(&self, spm: &spm::SpmModel, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        let split = self.inner.get_added_vocabulary().extract_and_normalize(self.inner.get_normalizer(), text);
        for (run, _, special) in split.get_splits(OffsetReferential::Original, OffsetType::None) {
            match special {
                Some(tokens) => ids.extend(tokens.iter().map(|t| t.id)),
                None => spm.encode(run, ids).map_err(|e| KilnError::invalid("text to tokenize", e))?,
            }
        }
        Ok(())
    }

    /// The text of `ids`. Control tokens (BOS, EOS, chat markers) print nothing.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.tokens.len()) {
            return Err(KilnError::invalid(
                "token id",
                format!("{bad} is outside the vocabulary of {} tokens", self.tokens.len()),
            ));
        }
        if self.kind == VocabKind::SentencePiece || self.user_defined.is_empty() {
            return self.decode_run(ids);
        }
        // The byte-level decoder would read a user-defined token's characters as byte
        // symbols (deepseek-coder's "ü" becomes the lone byte 0xFC); llama.cpp prints them
        // as they are.
        let mut text = String::new();
        let mut run_start = 0;
        for (i, id) in ids.iter().enumerate() {
            if self.user_defined.contains(id) {
                text += &self.decode_run(&ids[run_start..i])?;
                text += &self.tokens[*id as usize];
                run_start = i + 1;
            }
        }
        text += &self.decode_run(&ids[run_start..])?;
        Ok(text)
    }

    fn decode_run(&self, ids: &[u32]) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.inner.decode(ids, true).map_err(|e| KilnError::invalid("token ids", e.to_string()))
    }

    /// The token's text as stored in the vocabulary ("▁the", "Ġthe", "<0x0A>", "<s>").
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// Whether prompts start with BOS unless the caller says otherwise.
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// Whether generation stops at `id` (end of sequence or end of turn).
    pub fn is_eog(&self, id: u32) -> bool {
        Some(id) == self.eos || Some(id) == self.eot
    }

    /// The end-of-generation tokens (end of sequence, end of turn).
    pub fn eog_ids(&self) -> Vec<u32> {
        self.eos.into_iter().chain(self.eot).collect()
    }
}

/// Control, unknown and user-defined tokens are cut out of the text before the model sees it,
/// so that "<|im_start|>" stays one token. Control and unknown tokens are special (decode
/// skips them); user-defined ones are text. Returns the user-defined ids.
fn add_whole_tokens(
    inner: &mut tokenizers::Tokenizer,
    tokens: &[String],
    types: &[i64],
) -> tokenizers::Result<HashSet<u32>> {
    let mut special = Vec::new();
    let mut user = Vec::new();
    let mut user_ids = HashSet::new();
    for (id, (text, &ty)) in tokens.iter().zip(types).enumerate() {
        match ty {
            TYPE_CONTROL | TYPE_UNKNOWN => special.push(AddedToken::from(text.clone(), true).normalized(false)),
            TYPE_USER_DEFINED => {
                user.push(AddedToken::from(text.clone(), false).normalized(false));
                user_ids.insert(id as u32);
            }
            _ => {}
        }
    }
    // Every such token is already in the model's vocabulary, so ids do not change.
    inner.add_special_tokens(special)?;
    inner.add_tokens(user)?;
    Ok(user_ids)
}

/// Typed access to the metadata, with errors that name the file and the key.
struct Meta<'a> {
    path: &'a Path,
    metadata: &'a BTreeMap<String, Value>,
}

impl Meta<'_> {
    fn spm(&self, tokens: &[String], types: &[i64]) -> Result<(tokenizers::Tokenizer, spm::SpmModel)> {
        let scores = self.floats(KEY_SCORES)?.ok_or_else(|| self.err(KEY_SCORES, "is missing"))?;
        let scores = self.same_len(KEY_SCORES, scores, tokens.len())?;
        let add_space_prefix = self.bool(KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);
        // Like llama.cpp, id 0 when the file names none, if it is an unknown-type token.
        let unk = match self.id(KEY_UNK, tokens.len())? {
            Some(id) => Some(id as usize),
            None => (types[0] == TYPE_UNKNOWN).then_some(0),
        };
        let inner = spm::build(tokens, add_space_prefix).map_err(|e| self.err(KEY_TOKENS, e))?;
        Ok((inner, spm::SpmModel::new(tokens, &scores, unk.map(|id| id as u32))))
    }

    fn bpe(&self, tokens: &[String], pre: pretok::Pre) -> Result<tokenizers::Tokenizer> {
        let merges = self.strings(KEY_MERGES)?.ok_or_else(|| self.err(KEY_MERGES, "is missing"))?;
        bpe::build(tokens, &merges, pre).map_err(|e| self.err(KEY_MERGES, e))
    }

    fn err(&self, key: &str, message: impl std::fmt::Display) -> KilnError {
        KilnError::File { path: self.path.to_path_buf(), message: format!("metadata {key} {message}") }
    }

    fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_str().map(Some).ok_or_else(|| self.err(key, format!("should be a string, not {}", kind(v))))
            }
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_bool().map(Some).ok_or_else(|| self.err(key, format!("should be a boolean, not {}", kind(v))))
            }
        }
    }

    /// A token id; ids outside the vocabulary (some converters write u32::MAX for "none")
    /// count as absent, as in llama.cpp.
    fn id(&self, key: &str, n_tokens: usize) -> Result<Option<u32>> {
        let Some(v) = self.metadata.get(key) else {
            return Ok(None);
        };
        let id = v
            .as_i64()
            .or_else(|| v.as_u64().map(|_| i64::MAX))
            .ok_or_else(|| self.err(key, format!("should be a token id, not {}", kind(v))))?;
        if (0..n_tokens as i64).contains(&id) {
            Ok(Some(id as u32))
        } else {
            tracing::warn!(
                "{}: {key} = {id} is outside the vocabulary of {n_tokens} tokens; ignored",
                self.path.display()
            );
            Ok(None)
        }
    }

    fn array<T>(&self, key: &str, what: &str, item: impl Fn(&Value) -> Option<T>) -> Result<Option<Vec<T>>> {
        let Some(v) = self.metadata.get(key) else {
            return Ok(None);
        };
        let items =
            v.as_array().ok_or_else(|| self.err(key, format!("should be an array of {what}, not {}", kind(v))))?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                item(v)
                    .ok_or_else(|| self.err(key, format!("should be an array of {what}, but item {i} is {}", kind(v))))
            })
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>> {
        self.array(key, "strings", |v| v.as_str().map(str::to_owned))
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.array(key, "integers", Value::as_i64)
    }

    fn floats(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.array(key, "numbers", |v| match v {
            // The GGUF reader stores non-finite floats as null.
            Value::Null => Some(f32::NEG_INFINITY),
            v => v.as_f64().map(|f| f as f32),
        })
    }

    fn same_len<T>(&self, key: &str, items: Vec<T>, n_tokens: usize) -> Result<Vec<T>> {
        if items.len() == n_tokens {
            Ok(items)
        } else {
            Err(self.err(key, format!("has {} entries but {KEY_TOKENS} has {n_tokens}", items.len())))
        }
    }

    /// The vocabulary: non-empty and without duplicates, which would make ids ambiguous.
    fn tokens(&self) -> Result<Vec<String>> {
        let mut tokens = self.strings(KEY_TOKENS)?.ok_or_else(|| self.err(KEY_TOKENS, "is missing"))?;
        if tokens.is_empty() {
            return Err(self.err(KEY_TOKENS, "is empty"));
        }
        if tokens.len() > u32::MAX as usize {
            return Err(self.err(KEY_TOKENS, "has more than 2^32 tokens"));
        }
        for (id, token) in tokens.iter_mut().enumerate() {
            // llama.cpp's name for empty tokens, which could never be matched anyway.
            if token.is_empty() {
                *token = format!("[EMPTY_{id}]");
            }
        }
        let mut seen = HashSet::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            if !seen.insert(token.as_str()) {
                return Err(self.err(KEY_TOKENS, format!("holds {token:?} twice (the second time as id {id})")));
            }
        }
        Ok(tokens)
    }
}

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
