//! End-to-end forward pass against the reference outputs in ../shared/testdata.

mod common;

use std::sync::Arc;

use common::{gpus, testdata};
use kiln::engine::Model;
use kiln::gpu::GpuContext;
use kiln::model::{Output, SessionOptions};

fn f32s(path: &std::path::Path) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&std::fs::read(path).unwrap())
}

fn greedy_tokens() -> Vec<u32> {
    std::fs::read_to_string(testdata().join("stories260K/greedy200.tokens.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

fn load(ctx: &Arc<GpuContext>, rel: &str) -> Model {
    Model::load(ctx.clone(), testdata().join(rel), &mut |_| {}).unwrap()
}

fn opts(f16_kv: bool, ubatch: u32, all_logits: bool) -> SessionOptions {
    SessionOptions { n_ctx: 256, ubatch, f16_kv, all_logits, n_seq: 1 }
}

/// (max |Δ|, RMS Δ, share of rows with the same argmax)
fn compare(got: &[f32], want: &[f32], n_vocab: usize) -> (f32, f32, f32) {
    assert_eq!(got.len(), want.len());
    let mut max = 0f32;
    let mut ss = 0f64;
    for (a, b) in got.iter().zip(want) {
        let d = (a - b).abs();
        assert!(d.is_finite(), "non-finite logit");
        max = max.max(d);
        ss += (d as f64) * (d as f64);
    }
    let rows = got.len() / n_vocab;
    let argmax = |r: &[f32]| r.iter().enumerate().fold(0, |bi, (i, &v)| if v > r[bi] { i } else { bi });
    let same = (0..rows)
        .filter(|&r| argmax(&got[r * n_vocab..][..n_vocab]) == argmax(&want[r * n_vocab..][..n_vocab]))
        .count();
    (max, (ss / got.len() as f64).sqrt() as f32, same as f32 / rows as f32)
}

/// The share of rows whose argmax agrees with the reference's, counting a row as agreeing
/// where the reference's top logit is less than `tie` above its logit at the picked token:
/// a near-tie an error of the allowed size may flip either way.
fn argmax_agrees_but_near_ties(got: &[f32], want: &[f32], n_vocab: usize, tie: f32) -> f32 {
    let argmax = |r: &[f32]| r.iter().enumerate().fold(0, |bi, (i, &v)| if v > r[bi] { i } else { bi });
    let rows = got.len() / n_vocab;
    let agree = (0..rows)
        .filter(|&r| {
            let (g, w) = (&got[r * n_vocab..][..n_vocab], &want[r * n_vocab..][..n_vocab]);
            w[argmax(w)] - w[argmax(g)] < tie
        })
        .count();
    agree as f32 / rows as f32
}

/// Teacher-forced logits with an F32 KV cache match the float64 reference within 1e-3.
#[test]
fn stories260k_teacher_forced_logits() {
    let ids = greedy_tokens();
    let want = f32s(&testdata().join("stories260K/logits_numpy_f64ref.f32"));
    for g in gpus() {
        let model = load(&g.ctx, "stories260K/stories260K.gguf");
        // In one prefill step, and in steps of 7 tokens (ragged chunks through the cache).
        for ubatch in [256, 7] {
            let mut s = model.session(opts(false, ubatch, true)).unwrap();
            let got = s.forward(&ids[..200], Output::AllLogits).unwrap();
            let (max, rms, same) = compare(&got, &want, 512);
            eprintln!("[{}] stories260K ubatch {ubatch}: max |Δ| {max:.2e}, rms {rms:.2e}, argmax {same}", g.name);
            assert!(max < 1e-3, "[{}] ubatch {ubatch}: max |Δ| {max}", g.name);
        }
    }
    // Prompts of up to 64 tokens run on the GEMV in groups of columns, as on GPUs (CPU
    // adapters take the GEMM from 9 columns unless told): steps of 40 tokens, 5 groups of 8.
    let grouped = kiln::gpu::ContextOptions { gemv_max_cols: Some(64), ..Default::default() };
    let ctx = Arc::new(GpuContext::new(&grouped).unwrap());
    assert_eq!(ctx.caps.gemv_max_cols, 64);
    let mut s = load(&ctx, "stories260K/stories260K.gguf").session(opts(false, 40, true)).unwrap();
    let got = s.forward(&ids[..200], Output::AllLogits).unwrap();
    let (max, rms, same) = compare(&got, &want, 512);
    eprintln!("stories260K on the GEMV in steps of 40: max |Δ| {max:.2e}, rms {rms:.2e}, argmax {same}");
    assert!(max < 1e-3, "steps of 40 on the GEMV: max |Δ| {max}");
}

/// Greedy decoding from BOS reproduces the reference's 200 tokens.
#[test]
fn stories260k_greedy_200_tokens() {
    let ids = greedy_tokens();
    for g in gpus() {
        let model = load(&g.ctx, "stories260K/stories260K.gguf");
        let mut s = model.session(opts(true, 64, false)).unwrap();
        let mut tok = ids[0];
        let mut out = vec![tok];
        for _ in 0..200 {
            tok = s.next_greedy(&[tok]).unwrap();
            out.push(tok);
        }
        assert_eq!(out, ids, "[{}] greedy tokens differ", g.name);
        // The same with steps chained on the GPU (no host round trip between tokens), with
        // a stop after 150 tokens and a restart from there.
        let mut s = model.session(opts(true, 64, false)).unwrap();
        let mut chained = vec![ids[0]];
        let mut n = 0;
        let got = s
            .generate_greedy_chained(ids[0], 200, &mut |_| {
                n += 1;
                n < 150
            })
            .unwrap();
        chained.extend(&got);
        assert_eq!(s.position(), 150, "[{}] position after a stop", g.name);
        let rest = s.generate_greedy_chained(*chained.last().unwrap(), 50, &mut |_| true).unwrap();
        chained.extend(&rest);
        assert_eq!(chained, ids, "[{}] chained greedy tokens differ", g.name);
    }
}

/// Prefill of a 40-token prompt then decode gives the same logits as feeding the tokens one
/// by one.
#[test]
fn prefill_matches_token_by_token() {
    let ids = greedy_tokens();
    let g = &gpus()[0];
    for file in ["stories260K/stories260K.gguf", "derived/stories260K-pad256-Q4_K_M.gguf"] {
        let model = load(&g.ctx, file);
        let mut a = model.session(opts(false, 64, false)).unwrap();
        let mut b = model.session(opts(false, 64, false)).unwrap();
        let la = a.forward(&ids[..40], Output::LastLogits).unwrap();
        let mut lb = Vec::new();
        for &t in &ids[..40] {
            lb = b.forward(&[t], Output::LastLogits).unwrap();
        }
        let (max, ..) = compare(&la, &lb, 512);
        // Matrix cores (where the adapter has them) round the prompt's activations and
        // weights to f16; token by token runs on the GEMV in f32 (0.008 on an H200).
        let tol = if g.ctx.caps.coopmat { 2e-2 } else { 1e-3 };
        assert!(max < tol, "{file}: prefill vs one by one: max |Δ| {max}");
        let (na, nb) = (
            a.forward(&ids[40..41], Output::LastLogits).unwrap(),
            b.forward(&ids[40..41], Output::LastLogits).unwrap(),
        );
        let (max, ..) = compare(&na, &nb, 512);
        assert!(max < tol, "{file}: decode after prefill: max |Δ| {max}");
    }
}

/// Every quantized variant: max |Δ| 0.1, RMS 0.02, argmax equal on >= 99% of rows, with the
/// default F16 KV cache.
#[test]
fn derived_models_teacher_forced() {
    let ids = greedy_tokens();
    for g in gpus() {
        for q in ["f32", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M"] {
            let model = load(&g.ctx, &format!("derived/stories260K-pad256-{q}.gguf"));
            let want = f32s(&testdata().join(format!("derived/refs/stories260K-pad256-{q}.forced.logits_numpy.f32")));
            let mut s = model.session(opts(true, 256, true)).unwrap();
            let got = s.forward(&ids[..200], Output::AllLogits).unwrap();
            let (max, rms, same) = compare(&got, &want, 512);
            eprintln!("[{}] {q}: max |Δ| {max:.3e}, rms {rms:.3e}, argmax {same:.3}", g.name);
            assert!(max < 0.1 && rms < 0.02 && same >= 0.99, "[{}] {q}: max {max} rms {rms} argmax {same}", g.name);
        }
    }
}

/// Prefill whose GEMMs read f16 copies of the block-format weights (`Caps::dequant_f16_from`,
/// here from one token on: the route large prompts take on GPUs with matrix cores) stays
/// within `derived_models_teacher_forced`'s tolerances, with a decoder dispatch before each
/// GEMM (more dispatches than without the route).
#[test]
fn prefill_over_f16_copies_of_the_weights() {
    let ids = greedy_tokens();
    // Decoded into one buffer before each GEMM (where memory allows, the planner keeps them).
    let on = kiln::gpu::ContextOptions {
        dequant_f16_from: Some(Some(1)),
        resident_f16_copies: Some(false),
        ..Default::default()
    };
    let on = Arc::new(GpuContext::new(&on).unwrap());
    if on.caps.dequant_f16_from.is_none() {
        eprintln!("{}: no SHADER_F16, no f16 copy of the weights", on.describe());
        return;
    }
    let off = kiln::gpu::ContextOptions { dequant_f16_from: Some(None), ..Default::default() };
    let off = Arc::new(GpuContext::new(&off).unwrap());
    // The copies kept in GPU memory, decoded once (`plan::resident_f16_copies`).
    let resident = kiln::gpu::ContextOptions {
        dequant_f16_from: Some(Some(1)),
        resident_f16_copies: Some(true),
        ..Default::default()
    };
    let resident = Arc::new(GpuContext::new(&resident).unwrap());
    for q in ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M"] {
        let file = format!("derived/stories260K-pad256-{q}.gguf");
        let want = f32s(&testdata().join(format!("derived/refs/stories260K-pad256-{q}.forced.logits_numpy.f32")));
        let run = |ctx: &Arc<GpuContext>| {
            let mut s = load(ctx, &file).session(opts(true, 256, true)).unwrap();
            let before = kiln::gpu::buffers::dispatches_recorded();
            let got = s.forward(&ids[..200], Output::AllLogits).unwrap();
            (got, kiln::gpu::buffers::dispatches_recorded() - before, s.resident_f16_bytes())
        };
        let ((got, with, none), (_, without, _)) = (run(&on), run(&off));
        let (kept, dispatches, bytes) = run(&resident);
        assert_eq!(none, 0, "{q}: copies decoded before each GEMM are not resident");
        assert_eq!(dispatches, without, "{q}: dispatches over resident copies");
        if q == "Q8_0" {
            // Q8_0's copies are only resident ones: within the same bounds.
            assert_eq!(with, without, "{q}: no copy decoded before its GEMMs");
            let (max, rms, same) = compare(&kept, &want, 512);
            eprintln!("{q} over resident f16 copies: max |Δ| {max:.3e}, rms {rms:.3e}, argmax {same:.3}");
            assert!(max < 0.1 && rms < 0.02 && same >= 0.99, "{q} over f16 copies: max {max} rms {rms} argmax {same}");
        } else {
            let (max, rms, same) = compare(&got, &want, 512);
            eprintln!("{q} over f16 copies: max |Δ| {max:.3e}, rms {rms:.3e}, argmax {same:.3}; {with} dispatches against {without}");
            assert!(max < 0.1 && rms < 0.02 && same >= 0.99, "{q} over f16 copies: max {max} rms {rms} argmax {same}");
            assert!(with > without, "{q}: {with} dispatches with the f16 copies, {without} without");
            // Resident copies: the same copies and GEMMs, so the same logits bit for bit,
            // without a decode dispatch before each GEMM.
            let same_bits = kept.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same_bits, "{q}: resident copies changed the logits");
        }
        // Every layer matrix (all Q8_0 or K-quants here) and the LM head (every position's
        // logits) once, two bytes a weight.
        let model = load(&resident, &file);
        let matrices = model.weights.layers.iter().flat_map(|l| l.matrices()).chain([model.weights.lm_head()]);
        let want: u64 = matrices.map(|w| kiln::gpu::buffers::storage_size(w.rows as u64 * w.k as u64 * 2)).sum();
        assert_eq!(bytes, want, "{q}: bytes of the resident copies");
    }
    // Synthetic models whose Q/K/V matmuls are a group of several copies: stacked from Q4_K
    // and Q6_K parts (tiny-test), separate (Qwen3's per-head norms), against the same prompt
    // without the copies (weights in f16 against exact ones; on matrix cores, equal).
    let ids: Vec<u32> = greedy_tokens().iter().cycle().take(300).map(|&t| t % 1024).collect();
    for spec in ["tiny-test:q4_k_m", "tiny-qwen3:q4_k_m"] {
        let run = |ctx: &Arc<GpuContext>| {
            let o = SessionOptions { n_ctx: 512, ..opts(true, 512, true) };
            synth(ctx, spec).session(o).unwrap().forward(&ids, Output::AllLogits).unwrap()
        };
        let (got, want) = (run(&on), run(&off));
        let v = got.len() / ids.len();
        let (max, rms, same) = compare(&got, &want, v);
        let size = (want.iter().map(|x| (x * x) as f64).sum::<f64>() / want.len() as f64).sqrt() as f32;
        eprintln!("{spec} over f16 copies: max |Δ| {max:.3e}, rms {rms:.3e} of {size:.3}, argmax {same:.3}");
        assert!(rms <= 0.01 * size && same >= 0.98, "{spec} over f16 copies: rms {rms} of {size}, argmax {same}");
    }
}

/// Greedy 200 tokens from BOS, detokenized as they stream, reproduce llama2.c's text byte
/// for byte.
#[test]
fn stories260k_greedy_text_matches_llama2c() {
    let want = std::fs::read_to_string(testdata().join("stories260K/expected_llama2c_t0_n200.txt")).unwrap();
    let g = &gpus()[0];
    let model = load(&g.ctx, "stories260K/stories260K.gguf");
    let tok = kiln::tokenizer::Tokenizer::from_gguf(&model.file).unwrap();
    let mut s = model.session(opts(true, 64, false)).unwrap();
    let prompt = tok.encode("", true).unwrap();
    assert_eq!(prompt, vec![1]);
    let mut sampler =
        kiln::sample::Sampler::new(kiln::sample::SamplerConfig { temperature: 0.0, ..Default::default() });
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut text = String::new();
    let stats =
        kiln::generate::generate(&mut s, &tok, &prompt, &mut Vec::new(), Some(200), &mut sampler, &stop, &mut |t| {
            text.push_str(t);
            Ok(())
        })
        .unwrap();
    assert_eq!(stats.generated, 200);
    assert_eq!(text, want);
}

/// A second chat turn on a session that keeps its cache gives the same greedy answer as a
/// fresh session fed the whole conversation.
#[test]
fn chat_turns_reuse_the_cache() {
    use kiln::chat::{new_part, render_tokens, ChatTemplate, Message, BUILTIN};
    let g = &gpus()[0];
    let model = load(&g.ctx, "stories260K/stories260K.gguf");
    let tok = kiln::tokenizer::Tokenizer::from_gguf(&model.file).unwrap();
    let tmpl = ChatTemplate::from_source("chatml", BUILTIN[0].1, "<s>".into(), "</s>".into()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let greedy = || kiln::sample::Sampler::new(kiln::sample::SamplerConfig { temperature: 0.0, ..Default::default() });
    let answer = |s: &mut kiln::model::Session, feed: &[u32], hist: &mut Vec<u32>| {
        let mut text = String::new();
        let st = kiln::generate::generate(s, &tok, feed, hist, Some(20), &mut greedy(), &stop, &mut |t| {
            text.push_str(t);
            Ok(())
        })
        .unwrap();
        (text, st.generated)
    };
    let mut a = model.session(opts(true, 64, false)).unwrap();
    let mut cached = Vec::new();
    let mut msgs = vec![Message::new("user", "Hello there")];
    let ids1 = render_tokens(&tmpl, &tok, &msgs).unwrap();
    let feed = new_part(&mut a, &mut cached, &ids1);
    let mut hist = Vec::new();
    let (a1, n1) = answer(&mut a, &feed, &mut hist);
    cached.extend_from_slice(&feed);
    cached.extend_from_slice(&hist[hist.len() - n1..]);
    cached.truncate(a.position() as usize);
    msgs.push(Message::new("assistant", a1.trim()));
    msgs.push(Message::new("user", "Tell me a story"));
    let ids2 = render_tokens(&tmpl, &tok, &msgs).unwrap();
    let feed2 = new_part(&mut a, &mut cached, &ids2);
    assert!(feed2.len() < ids2.len(), "the second turn should reuse the cache");
    let (a2, _) = answer(&mut a, &feed2, &mut Vec::new());
    let mut b = model.session(opts(true, 64, false)).unwrap();
    let (b2, _) = answer(&mut b, &ids2, &mut Vec::new());
    assert_eq!(a2, b2);
}

/// The qwen2 (Q/K/V biases, tied embeddings, NeoX RoPE) and qwen3 (per-head Q/K norms, head
/// dim 128 != n_embd / n_head) code paths, on synthetic models: finite logits, prefill
/// equal to token-by-token decoding, and chained greedy decoding equal to single steps.
#[test]
fn qwen_architectures_run_consistently() {
    let g = &gpus()[0];
    for preset in ["tiny-qwen2:q8_0", "tiny-qwen3:q4_k_m", "tiny-test:f16"] {
        let (p, ft) = kiln::synth::parse_spec(preset).unwrap();
        let path = std::env::temp_dir().join(format!("kiln-test-{}-{}.gguf", p.name, std::process::id()));
        kiln::synth::build(&p, ft)
            .unwrap()
            .write(&mut std::io::BufWriter::new(std::fs::File::create(&path).unwrap()))
            .unwrap();
        let model = Model::load(g.ctx.clone(), &path, &mut |_| {}).unwrap();
        let ids: Vec<u32> = (0..24).map(|i| (3 + i * 37) % 1024).collect();
        let mut a = model.session(opts(false, 64, false)).unwrap();
        let la = a.forward(&ids, Output::LastLogits).unwrap();
        assert!(la.iter().all(|x| x.is_finite()), "{preset}: non-finite logits");
        let mut b = model.session(opts(false, 64, false)).unwrap();
        let mut lb = Vec::new();
        for &t in &ids {
            lb = b.forward(&[t], Output::LastLogits).unwrap();
        }
        let (max, ..) = compare(&la, &lb, 1024);
        let scale = la.iter().fold(0f32, |m, x| m.max(x.abs()));
        // On matrix cores the prefill GEMMs round activations to f16 (one step by itself runs
        // on the GEMV in f32): 3e-3 of the logits' size there (H200: 1.2e-3 on tiny-qwen3).
        let rel = if g.ctx.caps.coopmat { 3e-3 } else { 1e-3 };
        assert!(max <= rel * scale.max(1.0), "{preset}: prefill vs one by one: max |Δ| {max} (scale {scale})");
        // Decoding chained on the GPU, four steps to a command buffer where the model allows
        // it, leaves the cache that one step at a time leaves (each step at its own position:
        // the separate Q/K/V path's RoPE once took the last recorded step's): the next
        // token's logits agree.
        let mut c = model.session(opts(true, 64, false)).unwrap();
        c.set_steps_per_submit(4);
        let first = c.forward(&ids, Output::Argmax).unwrap()[0] as u32;
        let chained = c.generate_greedy_chained(first, 12, &mut |_| true).unwrap();
        let mut d = model.session(opts(true, 64, false)).unwrap();
        d.forward(&ids, Output::Argmax).unwrap();
        for &t in std::iter::once(&first).chain(&chained[..11]) {
            d.forward(&[t], Output::Argmax).unwrap();
        }
        let next = 17;
        let (lc, ld) =
            (c.forward(&[next], Output::LastLogits).unwrap(), d.forward(&[next], Output::LastLogits).unwrap());
        let (max, ..) = compare(&lc, &ld, 1024);
        let scale = ld.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max <= 1e-3 * scale.max(1.0), "{preset}: chained vs one step at a time: max |Δ| {max} (scale {scale})");
        std::fs::remove_file(&path).ok();
    }
}

/// Decode through the int8-activation GEMV (forced for every quantized GEMV: the test
/// models are far below the size where the planner picks it), in steps of 1 token, of 1
/// to 4 tokens (the Q/K/V and gate/up groups share one quantized input; the multi-column
/// kernels run) and of 13 to 31 (the grouped shape, 8 columns a workgroup). The logits
/// differ from the float GEMV's (the path ran), and rounding activations to int8 moves them by about 0.9% RMS of their size on these models: each
/// run is held to 1.5% RMS, 6% at most, and argmax equal on 97% of rows, a row whose two
/// top reference logits are closer than the RMS bound counting as equal: such near-ties (a
/// few hundredths of a logit on these 64 rows) flip with the attention kernel's last bits
/// once the activations are rounded to int8. (The two runs are
/// not compared with each other: rounding to int8 turns their float differences, from
/// different attention kernels, into whole steps of d wherever a value sits near a
/// rounding boundary.) Single-token steps also run with the gate/up projection writing the
/// down projection's int8 input (`Caps::q8_swiglu`), and also quantizing its own
/// (`Caps::q8_swiglu_norm`), held to the same bounds, with one and two dispatches fewer a
/// layer (the quantize dispatches).
#[test]
fn int8_gemv_decode_matches_reference() {
    let ids = greedy_tokens();
    let native = &gpus()[0];
    if native.ctx.info.backend != wgpu::Backend::Vulkan {
        eprintln!("int8 GEMV runs on Vulkan only; {} has none", native.ctx.describe());
        return;
    }
    // The quantize dispatches first (the planner's default on GPUs is the fused path below).
    let opts_int8 = kiln::gpu::ContextOptions {
        int8_gemv_always: true,
        gemv_max_cols: Some(64),
        q8_swiglu: Some(None),
        q8_swiglu_norm: Some(false),
        // The residual epilogue (its own test below) would take quantize dispatches away too.
        q8_add_norm: Some(None),
        ..Default::default()
    };
    let ctx = Arc::new(GpuContext::new(&opts_int8).unwrap());
    assert!(ctx.caps.int8_dot && ctx.caps.int8_gemv_always, "{:?}", ctx.caps);
    let swiglu = Some(kiln::plan::GEMV_Q8_SWIGLU);
    let opts_swiglu = kiln::gpu::ContextOptions { q8_swiglu: Some(swiglu), ..opts_int8.clone() };
    let ctx_swiglu = Arc::new(GpuContext::new(&opts_swiglu).unwrap());
    assert_eq!(ctx_swiglu.caps.q8_swiglu, swiglu);
    // And quantizing its own input through the RMSNorm: no quantize dispatch before it either.
    let opts_local = kiln::gpu::ContextOptions { q8_swiglu_norm: Some(true), ..opts_swiglu.clone() };
    let ctx_local = Arc::new(GpuContext::new(&opts_local).unwrap());
    assert!(ctx_local.caps.q8_swiglu_norm);
    let n = 64;
    for q in ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M"] {
        let file = format!("derived/stories260K-pad256-{q}.gguf");
        let want =
            &f32s(&testdata().join(format!("derived/refs/stories260K-pad256-{q}.forced.logits_numpy.f32")))[..n * 512];
        let size = (want.iter().map(|v| (v * v) as f64).sum::<f64>() / want.len() as f64).sqrt() as f32;
        let decode = |ctx: &Arc<GpuContext>, steps: &[usize]| {
            let mut s = load(ctx, &file).session(opts(true, 32, true)).unwrap();
            let mut logits = Vec::new();
            let mut i = 0;
            for step in steps.iter().cycle() {
                let end = (i + step).min(n);
                logits.extend(s.forward(&ids[i..end], Output::AllLogits).unwrap());
                i = end;
                if i == n {
                    break;
                }
            }
            logits
        };
        let float = decode(&native.ctx, &[1]);
        // Steps past 4 columns run the int8 GEMV's grouped shape, 8 columns a workgroup
        // (workgroup_id.z past 8).
        // Dispatches of one single-token step: the int8 SwiGLU epilogue saves one a layer.
        let dispatches = |ctx: &Arc<GpuContext>| {
            let mut s = load(ctx, &file).session(opts(true, 32, true)).unwrap();
            let before = kiln::gpu::buffers::dispatches_recorded();
            s.forward(&ids[..1], Output::AllLogits).unwrap();
            kiln::gpu::buffers::dispatches_recorded() - before
        };
        let n_layer = load(&ctx, &file).cfg.n_layer as u64;
        let plain = dispatches(&ctx);
        assert_eq!(plain - dispatches(&ctx_swiglu), n_layer, "{q}: the down projections' quantize dispatches");
        assert_eq!(plain - dispatches(&ctx_local), 2 * n_layer, "{q}: the gate/up projections' too");
        let runs = [
            (&ctx, &[1usize][..]),
            (&ctx, &[1, 3, 4, 2]),
            (&ctx, &[20, 13, 31]),
            (&ctx_swiglu, &[1]),
            (&ctx_local, &[1]),
        ];
        for (ctx, steps) in runs {
            let got = decode(ctx, steps);
            let (vs_float, ..) = compare(&got, &float, 512);
            let (max, rms, same) = compare(&got, want, 512);
            let agree = argmax_agrees_but_near_ties(&got, want, 512, 0.015 * size);
            let steps = match (ctx.caps.q8_swiglu, ctx.caps.q8_swiglu_norm) {
                (Some(_), true) => format!("{steps:?} (int8 SwiGLU epilogue, input quantized in the GEMV)"),
                (Some(_), false) => format!("{steps:?} (int8 SwiGLU epilogue)"),
                _ => format!("{steps:?}"),
            };
            eprintln!(
                "{q} steps {steps}: int8 vs reference max |Δ| {max:.3e}, rms {rms:.3e} (logits rms {size:.3}), \
                 argmax {same:.3} ({agree:.3} but near-ties); vs float GEMV {vs_float:.3e}"
            );
            assert!(vs_float > 0.0, "{q}: the int8 GEMV did not run");
            assert!(
                rms < 0.015 * size && max < 0.06 * size && agree >= 0.97,
                "{q} steps {steps}: max {max} rms {rms} argmax {same} ({agree} but near-ties)"
            );
        }
    }
}

