//! Tokenizer tests against llama.cpp's own tokenizer test data (vocab/*.gguf with .inp/.out)
//! and the stories260K prompts, plus round trips, streaming and metadata errors.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::testdata;
use kiln::gguf::GgufFile;
use kiln::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::{json, Value};

fn vocab_path(name: &str) -> PathBuf {
    testdata().join("vocab").join(format!("ggml-vocab-{name}.gguf"))
}

fn open(path: &Path) -> Tokenizer {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"))
}

fn vocab(name: &str) -> Tokenizer {
    open(&vocab_path(name))
}

fn stories() -> Tokenizer {
    open(&testdata().join("stories260K/stories260K.gguf"))
}

/// The cases as llama.cpp's test-tokenizer-0 reads them: inputs separated by
/// "\n__ggml_vocab_test__\n" (the file ends with one), one line of ids per input.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let path = vocab_path(name);
    let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).expect("read .inp");
    let out = std::fs::read_to_string(path.with_extension("gguf.out")).expect("read .out");
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(at) => {
                inputs.push(rest[..at].to_owned());
                rest = &rest[at + SEP.len()..];
            }
            None => {
                inputs.push(rest.to_owned());
                rest = "";
            }
        }
    }
    let expected: Vec<Vec<u32>> =
        out.lines().map(|line| line.split_whitespace().map(|id| id.parse().expect("token id")).collect()).collect();
    assert_eq!(inputs.len(), expected.len(), "{name}: .inp and .out disagree");
    inputs.into_iter().zip(expected).collect()
}

fn pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&id| format!("{id}:{:?}", tok.token_str(id).unwrap_or("?"))).collect()
}

/// Every input of the vocabulary's test file gives exactly llama.cpp's ids (no BOS).
fn check_vocab(name: &str) {
    let tok = vocab(name);
    let cases = cases(name);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false).expect("encode");
        if &got != want {
            failures.push(format!(
                "  text {text:?}\n    want {want:?}\n         {:?}\n    \
                 got  {got:?}\n         {:?}",
                pieces(&tok, want),
                pieces(&tok, &got)
            ));
        }
    }
    let passed = cases.len() - failures.len();
    eprintln!("{name}: {passed}/{} inputs tokenize as llama.cpp", cases.len());
    assert!(
        failures.is_empty(),
        "{name}: {} of {} inputs differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm_matches_llama_cpp() {
    check_vocab("llama-spm");
}

#[test]
fn gpt2_matches_llama_cpp() {
    check_vocab("gpt-2");
}

#[test]
fn falcon_matches_llama_cpp() {
    check_vocab("falcon");
}

#[test]
fn deepseek_coder_matches_llama_cpp() {
    check_vocab("deepseek-coder");
}

#[test]
fn every_vocab_file_is_tested() {
    let mut names: Vec<String> = std::fs::read_dir(testdata().join("vocab"))
        .expect("vocab dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf").map(str::to_owned))
        .collect();
    names.sort();
    assert_eq!(names, ["deepseek-coder", "falcon", "gpt-2", "llama-spm"]);
}

#[test]
fn stories260k_prompts_match_llama_cpp() {
    let tok = stories();
    assert_eq!(tok.vocab_size(), 512);
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert!(tok.add_bos_default());
    let text = std::fs::read_to_string(testdata().join("stories260K/tokenize_llamacpp.json"))
        .expect("read tokenize_llamacpp.json");
    let prompts: Vec<Value> = serde_json::from_str(&text).expect("json");
    assert_eq!(prompts.len(), 4);
    for prompt in &prompts {
        let text = prompt["text"].as_str().expect("text");
        let want: Vec<u32> =
            prompt["ids"].as_array().expect("ids").iter().map(|id| id.as_u64().expect("id") as u32).collect();
        let got = tok.encode(text, true).expect("encode");
        assert_eq!(got, want, "{text:?}\n  want {:?}\n  got  {:?}", pieces(&tok, &want), pieces(&tok, &got));
    }
}

const ROUND_TRIP: &[&str] = &[
    "Hello world",
    " Hello, world!  Two spaces, a\ttab and\nnew lines\n\n",
    "The llama 🦙 and the rocket 🚀 met 😶\u{200d}🌫️ on the moon.",
    "我想在apple工作1314151天～ 日本語のテキスト 한국어 텍스트",
    "нещо на Български, Cửa Việt, Führer, ½ month",
    "x = f(a, b) { return a->c[0] >= 1e-3; } // ''' \"\"\" ```",
];

