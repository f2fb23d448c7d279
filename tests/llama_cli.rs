//! llama.cpp's command lines work on kiln, through the real binary: each flag of issue 14 is
//! accepted and does what it does in llama.cpp (or what kiln says it does); a prompt longer
//! than the context is cut from its end and generation after it keeps its speed; `kiln info`
//! says why an adapter is unusable in one line, without wgpu's log records.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::testdata;

fn stories() -> PathBuf {
    testdata().join("stories260K/stories260K.gguf")
}

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-test-llama-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(o: Output) -> (String, String) {
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "kiln failed ({:?}): {err}", o.status.code());
    (out, err)
}

/// `kiln run -m MODEL ARGS…` (greedy) → (stdout, stderr).
fn run(model: &Path, args: &[&str]) -> (String, String) {
    ok(kiln().arg("run").arg("-m").arg(model).args(["--temp", "0"]).args(args).output().unwrap())
}

/// (tokens generated, tokens/s over the decode steps) from kiln run's speed line.
fn generation(stderr: &str) -> (usize, f64) {
    let line = stderr.lines().find(|l| l.contains("generation: ")).unwrap_or_else(|| panic!("no speed line: {stderr}"));
    let g = line.split("generation: ").nth(1).unwrap();
    let tokens = g.split_whitespace().next().unwrap().parse().unwrap();
    let rate =
        g.rsplit('(').next().and_then(|r| r.split_whitespace().next()).and_then(|r| r.parse().ok()).unwrap_or(0.0);
    (tokens, rate)
}

const PROMPT: &str = "Once upon a time";