/// Every logit of `ids` fed one token a step to `s`, and the dispatches those steps recorded.
fn token_by_token(s: &mut kiln::model::Session, ids: &[u32]) -> (Vec<f32>, u64) {
    let before = kiln::gpu::buffers::dispatches_recorded();
    let mut logits = Vec::new();
    for i in 0..ids.len() {
        logits.extend(s.forward(&ids[i..i + 1], Output::AllLogits).unwrap());
    }
    (logits, kiln::gpu::buffers::dispatches_recorded() - before)
}

/// A synthetic model (`kiln synth` spec) loaded on `ctx`.
fn synth(ctx: &Arc<GpuContext>, spec: &str) -> Model {
    synth_with(ctx, spec, |_, _| {})
}

/// As `synth`, its file changed by `edit` before it is written.
fn synth_with(
    ctx: &Arc<GpuContext>,
    spec: &str,
    edit: impl Fn(&mut kiln::gguf::writer::GgufWriter, &kiln::synth::Preset),
) -> Model {
    // A file of its own per call: tests run side by side in threads of one process.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (p, ft) = kiln::synth::parse_spec(spec).unwrap();
    let name = spec.replace(':', "-");
    let path = std::env::temp_dir().join(format!("kiln-test-{name}-{}-{call}.gguf", std::process::id()));
    let mut w = kiln::synth::build(&p, ft).unwrap();
    edit(&mut w, &p);
    w.write(&mut std::io::BufWriter::new(std::fs::File::create(&path).unwrap())).unwrap();
    let m = Model::load(ctx.clone(), &path, &mut |_| {}).unwrap();
    std::fs::remove_file(&path).ok();
    m
}

