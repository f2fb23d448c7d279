//! Sampling with llama.cpp's chain: repetition, frequency and presence penalties over the
//! recent tokens, then greedy, or top-k, top-p and min-p on the softmax of the candidates,
//! temperature, and a seeded draw. Generation samples on the GPU (wgsl/sample.wgsl, one
//! kernel chained with the decode steps); `Sampler` here is its CPU reference: the same steps
//! in the same order and the same f32 arithmetic, so both pick the same tokens wherever the
//! probabilities are not tied (up to the GPU's `exp` rounding at a draw's very edge).

/// Most candidates kept after top-k: top-k 0 ("off") means this many.
pub const SAMPLE_CAP: usize = 1024;

/// Most recent tokens the penalties can look at (`repeat_last_n` beyond it is capped).
pub const HISTORY_CAP: usize = 1024;

/// Most tokens a sampler can ban (the end-of-generation tokens of `--ignore-eos`).
pub const BAN_CAP: usize = 16;

/// Sampler settings; the defaults are llama.cpp's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off (then the `SAMPLE_CAP` most likely tokens).
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off.
    pub repeat_penalty: f32,
    /// Tokens of history the penalties look at (capped at `HISTORY_CAP`).
    pub repeat_last_n: usize,
    /// Subtracted once per occurrence in the window (OpenAI's frequency_penalty); 0 = off.
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurs in the window (OpenAI's presence_penalty); 0 = off.
    pub presence_penalty: f32,
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
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The candidates top-k keeps: `top_k`, with 0 and anything over the cap meaning the cap.
    pub fn effective_top_k(&self) -> usize {
        if self.top_k == 0 {
            SAMPLE_CAP
        } else {
            self.top_k.min(SAMPLE_CAP)
        }
    }

    /// The history tokens the penalties look at.
    pub fn penalty_window(&self) -> usize {
        self.repeat_last_n.min(HISTORY_CAP)
    }

    pub fn has_penalties(&self) -> bool {
        self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }
}

/// A 32-bit hash (PCG's output permutation): the RNG of both samplers.
fn pcg(v: u32) -> u32 {
    let s = v.wrapping_mul(747796405).wrapping_add(2891336453);
    let w = ((s >> ((s >> 28) + 4)) ^ s).wrapping_mul(277803737);
    (w >> 22) ^ w
}

/// Draw `n` of a seed: uniform in [0, 1) with 24 random bits (as wgsl/sample.wgsl).
pub fn uniform01(seed: u64, n: u32) -> f32 {
    let h = pcg(pcg(pcg(seed as u32) ^ (seed >> 32) as u32).wrapping_add(n));
    (h >> 8) as f32 * (1.0 / 16777216.0)
}

/// A seeded sampler: the same seed, logits and history give the same tokens.
pub struct Sampler {
    pub cfg: SamplerConfig,
    /// Draws made so far (the RNG's counter; greedy steps make none).
    pub draws: u32,
    // Reused across calls so sampling allocates nothing per token.
    cand: Vec<(u32, f32)>,
    counts: Vec<(u32, u32)>,
    /// Tokens never drawn (`--ignore-eos` bans the end-of-generation tokens, as llama.cpp
    /// does with a logit bias of -inf); at most `BAN_CAP`.
    pub banned: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        Sampler { cfg, draws: 0, cand: Vec::new(), counts: Vec::new(), banned: Vec::new() }
    }

    /// Never draw these tokens (at most `BAN_CAP` in all; more are refused).
    pub fn ban(&mut self, ids: impl IntoIterator<Item = u32>) -> crate::Result<()> {
        self.banned.extend(ids);
        if self.banned.len() > BAN_CAP {
            return Err(crate::KilnError::invalid("sampling", format!("at most {BAN_CAP} banned tokens")));
        }
        Ok(())
    }

    /// Applies the penalties for the last `penalty_window` tokens of `history` to `logits`.
    pub fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        let c = self.cfg;
        if !c.has_penalties() {
            return;
        }
        let window = &history[history.len().saturating_sub(c.penalty_window())..];
        self.counts.clear();
        for &t in window {
            match self.counts.iter_mut().find(|e| e.0 == t) {
                Some(e) => e.1 += 1,
                None => self.counts.push((t, 1)),
            }
        }
        for &(t, n) in &self.counts {
            if let Some(l) = logits.get_mut(t as usize) {
                // llama.cpp: divide positive logits, multiply negative ones.
                let mut v = if *l > 0.0 { *l / c.repeat_penalty } else { *l * c.repeat_penalty };
                v -= n as f32 * c.frequency_penalty + c.presence_penalty;
                *l = v;
            }
        }
    }

    /// Picks a token from `logits` given the `history` of tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let c = self.cfg;
        let mut penalized;
        let logits = if c.has_penalties() || !self.banned.is_empty() {
            penalized = logits.to_vec();
            self.apply_penalties(&mut penalized, history);
            for &t in &self.banned {
                if let Some(l) = penalized.get_mut(t as usize) {
                    *l = f32::MIN;
                }
            }
            &penalized[..]
        } else {
            logits
        };
        // The largest logit, lowest index on ties; NaN never counts.
        let mut best: Option<(u32, f32)> = None;
        for (i, &v) in logits.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|b| v > b.1) {
                best = Some((i as u32, v));
            }
        }
        if c.is_greedy() {
            return best.map(|b| b.0).unwrap_or(0);
        }
        // The top-k candidates, larger value first and lower index on ties.
        let k = c.effective_top_k();
        let mut cand = std::mem::take(&mut self.cand);
        cand.clear();
        cand.extend(logits.iter().enumerate().filter(|e| !e.1.is_nan()).map(|(i, &v)| (i as u32, v)));
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if cand.len() > k {
            cand.select_nth_unstable_by(k - 1, order);
            cand.truncate(k);
        }
        cand.sort_unstable_by(order);
        let pick = self.draw(&cand);
        self.cand = cand;
        pick
    }

    /// top-p, min-p, temperature and the draw over sorted candidates, in the order and f32
    /// arithmetic of the GPU kernel's last step.
    fn draw(&mut self, cand: &[(u32, f32)]) -> u32 {
        let c = self.cfg;
        if cand.is_empty() {
            return 0;
        }
        let mut keep = cand.len();
        let top = cand[0].1;
        let mut sum = 0f32;
        for e in &cand[..keep] {
            sum += (e.1 - top).exp();
        }
        if c.top_p < 1.0 {
            let mut acc = 0f32;
            for (i, e) in cand[..keep].iter().enumerate() {
                acc += (e.1 - top).exp() / sum;
                if acc >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let floor = c.min_p / sum;
            let mut k = 1;
            while k < keep && (cand[k].1 - top).exp() / sum >= floor {
                k += 1;
            }
            keep = k;
        }
        let mut total = 0f32;
        for e in &cand[..keep] {
            total += ((e.1 - top) / c.temperature).exp();
        }
        let mut r = uniform01(c.seed, self.draws) * total;
        self.draws = self.draws.wrapping_add(1);
        let mut pick = cand[keep.max(1) - 1].0;
        for e in &cand[..keep] {
            let w = ((e.1 - top) / c.temperature).exp();
            if r < w {
                pick = e.0;
                break;
            }
            r -= w;
        }
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
        g.ban([best]).unwrap();
        assert_ne!(g.sample(&l, &[]), best);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: 9,
            ..Default::default()
        });
        s.ban([best]).unwrap();
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