#[test]
fn decode_inverts_encode() {
    for name in ["llama-spm", "gpt-2", "falcon", "deepseek-coder"] {
        let tok = vocab(name);
        for text in ROUND_TRIP {
            let ids = tok.encode(text, false).expect("encode");
            let back = tok.decode(&ids).expect("decode");
            assert_eq!(&back, text, "{name}: {:?}", pieces(&tok, &ids));
        }
    }
    // 512 tokens: CJK and emoji go through byte fallback.
    let tok = stories();
    for text in ROUND_TRIP {
        let ids = tok.encode(text, true).expect("encode");
        assert_eq!(&tok.decode(&ids).expect("decode"), text);
    }
}

/// Feeds the ids one at a time: every piece is whole characters, and together they are the
/// text, with special tokens (BOS first, EOS in the middle) printing nothing.
fn check_stream(name: &str, tok: &Tokenizer) {
    for text in ROUND_TRIP {
        let mut ids = tok.encode(text, tok.bos().is_some()).expect("encode");
        if let Some(eos) = tok.eos() {
            ids.insert(ids.len() / 2, eos);
        }
        let mut stream = StreamDecoder::new(tok);
        let mut streamed = String::new();
        for &id in &ids {
            let piece = stream.push(id).expect("push");
            assert!(
                !piece.contains(char::REPLACEMENT_CHARACTER),
                "{name}: half a character {piece:?} after {streamed:?}"
            );
            streamed += &piece;
        }
        streamed += &stream.finish().expect("finish");
        assert_eq!(&streamed, text, "{name}");
        assert_eq!(streamed, tok.decode(&ids).expect("decode"), "{name}");
    }
}

#[test]
fn stream_decoder_emits_whole_characters() {
    for name in ["llama-spm", "gpt-2", "deepseek-coder"] {
        check_stream(name, &vocab(name));
    }
    check_stream("stories260K", &stories());
}

#[test]
fn stream_decoder_flushes_an_incomplete_character() {
    let tok = stories();
    // "🦙" is four byte-fallback tokens; stop after three.
    let ids = tok.encode("🦙", false).expect("encode");
    assert_eq!(ids.len(), 5, "{:?}", pieces(&tok, &ids)); // "▁" and four bytes
    let mut stream = StreamDecoder::new(&tok);
    let mut streamed = String::new();
    for &id in &ids[..4] {
        streamed += &stream.push(id).expect("push");
    }
    assert_eq!(streamed, "");
    assert!(stream.finish().expect("finish").ends_with('\u{FFFD}'));
}

#[test]
fn special_tokens_stay_whole() {
    let gpt2 = vocab("gpt-2");
    assert_eq!(gpt2.encode("<|endoftext|>", false).unwrap(), [50256]);
    let ids = gpt2.encode("Hello<|endoftext|> world", false).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 50256).count(), 1, "{ids:?}");
    assert_eq!(gpt2.decode(&ids).unwrap(), "Hello world");
    assert_eq!((gpt2.eos(), gpt2.eot()), (Some(50256), None));
    assert!(gpt2.is_eog(50256));
    assert!(!gpt2.add_bos_default());

    // deepseek-coder: a control token, and user-defined ones that decode as themselves.
    let coder = vocab("deepseek-coder");
    let bos = coder.bos().unwrap();
    assert_eq!(coder.token_str(bos), Some("<｜begin▁of▁sentence｜>"));
    let ids = coder.encode("<｜begin▁of▁sentence｜>x<|User|>y<|EOT|>", false).unwrap();
    assert_eq!(ids[0], bos);
    assert!(ids.contains(&32019) && ids.contains(&32021), "{ids:?}");
    assert_eq!(coder.decode(&ids).unwrap(), "x<|User|>y<|EOT|>");

    // SentencePiece: no dummy-prefix "▁" before a leading special token, one after it.
    let spm = vocab("llama-spm");
    assert_eq!(spm.encode("<s>", false).unwrap(), [1]);
    let hello = spm.encode("Hello", false).unwrap();
    let mut want = vec![1];
    want.extend(&hello);
    want.push(2);
    assert_eq!(spm.encode("<s>Hello</s>", false).unwrap(), want);
    assert_eq!(spm.encode("Hello", true).unwrap()[1..], hello[..]);
}

