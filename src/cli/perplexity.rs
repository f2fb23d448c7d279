//! `kiln perplexity`: perplexity of a text file by llama.cpp's method and in its output
//! format (see `crate::perplexity`): the running estimate after each chunk, `[1]x,[2]y,…`,
//! then `Final estimate: PPL = X +/- Y`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::perplexity::{score_chunk, Chunking, NllSums, Scoring};
use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    /// Model flags; -c is the chunk size here (default 512, as llama-perplexity's).
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Read every logit back and score on the CPU in f64 (slower; checks the GPU scoring).
    #[arg(long = "score-on-cpu")]
    pub score_on_cpu: bool,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| KilnError::File { path: args.file.clone(), message: e.to_string() })?;
    // llama.cpp's -f drops one final newline.
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let mut margs = args.model.clone();
    let (model, tok) = load_model(&mut margs)?;
    // The whole text at once, with BOS where the vocabulary adds one (llama.cpp's
    // common_tokenize(ctx, text, true)).
    let add_bos = tok.add_bos_default();
    let tokens = tok.encode(text, add_bos)?;
    let n_ctx = margs.ctx_size.unwrap_or(512);
    margs.ctx_size = Some(n_ctx);
    if n_ctx > model.cfg.n_ctx_train {
        eprintln!(
            "kiln: warning: the model was trained on only {} context tokens ({n_ctx} specified)",
            model.cfg.n_ctx_train
        );
    }
    let chunking = Chunking::new(tokens.len(), n_ctx as usize, args.chunks)?;
    let mut session = open_session(&model, &margs, n_ctx, true)?;
    let scoring = if args.score_on_cpu { Scoring::Host } else { Scoring::Gpu };
    let bos = if add_bos { tok.bos() } else { None };
    eprintln!(
        "kiln: {} tokens; perplexity over {} chunks of {n_ctx}, scored on the {}",
        tokens.len(),
        chunking.n_chunks,
        if scoring == Scoring::Gpu { "GPU" } else { "CPU" }
    );

    let mut sums = NllSums::default();
    let t = Instant::now();
    let mut o = std::io::stdout().lock();
    for c in 0..chunking.n_chunks {
        sums.add(&score_chunk(&mut session, &tokens, &chunking, c, bos, scoring)?);
        write!(o, "[{}]{:.4},", c + 1, sums.perplexity())?;
        o.flush()?;
    }
    writeln!(o)?;
    match sums.perplexity_error() {
        Some(err) => writeln!(o, "Final estimate: PPL = {:.4} +/- {err:.5}", sums.perplexity())?,
        None => writeln!(o, "Final estimate: PPL = {:.4}", sums.perplexity())?,
    }
    let (n, secs) = (chunking.n_chunks * chunking.n_ctx, t.elapsed().as_secs_f64());
    eprintln!("{n} tokens in {secs:.2} s ({:.1} tok/s)", n as f64 / secs);
    crate::cli::load::report_profile(&session)?;
    Ok(())
}
