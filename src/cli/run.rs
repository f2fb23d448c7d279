//! `kiln run`: complete a prompt, streaming the text to stdout and speeds to stderr.

use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::generate::{generate, generate_shifting, sampler, StopReason};
use crate::sample::SamplerConfig;
use crate::{KilnError, Result};

/// Sampling flags, named and defaulted as llama.cpp's.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1.0 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0.0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1.0 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens of history the penalties look at (at most 1024).
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Frequency penalty: subtracted once per occurrence in that history (0.0 = off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// Presence penalty: subtracted once from tokens in that history (0.0 = off).
    #[arg(long = "presence-penalty", default_value_t = 0.0, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Random seed (default: from the clock).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn config(&self) -> Result<SamplerConfig> {
        if self.temp < 0.0
            || !(0.0..=1.0).contains(&self.top_p)
            || !(0.0..=1.0).contains(&self.min_p)
            || self.repeat_penalty <= 0.0
        {
            return Err(KilnError::invalid(
                "sampling flags",
                "need temp >= 0, 0 <= top-p <= 1, 0 <= min-p <= 1, repeat-penalty > 0",
            ));
        }
        Ok(SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: 0,
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Tokens to generate (past a full context, generation goes on from its last half);
    /// -1 = until end of generation or a full context.
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
    /// Do not add the BOS token in front of the prompt.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Set by Ctrl-C; generation checks it after every token.
pub fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    // A second Ctrl-C (or a failure to install the handler) falls back to the default action.
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
    flag
}

pub fn run(args: &RunArgs) -> Result<()> {
    let cfg = args.sampling.config()?;
    let max_new = match args.n_predict {
        n if n < 0 => None,
        n => Some(n as usize),
    };
    let (model, tok) = load_model(&args.model)?;
    let prompt = tok.encode(&args.prompt, tok.add_bos_default() && !args.no_bos)?;
    let mut session = open_session(&model, &args.model, prompt.len() as u32 + 1, false)?;
    let stop = interrupt_flag();
    let mut out = std::io::stdout().lock();
    let mut history = Vec::new();
    let mut sampler = sampler(cfg, args.sampling.seed);
    let mut print = |s: &str| -> Result<()> {
        out.write_all(s.as_bytes())?;
        out.flush()?;
        Ok(())
    };
    // With -n, a full context restarts from its last half (as llama.cpp's context shift);
    // with -n -1, generation ends there.
    let stats = match max_new {
        Some(n) => generate_shifting(&mut session, &tok, &prompt, &mut history, n, &mut sampler, &stop, &mut print)?,
        None => generate(&mut session, &tok, &prompt, &mut history, None, &mut sampler, &stop, &mut print)?,
    };
    writeln!(out)?;
    out.flush()?;
    eprintln!(
        "prompt: {} tokens in {:.2} s ({:.1} tok/s); generation: {} tokens in {:.2} s ({:.1} tok/s)",
        stats.prompt_tokens,
        stats.prompt_secs,
        stats.prompt_tokens as f64 / stats.prompt_secs.max(1e-9),
        stats.generated,
        stats.gen_secs,
        stats.generated as f64 / stats.gen_secs.max(1e-9)
    );
    crate::cli::load::report_profile(&session)?;
    match stats.stop {
        StopReason::ContextFull => {
            eprintln!("kiln: stopped: the context of {} tokens is full (raise -c)", session.opts.n_ctx)
        }
        StopReason::Interrupted => {
            eprintln!("kiln: interrupted");
            std::process::exit(130);
        }
        _ => {}
    }
    Ok(())
}
