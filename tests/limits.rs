//! Resource limits: a model larger than the adapter's memory is refused before upload with
//! the sizes, a context too large for memory is reduced with a warning (or refused when -c
//! asked for it), a buffer over the adapter's maximum is refused with a clear message, and
//! `kiln run -v` reports GPU memory by use. `KILN_GPU_MEMORY` stands in for a small GPU.

mod common;

use std::process::Command;

use common::testdata;
use kiln::gpu::{ContextOptions, GpuContext};

fn run(memory: Option<&str>, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(["run", "-m"]).arg(testdata().join("stories260K/stories260K.gguf"));
    c.args(["-p", "Once", "-n", "4", "--temp", "0"]).args(extra);
    if let Some(m) = memory {
        c.env("KILN_GPU_MEMORY", m);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_model_larger_than_memory_is_refused_before_upload() {
    let (code, _, err) = run(Some("512K"), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("not enough GPU memory for the weights") && err.contains("MiB needed, the adapter has 0.5 MiB"),
        "{err}"
    );
}

#[test]
fn a_context_too_large_for_memory_is_reduced_with_a_warning() {
    // 1.1 MiB of weights, then 1.3 MiB of KV cache at the model's 2048 positions.
    let (code, out, err) = run(Some("2M"), &["-v"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("kiln: context reduced to"), "{err}");
    assert!(!out.trim().is_empty());
    // ... or refused when the user asked for it.
    let (code, _, err) = run(Some("2M"), &["-c", "2048"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not enough GPU memory for a context of 2048 tokens") && err.contains("use -c"), "{err}");
}

#[test]
fn run_v_reports_gpu_memory() {
    let (code, _, err) = run(None, &["-v", "-c", "256"]);
    assert_eq!(code, Some(0), "{err}");
    let line = err.lines().find(|l| l.contains("GPU memory:")).unwrap_or_else(|| panic!("no memory report: {err}"));
    assert!(line.contains("weights") && line.contains("KV cache") && line.contains("activations"), "{line}");
    assert!(line.contains("(256 tokens)"), "{line}");
}

#[test]
fn a_buffer_over_the_adapter_maximum_is_refused() {
    let ctx = GpuContext::new(&ContextOptions::default()).expect("GPU");
    let err = ctx.storage(ctx.limits.max_buffer_size + 1, "blk.0.ffn_norm.weight").unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_norm.weight needs") && err.contains("allows at most"), "{err}");
}

/// Full-size sessions of real model shapes on a device clamped to WebGPU's default limits
/// (128 MiB per storage binding, 256 MiB per buffer: lavapipe, GL, many integrated GPUs):
/// every buffer and binding must fit by construction, with no validation error anywhere.
/// The weights are allocated but never written (`Model::allocate`), so this costs no copying.
#[test]
fn full_size_sessions_fit_webgpu_default_limits() {
    use kiln::config::PrefillAttention;
    use kiln::engine::Model;
    use kiln::model::sizes::{fit_request, SessionRequest, SessionSizes};
    let ctx = GpuContext::new(&ContextOptions { limits: Some(wgpu::Limits::default()), ..Default::default() })
        .expect("a device with WebGPU's default limits");
    assert_eq!(ctx.max_storage(), 128 << 20);
    for spec in ["tinyllama-1.1b:q4_k_m", "llama-7b:q4_k_m", "qwen3-0.6b:q8_0"] {
        let (preset, ft) = kiln::synth::parse_spec(spec).unwrap();
        let model = Model::allocate(ctx.clone(), kiln::synth::layout(&preset, ft).unwrap())
            .unwrap_or_else(|e| panic!("{spec}: weights: {e}"));
        // The defaults, then `--ubatch 1`, `-c 1` and `--kv-type f32`.
        for (ctx_size, ubatch, f16_kv) in
            [(None, None, true), (None, Some(1), true), (Some(1), None, true), (None, None, false)]
        {
            let req = SessionRequest { ctx_size, min_ctx: 1, ubatch, batch: 2048, f16_kv, all_logits: false };
            let what = format!("{spec} -c {ctx_size:?} --ubatch {ubatch:?} f16 KV {f16_kv}");
            let ubatch = ubatch.unwrap_or(2048);
            let fitted = fit_request(&ctx, &model.cfg, model.weight_gpu_bytes, &req)
                .unwrap_or_else(|e| panic!("{what}: fitting: {e}"));
            // Model::session captures validation errors: any would fail here.
            let session = model.session(fitted.opts).unwrap_or_else(|e| panic!("{what}: {e}"));
            let o = session.opts;
            assert!(o.ubatch >= 1 && o.ubatch <= ubatch && o.n_ctx >= 1, "{what}: {o:?}");
            if ctx_size.is_none() && o.n_ctx < preset.n_ctx {
                assert!(!fitted.notes.is_empty(), "{what}: context reduced without a note");
            }
            eprintln!("{what}: n_ctx {} ubatch {} {:?}", o.n_ctx, o.ubatch, fitted.notes);
            drop(session);
            ctx.check_fault(&what).unwrap();
        }
    }
    // TinyLlama's 2048-position context with a 512-token ubatch: flash attention keeps no
    // score matrix, so the ubatch stays whole; the materialized path's scores
    // (KILN_PREFILL_ATTENTION=gemm) would be exactly 128 MiB, one tail pad too many for a
    // binding, and bring it down to 496.
    let (preset, ft) = kiln::synth::parse_spec("tinyllama-1.1b:q4_k_m").unwrap();
    let model = Model::allocate(ctx.clone(), kiln::synth::layout(&preset, ft).unwrap()).unwrap();
    let req =
        SessionRequest { ctx_size: None, min_ctx: 1, ubatch: Some(512), batch: 2048, f16_kv: true, all_logits: false };
    let fitted = fit_request(&ctx, &model.cfg, model.weight_gpu_bytes, &req).unwrap();
    let want = match kiln::config::prefill_attention_from_env() {
        PrefillAttention::Flash => 512,
        PrefillAttention::Gemm => 496,
    };
    assert_eq!((fitted.opts.n_ctx, fitted.opts.ubatch), (2048, want));
    let whole = kiln::model::session::SessionOptions { ubatch: 512, ..fitted.opts };
    let gemm = SessionSizes::with_attention(&model.cfg, &whole, PrefillAttention::Gemm, &ctx.caps);
    assert_eq!(gemm.first_too_large(&ctx).map(|b| b.0), Some("attention scores"));
    assert_eq!(SessionSizes::with_attention(&model.cfg, &whole, PrefillAttention::Flash, &ctx.caps).scores, 0);
    // What still grows with the ubatch: every position's logits. Qwen3's 151936-token
    // vocabulary at 512 positions is 297 MiB: the ubatch comes down to whole 16-token steps
    // of at most 128 MiB (220 rows fit).
    let (preset, ft) = kiln::synth::parse_spec("qwen3-0.6b:q8_0").unwrap();
    let model = Model::allocate(ctx.clone(), kiln::synth::layout(&preset, ft).unwrap()).unwrap();
    let req = SessionRequest {
        ctx_size: Some(2048),
        min_ctx: 1,
        ubatch: Some(512),
        batch: 2048,
        f16_kv: true,
        all_logits: true,
    };
    let fitted = fit_request(&ctx, &model.cfg, model.weight_gpu_bytes, &req).unwrap();
    assert_eq!((fitted.opts.n_ctx, fitted.opts.ubatch), (2048, 208));
    let session = model.session(fitted.opts).unwrap();
    drop(session);
    ctx.check_fault("qwen3 all logits").unwrap();
}

/// A session that cannot fit even one token per step is refused with the buffer and what to
/// do, and a context asked for with -c is refused rather than reduced.
#[test]
fn a_session_that_cannot_fit_is_refused_with_the_sizes() {
    use kiln::engine::Model;
    use kiln::model::sizes::{fit_request, SessionRequest};
    let ctx = GpuContext::new(&ContextOptions { limits: Some(wgpu::Limits::default()), ..Default::default() })
        .expect("a device with WebGPU's default limits");
    let (preset, ft) = kiln::synth::parse_spec("qwen3-0.6b:q8_0").unwrap();
    let model = Model::allocate(ctx.clone(), kiln::synth::layout(&preset, ft).unwrap()).unwrap();
    // f32 keys of 40960 positions x 1024 are 160 MiB, over one 128 MiB binding; 32768 of
    // them are exactly 128 MiB (KV-cache layers carry no tail pad).
    let req = SessionRequest {
        ctx_size: Some(40960),
        min_ctx: 1,
        ubatch: Some(512),
        batch: 2048,
        f16_kv: false,
        all_logits: false,
    };
    let err = fit_request(&ctx, &model.cfg, model.weight_gpu_bytes, &req).unwrap_err().to_string();
    assert!(err.contains("KV cache of 40960 positions") && err.contains("-c 32768 would fit"), "{err}");
    assert!(err.contains("134217728"), "{err}");
    // Without -c the context is capped, with a note.
    let req = SessionRequest { ctx_size: None, ..req };
    let fitted = fit_request(&ctx, &model.cfg, model.weight_gpu_bytes, &req).unwrap();
    assert_eq!(fitted.opts.n_ctx, 32768);
    assert!(fitted.notes.iter().any(|n| n.contains("context capped at 32768")), "{:?}", fitted.notes);
}
