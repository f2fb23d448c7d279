//! Scoring and perplexity: the GPU scoring path (log-softmax and NLL on the GPU, one float
//! per token read back) against the float64 reference, against scoring on the CPU, and
//! `kiln perplexity` / `kiln eval` on the command line.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gpus, testdata};
use kiln::engine::Model;
use kiln::kernels::nll::nll_of;
use kiln::model::SessionOptions;
use kiln::perplexity::{score_chunk, Chunking, NllSums, Scoring};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn greedy_tokens() -> Vec<u32> {
    std::fs::read_to_string(testdata().join("stories260K/greedy200.tokens.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

/// exp(mean NLL) of the next tokens of positions `from..ids.len() - 1`, from float64 logits.
fn reference_perplexity(logits: &[f32], ids: &[u32], from: usize, n_vocab: usize) -> f64 {
    let mut sums = NllSums::default();
    let nlls: Vec<f32> =
        (from..ids.len() - 1).map(|i| nll_of(&logits[i * n_vocab..(i + 1) * n_vocab], ids[i + 1]) as f32).collect();
    sums.add(&nlls);
    sums.perplexity()
}

fn relative(a: f64, b: f64) -> f64 {
    (a / b - 1.0).abs()
}

/// stories260K over the 200 reference tokens: the GPU scores give the float64 reference's
/// perplexity within 1e-4 relative, scoring every position (eval) and the second half as a
/// perplexity chunk, in one step and in steps of 96 (the last one of 8 tokens, which runs the
/// decode GEMVs); scoring on the CPU agrees.
#[test]
fn stories260k_gpu_scoring_matches_float64_reference() {
    let ids = &greedy_tokens()[..200];
    let logits: Vec<f32> =
        bytemuck::pod_collect_to_vec(&std::fs::read(testdata().join("stories260K/logits_numpy_f64ref.f32")).unwrap());
    let v = 512;
    let chunk = Chunking { n_ctx: 200, n_chunks: 1 };
    // The native adapter (the kernel itself is tested on every adapter in tests/ops.rs).
    let g = &gpus()[0];
    let model = Model::load(g.ctx.clone(), testdata().join("stories260K/stories260K.gguf"), &mut |_| {}).unwrap();
    for ubatch in [256, 96] {
        let opts = SessionOptions { n_ctx: 200, ubatch, f16_kv: false, all_logits: true, n_seq: 1 };
        let mut s = model.session(opts).unwrap();
        let what = format!("[{}] ubatch {ubatch}", g.name);

        let all = s.score(ids, 0).unwrap();
        assert_eq!(all.len(), 199, "{what}");
        let mut sums = NllSums::default();
        sums.add(&all);
        let want = reference_perplexity(&logits, ids, 0, v);
        eprintln!("{what}: every position: PPL {:.6} (float64 reference {want:.6})", sums.perplexity());
        assert!(relative(sums.perplexity(), want) < 1e-4, "{what}: {} vs {want}", sums.perplexity());

        let gpu = score_chunk(&mut s, ids, &chunk, 0, Some(1), Scoring::Gpu).unwrap();
        let host = score_chunk(&mut s, ids, &chunk, 0, Some(1), Scoring::Host).unwrap();
        assert_eq!((gpu.len(), host.len()), (99, 99), "{what}");
        let (mut g_sums, mut h_sums) = (NllSums::default(), NllSums::default());
        g_sums.add(&gpu);
        h_sums.add(&host);
        let want = reference_perplexity(&logits, ids, 100, v);
        eprintln!(
            "{what}: second half: PPL {:.6} on the GPU, {:.6} on the CPU (float64 reference {want:.6})",
            g_sums.perplexity(),
            h_sums.perplexity()
        );
        assert!(relative(g_sums.perplexity(), want) < 1e-4, "{what}: {} vs {want}", g_sums.perplexity());
        for (i, (a, b)) in gpu.iter().zip(&host).enumerate() {
            assert!((a - b).abs() < 1e-4, "{what}: position {}: NLL {a} on the GPU, {b} on the CPU", 100 + i);
        }
    }
    // A session without all logits cannot score; that is an error, not a panic.
    let mut s =
        model.session(SessionOptions { n_ctx: 64, ubatch: 64, f16_kv: true, all_logits: false, n_seq: 1 }).unwrap();
    assert!(s.score(&ids[..10], 0).unwrap_err().to_string().contains("all logits"));
}

fn synth_model(dir: &Path, spec: &str) -> PathBuf {
    let path = dir.join(format!("{}.gguf", spec.replace(':', "_")));
    let out = kiln().args(["synth", "--preset", spec, "-o"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path
}

/// Lower-case words, which the synthetic vocabularies hold as pieces.
fn words(n: usize) -> String {
    let words = ["once", "upon", "a", "time", "there", "was", "little", "girl", "named", "lily", "she", "liked"];
    (0..n).map(|i| words[(i * 7 + i / 5) % words.len()]).collect::<Vec<_>>().join(" ")
}

/// The running estimates and the final "PPL = X +/- Y" of `kiln perplexity`'s output.
fn parse_perplexity(stdout: &str) -> (Vec<f64>, f64, f64) {
    let mut lines = stdout.lines();
    let running = lines
        .next()
        .expect("running estimates")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.split(']').nth(1).expect("[i]x").parse().expect("estimate"))
        .collect();
    let last = lines.next().expect("final estimate");
    let rest = last.strip_prefix("Final estimate: PPL = ").unwrap_or_else(|| panic!("{last:?}"));
    let (ppl, err) = rest.split_once(" +/- ").unwrap_or_else(|| panic!("{last:?}"));
    (running, ppl.parse().unwrap(), err.parse().unwrap())
}

/// `kiln perplexity` on a synthetic model gives the same estimates with GPU scoring and
/// with `--score-on-cpu`, in llama-perplexity's format; `kiln eval` likewise with and
/// without `--logits-out`.
#[test]
fn perplexity_and_eval_agree_with_and_without_gpu_scoring() {
    let dir = tmp_dir("perplexity");
    let model = synth_model(&dir, "tiny-test:q8_0");
    let text = dir.join("text.txt");
    std::fs::write(&text, words(400)).unwrap();
    let run = |extra: &[&str]| {
        let out = kiln()
            .args(["perplexity", "-m"])
            .arg(&model)
            .arg("-f")
            .arg(&text)
            .args(["-c", "48", "--ubatch", "20", "--chunks", "3"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        parse_perplexity(&String::from_utf8_lossy(&out.stdout))
    };
    let (gpu_running, gpu_ppl, gpu_err) = run(&[]);
    let (cpu_running, cpu_ppl, cpu_err) = run(&["--score-on-cpu"]);
    eprintln!("tiny-test: PPL {gpu_ppl} +/- {gpu_err} (GPU scoring), {cpu_ppl} +/- {cpu_err} (CPU)");
    assert_eq!(gpu_running.len(), 3, "{gpu_running:?}");
    assert_eq!(gpu_running.len(), cpu_running.len());
    for (a, b) in gpu_running.iter().zip(&cpu_running).chain([(&gpu_ppl, &cpu_ppl)]) {
        assert!(relative(*a, *b) < 1e-5, "GPU {a} vs CPU {b}");
    }
    assert!(relative(gpu_err, cpu_err) < 1e-3, "+/- {gpu_err} vs {cpu_err}");
    assert_eq!(*gpu_running.last().unwrap(), gpu_ppl);

    // A text shorter than two chunks is refused as llama-perplexity refuses it.
    let out = kiln().args(["perplexity", "-m"]).arg(&model).arg("-f").arg(&text).args(["-c", "2048"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs at least 4096"), "{err}");

    let ids: Vec<String> = (0..60).map(|i| ((i * 37 + 5) % 1024).to_string()).collect();
    let tokens = dir.join("tokens.txt");
    std::fs::write(&tokens, ids.join(" ")).unwrap();
    let eval = |extra: &[&str]| -> f64 {
        let out = kiln().args(["eval", "-m"]).arg(&model).arg("--tokens").arg(&tokens).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let nll = stdout.split("mean NLL ").nth(1).and_then(|s| s.split_whitespace().next());
        nll.unwrap_or_else(|| panic!("{stdout}")).parse().unwrap()
    };
    let logits = dir.join("logits.f32");
    let (gpu, cpu) = (eval(&[]), eval(&["--logits-out", logits.to_str().unwrap()]));
    eprintln!("tiny-test eval: mean NLL {gpu} (GPU scoring), {cpu} (CPU)");
    assert!(relative(gpu, cpu) < 1e-5, "mean NLL {gpu} vs {cpu}");
    assert_eq!(std::fs::metadata(&logits).unwrap().len(), 60 * 1024 * 4);
    std::fs::remove_dir_all(&dir).ok();
}

/// `kiln perplexity` prints what llama-perplexity printed on the same model and text
/// (tests/data/perplexity_llamacpp.json), each estimate within one unit of its last digit.
#[test]
fn perplexity_matches_llama_cpp_on_stories260k() {
    let data_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data_dir.join("perplexity_llamacpp.json")).unwrap()).unwrap();
    let args: Vec<&str> = want["kiln_args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let out = kiln()
        .args(["perplexity", "-m"])
        .arg(testdata().join(want["model"].as_str().unwrap()))
        .arg("-f")
        .arg(data_dir.join(want["text"].as_str().unwrap()))
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = String::from_utf8_lossy(&out.stdout).to_string();
    let llama = format!("{}\n{}\n", want["stdout"].as_str().unwrap(), want["final"].as_str().unwrap());
    eprintln!("kiln:\n{got}llama.cpp:\n{llama}");
    let ((got_running, got_ppl, got_err), (want_running, want_ppl, want_err)) =
        (parse_perplexity(&got), parse_perplexity(&llama));
    assert_eq!(got_running.len(), want_running.len(), "{got}");
    for (a, b) in got_running.iter().zip(&want_running).chain([(&got_ppl, &want_ppl)]) {
        assert!((a - b).abs() <= 1.01e-4, "kiln {a} vs llama.cpp {b}\n{got}");
    }
    assert!((got_err - want_err).abs() <= 1.01e-5, "+/- {got_err} vs {want_err}");
}
