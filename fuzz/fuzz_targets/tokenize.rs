//! Tokenization of arbitrary text with each real vocabulary of the test data (SentencePiece
//! and byte-level BPE), then decoding (whole and streamed) of the ids and of arbitrary ids.
#![no_main]

use std::sync::OnceLock;

use kiln::gguf::GgufFile;
use kiln::tokenizer::{StreamDecoder, Tokenizer};
use libfuzzer_sys::fuzz_target;

fn tokenizers() -> &'static [Tokenizer] {
    static T: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = std::env::var_os("KILN_TESTDATA")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/testdata")));
        ["vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-deepseek-coder.gguf"]
            .iter()
            .map(|p| Tokenizer::from_gguf(&GgufFile::open(dir.join(p)).expect("test vocabulary")).expect("tokenizer"))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let tok = &tokenizers()[sel as usize % tokenizers().len()];
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, sel & 0x80 != 0).expect("encode");
    let whole = tok.decode(&ids).expect("decode");
    let mut stream = StreamDecoder::new(tok);
    let mut streamed = String::new();
    for &id in &ids {
        streamed += &stream.push(id).expect("stream decode");
    }
    let _ = (whole, streamed);
    // Arbitrary ids, in and out of the vocabulary.
    let raw: Vec<u32> = rest.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32 * 2).collect();
    let _ = tok.decode(&raw);
});
