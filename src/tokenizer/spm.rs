//! SentencePiece BPE ("llama" vocabularies), merged as llama.cpp's `llm_tokenizer_spm` does:
//! the text is split into UTF-8 characters, and the adjacent pair whose concatenation is the
//! vocabulary piece with the highest score (the leftmost on ties) is merged, again and again.
//! Only what no merge covered falls back: a character that is not a piece becomes its
//! `<0xXX>` byte tokens, or `<unk>` where the vocabulary has no byte tokens.
//!
//! Merging first matters wherever a character is only part of longer pieces: in a vocabulary
//! that has "▁the" but not "▁", "▁the" is one token, not three bytes and "the".
//!
//! Special tokens, the dummy-prefix space and "▁" for spaces are the HF pipeline's part (its
//! added vocabulary and normalizers, see [`build`]); it also decodes.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper, Tokenizer};

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

/// The HF pipeline around the SentencePiece merges: the dummy prefix and "▁" for spaces
/// going in, the byte tokens fused back into characters coming out. Its BPE model has no
/// merges: it only maps ids to pieces for decoding ([`SpmModel`] encodes).
pub(super) fn build(tokens: &[String], add_space_prefix: bool) -> tokenizers::Result<Tokenizer> {
    let vocab: Vocab = tokens.iter().enumerate().map(|(id, token)| (token.clone(), id as u32)).collect();
    // No word cache (see bpe.rs: it would leak per model).
    let model = BPE::builder().vocab_and_merges(vocab, Vec::new()).cache_capacity(0);
    let mut tokenizer = Tokenizer::new(model.build()?);

    // No pre-tokenizer: like llama.cpp, the whole text (between special tokens) is one word.
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    let mut decoders: Vec<DecoderWrapper> = vec![Replace::new(SPACE, " ")?.into()];
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_owned()).into());
    }
    normalizers.push(Replace::new(" ", SPACE)?.into());
    decoders.push(ByteFallback::new().into());
    decoders.push(Fuse::new().into());
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)))?;
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// What the merges need of a vocabulary.
pub(super) struct SpmModel {
    /// Every piece, control and byte tokens included: llama.cpp looks merges up in the whole
    /// vocabulary.
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// The `<0xXX>` token of each byte. (llama.cpp would also try the byte itself as a
    /// piece, which can only help for an ASCII character, and that one was looked up already.)
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
}