#[test]
fn prompt_from_a_file_equals_the_same_prompt() {
    let dir = tmp_dir("file");
    let want = run(&stories(), &["-p", PROMPT, "-n", "24"]).0;
    assert!(want.len() > 40, "{want:?}");
    // As llama.cpp, one trailing newline of the file is not part of the prompt.
    for (name, text) in [("plain.txt", PROMPT.to_string()), ("newline.txt", format!("{PROMPT}\n"))] {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        let got = run(&stories(), &["-f", f.to_str().unwrap(), "-n", "24"]).0;
        assert_eq!(got, want, "-f {name}");
    }
    // -p and -f together, or neither: a usage error.
    let both = kiln().arg("run").arg("-m").arg(stories()).args(["-p", "x", "-f", "y"]).output().unwrap();
    assert_eq!(both.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reverse_prompts_stop_at_the_string_and_escapes_apply_to_them() {
    let full = run(&stories(), &["-p", PROMPT, "-n", "60"]).0;
    // A word from the middle of the text (not its first occurrence's prefix elsewhere).
    let stop = "park";
    let at = full.find(stop).unwrap_or_else(|| panic!("{stop:?} not in {full:?}")) + stop.len();
    assert!(at < full.trim_end().len() - 10, "the stop string should be in the middle: {full:?}");
    let (got, err) = run(&stories(), &["-p", PROMPT, "-n", "60", "-r", "nothing like this", "-r", stop]);
    assert_eq!(got.trim_end_matches('\n'), &full[..at], "{err}");
    assert!(!err.contains("interrupted"), "{err}");
    // With -e, "\x2e" is "."; without, it is four characters that never appear.
    let dot = full.find('.').unwrap() + 1;
    let (escaped, _) = run(&stories(), &["-p", PROMPT, "-n", "60", "-e", "-r", r"\x2e"]);
    assert_eq!(escaped.trim_end_matches('\n'), &full[..dot]);
    let (literal, _) = run(&stories(), &["-p", PROMPT, "-n", "60", "-r", r"\x2e"]);
    assert_eq!(literal, full);
    // The sampling path (temperature > 0, logits read back) stops the same way.
    let mut sampled = kiln();
    sampled.arg("run").arg("-m").arg(stories());
    let sampled = ok(sampled
        .args(["-p", PROMPT, "-n", "60", "--temp", "0.7", "-s", "5", "--top-k", "1", "-r", stop])
        .output()
        .unwrap())
    .0;
    assert_eq!(sampled.trim_end_matches('\n'), &full[..at]);
}

#[test]
fn ignore_eos_generates_past_the_end_of_generation_token() {
    // stories260K never ranks its EOS token high (llama2.c's stories are separated by BOS),
    // so this copy makes "." its end-of-generation token (id 426): greedy text ends at the
    // first sentence without --ignore-eos and runs on with it.
    let dir = tmp_dir("eos");
    let mut bytes = std::fs::read(stories()).unwrap();
    let key = b"tokenizer.ggml.eos_token_id";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(&bytes[at..at + 8], &[4, 0, 0, 0, 2, 0, 0, 0], "u32 eos id 2");
    bytes[at + 4..at + 8].copy_from_slice(&426u32.to_le_bytes());
    let model = dir.join("stories260K-eos-is-dot.gguf");
    std::fs::write(&model, bytes).unwrap();
    let (short, err) = run(&model, &["-p", PROMPT, "-n", "40"]);
    let (n, _) = generation(&err);
    assert!(n < 40 && !short.contains('.'), "stopped at the first '.' after {n} tokens: {short:?}");
    let (long, err) = run(&model, &["-p", PROMPT, "-n", "40", "--ignore-eos"]);
    assert_eq!(generation(&err).0, 40, "{err}");
    assert!(long.starts_with(short.trim_end_matches('\n')), "{short:?} / {long:?}");
    assert!(long.len() > short.len() + 40, "{long:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn llama_cpp_model_flags_are_accepted_and_do_what_kiln_says() {
    let want = run(&stories(), &["-p", PROMPT, "-n", "16"]).0;
    // -ngl, -t, -fa (with and without a value), -b, -ub, --no-mmap: the same text.
    let (got, err) = run(
        &stories(),
        &["-p", PROMPT, "-n", "16", "-ngl", "99", "-t", "2", "-fa", "on", "-b", "256", "-ub", "64", "--no-mmap", "-v"],
    );
    assert_eq!(got, want);
    assert_eq!(err.matches("kiln keeps every layer on the GPU").count(), 1, "{err}");
    assert!(err.contains("(batch 64)"), "-ub sets the batch: {err}");
    // -b caps -ub (llama.cpp: n_ubatch <= n_batch); the old --ubatch still works.
    let (_, err) = run(&stories(), &["-p", PROMPT, "-n", "2", "-b", "32", "-ub", "64", "-fa", "-v"]);
    assert!(err.contains("(batch 32)"), "{err}");
    let (_, err) = run(&stories(), &["-p", PROMPT, "-n", "2", "--ubatch", "16", "-tb", "1", "-ngl", "auto", "-v"]);
    assert!(err.contains("(batch 16)"), "{err}");
    // A llama.cpp flag kiln does not support: clap's error and one line saying so.
    let o = kiln().arg("run").arg("-m").arg(stories()).args(["-p", "hi", "-nkvo"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("unexpected argument") && err.contains("-nkvo/--no-kv-offload is a llama.cpp flag"), "{err}");
    let o = kiln().arg("run").arg("-m").arg(stories()).args(["-p", "hi", "--frobnicate"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("llama.cpp"));
    // Bad values are usage errors.
    for bad in [["-fa", "maybe"], ["-ngl", "lots"], ["-b", "0"]] {
        let o = kiln().arg("run").arg("-m").arg(stories()).args(["-p", "hi"]).args(bad).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn chat_takes_a_system_prompt() {
    let chat = |extra: &[&str]| {
        let mut c = kiln()
            .arg("chat")
            .arg("-m")
            .arg(stories())
            .args(["--temp", "0", "-n", "4", "-v"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(b"Hello there\n/exit\n").unwrap();
        let (_, err) = ok(c.wait_with_output().unwrap());
        // -v prints each turn's speed line: "prompt: N tokens in …".
        let line = err.lines().find(|l| l.contains("prompt: ")).unwrap_or_else(|| panic!("{err}")).to_string();
        line.split("prompt: ").nth(1).unwrap().split_whitespace().next().unwrap().parse::<usize>().unwrap()
    };
    let plain = chat(&[]);
    let with_system = chat(&["-sys", "You tell short stories about a cat."]);
    assert!(with_system > plain + 5, "{plain} -> {with_system} prompt tokens");
    assert_eq!(chat(&["--system", "You tell short stories about a cat."]), with_system);
}

#[test]
fn a_prompt_longer_than_the_context_keeps_its_end_and_generation_keeps_its_speed() {
    let dir = tmp_dir("long");
    // tiny-test has a context of 512: the prompt is more than 3x that. Its random weights may
    // sample EOS anywhere, so --ignore-eos keeps both runs at 48 tokens.
    let model = dir.join("tiny.gguf");
    ok(kiln().args(["synth", "--preset", "tiny-test:q4_k_m", "-o"]).arg(&model).output().unwrap());
    let long = "Once upon a time, there was a little girl named Lily. She loved to play outside. ".repeat(40);
    let file = dir.join("long.txt");
    std::fs::write(&file, &long).unwrap();
    let tokens: usize =
        ok(kiln().arg("tokenize").arg("-m").arg(&model).arg(&long).output().unwrap()).0.split_whitespace().count();
    assert!(tokens > 3 * 512, "{tokens} tokens");
    let args = ["-n", "48", "--ignore-eos"];
    // Best of two runs each: the machine may be busy with other work.
    let mut rates = [0f64; 2];
    for _ in 0..2 {
        let (_, err) = run(&model, &[&["-f", file.to_str().unwrap()], &args[..]].concat());
        assert!(
            err.contains(&format!("the prompt is {tokens} tokens and the context holds 512: keeping its last 255")),
            "{err}"
        );
        let (n, rate) = generation(&err);
        assert_eq!(n, 48);
        rates[0] = rates[0].max(rate);
        let (_, err) = run(&model, &[&["-p", "Once upon a time"], &args[..]].concat());
        rates[1] = rates[1].max(generation(&err).1);
    }
    eprintln!(
        "generation after a {tokens}-token prompt: {:.1} tok/s; after a short one: {:.1} tok/s",
        rates[0], rates[1]
    );
    assert!(rates[0] >= 0.5 * rates[1], "long prompt {:.1} tok/s, short {:.1} tok/s", rates[0], rates[1]);
    // Under an explicit -c the prompt is refused with the sizes.
    let o = kiln().arg("run").arg("-m").arg(&model).args(["-c", "256", "-f"]).arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("the prompt is {tokens} tokens and the context (-c) holds 256")), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_token_shows_no_rate_it_did_not_measure() {
    let (_, err) = run(&stories(), &["-p", PROMPT, "-n", "1"]);
    let line = err.lines().find(|l| l.contains("generation:")).unwrap();
    assert!(line.contains("generation: 1 token (from prompt processing; no decode step to time)"), "{line}");
    let (_, err) = run(&stories(), &["-p", PROMPT, "-n", "3"]);
    assert!(err.contains("generation: 3 tokens, 2 decode steps in"), "{err}");
}

#[test]
fn info_reports_an_unusable_gl_adapter_in_one_line_without_log_records() {
    // Mesa's GL driver limited to GLSL 3.30 cannot compile compute shaders: the state of
    // NVIDIA's GL 3.3 driver that issue 14 found.
    let o = kiln().arg("info").env("MESA_GLSL_VERSION_OVERRIDE", "330").env_remove("RUST_LOG").output().unwrap();
    let (out, err) = ok(o);
    if !out.contains("backend Gl") {
        // As the kernel tests: a machine without wgpu's GL backend says so with KILN_TEST_GL=0.
        assert_eq!(std::env::var("KILN_TEST_GL").as_deref(), Ok("0"), "no GL adapter: {out}");
        return;
    }
    let unusable: Vec<&str> = out.lines().filter(|l| l.contains("kiln cannot use this adapter")).collect();
    assert_eq!(unusable.len(), 1, "{out}");
    assert!(unusable[0].contains("compute shaders"), "{}", unusable[0]);
    assert!(!err.contains("ERROR") && !err.contains("Validation Error"), "stderr: {err}");
    // The records stay available under -vv.
    let o =
        kiln().args(["info", "-vv"]).env("MESA_GLSL_VERSION_OVERRIDE", "330").env_remove("RUST_LOG").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("ERROR"));
}