/// Decode attention writing the output projection's int8 input (`Caps::attn_q8_out`) gives
/// the logits of the quantize dispatch it replaces (the same blocks of the same float
/// output: equal within 1e-5 of the largest logit), one dispatch fewer a layer, over
/// single-token steps past the decode kernel's split size (the combine pass writing the
/// blocks) on models whose heads are whole blocks: a stacked Q/K/V projection (64-wide heads)
/// and qwen3's separate ones (128-wide).
#[test]
fn decode_attention_writes_the_output_projections_int8_input() {
    let native = &gpus()[0];
    if native.ctx.info.backend != wgpu::Backend::Vulkan {
        eprintln!("int8 GEMV runs on Vulkan only; {} has none", native.ctx.describe());
        return;
    }
    let base = kiln::gpu::ContextOptions { int8_gemv_always: true, ..Default::default() };
    let on = Arc::new(GpuContext::new(&kiln::gpu::ContextOptions { attn_q8_out: Some(true), ..base.clone() }).unwrap());
    let off = Arc::new(GpuContext::new(&kiln::gpu::ContextOptions { attn_q8_out: Some(false), ..base }).unwrap());
    assert!(on.caps.attn_q8_out && !off.caps.attn_q8_out, "{:?}", on.caps);
    let ids: Vec<u32> = greedy_tokens().iter().cycle().take(150).map(|&t| t % 1024).collect();
    for spec in ["tiny-test:q4_k_m", "tiny-qwen3:q6_k"] {
        let run = |ctx: &Arc<GpuContext>| {
            let model = synth(ctx, spec);
            let mut s = model.session(opts(true, 1, true)).unwrap();
            let before = kiln::gpu::buffers::dispatches_recorded();
            let mut logits = s.forward(&ids[..1], Output::AllLogits).unwrap();
            let dispatches = kiln::gpu::buffers::dispatches_recorded() - before;
            for i in 1..ids.len() {
                logits.extend(s.forward(&ids[i..i + 1], Output::AllLogits).unwrap());
            }
            (logits, dispatches, model.cfg.n_layer as u64)
        };
        let (got, d_on, n_layer) = run(&on);
        let (want, d_off, _) = run(&off);
        assert_eq!(d_off - d_on, n_layer, "{spec}: the output projections' quantize dispatches");
        let largest = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (max, ..) = compare(&got, &want, 1024);
        eprintln!(
            "{spec}: attention's int8 output vs the quantize dispatch: max |Δ| {max:.3e} (largest logit {largest:.3})"
        );
        assert!(max <= 1e-5 * largest, "{spec}: max |Δ| {max} of {largest}");
    }
}

