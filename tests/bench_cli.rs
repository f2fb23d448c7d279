//! `kiln bench` with llama-bench's flags (-d, -pg, -b, -ub, -ngl, -fa, -o jsonl, --progress),
//! the GPU memory and load time its records carry, rows printed as each test finishes, and
//! the advice on machines whose only adapter is OpenGL on the CPU.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn bench(args: &[&str]) -> (String, String) {
    let o = kiln().arg("bench").args(["--synthetic", "tiny-test:q4_k_m"]).args(args).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "kiln bench {args:?}: {err}");
    (out, err)
}

/// One CSV line's fields ("a,\"b, c\"" → a, b, c).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

#[test]
fn llama_bench_flags_name_the_tests_and_records_carry_memory_and_load_time() {
    let (out, err) = bench(&[
        "-p",
        "16",
        "-n",
        "4",
        "-pg",
        "8,4",
        "-d",
        "0,24",
        "-r",
        "1",
        "-b",
        "2048",
        "-ub",
        "8,16",
        "-ngl",
        "99",
        "-fa",
        "0,1",
        "-o",
        "jsonl",
        "--progress",
        "--no-warmup",
    ]);
    let records: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<(u64, &str)> =
        records.iter().map(|r| (r["ubatch"].as_u64().unwrap(), r["test"].as_str().unwrap())).collect();
    let tests = ["pp16", "tg4", "pp8+tg4", "pp16 @ d24", "tg4 @ d24", "pp8+tg4 @ d24"];
    let want: Vec<(u64, &str)> = [8u64, 16].iter().flat_map(|&ub| tests.iter().map(move |&t| (ub, t))).collect();
    assert_eq!(names, want);
    for r in &records {
        let m = &r["gpu_memory"];
        let (w, kv, act) =
            (m["weights"].as_u64().unwrap(), m["kv_cache"].as_u64().unwrap(), m["activations"].as_u64().unwrap());
        // At least the weights' own bytes (the GPU layout pads some formats); the KV cache is
        // tiny-test's 2 layers x (K, V) x 128 (KV dim) x f16 per position.
        let size = r["model"]["size_bytes"].as_u64().unwrap();
        assert!(w >= size && w < 4 * size, "weights {w} for {size} bytes of tensors");
        assert_eq!(kv, 2 * 2 * 128 * 2 * r["n_ctx"].as_u64().unwrap(), "{r}");
        assert_eq!(r["n_ctx"], 24 + 16, "the largest test: pp16 @ d24");
        assert!(act > 0, "{r}");
        assert!(r["load_secs"].as_f64().unwrap() > 0.0);
        // Time to first token: a 20-token prompt (n_ctx 40 holds it), first and best of four.
        let t = &r["ttft"];
        assert_eq!(t["prompt_tokens"], 20, "{r}");
        let (first, best) = (t["first_ms"].as_f64().unwrap(), t["best_ms"].as_f64().unwrap());
        assert!(best > 0.0 && best <= first, "{t}");
        // Generation tests carry the GPU's pace from steps back to back (lavapipe has timestamps).
        if r["n_gen"].as_u64().unwrap() > 0 && r["n_prompt"].as_u64().unwrap() == 0 {
            assert!(r["back_to_back"]["gpu_us"].as_f64().unwrap() > 0.0, "{r}");
        }
        assert_eq!(r["n_batch"], 2048);
        let depth = if r["test"].as_str().unwrap().ends_with("@ d24") { 24 } else { 0 };
        assert_eq!(r["n_depth"], depth);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
    }
    // --progress: a line per run on stderr.
    assert_eq!(err.lines().filter(|l| l.starts_with("kiln bench: tiny-test:q4_k_m ")).count(), 12, "{err}");
    // -b caps -ub, as in llama.cpp; the csv carries the memory too.
    let (csv, _) = bench(&["-p", "8", "-n", "0", "-r", "1", "-b", "4", "-ub", "8", "-o", "csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    let (header, row) = (csv_fields(lines[0]), csv_fields(lines[1]));
    let field = |name: &str| row[header.iter().position(|h| h == name).unwrap()].as_str();
    assert_eq!((field("ubatch"), field("n_batch")), ("4", "4"));
    assert!(field("gpu_weights_bytes").parse::<u64>().unwrap() > 0);
    assert!(field("load_secs").parse::<f64>().unwrap() > 0.0);
    // `kiln report` reads jsonl and shows the memory.
    let dir = std::env::temp_dir().join(format!("kiln-test-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.jsonl"), &out).unwrap();
    let o = kiln().arg("report").arg(dir.join("run.jsonl")).arg("-o").arg(&dir).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("GPU memory") && md.contains(" MiB ("), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A record names the `KILN_*` knobs it ran under (which variant it measured), never the API key.
#[test]
fn records_carry_the_kiln_settings_but_not_the_api_key() {
    let o = kiln()
        .args([
            "bench",
            "--synthetic",
            "tiny-test:q4_k_m",
            "-p",
            "8",
            "-n",
            "0",
            "-r",
            "1",
            "-o",
            "jsonl",
            "--no-warmup",
        ])
        .env("KILN_GEMV_Q8_SWIGLU", "off")
        .env("KILN_API_KEY", "sekret")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let r: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(r["kiln_env"]["KILN_GEMV_Q8_SWIGLU"], "off", "{r}");
    assert!(r["kiln_env"].get("KILN_API_KEY").is_none() && !out.contains("sekret"), "{r}");
}

#[test]
fn parallel_decodes_several_sequences_per_step() {
    // tg6 as usual, then stepped as a server steps one sequence and with 3 and 5 decoded
    // together, at depths 0 and 4; prompt tests run once. The rows come in order and count
    // every sequence's tokens.
    let (out, err) =
        bench(&["-p", "8", "-n", "6", "--parallel", "1,3,5", "-d", "0,4", "-r", "2", "-o", "jsonl", "--progress"]);
    let records: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = records.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "pp8",
            "tg6",
            "pp8 @ d4",
            "tg6 @ d4",
            "tg6 x1",
            "tg6 x3",
            "tg6 x5",
            "tg6 @ d4 x1",
            "tg6 @ d4 x3",
            "tg6 @ d4 x5"
        ]
    );
    for r in &records {
        let np = r["n_parallel"].as_u64().unwrap();
        let name = r["test"].as_str().unwrap();
        let stepped = name.rsplit_once(" x").map(|(_, n)| n.parse::<u64>().unwrap());
        assert_eq!(np, stepped.unwrap_or(1), "{r}");
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        if stepped.is_some() {
            // Every sequence's region of the cache: 5 sequences of depth 4 + 6 + 1 positions.
            let kv = r["gpu_memory"]["kv_cache"].as_u64().unwrap();
            assert_eq!(kv, 5 * (4 + 6 + 1) * 2 * 2 * 128 * 2, "{r}");
            assert_eq!(r["sampling"], "greedy");
        }
    }
    // A warm-up and two repetitions of each of the 10 tests.
    assert_eq!(err.lines().filter(|l| l.starts_with("kiln bench: tiny-test:q4_k_m ")).count(), 30, "{err}");
    let o = kiln().args(["bench", "--synthetic", "tiny-test:q4_k_m", "--parallel", "0"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--parallel"));
}

#[test]
fn rows_are_printed_as_their_tests_finish() {
    // pp8 takes well under a second; tg96 five times takes seconds on lavapipe.
    let mut child = kiln()
        .args(["bench", "--synthetic", "tiny-test:q4_k_m", "-p", "8", "-n", "96", "-r", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first_row = lines.by_ref().map(|l| l.unwrap()).find(|l| l.starts_with("| tiny-test")).unwrap();
    assert!(first_row.contains("| pp8 |"), "{first_row}");
    assert!(child.try_wait().unwrap().is_none(), "the pp8 row came only when the whole run had ended");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(rest.iter().any(|l| l.contains("| tg96 |")), "{rest:?}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn on_gl_over_llvmpipe_alone_kiln_says_to_install_lavapipe() {
    // No Vulkan driver (the loader reads none): kiln picks wgpu's GL backend on llvmpipe.
    let o = kiln()
        .arg("info")
        .env("VK_ICD_FILENAMES", "/nonexistent.json")
        .env("VK_DRIVER_FILES", "/nonexistent.json")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    if !out.contains("backend Gl") {
        assert_eq!(std::env::var("KILN_TEST_GL").as_deref(), Ok("0"), "no GL adapter: {out}");
        return;
    }
    assert!(out.contains("note: ") && out.contains("apt-get install mesa-vulkan-drivers"), "{out}");
    // Where lavapipe is installed, nothing to advise.
    let o = kiln().arg("info").output().unwrap();
    if String::from_utf8_lossy(&o.stdout).contains("backend Vulkan") {
        assert!(!String::from_utf8_lossy(&o.stdout).contains("mesa-vulkan-drivers"));
    }
}
