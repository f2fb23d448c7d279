//! SentencePiece BPE ("llama" vocabularies). llama.cpp splits the text into characters and
//! repeatedly merges the adjacent pair whose concatenation is the vocabulary token with the
//! highest score, falling back to `<0xXX>` byte tokens for characters outside the vocabulary.
//! A BPE model whose merge ranks follow those scores does the same (HF's LlamaConverter).

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper, Tokenizer};

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

pub(super) fn build(
    tokens: &[String],
    scores: &[f32],
    add_space_prefix: bool,
    unk_token: Option<&str>,
) -> tokenizers::Result<Tokenizer> {
    let vocab: Vocab = tokens.iter().enumerate().map(|(id, token)| (token.clone(), id as u32)).collect();
    let merges = merges_by_score(tokens, scores, &vocab);
    // No word cache (see bpe.rs: it would leak per model).
    let mut model = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).cache_capacity(0);
    if let Some(unk) = unk_token {
        model = model.unk_token(unk.to_owned());
    }
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

/// Every split of a token into two tokens, as a merge, best score first. Equal scores (Llama
/// 2's runs of "▁" all score -1e9) are ordered by the ids of the two parts, as in the
/// tokenizer.json files from which llama.cpp's expected outputs were made.
fn merges_by_score(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    let mut found: Vec<(f32, u32, u32)> = Vec::new();
    for (merged, &score) in tokens.iter().zip(scores) {
        for (split, _) in merged.char_indices().skip(1) {
            let (left, right) = merged.split_at(split);
            if let (Some(&left), Some(&right)) = (vocab.get(left), vocab.get(right)) {
                // + 0.0 turns -0.0 into 0.0: llama.cpp compares scores with `<`.
                found.push((score + 0.0, left, right));
            }
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    found.into_iter().map(|(_, left, right)| (tokens[left as usize].clone(), tokens[right as usize].clone())).collect()
}