/// Split decode attention merged by its last workgroups (`Caps::decode_merge`) gives the
/// logits of the combine pass it replaces, within 1e-5 of the largest logit (the same partials
/// added in another order), with one dispatch fewer a layer for every step whose context is
/// split: single-token steps up to 300 positions, past the split size of 64-wide heads (256
/// positions in wide workgroups) and of 128-wide ones (128), with the float output and with
/// the output projection's int8 input (`Caps::attn_q8_out`, which the merge then writes; 1e-2
/// there, where an output's last bits can move a quant by a step).
#[test]
fn merged_decode_splits_match_the_combine_pass() {
    let native = &gpus()[0];
    let ids: Vec<u32> = greedy_tokens().iter().cycle().take(300).map(|&t| t % 1024).collect();
    let int8 = native.ctx.info.backend == wgpu::Backend::Vulkan;
    for q8 in [false, true].into_iter().take(1 + int8 as usize) {
        let base = kiln::gpu::ContextOptions { int8_gemv_always: q8, attn_q8_out: Some(q8), ..Default::default() };
        let ctx = |merge| {
            Arc::new(GpuContext::new(&kiln::gpu::ContextOptions { decode_merge: Some(merge), ..base.clone() }).unwrap())
        };
        let (on, off) = (ctx(true), ctx(false));
        if !on.caps.decode_merge {
            eprintln!("{}: no split decode attention merged by its last workgroups here", on.describe());
            return;
        }
        assert!(!off.caps.decode_merge && on.caps.attn_q8_out == q8, "{:?}", on.caps);
        for spec in ["tiny-test:q4_k_m", "tiny-qwen3:q6_k"] {
            let run = |ctx: &Arc<GpuContext>| {
                let model = synth(ctx, spec);
                let mut s = model.session(SessionOptions { n_ctx: 512, ..opts(true, 1, true) }).unwrap();
                let (logits, dispatches) = token_by_token(&mut s, &ids);
                let c = &model.cfg;
                let shape = kiln::kernels::attention::AttnShape {
                    n_head: c.n_head,
                    n_kv_head: c.n_kv_head,
                    head_dim: c.head_dim,
                    n_ctx: 512,
                };
                // The steps whose attention the plain kernel splits (a combine pass each, off).
                let split = (1..=ids.len() as u32)
                    .filter(|&kv| shape.decode_dispatches(&off.caps, kv, shape.decode_block(kv)) == 2)
                    .count() as u64;
                (logits, dispatches, c.n_layer as u64 * split)
            };
            let (got, d_on, _) = run(&on);
            let (want, d_off, saved) = run(&off);
            assert!(saved > 0, "{spec}: no step split its context");
            assert_eq!(d_off - d_on, saved, "{spec} (int8 output: {q8}): the combine passes");
            let largest = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let (max, ..) = compare(&got, &want, 1024);
            eprintln!("{spec} (int8 output: {q8}): merged splits vs the combine pass: max |Δ| {max:.3e} (largest logit {largest:.3})");
            // Through int8 blocks, a last-bit difference in a value near a rounding boundary
            // moves its quant a whole step (`tests/ops.rs` checks that the merge's blocks
            // quantize its output).
            let tol = if q8 { 1e-2 } else { 1e-5 };
            assert!(max <= tol * largest, "{spec} (int8 output: {q8}): max |Δ| {max} of {largest}");
        }
    }
}

