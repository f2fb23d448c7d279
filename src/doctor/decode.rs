//! End to end: greedy decoding of a tiny model built in memory (`kiln synth`'s tiny-test in
//! Q4_K_M: Q4_K and Q6_K matrices, GQA), as generation runs it. It must give the same tokens
//! on every run and agree with the teacher-forced logits' argmax, and with every fallback
//! forced the logits must agree within rounding (of activations to int8 too, where the
//! native kernels take the int8 GEMV) and the tokens with them.

use std::sync::Arc;

use crate::engine::Model;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::model::{Output, SessionOptions};

use super::checker::Checker;

/// The model decoded (a `kiln synth` preset and format).
pub const MODEL: &str = "tiny-test:q4_k_m";
/// Prompt tokens (a ubatch of 9 through the GEMM, then 3 through the multi-column GEMV) and
/// tokens generated.
const PROMPT: usize = 12;
const UBATCH: u32 = 9;
const GENERATED: usize = 12;
/// Logits with every fallback forced differ from the native kernels' by summation order and
/// the cooperative GEMM's f16 activations: within 1e-3 of max(1, max |logit|).
const LOGITS_TOL: f32 = 1e-3;
/// Where the native kernels run a chunk of the teacher-forced pass on the int8 GEMV (from
/// `plan::GEMV_Q8_MIN_COLS` columns on GPUs with integer dot products: here its last chunk
/// of 5 tokens), its activations are rounded to int8 blocks, as llama.cpp rounds every
/// quantized matmul's: within 2% (H200, run 107: 0.66%; 0.065% with the int8 GEMV kept
/// to one column). A wrong kernel is off by the logits' size.
const LOGITS_TOL_INT8: f32 = 2e-2;

/// The logits' tolerance against the fallbacks: whether the native adapter's planner puts a
/// chunk of `logits_along`'s pass on the int8 GEMV.
fn logits_tol(native: &GpuContext, model: &Model) -> f32 {
    let tokens = (PROMPT + GENERATED - 1) as u32;
    let last_chunk = match tokens % UBATCH {
        0 => UBATCH,
        r => r,
    };
    let n = model.cfg.n_embd;
    let int8 = [UBATCH, last_chunk].into_iter().any(|m| {
        let kernel = crate::plan::plan_matmul(m, n, n, crate::quant::WeightFormat::Q4K, &native.caps);
        matches!(kernel, crate::plan::MatmulKernel::Gemv { q8: true, .. })
    });
    if int8 {
        LOGITS_TOL_INT8
    } else {
        LOGITS_TOL
    }
}

fn load(ctx: &Arc<GpuContext>) -> Result<Model> {
    let (preset, ft) = crate::synth::parse_spec(MODEL)?;
    let file = crate::synth::build(&preset, ft)?.into_gguf(MODEL)?;
    Model::load_file(ctx.clone(), file, &mut |_| {})
}

fn session(model: &Model, all_logits: bool) -> Result<crate::model::Session> {
    model.session(SessionOptions { n_ctx: 32, ubatch: UBATCH, f16_kv: true, all_logits, n_seq: 1 })
}

fn prompt(n_vocab: u32) -> Vec<u32> {
    (0..PROMPT).map(|i| 3 + (i as u32 * 7919) % (n_vocab - 3)).collect()
}

/// The prompt's greedy token, then greedy steps chained on the GPU (as generation runs),
/// `per_submit` steps per command buffer where given (else the session's default, 4 or
/// `KILN_STEPS_PER_SUBMIT`).
fn greedy(model: &Model, per_submit: Option<usize>) -> Result<Vec<u32>> {
    let mut s = session(model, false)?;
    if let Some(n) = per_submit {
        s.set_steps_per_submit(n);
    }
    let first = s.forward(&prompt(model.cfg.n_vocab), Output::Argmax)?[0] as u32;
    let mut tokens = vec![first];
    tokens.extend(s.generate_greedy_chained(first, GENERATED - 1, &mut |_| true)?);
    Ok(tokens)
}

/// The logits that predict each of `tokens`: after the prompt and after each token but the
/// last, from one teacher-forced pass (prefill kernels).
fn logits_along(model: &Model, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let mut s = session(model, true)?;
    let mut ids = prompt(model.cfg.n_vocab);
    ids.extend_from_slice(&tokens[..tokens.len().saturating_sub(1)]);
    let all = s.forward(&ids, Output::AllLogits)?;
    let v = model.cfg.n_vocab as usize;
    Ok(all.chunks(v).skip(PROMPT - 1).map(|r| r.to_vec()).collect())
}

/// The lowest index of the largest value, and how far the runner-up is below it.
fn top_and_margin(row: &[f32]) -> (u32, f32) {
    let best = crate::kernels::argmax::reference(row, row.len().max(1)).first().copied().unwrap_or(0);
    let top = row.get(best as usize).copied().unwrap_or(0.0);
    let second = row.iter().enumerate().filter(|(i, _)| *i != best as usize).map(|(_, &v)| v).fold(f32::MIN, f32::max);
    (best, top - second)
}

/// Compares `got` with `want` token by token; where the logits that predicted a token have
/// their top two within the logits' tolerance `tol`, either is right, and the tokens are
/// compared up to there only (after it the contexts differ).
fn tokens_up_to_a_tie(ck: &mut Checker, what: &str, got: &[u32], want: &[u32], logits: &[Vec<f32>], tol: f32) {
    let parted = want.iter().zip(got).position(|(a, b)| a != b);
    let tie =
        parted.filter(|&i| logits.get(i).is_some_and(|row| top_and_margin(row).1 <= tol * super::compare::scale(row)));
    match tie {
        Some(i) => {
            ck.tokens(format!("{what}, up to a near tie at token {i}"), &got[..i], &want[..i]);
            let margin = logits.get(i).map(|r| top_and_margin(r).1).unwrap_or(0.0);
            ck.expect(
                format!("{what}: parted at a near tie"),
                true,
                format!("token {i}: top two logits {margin:.2e} apart"),
            );
        }
        None => ck.tokens(what, got, want),
    }
}

/// The check: `native` decodes twice (its steps grouped into command buffers differently)
/// and scores its tokens teacher-forced; `fallback` (the same adapter with every fallback
/// forced), where given, does the same to be compared.
pub fn greedy_decoding(ck: &mut Checker, native: &Arc<GpuContext>, fallback: Option<&Arc<GpuContext>>) -> Result<()> {
    let model = load(native)?;
    let want = greedy(&model, None)?;
    // The second run submits each step on its own: neither the run nor how its steps are
    // grouped into command buffers may change a token.
    ck.tokens("native: greedy tokens of a second run, one step per submit", &greedy(&model, Some(1))?, &want);
    let logits = logits_along(&model, &want)?;
    let tol = logits_tol(native, &model);
    let prefill: Vec<u32> = logits.iter().map(|r| top_and_margin(r).0).collect();
    tokens_up_to_a_tie(ck, "native: teacher-forced argmax against the decoded tokens", &prefill, &want, &logits, tol);
    let Some(fallback) = fallback else {
        return Ok(());
    };
    let model = load(fallback)?;
    let fb_logits = logits_along(&model, &want)?;
    ck.close("fallback: teacher-forced logits", &fb_logits.concat(), &logits.concat(), tol);
    tokens_up_to_a_tie(ck, "fallback: greedy tokens", &greedy(&model, None)?, &want, &logits, tol);
    Ok(())
}