/// A run of the text: one character, or the characters merged into it so far. `len` 0
/// means merged into the symbol on its left.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of the adjacent symbols `left` and `right` into a piece of `len` bytes.
/// The queue pops the highest score first and, among equal scores, the leftmost pair
/// (llama.cpp's `llm_bigram_spm::comparator`).
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Scores are never NaN (see `SpmModel::new`); total_cmp orders them as `<` does.
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl SpmModel {
    pub(super) fn new(tokens: &[String], scores: &[f32], unk: Option<u32>) -> SpmModel {
        let ids: HashMap<String, u32> =
            tokens.iter().enumerate().map(|(id, token)| (token.clone(), id as u32)).collect();
        // + 0.0 turns -0.0 into 0.0 (llama.cpp compares with `<`, which cannot tell them
        // apart); a NaN score, which `<` cannot order, ranks last.
        let scores = scores.iter().map(|&s| if s.is_nan() { f32::NEG_INFINITY } else { s + 0.0 }).collect();
        let mut byte_ids = [None; 256];
        for (byte, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{byte:02X}>")).copied();
        }
        SpmModel { ids, scores, byte_ids, unk }
    }

    /// Appends the ids of `text` (already normalized: "▁" for spaces, the dummy prefix).
    /// Fails only for a character that is not a piece in a vocabulary that has neither its
    /// byte tokens nor `<unk>`.
    pub(super) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = symbols.len();
            let next = (start + c.len_utf8() < text.len()).then_some(i + 1);
            symbols.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next });
        }
        let mut queue = BinaryHeap::new();
        for left in 1..symbols.len() {
            self.push_bigram(text, &symbols, left - 1, left, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // Stale: one side was merged since the pair was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.left].next = right.next;
            symbols[bigram.right].len = 0;
            if let Some(next) = right.next {
                symbols[next].prev = Some(bigram.left);
            }
            if let Some(prev) = left.prev {
                self.push_bigram(text, &symbols, prev, bigram.left, &mut queue);
            }
            if let Some(next) = right.next {
                self.push_bigram(text, &symbols, bigram.left, next, &mut queue);
            }
        }

        // A merged symbol is a piece (a pair is queued only when its text is one), so only a
        // single character can miss here, and llama.cpp's `resegment` then emits its bytes.
        let mut at = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let sym = symbols[i];
            let piece = &text[sym.start..sym.start + sym.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => self.fall_back(piece, out)?,
            }
            at = sym.next;
        }
        Ok(())
    }

    /// Queues the merge of `left` and `right` when their text is a piece.
    fn push_bigram(&self, text: &str, symbols: &[Symbol], left: usize, right: usize, queue: &mut BinaryHeap<Bigram>) {
        let (l, r) = (symbols[left], symbols[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(merged) {
            queue.push(Bigram { score: self.scores[id as usize], left, right, len: merged.len() });
        }
    }

    /// A character that is not a piece: its byte tokens, else `<unk>`.
    fn fall_back(&self, piece: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let bytes: Option<Vec<u32>> = piece.bytes().map(|b| self.byte_ids[b as usize]).collect();
        match (bytes, self.unk) {
            (Some(bytes), _) => out.extend(bytes),
            (None, Some(unk)) => out.push(unk),
            (None, None) => {
                return Err(format!(
                    "{piece:?} is not in the vocabulary, which has no byte tokens for it and no <unk> token"
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(pieces: &[(&str, f32)], unk: Option<u32>) -> SpmModel {
        let tokens: Vec<String> = pieces.iter().map(|(p, _)| p.to_string()).collect();
        let scores: Vec<f32> = pieces.iter().map(|(_, s)| *s).collect();
        SpmModel::new(&tokens, &scores, unk)
    }

    fn encode(m: &SpmModel, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode(text, &mut out).unwrap();
        out
    }

    #[test]
    fn merges_before_falling_back() {
        // "▁" and "x" are not pieces; "▁x" is.
        let m = model(&[("<unk>", 0.0), ("▁x", -1.0), ("y", -2.0)], Some(0));
        assert_eq!(encode(&m, "▁xy"), [1, 2]);
        assert_eq!(encode(&m, "x▁y"), [0, 0, 2]);
    }

    #[test]
    fn best_score_first_then_leftmost() {
        // "abc": "ab" (-2) and "bc" (-1) compete for "b": the better score wins.
        let m = model(&[("a", 0.0), ("b", 0.0), ("c", 0.0), ("ab", -2.0), ("bc", -1.0)], None);
        assert_eq!(encode(&m, "abc"), [0, 4]);
        // Equal scores: the leftmost pair.
        let m = model(&[("a", 0.0), ("ab", -1.0), ("ba", -1.0), ("b", 0.0)], None);
        assert_eq!(encode(&m, "aba"), [1, 0]);
        assert_eq!(encode(&m, "bab"), [2, 3]);
    }

    #[test]
    fn bytes_then_unk_then_an_error() {
        let m = model(&[("<unk>", 0.0), ("<0xC3>", 0.0), ("<0xA9>", 0.0), ("a", -1.0)], Some(0));
        assert_eq!(encode(&m, "aéa"), [3, 1, 2, 3]);
        assert_eq!(encode(&m, "aüa"), [3, 0, 3]); // 0xBC has no token
        let m = model(&[("a", -1.0)], None);
        assert!(m.encode("ab", &mut Vec::new()).unwrap_err().contains("\"b\""));
    }
}