/// One-token steps whose output and down projections also write the int8 input of the GEMV
/// after them through its RMSNorm (`Caps::q8_add_norm`: gate/up, the next layer's Q/K/V) give
/// the logits of the quantize dispatches they replace (the same blocks of the same float
/// values, only each block's sum of squares added in another order: within 1e-5 of the
/// largest logit), with that many dispatches fewer: two a layer but the last (whose down
/// projection feeds the LM head, which keeps its quantize dispatch). On the int8 GEMV for every
/// quantized matrix, with decode attention writing the output projection's int8 input and the
/// gate/up projection reading quantized blocks (not quantizing its own input), over a stacked
/// Q/K/V projection and qwen3's separate ones.
#[test]
fn residual_epilogue_writes_the_next_gemvs_int8_input() {
    let native = &gpus()[0];
    if native.ctx.info.backend != wgpu::Backend::Vulkan {
        eprintln!("int8 GEMV runs on Vulkan only; {} has none", native.ctx.describe());
        return;
    }
    let base = kiln::gpu::ContextOptions {
        int8_gemv_always: true,
        attn_q8_out: Some(true),
        quantize_lanes: Some(true),
        q8_swiglu: Some(None),
        ..Default::default()
    };
    let ctx =
        |add| Arc::new(GpuContext::new(&kiln::gpu::ContextOptions { q8_add_norm: Some(add), ..base.clone() }).unwrap());
    let (on, off) = (ctx(Some(kiln::plan::GEMV_Q8_ADD_NORM)), ctx(None));
    if on.caps.q8_add_norm.is_none() {
        eprintln!("{}: no int8 residual epilogue here", on.describe());
        return;
    }
    assert!(on.caps.quantize_lanes && on.caps.attn_q8_out && off.caps.q8_add_norm.is_none(), "{:?}", on.caps);
    let ids: Vec<u32> = greedy_tokens().iter().take(40).map(|&t| t % 1024).collect();
    // A stacked Q/K/V projection and qwen3's separate ones; the norms' weights spread around 1
    // (a synthetic model's are all 1, which would hide a block left unscaled).
    for spec in ["tiny-test:q4_k_m", "tiny-qwen3:q6_k"] {
        let run = |ctx: &Arc<GpuContext>| {
            let model = synth_with(ctx, spec, |w, p| {
                let mut r = common::rng(5);
                for name in (0..p.n_layer)
                    .flat_map(|i| [format!("blk.{i}.attn_norm.weight"), format!("blk.{i}.ffn_norm.weight")])
                {
                    let g: Vec<f32> = r.normal(p.n_embd as usize, 0.5).iter().map(|v| 1.0 + v).collect();
                    assert!(w.replace_tensor(&name, bytemuck::cast_slice(&g).to_vec()), "{name}");
                }
            });
            let mut s = model.session(opts(true, 1, true)).unwrap();
            let (logits, dispatches) = token_by_token(&mut s, &ids);
            let c = &model.cfg;
            (logits, dispatches, c.n_layer as u64, c.n_vocab as usize)
        };
        let (got, d_on, n_layer, n_vocab) = run(&on);
        let (want, d_off, ..) = run(&off);
        assert_eq!(d_off - d_on, (2 * n_layer - 1) * ids.len() as u64, "{spec}: the quantize dispatches replaced");
        let largest = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (max, ..) = compare(&got, &want, n_vocab);
        eprintln!("{spec}: the residual epilogue's int8 input vs the quantize dispatches: max |Δ| {max:.3e} (largest logit {largest:.3})");
        assert!(max <= 1e-5 * largest, "{spec}: max |Δ| {max} of {largest}");
    }
}