#[test]
fn out_of_range_ids_are_an_error() {
    let tok = stories();
    let err = tok.decode(&[1, 512]).unwrap_err().to_string();
    assert!(err.contains("512"), "{err}");
}

// Hand-made metadata: the checks on what a file declares.

fn gpt2_meta(tokens: &[&str], merges: &[&str]) -> BTreeMap<String, Value> {
    BTreeMap::from([
        ("tokenizer.ggml.model".to_owned(), json!("gpt2")),
        ("tokenizer.ggml.pre".to_owned(), json!("gpt-2")),
        ("tokenizer.ggml.tokens".to_owned(), json!(tokens)),
        ("tokenizer.ggml.merges".to_owned(), json!(merges)),
    ])
}

fn spm_meta(tokens: &[&str], scores: &[f32]) -> BTreeMap<String, Value> {
    let types: Vec<i32> = tokens
        .iter()
        .map(|t| match *t {
            "<unk>" => 2,
            "<s>" | "</s>" => 3,
            _ => 1,
        })
        .collect();
    BTreeMap::from([
        ("tokenizer.ggml.model".to_owned(), json!("llama")),
        ("tokenizer.ggml.tokens".to_owned(), json!(tokens)),
        ("tokenizer.ggml.scores".to_owned(), json!(scores)),
        ("tokenizer.ggml.token_type".to_owned(), json!(types)),
    ])
}

fn error(meta: &BTreeMap<String, Value>) -> String {
    Tokenizer::from_metadata(Path::new("made-up.gguf"), meta).expect_err("should be refused").to_string()
}

fn assert_mentions(message: &str, words: &[&str]) {
    for word in words {
        assert!(message.contains(word), "{message:?} should mention {word:?}");
    }
}

#[test]
fn hand_made_vocabularies_work() {
    let meta = gpt2_meta(&["a", "b", "ab", "Ġ", "Ġab", "<|im_end|>"], &["a b", "Ġ ab"]);
    let tok = Tokenizer::from_metadata(Path::new("made-up.gguf"), &meta).unwrap();
    assert_eq!(tok.encode("ab ab", false).unwrap(), [2, 4]);
    // Found by name: the file names no EOT id.
    assert_eq!(tok.eot(), Some(5));
    assert!(tok.is_eog(5) && !tok.is_eog(2));
    assert_eq!(tok.bos(), None);
    assert!(tok.encode("a", true).is_err());

    let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab"];
    let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0];
    let tok = Tokenizer::from_metadata(Path::new("x.gguf"), &spm_meta(&tokens, &scores)).unwrap();
    assert_eq!(tok.encode("ab", true).unwrap(), [1, 8]);
    // No byte tokens: an unknown character becomes <unk>.
    assert_eq!(tok.encode("ab c", false).unwrap(), [8, 3, 0]);
    assert_eq!(tok.decode(&[1, 8, 6]).unwrap(), "ab a");
}

/// Each `tokenizer.ggml.pre` cuts digits and words where llama.cpp's regexes do, which shows
/// through merges that would join across the cuts.
#[test]
fn pre_tokenizers_cut_where_llama_cpp_does() {
    let mut tokens: Vec<String> = ('!'..='~').map(String::from).collect();
    // GPT-2's byte symbols for space and newline.
    tokens.extend(["Ġ", "Ċ", "12", "123", "1234", "ab", "Ġab", "xyz"].map(String::from));
    let merges = ["1 2", "12 3", "123 4", "a b", "Ġ ab"];
    let cut = |pre: &str, text: &str| -> Vec<String> {
        let mut meta = gpt2_meta(&[], &merges);
        meta.insert("tokenizer.ggml.tokens".into(), json!(tokens));
        meta.insert("tokenizer.ggml.pre".into(), json!(pre));
        let tok = Tokenizer::from_metadata(Path::new("made-up.gguf"), &meta).unwrap_or_else(|e| panic!("{pre}: {e}"));
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text, "{pre}");
        ids.iter().map(|&id| tok.token_str(id).unwrap().to_owned()).collect()
    };
    let whole = ["1234"].as_slice();
    let threes = ["123", "4"].as_slice();
    let singles = ["1", "2", "3", "4"].as_slice();
    for (pre, digits) in [
        ("gpt-2", whole),
        ("mpt", whole),
        ("deepseek-llm", whole),
        ("default", threes),
        ("no-such-pre", threes),
        ("falcon", threes),
        ("llama-bpe", threes),
        ("qwen2", singles),
        ("starcoder", singles),
        ("refact", singles),
        ("deepseek-coder", singles),
    ] {
        assert_eq!(cut(pre, "1234"), digits, "{pre}");
        assert_eq!(cut(pre, "ab ab"), ["ab", "Ġab"], "{pre}");
    }
    // Llama 3 takes a word that is a token as it is, merges or not.
    assert_eq!(cut("llama-bpe", "xyz"), ["xyz"]);
    assert_eq!(cut("gpt-2", "xyz"), ["x", "y", "z"]);
}

