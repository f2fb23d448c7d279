//! `kiln run`: complete a prompt, streaming the text to stdout and speeds to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::generate::{generate, generate_shifting, sampler, GenStats, StopReason};
use crate::sample::{Sampler, SamplerConfig};
use crate::stop::{process_escapes, StopStrings};
use crate::tokenizer::Tokenizer;
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
    /// Never end at the end-of-generation token: it is never sampled (llama.cpp's
    /// --ignore-eos; greedy decoding then samples on the CPU).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
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

    /// The sampler these flags describe, for a model with this tokenizer.
    pub fn sampler(&self, tok: &Tokenizer) -> Result<Sampler> {
        let mut s = sampler(self.config()?, self.seed);
        if self.ignore_eos {
            s.ban(tok.eog_ids())?;
        }
        Ok(s)
    }
}

/// Text flags of run and chat as llama.cpp has them: escapes and stop strings.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TextArgs {
    /// Stop when the generated text contains this string (llama.cpp's reverse prompt;
    /// repeatable). The text is shown through the stop string.
    #[arg(short = 'r', long = "reverse-prompt", value_name = "TEXT")]
    pub reverse_prompt: Vec<String>,
    /// Process escapes (\n, \t, \\, \", \xHH, …) in the prompt, system prompt and stop strings
    /// (llama.cpp's -e).
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Take the prompt as written (the default).
    #[arg(long = "no-escape")]
    pub no_escape: bool,
}

impl TextArgs {
    /// `text` with escapes processed under -e.
    pub fn text(&self, text: &str) -> String {
        if self.escape {
            process_escapes(text)
        } else {
            text.to_string()
        }
    }

    pub fn stop_strings(&self) -> StopStrings {
        StopStrings::new(self.reverse_prompt.iter().map(|r| self.text(r)))
    }
}

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["prompt", "file"]))]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from a file (one trailing newline dropped, as llama.cpp does).
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (past a full context, generation goes on from its last half);
    /// -1 = until end of generation or a full context.
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
    /// Do not add the BOS token in front of the prompt.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    #[command(flatten)]
    pub text: TextArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl RunArgs {
    /// The prompt text: -p, or the file of -f; escapes processed under -e.
    fn prompt_text(&self) -> Result<String> {
        let raw = match (&self.prompt, &self.file) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => {
                let mut t = std::fs::read_to_string(f).map_err(|e| KilnError::File {
                    path: f.clone(),
                    message: format!("cannot read the prompt: {e}"),
                })?;
                if t.ends_with('\n') {
                    t.pop();
                }
                t
            }
            (None, None) => return Err(KilnError::invalid("prompt", "give one with -p TEXT or -f FILE")),
        };
        Ok(self.text.text(&raw))
    }
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
    let max_new = match args.n_predict {
        n if n < 0 => None,
        n => Some(n as usize),
    };
    args.sampling.config()?;
    let text = args.prompt_text()?;
    let mut margs = args.model.clone();
    let (model, tok) = load_model(&mut margs)?;
    let prompt = tok.encode(&text, tok.add_bos_default() && !args.no_bos)?;
    let mut session = open_session(&model, &margs, 1, false)?;
    let prompt = fit_prompt(prompt, session.opts.n_ctx as usize, &tok, margs.ctx_size.is_some())?;
    let stop = interrupt_flag();
    let mut out = std::io::stdout().lock();
    let mut history = Vec::new();
    let mut sampler = args.sampling.sampler(&tok)?;
    let mut stops = args.text.stop_strings();
    let mut stopped_at_string = false;
    let mut print = |s: &str| -> Result<()> {
        let (show, hit) = stops.push(s);
        out.write_all(&s.as_bytes()[..show])?;
        out.flush()?;
        if hit {
            // Ends generation after this token, as Ctrl-C would, but it is no interruption.
            stopped_at_string = true;
            stop.store(true, Ordering::SeqCst);
        }
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
    eprintln!("{}", speed_line(&stats));
    crate::cli::load::report_profile(&session)?;
    match stats.stop {
        StopReason::ContextFull => {
            eprintln!("kiln: stopped: the context of {} tokens is full (raise -c)", session.opts.n_ctx)
        }
        StopReason::Interrupted if !stopped_at_string => {
            eprintln!("kiln: interrupted");
            std::process::exit(130);
        }
        _ => {}
    }
    Ok(())
}

/// A prompt longer than the context, as llama.cpp handles it: refused with the sizes when
/// the context was chosen with -c; otherwise its end is kept (BOS first, as the model saw it
/// in training), half a context long so that there is room to generate, with a warning.
pub fn fit_prompt(prompt: Vec<u32>, n_ctx: usize, tok: &Tokenizer, explicit_ctx: bool) -> Result<Vec<u32>> {
    if prompt.len() < n_ctx {
        return Ok(prompt);
    }
    if explicit_ctx {
        return Err(KilnError::invalid(
            "prompt",
            format!(
                "the prompt is {} tokens and the context (-c) holds {n_ctx}; raise -c to more than {} or shorten the prompt",
                prompt.len(),
                prompt.len()
            ),
        ));
    }
    let bos: Vec<u32> = match (prompt.first(), tok.bos()) {
        (Some(&first), Some(b)) if first == b => vec![b],
        _ => Vec::new(),
    };
    let keep = (n_ctx / 2).saturating_sub(bos.len()).max(1);
    eprintln!(
        "kiln: the prompt is {} tokens and the context holds {n_ctx}: keeping its last {keep} tokens (raise -c to keep more)",
        prompt.len()
    );
    Ok([bos.as_slice(), &prompt[prompt.len() - keep..]].concat())
}

/// "prompt: …; generation: …" as llama.cpp counts: the first token comes out of prompt
/// processing, so the generation rate is over the decode steps after it, and a run with no
/// decode step shows no rate.
pub fn speed_line(stats: &GenStats) -> String {
    let prompt = format!(
        "prompt: {} tokens in {:.2} s ({:.1} tok/s)",
        stats.prompt_tokens,
        stats.prompt_secs,
        stats.prompt_tokens as f64 / stats.prompt_secs.max(1e-9)
    );
    match stats.generated {
        0 => return format!("{prompt}; generation: 0 tokens"),
        1 => return format!("{prompt}; generation: 1 token (from prompt processing; no decode step to time)"),
        _ => {}
    }
    let steps = stats.generated - 1;
    format!(
        "{prompt}; generation: {} tokens, {steps} decode step{} in {:.2} s ({:.1} tok/s)",
        stats.generated,
        if steps == 1 { "" } else { "s" },
        stats.gen_secs,
        steps as f64 / stats.gen_secs.max(1e-9)
    )
}
