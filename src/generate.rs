//! Text generation on a session: prompt prefill, then tokens until end of generation, the
//! token limit, a full context or a stop request. Every token is picked on the GPU (greedy or
//! sampled, penalties included) and decode steps chain on the GPU: the host reads 4 bytes
//! per token and never holds the GPU up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::{KilnError, Result};
use crate::model::{Output, Session};
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    EndOfGeneration,
    Limit,
    ContextFull,
    Interrupted,
}

#[derive(Debug, Clone, Copy)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub prompt_secs: f64,
    pub generated: usize,
    pub gen_secs: f64,
    pub stop: StopReason,
}

/// Feeds `prompt` (already in the model's vocabulary) and generates up to `max_new` tokens
/// (None: until end of generation or a full context). Text is streamed to `on_text`;
/// `history` gets every token fed or generated (the repetition penalty's window).
#[allow(clippy::too_many_arguments)]
pub fn generate(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    history: &mut Vec<u32>,
    max_new: Option<usize>,
    sampler: &mut Sampler,
    stop: &AtomicBool,
    on_text: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<GenStats> {
    let mut dec = StreamDecoder::new(tok);
    let stats = generate_with(session, tok, prompt, history, max_new, sampler, stop, &mut dec, on_text)?;
    let rest = dec.finish()?;
    if !rest.is_empty() {
        on_text(&rest)?;
    }
    Ok(stats)
}

/// Generates `max_new` tokens however small the context: when it fills up, the session
/// restarts from the last half of the context's tokens (after BOS, if the vocabulary uses
/// one), as llama.cpp's context shift does, re-evaluating them since kiln keeps no
/// position-free keys. Stops early only at end of generation or on a stop request.
#[allow(clippy::too_many_arguments)]
pub fn generate_shifting(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    history: &mut Vec<u32>,
    max_new: usize,
    sampler: &mut Sampler,
    stop: &AtomicBool,
    on_text: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<GenStats> {
    let n_ctx = session.opts.n_ctx as usize;
    let mut dec = StreamDecoder::new(tok);
    let mut total = GenStats {
        prompt_tokens: prompt.len(),
        prompt_secs: 0.0,
        generated: 0,
        gen_secs: 0.0,
        stop: StopReason::Limit,
    };
    let mut feed = prompt.to_vec();
    let mut first = true;
    loop {
        let before = history.len();
        let left = Some(max_new - total.generated);
        let s = generate_with(session, tok, &feed, history, left, sampler, stop, &mut dec, on_text)?;
        if first {
            total.prompt_secs = s.prompt_secs;
            first = false;
        } else {
            total.gen_secs += s.prompt_secs;
        }
        total.generated += s.generated;
        total.gen_secs += s.gen_secs;
        total.stop = s.stop;
        if s.stop != StopReason::ContextFull || total.generated >= max_new {
            break;
        }
        // The cache holds what was fed and generated (history got both, in that order).
        let mut context = feed;
        context.extend_from_slice(&history[before + context.len()..]);
        // Keep BOS and the last half of the context; the next call evaluates them and goes on.
        let bos: Vec<u32> = match (tok.add_bos_default(), tok.bos()) {
            (true, Some(b)) => vec![b],
            _ => Vec::new(),
        };
        let keep = (n_ctx / 2).saturating_sub(bos.len()).max(1).min(context.len());
        feed = [bos.as_slice(), &context[context.len() - keep..]].concat();
        session.reset();
        if history.len() > 2 * n_ctx {
            // The repetition penalty only looks back a window; the rest can go.
            history.drain(..history.len() - n_ctx);
        }
        tracing::debug!("context full: restarting from the last {keep} tokens");
    }
    let rest = dec.finish()?;
    if !rest.is_empty() {
        on_text(&rest)?;
    }
    Ok(total)
}

/// `generate` with the caller's decoder (kept across context restarts).
#[allow(clippy::too_many_arguments)]
fn generate_with(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    history: &mut Vec<u32>,
    max_new: Option<usize>,
    sampler: &mut Sampler,
    stop: &AtomicBool,
    dec: &mut StreamDecoder,
    on_text: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<GenStats> {
    let n_ctx = session.opts.n_ctx as usize;
    if prompt.is_empty() {
        return Err(KilnError::invalid("prompt", "the prompt is empty (and the model adds no BOS token)"));
    }
    if session.position() as usize + prompt.len() > n_ctx {
        return Err(KilnError::invalid(
            "prompt",
            format!(
                "{} prompt tokens do not fit the context ({} used of {n_ctx}; raise -c)",
                prompt.len(),
                session.position()
            ),
        ));
    }
    let greedy = sampler.cfg.is_greedy();
    let t = Instant::now();
    history.extend_from_slice(prompt);
    session.set_sampling(sampler, history);
    let first = session.forward(prompt, Output::Sampled)?[0] as u32;
    if !greedy {
        sampler.draws = sampler.draws.wrapping_add(1);
    }
    let prompt_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let limit = max_new.unwrap_or(usize::MAX);
    let mut generated = 0usize;
    let mut reason = StopReason::Limit;
    let mut error: Option<KilnError> = None;
    // Host time spent detokenizing (for the profile; sampling runs on the GPU).
    let mut detok_secs = 0f64;
    let sample_secs = 0f64;
    // Handles one new token; false stops generation.
    let mut accept = |id: u32, generated: &mut usize, reason: &mut StopReason, history: &mut Vec<u32>| -> bool {
        if tok.is_eog(id) {
            *reason = StopReason::EndOfGeneration;
            return false;
        }
        *generated += 1;
        history.push(id);
        let t = Instant::now();
        let piece = dec.push(id);
        detok_secs += t.elapsed().as_secs_f64();
        match piece.and_then(|s| if s.is_empty() { Ok(()) } else { on_text(&s) }) {
            Ok(()) => {}
            Err(e) => {
                error = Some(e);
                return false;
            }
        }
        if stop.load(Ordering::Relaxed) {
            *reason = StopReason::Interrupted;
            return false;
        }
        if *generated >= limit {
            *reason = StopReason::Limit;
            return false;
        }
        true
    };
    if limit > 0 && accept(first, &mut generated, &mut reason, history) {
        let room = n_ctx - session.position() as usize;
        let want = (limit - generated).min(room);
        let draws = &mut sampler.draws;
        let got = session.generate_chained(first, want, &mut |id| {
            if !greedy {
                *draws = draws.wrapping_add(1);
            }
            accept(id, &mut generated, &mut reason, history)
        })?;
        if got.len() == want && want == room && reason == StopReason::Limit && generated < limit {
            reason = StopReason::ContextFull;
        }
    } else if limit == 0 {
        reason = StopReason::Limit;
    }
    session.add_host_time(sample_secs, detok_secs);
    if let Some(e) = error {
        return Err(e);
    }
    Ok(GenStats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        generated,
        gen_secs: t.elapsed().as_secs_f64(),
        stop: reason,
    })
}

/// Sampler settings from the CLI's numbers, with a time-based seed when none is given.
pub fn sampler(cfg: SamplerConfig, seed: Option<u64>) -> Sampler {
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    Sampler::new(SamplerConfig { seed, ..cfg })
}