#[test]
fn bad_metadata_is_refused_with_the_key() {
    let good = gpt2_meta(&["a", "b", "ab"], &["a b"]);

    let mut meta = good.clone();
    meta.insert("tokenizer.ggml.model".into(), json!("t5"));
    assert_mentions(&error(&meta), &["made-up.gguf", "tokenizer.ggml.model", "t5"]);

    let mut meta = good.clone();
    meta.remove("tokenizer.ggml.model");
    assert_mentions(&error(&meta), &["tokenizer.ggml.model", "missing"]);

    let mut meta = good.clone();
    meta.remove("tokenizer.ggml.tokens");
    assert_mentions(&error(&meta), &["tokenizer.ggml.tokens", "missing"]);

    let mut meta = good.clone();
    meta.insert("tokenizer.ggml.tokens".into(), json!(["a", 7, "ab"]));
    assert_mentions(&error(&meta), &["tokenizer.ggml.tokens", "item 1"]);

    let mut meta = good.clone();
    meta.insert("tokenizer.ggml.tokens".into(), json!(["a", "b", "a"]));
    assert_mentions(&error(&meta), &["tokenizer.ggml.tokens", "twice"]);

    let mut meta = good.clone();
    meta.remove("tokenizer.ggml.merges");
    assert_mentions(&error(&meta), &["tokenizer.ggml.merges", "missing"]);

    let mut meta = good.clone();
    meta.insert("tokenizer.ggml.merges".into(), json!(["ab"]));
    assert_mentions(&error(&meta), &["tokenizer.ggml.merges", "item 0"]);

    let mut meta = good.clone();
    meta.insert("tokenizer.ggml.token_type".into(), json!([1, 1]));
    assert_mentions(&error(&meta), &["tokenizer.ggml.token_type", "2 entries", "3"]);

    let mut meta = good.clone();
    meta.insert("tokenizer.ggml.bos_token_id".into(), json!("one"));
    assert_mentions(&error(&meta), &["tokenizer.ggml.bos_token_id", "a string"]);

    let mut meta = good;
    meta.insert("tokenizer.ggml.add_bos_token".into(), json!(1));
    assert_mentions(&error(&meta), &["tokenizer.ggml.add_bos_token", "boolean"]);

    let tokens = ["<unk>", "a"];
    let mut meta = spm_meta(&tokens, &[0.0, -1.0, -2.0]);
    assert_mentions(&error(&meta), &["tokenizer.ggml.scores", "3 entries", "2"]);
    meta.remove("tokenizer.ggml.scores");
    assert_mentions(&error(&meta), &["tokenizer.ggml.scores", "missing"]);
}

// SentencePiece merging on vocabularies llama.cpp's vocab tests do not cover (the synthetic
// models', hand-made ones), against llama-tokenize's ids (tests/data/make_spm_cases.py).

fn spm_cases_file() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spm_llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("read spm_llamacpp.json")).expect("json")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|id| id.as_u64().expect("id") as u32).collect()
}

