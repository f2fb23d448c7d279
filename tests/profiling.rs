//! Profiling and benchmarking (issue 4): stage profiles that add up, bench records with every
//! field, synthetic files that load with the right formats, and reports from two machines.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::gpus;
use kiln::engine::Model;
use kiln::gguf::GgufFile;
use kiln::gpu::GpuContext;
use kiln::model::{Output, SessionOptions};
use kiln::profile::{PhaseProfile, ProfileMode};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn tiny_model(ctx: &Arc<GpuContext>, spec: &str) -> Model {
    let (preset, ft) = kiln::synth::parse_spec(spec).unwrap();
    let file = kiln::synth::build(&preset, ft).unwrap().into_gguf(spec).unwrap();
    Model::load_file(ctx.clone(), file, &mut |_| {}).unwrap()
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every stage took time, and the stages add up to the steps' timestamp span within 10%.
fn check_phase(p: &PhaseProfile, what: &str, expect_stages: &[&str]) {
    assert!(p.steps > 0, "{what}: no steps profiled");
    for s in &p.stages {
        assert!(s.total_ms > 0.0, "{what}: stage {} took no time", s.stage);
        assert!(s.calls > 0 && !s.kernel.is_empty() && !s.shape.is_empty(), "{what}: {s:?}");
        assert!(s.dispatches >= s.calls, "{what}: every call of a stage dispatches: {s:?}");
    }
    for name in expect_stages {
        assert!(p.stages.iter().any(|s| s.stage == *name), "{what}: no stage {name} in {:?}", p.stages);
    }
    let (sum, span) = (p.stage_ms(), p.span_ms);
    assert!(span > 0.0);
    assert!((sum - span).abs() <= 0.10 * span, "{what}: stages add up to {sum:.3} ms, the span is {span:.3} ms");
}

#[test]
fn stage_profile_adds_up_to_the_step() {
    let mut ran = 0;
    for g in gpus() {
        if !g.ctx.caps.timestamps {
            eprintln!("[{}] no timestamp queries: profiling is refused here", g.name);
            continue;
        }
        let model = tiny_model(&g.ctx, "tiny-qwen3:q4_k_m");
        let mut modes = vec![ProfileMode::PassPerStage];
        if g.ctx.caps.timestamps_in_passes {
            modes.push(ProfileMode::InsidePasses);
        }
        for mode in modes {
            let what = format!("[{}] {mode:?}", g.name);
            let opts = SessionOptions { n_ctx: 64, ubatch: 16, f16_kv: true, all_logits: false, n_seq: 1 };
            let prompt: Vec<u32> = (0..20).map(|i| 5 + i * 37).collect();
            // The same greedy tokens without profiling: timestamps do not change the step.
            let mut plain = model.session(opts).unwrap();
            let first = plain.forward(&prompt, Output::Argmax).unwrap()[0] as u32;
            let want = plain.generate_greedy_chained(first, 6, &mut |_| true).unwrap();
            assert!(plain.profile().is_none());

            let mut s = model.session(opts).unwrap();
            s.enable_profiling_mode(mode).unwrap();
            // 20 tokens with ubatch 16: two prefill steps (16 + 4 tokens).
            let got_first = s.forward(&prompt, Output::Argmax).unwrap()[0] as u32;
            let mut got = s.generate_greedy_chained(got_first, 3, &mut |_| true).unwrap();
            // Single decode steps too (not chained).
            for _ in 0..3 {
                let t = *got.last().unwrap();
                got.push(s.forward(&[t], Output::Argmax).unwrap()[0] as u32);
            }
            assert_eq!((got_first, &got), (first, &want), "{what}: profiling changed the tokens");
            assert!(s.timing.gpu > 0.0, "{what}: no GPU time for the last step");
            let p = s.take_profile().unwrap();
            assert_eq!((p.prefill.steps, p.prefill.tokens), (2, 20), "{what}");
            assert_eq!((p.decode.steps, p.decode.tokens), (6, 6), "{what}");
            // The 16-token chunk runs on the GEMM behind a norm dispatch, or (where the planner
            // gives the GEMV that many tokens: GPUs without matrix cores) on the GEMV with the
            // norm fused.
            let fused = 16 <= kiln::plan::prefill_gemv_cols(model.cfg.n_embd, &g.ctx.caps);
            let qkv: &[&str] = if fused { &["attn_norm+qkv"] } else { &["attn_norm", "qkv"] };
            let prefill_stages: Vec<&str> = ["embed"]
                .into_iter()
                .chain(qkv.iter().copied())
                .chain(["qk_norm", "rope", "attention", "ffn_down+add", "sample"])
                .collect();
            check_phase(&p.prefill, &format!("{what} prefill"), &prefill_stages);
            check_phase(
                &p.decode,
                &format!("{what} decode"),
                &["attn_norm+qkv", "ffn_norm+ffn_gate_up", "ffn_down+add", "output_norm+lm_head", "sample"],
            );
            assert_eq!(p.decode.submits, 6, "{what}");
            assert_eq!(p.decode.readbacks, 6, "{what}");
            // The table names every stage.
            let table = p.decode.table("decode", None);
            for st in &p.decode.stages {
                assert!(table.contains(&st.stage));
            }
            ran += 1;
        }
        // A Llama-shaped model decodes in at most 6 dispatches per layer (fused Q/K/V with RoPE
        // and the cache write, one attention, fused norms, gate/up and residual adds), plus the
        // embedding, the head and the sampler.
        let llama = tiny_model(&g.ctx, "tiny-test:q4_k_m");
        let mut s =
            llama.session(SessionOptions { n_ctx: 64, ubatch: 16, f16_kv: true, all_logits: false, n_seq: 1 }).unwrap();
        s.enable_profiling().unwrap();
        let first = s.forward(&[5, 6, 7], Output::Argmax).unwrap()[0] as u32;
        s.generate_greedy_chained(first, 4, &mut |_| true).unwrap();
        let p = s.take_profile().unwrap();
        let per_token = p.decode.stages.iter().map(|s| s.dispatches).sum::<u64>() as f64 / p.decode.tokens as f64;
        let layers = llama.cfg.n_layer as f64;
        assert!(per_token <= 6.0 * layers + 3.0, "[{}] {per_token} dispatches per decode token", g.name);
        assert!(p.decode.table("decode", None).contains("dispatches/token"));
    }
    assert!(ran > 0, "no adapter with timestamp queries");
}

fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = kiln().arg("bench").args(args).output().unwrap();
    assert!(out.status.success(), "kiln bench failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_json_records_carry_every_field() {
    let v =
        bench_json(&["--synthetic", "tiny-test:q4_k_m", "-p", "16", "-n", "4", "-r", "2", "-o", "json", "--profile"]);
    let recs = v.as_array().unwrap();
    assert_eq!(recs.len(), 2);
    for (r, test) in recs.iter().zip(["pp16", "tg4"]) {
        assert_eq!(r["test"], test);
        for key in ["kiln_version", "git_commit", "date", "kv_type"] {
            assert!(!r[key].as_str().unwrap().is_empty(), "{key}");
        }
        let date = r["date"].as_str().unwrap();
        assert!(date.len() == 20 && date.ends_with('Z') && date.as_bytes()[10] == b'T', "{date}");
        let a = &r["adapter"];
        for key in ["name", "vendor", "device_type", "backend", "driver"] {
            assert!(!a[key].as_str().unwrap().is_empty(), "adapter.{key}");
        }
        assert!(a["vendor_id"].as_u64().is_some());
        assert!(a["features"].as_array().unwrap().iter().any(|f| f == "timestamp-query"));
        for key in ["max_buffer_size", "max_storage_buffer_binding_size", "max_compute_workgroup_storage_size"] {
            assert!(a["limits"][key].as_u64().unwrap() > 0, "limits.{key}");
        }
        let m = &r["model"];
        assert_eq!(m["synthetic"], "tiny-test:q4_k_m");
        assert_eq!(m["arch"], "llama");
        assert!(m["size_bytes"].as_u64().unwrap() > 0 && m["params"].as_u64().unwrap() > 0);
        assert!(m["formats"]["Q4_K"].as_u64().unwrap() > 0 && m["formats"]["Q6_K"].as_u64().unwrap() > 0);
        let samples: Vec<f64> = r["samples_ts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(samples.len(), 2);
        assert!(samples.iter().all(|&x| x > 0.0));
        let avg = r["avg_ts"].as_f64().unwrap();
        assert!((avg - (samples[0] + samples[1]) / 2.0).abs() < 1e-6 * avg);
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
        let peak = &r["peak"];
        for key in ["read_gbs", "gflops", "dispatch_us"] {
            assert!(peak[key].as_f64().unwrap() > 0.0, "peak.{key}");
        }
        if gpus()[0].ctx.caps.timestamps_in_passes {
            assert!(peak["timed_dispatch_us"].as_f64().unwrap() > 0.0);
        }
        assert!(r["profiled_ts"].as_f64().unwrap() > 0.0);
        let p: PhaseProfile = serde_json::from_value(r["profile"].clone()).unwrap();
        // Two timed repetitions of the test (the warm-up is not counted).
        let tokens = if test == "pp16" { 32 } else { 8 };
        assert_eq!(p.tokens, tokens, "{test}");
        check_phase(&p, test, &["embed", "attention", "sample"]);
    }
}

#[test]
fn bench_writes_markdown_and_csv() {
    let args = ["--synthetic", "tiny-test:q8_0", "-p", "8", "-n", "2", "-r", "1"];
    let md = kiln().arg("bench").args(args).output().unwrap();
    assert!(md.status.success(), "{}", String::from_utf8_lossy(&md.stderr));
    let md = String::from_utf8(md.stdout).unwrap();
    // Without -ub the planner picks the prompt step: the table says which (llama-bench's
    // n_ubatch column, which it shows for a step other than its default 512).
    assert!(md.starts_with("| model | size | params | formats | backend | GPU | n_ubatch | test | t/s |"), "{md}");
    let ub = kiln().arg("bench").args(args).args(["-ub", "512"]).output().unwrap();
    let ub = String::from_utf8(ub.stdout).unwrap();
    assert!(ub.starts_with("| model | size | params | formats | backend | GPU | test | t/s |"), "{ub}");
    assert_eq!(md.lines().filter(|l| l.starts_with("| tiny-test:q8_0 (synthetic)")).count(), 2, "{md}");
    let csv = kiln().arg("bench").args(args).args(["-o", "csv"]).output().unwrap();
    let csv = String::from_utf8(csv.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    let n = lines[0].split(',').count();
    assert!(lines[1..].iter().all(|l| l.split(',').count() == n || l.contains('"')), "{csv}");
    // Bad flags are one clear line and exit code 2.
    let bad = kiln().args(["bench", "--synthetic", "nope:q4_k_m"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown preset"));
}

#[test]
fn synth_file_loads_with_the_q4_k_m_mix() {
    let dir = tmp_dir("synth");
    let path = dir.join("mini.gguf");
    let out = kiln().args(["synth", "--preset", "mini-llama:q4_k_m", "-o"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file = GgufFile::open(&path).unwrap();
    let (preset, ft) = kiln::synth::parse_spec("mini-llama:q4_k_m").unwrap();
    let cfg = kiln::model::ModelConfig::from_gguf(&file).unwrap();
    assert_eq!((cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_vocab), (4, 512, 1536, 8192));
    for t in &file.tensors {
        let layer = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse().ok());
        let want = kiln::synth::tensor_format(ft, &t.name, layer, preset.n_layer);
        if t.dims.len() == 1 {
            assert_eq!(t.type_name(), "F32", "{}", t.name);
        } else {
            assert_eq!(t.format, Some(want), "{}", t.name);
        }
    }
    // llama.cpp's Q4_K_M: Q6_K for the output head and for some attn_v / ffn_down.
    let fmt = |n: &str| file.tensor(n).unwrap().type_name();
    assert_eq!(fmt("output.weight"), "Q6_K");
    assert_eq!(fmt("blk.0.attn_q.weight"), "Q4_K");
    assert!((0..4).any(|l| fmt(&format!("blk.{l}.ffn_down.weight")) == "Q6_K"));
    assert!((0..4).any(|l| fmt(&format!("blk.{l}.attn_v.weight")) == "Q6_K"));
    let shape = |n: &str| file.tensor(n).unwrap().dims.clone();
    assert_eq!(shape("token_embd.weight"), vec![512, 8192]);
    assert_eq!(shape("blk.0.attn_k.weight"), vec![512, 256]);
    assert_eq!(shape("blk.3.ffn_gate.weight"), vec![512, 1536]);
    assert_eq!(shape("blk.3.ffn_down.weight"), vec![1536, 512]);
    // And kiln runs it.
    let ctx = &gpus()[0].ctx;
    let model = Model::load(ctx.clone(), &path, &mut |_| {}).unwrap();
    let mut s =
        model.session(SessionOptions { n_ctx: 32, ubatch: 32, f16_kv: true, all_logits: false, n_seq: 1 }).unwrap();
    let tok = s.forward(&[1, 300, 301], Output::Argmax).unwrap()[0];
    assert!((tok as u32) < 8192);
    std::fs::remove_dir_all(&dir).ok();
}

fn samples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiling/samples");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

#[test]
fn report_merges_two_machines() {
    let files = samples();
    assert!(files.len() >= 2, "profiling/samples needs two bench JSON files");
    let records = kiln::report::load(&files).unwrap();
    let gpus: std::collections::BTreeSet<&str> = records.iter().map(|r| r.adapter.name.as_str()).collect();
    assert!(gpus.len() >= 2, "the samples come from one adapter: {gpus:?}");
    let dir = tmp_dir("report");
    let out = kiln().arg("report").args(&files).arg("-o").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert_eq!(md, String::from_utf8(out.stdout).unwrap());
    for g in &gpus {
        assert!(md.contains(g), "report lacks {g}");
    }
    let rows =
        md.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| model") && !l.starts_with("| ---")).count();
    assert!(rows >= records.len(), "{md}");
    assert!(md.contains("## Time per token by stage"));
    for svg in ["tokens_per_second.svg", "stages_per_token.svg"] {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(text.starts_with("<svg"), "{svg}");
        assert!(text.matches("<rect").count() > records.len(), "{svg} has too few bars");
        assert!(md.contains(svg));
    }
    let tps = std::fs::read_to_string(dir.join("tokens_per_second.svg")).unwrap();
    for g in &gpus {
        assert!(tps.contains(g), "chart legend lacks {g}");
    }
    // Not bench JSON: a clear error.
    let bad = kiln().arg("report").arg(dir.join("report.md")).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}
