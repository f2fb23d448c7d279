//! GGUF loading and model configuration on the real test files, and clean failures on broken
//! ones (through the library and through `kiln inspect`'s exit code).

mod common;

use common::testdata;
use kiln::gguf::GgufFile;
use kiln::model::{Arch, ModelConfig};
use kiln::quant::WeightFormat;

#[test]
fn stories260k_config() {
    let f = GgufFile::open(testdata().join("stories260K/stories260K.gguf")).unwrap();
    let c = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!((c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_kv_head, c.head_dim, c.n_vocab), (5, 64, 172, 8, 4, 8, 512));
    assert_eq!(c.rms_eps, 1e-5);
    assert_eq!(c.rope_base, 10000.0);
    assert!(!c.tied_embeddings);
    c.validate_tensors(&f).unwrap();
    assert!(f.tensors.iter().all(|t| t.format == Some(WeightFormat::F32)));
}

#[test]
fn q4_k_m_mixes_q4_k_and_q6_k() {
    let f = GgufFile::open(testdata().join("derived/stories260K-pad256-Q4_K_M.gguf")).unwrap();
    let c = ModelConfig::from_gguf(&f).unwrap();
    c.validate_tensors(&f).unwrap();
    assert_eq!(f.tensor("output.weight").unwrap().format, Some(WeightFormat::Q6K));
    assert_eq!(f.tensor("blk.0.attn_q.weight").unwrap().format, Some(WeightFormat::Q4K));
    assert_eq!((c.n_embd, c.n_head, c.n_kv_head, c.head_dim), (256, 32, 16, 8));
}

#[test]
fn vocabulary_only_files_open() {
    for name in ["ggml-vocab-llama-spm", "ggml-vocab-gpt-2", "ggml-vocab-falcon", "ggml-vocab-deepseek-coder"] {
        let f = GgufFile::open(testdata().join(format!("vocab/{name}.gguf"))).unwrap();
        assert!(f.tensors.is_empty());
        assert!(f.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(|a| a.len() > 1000).unwrap_or(false));
    }
}

fn broken(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn broken_files_fail_with_a_message() {
    let good = std::fs::read(testdata().join("stories260K/stories260K.gguf")).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated-data.gguf", good[..good.len() - 1000].to_vec(), "truncated"),
        ("truncated-header.gguf", good[..200].to_vec(), "malformed GGUF header"),
        ("bad-magic.gguf", [b"GGUX".as_slice(), &good[4..]].concat(), "bad magic"),
        ("version-99.gguf", [b"GGUF".as_slice(), &99u32.to_le_bytes(), &good[8..]].concat(), "version 99"),
        ("empty.gguf", Vec::new(), "bad magic"),
    ];
    for (name, bytes, want) in cases {
        let p = broken(name, &bytes);
        let err = GgufFile::open(&p).err().unwrap_or_else(|| panic!("{name} opened")).to_string();
        assert!(err.contains(want), "{name}: {err}");
        // The CLI reports it on one line with exit code 2.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).arg("inspect").arg(&p).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{name}: {stderr}");
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let f = GgufFile::open(testdata().join("vocab/ggml-vocab-gpt-2.gguf")).unwrap();
    let err = ModelConfig::from_gguf(&f).unwrap_err().to_string();
    assert!(err.contains("\"gpt2\"") && err.contains("llama, qwen2, qwen3"), "{err}");
}

/// `kiln tokenize` on a vocabulary-only file, with and without BOS; `kiln run` on a missing
/// file fails with exit code 2 and one line.
#[test]
fn cli_tokenize_and_bad_paths() {
    let bin = env!("CARGO_BIN_EXE_kiln");
    let vocab = testdata().join("vocab/ggml-vocab-llama-spm.gguf");
    let out = std::process::Command::new(bin).args(["tokenize", "-m"]).arg(&vocab).arg("Hello world").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let ids: Vec<u32> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert_eq!(ids[0], 1, "BOS first");
    let out = std::process::Command::new(bin)
        .args(["tokenize", "--no-bos", "-m"])
        .arg(&vocab)
        .arg("Hello world")
        .output()
        .unwrap();
    let no_bos: Vec<u32> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert_eq!(no_bos, ids[1..]);
    let out =
        std::process::Command::new(bin).args(["run", "-m", "/nonexistent/model.gguf", "-p", "hi"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim().lines().count(), 1, "{out:?}");
}