/// Every case's text gives its ids (no BOS); returns how many cases there were.
fn check_cases(name: &str, tok: &Tokenizer, cases: &Value) -> usize {
    let cases = cases.as_array().expect("cases");
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, false).expect("encode");
        if got != want {
            failures.push(format!(
                "  text {text:?}\n    want {want:?}\n         {:?}\n    got  {got:?}\n         {:?}",
                pieces(tok, &want),
                pieces(tok, &got)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} texts differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

#[test]
fn spm_merges_match_llama_cpp_on_synthetic_vocabularies() {
    let data = spm_cases_file();
    let synthetic = data["synthetic"].as_array().expect("synthetic");
    // tiny-test, mini-llama, tinyllama-1.1b and llama-7b, qwen3-0.6b.
    let sizes: Vec<u64> = synthetic.iter().map(|v| v["n_vocab"].as_u64().expect("n_vocab")).collect();
    assert_eq!(sizes, [1024, 8192, 32000, 151936]);
    for vocab in synthetic {
        let n_vocab = vocab["n_vocab"].as_u64().expect("n_vocab") as u32;
        // The metadata `kiln synth` writes.
        let (tokens, scores, types) = kiln::synth::vocabulary(n_vocab);
        let meta = BTreeMap::from([
            ("tokenizer.ggml.model".to_owned(), json!("llama")),
            ("tokenizer.ggml.tokens".to_owned(), json!(tokens)),
            ("tokenizer.ggml.scores".to_owned(), json!(scores)),
            ("tokenizer.ggml.token_type".to_owned(), json!(types)),
            ("tokenizer.ggml.bos_token_id".to_owned(), json!(1)),
            ("tokenizer.ggml.eos_token_id".to_owned(), json!(2)),
            ("tokenizer.ggml.unknown_token_id".to_owned(), json!(0)),
        ]);
        let tok = Tokenizer::from_metadata(Path::new("synthetic.gguf"), &meta).unwrap();
        let name = format!("synthetic vocabulary of {n_vocab}");
        let n = check_cases(&name, &tok, &vocab["cases"]);
        eprintln!("{name}: {n}/{n} texts tokenize as llama.cpp");
    }
    // The issue's example: "▁" is not a piece, "▁the" is.
    let (tokens, scores, types) = kiln::synth::vocabulary(32000);
    let meta = BTreeMap::from([
        ("tokenizer.ggml.model".to_owned(), json!("llama")),
        ("tokenizer.ggml.tokens".to_owned(), json!(tokens)),
        ("tokenizer.ggml.scores".to_owned(), json!(scores)),
        ("tokenizer.ggml.token_type".to_owned(), json!(types)),
    ]);
    let tok = Tokenizer::from_metadata(Path::new("synthetic.gguf"), &meta).unwrap();
    assert_eq!(tok.encode("the quick brown fox", false).unwrap(), [7473, 1383, 15304, 21477, 1032, 1049, 306]);
}

#[test]
fn spm_merges_match_llama_cpp_on_hand_made_vocabularies() {
    let data = spm_cases_file();
    let hand_made = data["hand_made"].as_array().expect("hand_made");
    assert_eq!(hand_made.len(), 2);
    for vocab in hand_made {
        let name = vocab["name"].as_str().expect("name");
        let meta = BTreeMap::from([
            ("tokenizer.ggml.model".to_owned(), json!("llama")),
            ("tokenizer.ggml.tokens".to_owned(), vocab["tokens"].clone()),
            ("tokenizer.ggml.scores".to_owned(), vocab["scores"].clone()),
            ("tokenizer.ggml.token_type".to_owned(), vocab["types"].clone()),
            ("tokenizer.ggml.add_space_prefix".to_owned(), vocab["add_space_prefix"].clone()),
            ("tokenizer.ggml.bos_token_id".to_owned(), json!(1)),
            ("tokenizer.ggml.eos_token_id".to_owned(), json!(2)),
            ("tokenizer.ggml.unknown_token_id".to_owned(), json!(0)),
        ]);
        let tok = Tokenizer::from_metadata(Path::new(name), &meta).unwrap();
        let n = check_cases(name, &tok, &vocab["cases"]);
        eprintln!("{name}: {n}/{n} texts tokenize as llama.cpp");
        // Where llama.cpp aborts (no byte tokens for a character that is not a piece), one
        // <unk> per such character.
        if let Some(unk_cases) = vocab.get("kiln_unk_cases") {
            check_cases(&format!("{name} (<unk>)"), &tok, unk_cases);
        }
    }
}