/// Sequences of one shared session (a region of the KV cache each, the server's slots): the
/// prompts of different lengths prefilled into their regions, then batched decode steps over
/// nine of them (a step of eight and one of one, the columns in another order than the
/// slots) give each column the logits its sequence gets alone in a plain session, within
/// 1e-4 of the largest logit (the same kernels over other columns: in practice equal), and
/// the same greedy tokens. Also for a model whose separate Q/K/V projections step each
/// sequence on its own (qwen3's head norms).
#[test]
fn batched_decode_step_matches_each_sequence_alone() {
    let g = &gpus()[0];
    let stories = load(&g.ctx, "stories260K/stories260K.gguf");
    let qwen3 = {
        let (p, ft) = kiln::synth::parse_spec("tiny-qwen3:q4_k_m").unwrap();
        let path = std::env::temp_dir().join(format!("kiln-test-batched-{}-{}.gguf", p.name, std::process::id()));
        kiln::synth::build(&p, ft)
            .unwrap()
            .write(&mut std::io::BufWriter::new(std::fs::File::create(&path).unwrap()))
            .unwrap();
        let m = Model::load(g.ctx.clone(), &path, &mut |_| {}).unwrap();
        std::fs::remove_file(&path).ok();
        m
    };
    let text = greedy_tokens();
    for (model, n_seq, batched) in [(&stories, 10u32, true), (&qwen3, 3, false)] {
        let v = model.cfg.n_vocab as usize;
        let n_ctx = 64;
        let one = SessionOptions { n_ctx, ubatch: 16, f16_kv: true, all_logits: false, n_seq: 1 };
        let mut shared = model.session(SessionOptions { n_seq, ..one }).unwrap();
        // The GEMV's columns: 8 on CPU adapters, 32 on GPUs.
        let widest = (n_seq as usize - 1).min(g.ctx.caps.gemv_max_cols as usize);
        assert_eq!(
            shared.batch_columns(),
            if batched { (n_seq as usize).min(g.ctx.caps.gemv_max_cols as usize) } else { 1 }
        );
        // Slot s holds a prompt of 1 + 3s tokens from its own place in the text; the last
        // slot stays empty.
        let active: Vec<usize> = (0..n_seq as usize - 1).rev().collect();
        let prompt = |s: usize| -> Vec<u32> { text[5 * s..5 * s + 1 + 3 * s].iter().map(|&t| t % v as u32).collect() };
        let mut alone = Vec::new();
        let mut next = Vec::new();
        for &s in &active {
            let got = shared.forward_slot(s, &prompt(s), Output::LastLogits).unwrap();
            let mut plain = model.session(one).unwrap();
            let want = plain.forward(&prompt(s), Output::LastLogits).unwrap();
            common::assert_close(&format!("slot {s} prefill"), &got, &want, 1e-4);
            next.push(argmax(&want));
            alone.push(plain);
        }
        let steps_before = shared.batch_stats().steps;
        for step in 0..3 {
            let batch: Vec<(usize, u32)> = active.iter().zip(&next).map(|(&s, &t)| (s, t)).collect();
            let got = shared.decode_slots_logits(&batch).unwrap();
            for (i, &(s, t)) in batch.iter().enumerate() {
                let want = alone[i].forward(&[t], Output::LastLogits).unwrap();
                let what = format!("{} step {step} slot {s} (column {i})", model.cfg.name);
                common::assert_close(&what, &got[i * v..(i + 1) * v], &want, 1e-4);
                next[i] = argmax(&want);
                assert_eq!(argmax(&got[i * v..(i + 1) * v]), next[i], "{what}: greedy token");
            }
        }
        let stats = shared.batch_stats();
        if batched {
            // Nine sequences: on CPU adapters a step of eight and a step of one, three times;
            // on GPUs one step of nine.
            let per_round = (n_seq as u64 - 1).div_ceil(widest as u64);
            assert_eq!((stats.steps - steps_before, stats.widest), (3 * per_round, widest as u64));
        } else {
            assert_eq!((stats.steps - steps_before, stats.widest), (3 * active.len() as u64, 1));
        }
        for &s in &active {
            assert_eq!(shared.slot_position(s).unwrap(), (1 + 3 * s + 3) as u32);
        }
    }
}

