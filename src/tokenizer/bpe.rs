//! Byte-level BPE ("gpt2" vocabularies): the text is cut into words by the pre-tokenizer's
//! regexes, each word's UTF-8 bytes are mapped to GPT-2's printable byte symbols, and the
//! merges of `tokenizer.ggml.merges` apply by rank within each word.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use super::pretok::Pre;

pub(super) fn build(tokens: &[String], merges: &[String], pre: Pre) -> tokenizers::Result<Tokenizer> {
    let vocab: Vocab = tokens.iter().enumerate().map(|(id, token)| (token.clone(), id as u32)).collect();
    tracing::debug!("byte-level BPE, pre-tokenizer {}", pre.name);
    let merges = parse_merges(merges, &vocab)?;
    // No word cache: tokenizers keeps it per thread and never frees the entries of a dropped
    // model, so every vocabulary loaded in a process would leak its cache (found by fuzzing).
    let model =
        BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(pre.ignore_merges).cache_capacity(0).build()?;
    let mut tokenizer = Tokenizer::new(model);

    let mut steps = pre
        .regexes
        .iter()
        .map(|regex| {
            Split::new(SplitPattern::Regex((*regex).to_owned()), SplitDelimiterBehavior::Isolated, false)
                .map(PreTokenizerWrapper::from)
        })
        .collect::<tokenizers::Result<Vec<_>>>()?;
    // Only the byte mapping: the words are already cut.
    steps.push(ByteLevel::new(false, false, false).into());
    tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

/// "left right" pairs, split at the first space after the first character as llama.cpp does.
/// Merges of tokens outside the vocabulary could never apply; they are dropped.
fn parse_merges(merges: &[String], vocab: &Vocab) -> tokenizers::Result<Vec<(String, String)>> {
    let mut pairs = Vec::with_capacity(merges.len());
    let mut unusable = 0usize;
    for (i, merge) in merges.iter().enumerate() {
        let Some((split, _)) = merge.char_indices().skip(1).find(|&(_, c)| c == ' ') else {
            return Err(format!("item {i} ({merge:?}) is not two tokens separated by a space").into());
        };
        let (left, right) = (&merge[..split], &merge[split + 1..]);
        if [left, right, &format!("{left}{right}")].iter().all(|t| vocab.contains_key(*t)) {
            pairs.push((left.to_owned(), right.to_owned()));
        } else {
            unusable += 1;
        }
    }
    if unusable > 0 {
        tracing::warn!("{unusable} BPE merges name tokens outside the vocabulary; ignored");
    }
    Ok(pairs)
}
