//! Perplexity as llama.cpp's `llama-perplexity` computes it, so the two can be compared on
//! the same file and text: the whole text tokenized once (with BOS where the vocabulary adds
//! one), cut into `tokens / n_ctx` chunks of n_ctx tokens whose first token is replaced by
//! BOS, each evaluated from an empty context, and the next-token predictions of the second
//! half of each chunk (positions n_ctx/2 .. n_ctx - 2) scored.

use crate::error::{KilnError, Result};
use crate::kernels::nll::nll_of;
use crate::model::{Output, Session};

/// Where the log-softmax of each scored position is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// On the GPU, reading back one float per scored token (`Session::score`).
    Gpu,
    /// Every logit read back and scored on the CPU in f64 (slower; checks the GPU path).
    Host,
}

/// How a text is cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    pub n_ctx: usize,
    pub n_chunks: usize,
}

impl Chunking {
    /// llama.cpp's chunking of `n_tokens` (BOS included) into chunks of `n_ctx`: as many as
    /// fit, at most `max_chunks`; it refuses texts shorter than two chunks.
    pub fn new(n_tokens: usize, n_ctx: usize, max_chunks: Option<usize>) -> Result<Chunking> {
        if n_ctx < 2 {
            return Err(KilnError::invalid("-c", format!("a context of {n_ctx} tokens leaves nothing to score")));
        }
        if n_tokens < 2 * n_ctx {
            return Err(KilnError::invalid(
                "text",
                format!(
                    "it tokenizes to only {n_tokens} tokens; perplexity with a context of {n_ctx} needs at least {} (lower -c)",
                    2 * n_ctx
                ),
            ));
        }
        let n_chunks = (n_tokens / n_ctx).min(max_chunks.unwrap_or(usize::MAX)).max(1);
        Ok(Chunking { n_ctx, n_chunks })
    }

    /// The first position of a chunk whose next token is scored.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }
}

/// Running sums of the scored negative log-likelihoods, in f64 as llama.cpp keeps them.
#[derive(Debug, Clone, Copy, Default)]
pub struct NllSums {
    pub sum: f64,
    pub sum_sq: f64,
    pub count: usize,
}

impl NllSums {
    pub fn add(&mut self, nlls: &[f32]) {
        for &v in nlls {
            let v = v as f64;
            self.sum += v;
            self.sum_sq += v * v;
        }
        self.count += nlls.len();
    }

    /// exp(mean NLL).
    pub fn perplexity(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// llama.cpp's "+/-": the standard error of the mean NLL carried to the perplexity
    /// (None when it is undefined: fewer than two tokens, or no spread).
    pub fn perplexity_error(&self) -> Option<f64> {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        (self.count > 1 && var > 0.0).then(|| (var / (n - 1.0)).sqrt() * self.perplexity())
    }
}

/// Evaluates chunk `c` of `tokens` from an empty context and returns the NLLs of its scored
/// positions (n_ctx - 1 - n_ctx/2 of them). The chunk's first token becomes `bos` when given.
pub fn score_chunk(
    session: &mut Session,
    tokens: &[u32],
    chunking: &Chunking,
    c: usize,
    bos: Option<u32>,
    scoring: Scoring,
) -> Result<Vec<f32>> {
    let n = chunking.n_ctx;
    let mut ids = tokens[c * n..(c + 1) * n].to_vec();
    if let Some(bos) = bos {
        ids[0] = bos;
    }
    session.reset();
    match scoring {
        Scoring::Gpu => session.score(&ids, chunking.first()),
        Scoring::Host => {
            let logits = session.forward(&ids, Output::AllLogits)?;
            let v = session.cfg.n_vocab as usize;
            Ok((chunking.first()..n - 1).map(|i| nll_of(&logits[i * v..(i + 1) * v], ids[i + 1]) as f32).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking_follows_llama_cpp() {
        assert_eq!(Chunking::new(1025, 512, None).unwrap(), Chunking { n_ctx: 512, n_chunks: 2 });
        assert_eq!(Chunking::new(5000, 512, Some(3)).unwrap().n_chunks, 3);
        assert_eq!(Chunking::new(5000, 512, None).unwrap().first(), 256);
        let err = Chunking::new(1023, 512, None).unwrap_err().to_string();
        assert!(err.contains("1023") && err.contains("1024"), "{err}");
    }

    #[test]
    fn sums_give_llama_cpp_estimate() {
        let mut s = NllSums::default();
        s.add(&[1.0, 2.0, 3.0]);
        // mean 2, variance 2/3, standard error sqrt(2/3 / 2).
        assert!((s.perplexity() - 2f64.exp()).abs() < 1e-12);
        let want = (1.0f64 / 3.0).sqrt() * 2f64.exp();
        assert!((s.perplexity_error().unwrap() - want).abs() < 1e-9);
        let mut flat = NllSums::default();
        flat.add(&[1.5, 1.5]);
        assert_eq!(flat.perplexity_error(), None);
    }
}