/// Prompts of several sequences prefilled in one step (`prefill_slots`, the server's way):
/// each sequence's pick equals its greedy token alone, and its cache holds what its own
/// session's does, which the logits of a batched decode step after them check (1e-4 of the
/// largest logit): chunks of different lengths, one appended to a prompt already in its
/// region, one that picks nothing (a prompt's first chunk), its rest with another's next
/// step. A mix with too few tokens for the GEMM runs chunk by chunk, with the same results.
#[test]
fn prompts_prefilled_together_match_each_sequence_alone() {
    use kiln::model::session::PromptChunk;
    let g = &gpus()[0];
    let model = load(&g.ctx, "stories260K/stories260K.gguf");
    let v = model.cfg.n_vocab as usize;
    let text: Vec<u32> = greedy_tokens().iter().map(|&t| t % v as u32).collect();
    let one = SessionOptions { n_ctx: 64, ubatch: 32, f16_kv: true, all_logits: false, n_seq: 1 };
    let greedy = kiln::sample::Sampler::new(kiln::sample::SamplerConfig { temperature: 0.0, ..Default::default() });
    let mut shared = model.session(SessionOptions { n_seq: 4, ..one }).unwrap();
    assert!(shared.can_prefill_together(), "stories260K has the stacked Q/K/V and flash attention");
    for slot in 0..4 {
        shared.set_slot_sampling(slot, &greedy, &[]).unwrap();
    }
    // Each slot's whole prompt, from its own place in the text.
    let prompts: Vec<&[u32]> = vec![&text[0..11], &text[3..8], &text[10..23], &text[20..29]];
    // Slot 1 holds the first 3 tokens of its prompt already.
    shared.forward_slot(1, &prompts[1][..3], Output::Argmax).unwrap();
    let steps = [
        vec![
            PromptChunk { slot: 0, tokens: prompts[0], pick: true },
            PromptChunk { slot: 1, tokens: &prompts[1][3..], pick: true },
            PromptChunk { slot: 2, tokens: &prompts[2][..6], pick: false },
        ],
        // Slot 2's rest (7 tokens) beside slot 3's whole prompt (9).
        vec![
            PromptChunk { slot: 2, tokens: &prompts[2][6..], pick: true },
            PromptChunk { slot: 3, tokens: prompts[3], pick: true },
        ],
    ];
    let mut picks = [None; 4];
    for step in &steps {
        let got = shared.prefill_slots(step).unwrap();
        assert_eq!(got.len(), step.len());
        for (c, p) in step.iter().zip(got) {
            assert_eq!(p.is_some(), c.pick, "slot {}: a pick exactly for the last chunk", c.slot);
            if p.is_some() {
                picks[c.slot] = p;
            }
        }
    }
    let mut alone = Vec::new();
    for (slot, p) in prompts.iter().enumerate() {
        assert_eq!(shared.slot_position(slot).unwrap(), p.len() as u32);
        let mut plain = model.session(one).unwrap();
        let want = plain.forward(p, Output::LastLogits).unwrap();
        assert_eq!(picks[slot], Some(argmax(&want)), "slot {slot}: the pick after its prompt");
        alone.push(plain);
    }
    // The caches: a batched step over all four, against each session alone.
    let batch: Vec<(usize, u32)> = (0..4).map(|s| (s, picks[s].unwrap())).collect();
    let got = shared.decode_slots_logits(&batch).unwrap();
    for (i, &(s, t)) in batch.iter().enumerate() {
        let want = alone[i].forward(&[t], Output::LastLogits).unwrap();
        common::assert_close(&format!("slot {s} after its prompt"), &got[i * v..(i + 1) * v], &want, 1e-4);
    }
    // Too few tokens for the GEMM: chunk by chunk, the same picks.
    let mut small = model.session(SessionOptions { n_seq: 2, ..one }).unwrap();
    for slot in 0..2 {
        small.set_slot_sampling(slot, &greedy, &[]).unwrap();
    }
    let few = [
        PromptChunk { slot: 1, tokens: &text[0..2], pick: true },
        PromptChunk { slot: 0, tokens: &text[3..6], pick: true },
    ];
    let got = small.prefill_slots(&few).unwrap();
    for c in &few {
        let want = model.session(one).unwrap().forward(c.tokens, Output::Argmax).unwrap()[0] as u32;
        assert_eq!(got[few.iter().position(|d| d.slot == c.slot).unwrap()], Some(want), "slot {}", c.slot);
    }
    // The same slot twice in one step is refused.
    let twice = [
        PromptChunk { slot: 0, tokens: &text[0..9], pick: true },
        PromptChunk { slot: 0, tokens: &text[9..18], pick: true },
    ];
    assert!(small.prefill_slots(&twice).is_err());
}

