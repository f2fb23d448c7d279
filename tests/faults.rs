//! Faults and determinism: a lost device becomes an error (never a hang), Ctrl-C stops `kiln
//! run` with exit 130 after flushing, a closed stdout pipe ends it quietly; the same model,
//! prompt, seed and adapter give the same tokens, with and without subgroup and f16 kernels.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::testdata;
use kiln::config::Disabled;
use kiln::engine::Model;
use kiln::generate::generate;
use kiln::gpu::{ContextOptions, GpuContext};
use kiln::model::{Output, SessionOptions};
use kiln::sample::{Sampler, SamplerConfig};
use kiln::tokenizer::Tokenizer;

fn stories() -> std::path::PathBuf {
    testdata().join("stories260K/stories260K.gguf")
}

fn load(disable: Disabled) -> (Model, Tokenizer) {
    let ctx = GpuContext::new(&ContextOptions { disable, ..Default::default() }).expect("GPU");
    let model = Model::load(ctx, stories(), &mut |_| {}).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    (model, tok)
}

/// Tokens generated from BOS with `cfg` (greedy when temperature is 0).
fn tokens(model: &Model, tok: &Tokenizer, cfg: SamplerConfig, n: usize) -> Vec<u32> {
    let mut session =
        model.session(SessionOptions { n_ctx: 256, ubatch: 64, f16_kv: true, all_logits: false, n_seq: 1 }).unwrap();
    let mut history = Vec::new();
    let mut sampler = Sampler::new(cfg);
    let stop = AtomicBool::new(false);
    let bos = tok.bos().unwrap();
    generate(&mut session, tok, &[bos], &mut history, Some(n), &mut sampler, &stop, &mut |_| Ok(())).unwrap();
    history[1..].to_vec()
}

#[test]
fn greedy_tokens_are_identical_with_and_without_subgroup_and_f16_kernels() {
    let want: Vec<u32> = std::fs::read_to_string(testdata().join("stories260K/greedy200.tokens.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let greedy = SamplerConfig { temperature: 0.0, ..SamplerConfig::default() };
    let (full, tok) = load(Disabled::NONE);
    eprintln!("full: {}  caps {:?}", full.ctx.describe(), full.ctx.caps);
    let a = tokens(&full, &tok, greedy, 200);
    let (plain, _) = load(Disabled { subgroup: true, f16: true, ..Disabled::NONE });
    eprintln!("plain: caps {:?}", plain.ctx.caps);
    let b = tokens(&plain, &tok, greedy, 200);
    let first_diff = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(a, b, "greedy tokens differ with subgroup/f16 kernels off (first at {first_diff:?})");
    // And both are llama2.c's greedy text (the file starts with BOS).
    assert_eq!(a, want[1..], "greedy tokens differ from the reference");
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let (model, tok) = load(Disabled::NONE);
    let cfg =
        |seed| SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplerConfig::default() };
    let a = tokens(&model, &tok, cfg(42), 150);
    let b = tokens(&model, &tok, cfg(42), 150);
    let c = tokens(&model, &tok, cfg(43), 150);
    assert_eq!(a, b, "two runs with seed 42 differ");
    assert_ne!(a, c, "seeds 42 and 43 gave the same 150 tokens");
    // A second model load on the same adapter too.
    let (model2, _) = load(Disabled::NONE);
    assert_eq!(a, tokens(&model2, &tok, cfg(42), 150), "a new load with seed 42 differs");
}

#[test]
fn a_lost_device_is_an_error_not_a_hang() {
    let (model, _) = load(Disabled::NONE);
    let mut session =
        model.session(SessionOptions { n_ctx: 64, ubatch: 16, f16_kv: true, all_logits: false, n_seq: 1 }).unwrap();
    session.forward(&[1, 400], Output::Argmax).unwrap();
    model.ctx.device.destroy();
    let t = Instant::now();
    let err = session.forward(&[300], Output::Argmax).expect_err("a step on a destroyed device succeeded").to_string();
    eprintln!("after device loss: {err} ({:?})", t.elapsed());
    assert!(err.contains("GPU") && err.contains("lost"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    // Chained decoding too.
    let err = session.generate_greedy_chained(5, 10, &mut |_| true).expect_err("chained decode succeeded").to_string();
    assert!(err.contains("lost"), "{err}");
}

fn kiln_run(extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(["run", "-m"]).arg(stories()).args(["-p", "Once upon a time", "-c", "128", "--temp", "0"]).args(extra);
    c
}

#[test]
fn writing_to_a_closed_pipe_ends_quietly() {
    let mut child = kiln_run(&["-n", "20000"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte).unwrap();
    drop(stdout); // as `| head -c 1` does
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(t.elapsed() < Duration::from_secs(20), "kiln went on writing to a closed pipe");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.trim().is_empty(), "stderr: {stderr}");
}

#[test]
fn ctrl_c_stops_run_with_exit_130_after_flushing() {
    let mut child = kiln_run(&["-n", "100000"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let t = Instant::now();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(t.elapsed() < Duration::from_secs(10), "Ctrl-C took {:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // What was printed is complete: the text, then the newline run writes after it.
    let text = [first.as_slice(), &rest].concat();
    assert!(text.len() > 16 && text.ends_with(b"\n"), "{:?}", String::from_utf8_lossy(&text));
}
