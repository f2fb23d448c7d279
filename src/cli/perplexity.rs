//! `kiln perplexity`: perplexity of a text file by llama.cpp's method: chunks of n_ctx
//! tokens (each starting with BOS), scoring the predictions of the second half of each.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::model::Output;
use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| KilnError::File { path: args.file.clone(), message: e.to_string() })?;
    let mut margs = args.model.clone();
    let (model, tok) = load_model(&mut margs)?;
    let tokens = tok.encode(&text, false)?;
    let n_ctx = margs.ctx_size.unwrap_or(512).min(model.cfg.n_ctx_train.max(16));
    margs.ctx_size = Some(n_ctx);
    let mut session = open_session(&model, &margs, n_ctx, true)?;
    let n = n_ctx as usize;
    let chunks = tokens.len() / n;
    if chunks == 0 {
        return Err(KilnError::invalid(
            "text",
            format!("{} tokens is less than one chunk of {n} (lower -c)", tokens.len()),
        ));
    }
    let v = model.cfg.n_vocab as usize;
    let first = n / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    let t = Instant::now();
    let mut o = std::io::stdout().lock();
    for c in 0..chunks {
        let mut ids = tokens[c * n..(c + 1) * n].to_vec();
        if let (true, Some(b)) = (tok.add_bos_default(), tok.bos()) {
            ids[0] = b;
        }
        session.reset();
        let logits = session.forward(&ids, Output::AllLogits)?;
        for i in first..n - 1 {
            let row = &logits[i * v..(i + 1) * v];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            nll += lse - row[tokens[c * n + i + 1] as usize] as f64;
            count += 1;
        }
        write!(o, "[{}]{:.4},", c + 1, (nll / count as f64).exp())?;
        o.flush()?;
    }
    writeln!(o)?;
    writeln!(o, "Final estimate: PPL = {:.4} over {chunks} chunks of {n} tokens", (nll / count as f64).exp())?;
    eprintln!("{} tokens in {:.2} s", chunks * n, t.elapsed().as_secs_f64());
    crate::cli::load::report_profile(&session)?;
    Ok(())
}