/// Pipelined batched steps (`submit_slots`: the next step submitted before the last one is
/// read, each column fed the pick the step before made for its slot on the GPU) give the
/// tokens that steps run one by one give, also when the columns change between steps (a
/// sequence leaves, one joins with a token the host knows, the order changes), and with a
/// prompt's step run in between (which overwrites the session's own pick buffer).
#[test]
fn pipelined_batched_steps_give_the_tokens_of_steps_one_by_one() {
    let g = &gpus()[0];
    let model = load(&g.ctx, "stories260K/stories260K.gguf");
    let v = model.cfg.n_vocab;
    let text = greedy_tokens();
    let o = SessionOptions { n_ctx: 48, ubatch: 16, f16_kv: true, all_logits: false, n_seq: 4 };
    let greedy = kiln::sample::Sampler::new(kiln::sample::SamplerConfig { temperature: 0.0, ..Default::default() });
    let prompt = |s: usize| -> Vec<u32> { text[4 * s..4 * s + 2 + s].iter().map(|&t| t % v).collect() };
    // Steps: slots 0-2 for three steps, then slot 1 leaves and slot 3 joins (its prompt
    // prefilled between two steps), then the order turns round.
    let plan: Vec<Vec<usize>> =
        vec![vec![0, 1, 2], vec![0, 1, 2], vec![0, 1, 2], vec![0, 2, 3], vec![3, 2, 0], vec![3, 2, 0]];
    let run = |pipelined: bool| -> Vec<Vec<u32>> {
        let mut s = model.session(o).unwrap();
        assert!(s.can_pipeline() || g.ctx.caps.gemv_max_cols < 3);
        let mut next = [0u32; 4];
        for (slot, next) in next.iter_mut().enumerate().take(3) {
            s.set_slot_sampling(slot, &greedy, &[]).unwrap();
            *next = s.forward_slot(slot, &prompt(slot), Output::Argmax).unwrap()[0] as u32;
        }
        let mut picks = Vec::new();
        let mut last: Vec<usize> = Vec::new();
        let mut in_flight: Vec<Vec<usize>> = Vec::new();
        for (i, cols) in plan.iter().enumerate() {
            if i == 3 {
                // A prompt's step between two steps (slot 3 joins with its first token).
                s.set_slot_sampling(3, &greedy, &[]).unwrap();
                next[3] = s.forward_slot(3, &prompt(3), Output::Argmax).unwrap()[0] as u32;
            }
            if !pipelined {
                let batch: Vec<(usize, u32)> = cols.iter().map(|&c| (c, next[c])).collect();
                let got = s.decode_slots(&batch).unwrap();
                for (&c, &t) in cols.iter().zip(&got) {
                    next[c] = t;
                }
                picks.push(got);
                continue;
            }
            use kiln::model::session::Feed;
            let feeds: Vec<(usize, Feed)> = cols
                .iter()
                .map(|&c| (c, if last.contains(&c) { Feed::Picked } else { Feed::Token(next[c]) }))
                .collect();
            s.submit_slots(&feeds).unwrap();
            in_flight.push(cols.clone());
            last = cols.clone();
            if in_flight.len() == 2 {
                let got = s.finish_slots().unwrap();
                let done = in_flight.remove(0);
                for (&c, &t) in done.iter().zip(&got) {
                    next[c] = t;
                }
                picks.push(got);
            }
        }
        if pipelined {
            let got = s.finish_slots().unwrap();
            picks.push(got);
            assert!(s.finish_slots().is_err(), "no step left in flight");
        }
        picks
    };
    if g.ctx.caps.gemv_max_cols < 3 {
        return;
    }
    assert_eq!(run(true), run(false));
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

/// On GPUs, a session's `build_pipelines` (run before the first prompt by the CLI and the
/// server) builds every pipeline a prompt of any length up to the ubatch and a decode step
/// take: afterwards prompts of 1 to 256 tokens in TinyLlama's shapes compile none. (A
/// server's first 128-token prompt compiled the cooperative GEMM's unsplit 64x64 tile with
/// its SwiGLU epilogue, 220 ms before its first token on an H200, run 111.) CPU adapters
/// compile at a shader's first dispatch whatever was built, so there it checks nothing. On a
/// context of its own: the tests running beside it compile pipelines on the shared ones.
#[test]
fn built_pipelines_cover_every_prompt_length() {
    let ctx = GpuContext::new(&kiln::gpu::ContextOptions::default()).unwrap();
    if ctx.caps.cpu_adapter {
        eprintln!("{}: a CPU adapter compiles at first dispatch; nothing to check", ctx.describe());
        return;
    }
    let (p, ft) = kiln::synth::parse_spec("tinyllama-1.1b:q4_k_m").unwrap();
    let file = kiln::synth::build(&p, ft).unwrap().into_gguf("tinyllama").unwrap();
    let model = Model::load_file(ctx.clone(), file, &mut |_| {}).unwrap();
    let mut s = model.session(SessionOptions { n_ctx: 1024, ubatch: 256, ..opts(true, 256, false) }).unwrap();
    s.build_pipelines().unwrap();
    let built = ctx.pipelines.len();
    let ids: Vec<u32> = (0..256).map(|i| 3 + i * 7).collect();
    for m in [1usize, 3, 5, 9, 12, 17, 24, 33, 47, 64, 100, 128, 160, 200, 222, 240, 256] {
        s.forward(&ids[..m], Output::Argmax).unwrap();
        s.forward(&ids[..1], Output::Argmax).unwrap();
        s.reset();
        assert_eq!(ctx.pipelines.len(), built, "a {m}-token prompt compiled a pipeline after build_pipelines");
    }
}

/// The planner's 2,048-token prompt steps (GPUs with cooperative matrices) give what
/// llama.cpp's 512-token steps give: mini-llama's 2,040-token prompt in one step and in steps
/// of 512 (a ragged last one), every position's logits within 1e-3 of the largest. (Where a
/// GEMM is split along K at one size and not at the other, sums run in another order.)
#[test]
fn a_long_prompt_in_one_step_matches_steps_of_512() {
    let g = &gpus()[0];
    let (p, ft) = kiln::synth::parse_spec("mini-llama:q4_k_m").unwrap();
    let file = kiln::synth::build(&p, ft).unwrap().into_gguf("mini-llama").unwrap();
    let model = Model::load_file(g.ctx.clone(), file, &mut |_| {}).unwrap();
    let v = model.cfg.n_vocab as usize;
    let ids: Vec<u32> = (0..2040).map(|i| (3 + (i * 7919) % (v - 3)) as u32).collect();
    let mut logits = Vec::new();
    for ubatch in [2048, 512] {
        let mut s = model.session(SessionOptions { n_ctx: 2048, ..opts(true, ubatch, true) }).unwrap();
        logits.push(s.forward(&ids, Output::AllLogits).unwrap());
    }
    let (one, steps) = (&logits[0], &logits[1]);
    let largest = steps.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (max, rms, same) = compare(one, steps, v);
    eprintln!("[{}] mini-llama 2040 tokens, ubatch 2048 against 512: max |Δ| {max:.2e} of {largest:.2}, rms {rms:.2e}, argmax {same}", g.name);
    assert!(max <= 1e-3 * largest, "[{}] max |Δ| {max} against the largest logit {largest}", g.name);
}
