//! Sampling: greedy on the GPU (argmax), or on the CPU from the last logits with llama.cpp's
//! chain: repetition penalty, top-k, top-p, min-p, temperature, then a seeded draw.

/// Sampler settings; the defaults are llama.cpp's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off.
    pub repeat_penalty: f32,
    /// Tokens of history the penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// A seeded sampler: the same seed and logits give the same tokens.
pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: u64,
    // Reused across calls so sampling allocates nothing per token.
    cand: Vec<(u32, f32)>,
    probs: Vec<f32>,
    weights: Vec<f64>,
    /// Tokens never drawn (`--ignore-eos` bans the end-of-generation tokens, as llama.cpp
    /// does with a logit bias of -inf).
    banned: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        Sampler {
            cfg,
            rng: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
            cand: Vec::new(),
            probs: Vec::new(),
            weights: Vec::new(),
            banned: Vec::new(),
        }
    }

    /// Never draw these tokens.
    pub fn ban(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.banned.extend(ids);
    }

    /// Whether sampling is a plain argmax of the logits (greedy, no penalty, nothing banned),
    /// which the GPU can do without reading the logits back.
    pub fn is_plain_argmax(&self) -> bool {
        self.cfg.is_greedy() && self.cfg.repeat_penalty == 1.0 && self.banned.is_empty()
    }

    fn next_f64(&mut self) -> f64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks a token from `logits` given the `history` of tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let c = self.cfg;
        let mut cand = std::mem::take(&mut self.cand);
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        if c.repeat_penalty != 1.0 {
            let start = history.len().saturating_sub(c.repeat_last_n);
            for &t in &history[start..] {
                if let Some(e) = cand.get_mut(t as usize) {
                    // llama.cpp: divide positive logits, multiply negative ones.
                    e.1 = if e.1 > 0.0 { e.1 / c.repeat_penalty } else { e.1 * c.repeat_penalty };
                }
            }
        }
        for &t in &self.banned {
            if let Some(e) = cand.get_mut(t as usize) {
                e.1 = f32::NEG_INFINITY;
            }
        }
        if c.is_greedy() {
            let best = cand.iter().fold((0u32, f32::NEG_INFINITY), |b, &e| if e.1 > b.1 { e } else { b }).0;
            self.cand = cand;
            return best;
        }
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if c.top_k > 0 {
            cand.truncate(c.top_k.max(1));
        }
        // Softmax over what is left (sorted, so the max is first).
        let max = cand[0].1;
        let mut probs = std::mem::take(&mut self.probs);
        probs.clear();
        probs.extend(cand.iter().map(|e| (e.1 - max).exp()));
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        // top-p: the smallest prefix whose probability reaches p.
        let mut keep = probs.len();
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        // min-p: drop tokens less likely than min_p times the best one.
        if c.min_p > 0.0 {
            let floor = probs[0] * c.min_p;
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        cand.truncate(keep);
        // Temperature on the survivors, then draw.
        let mut weights = std::mem::take(&mut self.weights);
        weights.clear();
        weights.extend(cand.iter().map(|e| (((e.1 - max) / c.temperature) as f64).exp()));
        let total: f64 = weights.iter().sum();
        let mut r = self.next_f64() * total;
        let mut pick = cand[cand.len() - 1].0;
        for (e, w) in cand.iter().zip(&weights) {
            if r < *w {
                pick = e.0;
                break;
            }
            r -= w;
        }
        self.cand = cand;
        self.probs = probs;
        self.weights = weights;
        pick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37 % 100) as f32) / 10.0).collect()
    }

    #[test]
    fn greedy_takes_the_maximum() {
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, ..Default::default() });
        let l = logits();
        let best = l.iter().enumerate().fold(0, |b, (i, &v)| if v > l[b] { i } else { b });
        assert_eq!(s.sample(&l, &[]), best as u32);
    }

    #[test]
    fn same_seed_same_tokens() {
        let l = logits();
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                top_k: 0,
                min_p: 0.0,
                top_p: 1.0,
                temperature: 1.0,
                ..Default::default()
            });
            (0..50).map(|_| s.sample(&l, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let l = logits();
        let mut s = Sampler::new(SamplerConfig { top_k: 1, temperature: 1.5, seed: 3, ..Default::default() });
        let mut g = Sampler::new(SamplerConfig { temperature: 0.0, ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&l, &[]), g.sample(&l, &[]));
        }
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut l = vec![0.0f32; 10];
        l[3] = 2.0;
        l[5] = 1.9;
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, repeat_penalty: 1.5, ..Default::default() });
        assert_eq!(s.sample(&l, &[3]), 5);
        assert_eq!(s.sample(&l, &[]), 3);
    }

    #[test]
    fn banned_tokens_are_never_drawn() {
        let l = logits();
        let best = l.iter().enumerate().fold(0, |b, (i, &v)| if v > l[b] { i } else { b }) as u32;
        let mut g = Sampler::new(SamplerConfig { temperature: 0.0, ..Default::default() });
        assert!(g.is_plain_argmax());
        g.ban([best]);
        assert!(!g.is_plain_argmax());
        assert_ne!(g.sample(&l, &[]), best);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: 9,
            ..Default::default()
        });
        s.ban([best]);
        assert!((0..200).all(|_| s.sample(&l, &[]) != best));
    }

    #[test]
    fn draws_follow_the_distribution() {
        // Two tokens with probabilities 0.25 / 0.75 at temperature 1.
        let l = vec![0.0f32, 3f32.ln()];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        });
        let ones = (0..20000).filter(|_| s.sample(&l, &[]) == 1).count() as f64 / 20000.0;
        assert!((ones - 0.75).abs() < 0.02, "{ones}");
    }
}
