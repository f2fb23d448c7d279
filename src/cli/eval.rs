//! `kiln eval`: teacher-forced evaluation of a token sequence. Row i of the logits is the
//! prediction after ids[0..=i]; prints mean negative log-likelihood and perplexity. Scored on
//! the GPU (one float per token read back) unless the logits are asked for.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::kernels::nll::nll_of;
use crate::model::Output;
use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Whitespace-separated token ids.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Write raw f32 logits here, one row per position (they are then scored on the CPU).
    #[arg(long = "logits-out")]
    pub logits_out: Option<PathBuf>,
}

pub fn run(args: &EvalArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.tokens)
        .map_err(|e| KilnError::File { path: args.tokens.clone(), message: e.to_string() })?;
    let ids = text
        .split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| KilnError::File { path: args.tokens.clone(), message: format!("{t:?} is not a token id") })
        })
        .collect::<Result<Vec<u32>>>()?;
    if ids.is_empty() {
        return Err(KilnError::File { path: args.tokens.clone(), message: "no token ids".into() });
    }
    let mut margs = args.model.clone();
    let (model, _) = load_model(&mut margs)?;
    let mut session = open_session(&model, &margs, ids.len() as u32, true)?;
    let t = Instant::now();
    let nll: f64 = match &args.logits_out {
        None => session.score(&ids, 0)?.iter().map(|&x| x as f64).sum(),
        Some(out) => {
            let logits = session.forward(&ids, Output::AllLogits)?;
            std::fs::write(out, bytemuck::cast_slice(&logits))
                .map_err(|e| KilnError::File { path: out.clone(), message: e.to_string() })?;
            let v = model.cfg.n_vocab as usize;
            (0..ids.len() - 1).map(|i| nll_of(&logits[i * v..(i + 1) * v], ids[i + 1])).sum()
        }
    };
    let secs = t.elapsed().as_secs_f64();
    let mut o = std::io::stdout().lock();
    if ids.len() > 1 {
        let mean = nll / (ids.len() - 1) as f64;
        writeln!(o, "tokens {}  mean NLL {mean:.6}  perplexity {:.4}", ids.len(), mean.exp())?;
    } else {
        writeln!(o, "tokens 1 (no next-token predictions to score)")?;
    }
    eprintln!("{} tokens in {:.3} s ({:.1} tok/s)", ids.len(), secs, ids.len() as f64 / secs);
    crate::cli::load::report_profile(&session)?;
    Ok(())
}
