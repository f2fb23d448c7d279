//! Sequences sharing one session (the server's slots). Sequence s owns rows
//! [s * n_ctx, (s + 1) * n_ctx) of the one preallocated KV cache, and has its own position and
//! sampler (configuration and state). Its prompt goes into its region through the usual steps
//! with that region's first row as the KV base. A batched decode step feeds one token to each
//! of up to `sizes::batch_columns` sequences: the GEMVs read the weights once for all of them,
//! and the Q/K/V epilogue, decode attention and the sampler take each column's position,
//! region and slot from the table the step buffer holds, written once per step. Sequence 0 is
//! the one the single-sequence API (`forward`, chained decoding) works on.

use super::forward::StepShape;
use super::{Output, Session};
use crate::error::{KilnError, Result};
use crate::kernels::matmul::{step_table, StepColumn};
use crate::sample::Sampler;

/// What decode steps over sequences carried so far (for the server's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// GPU decode steps run by `decode_slots`, ...
    pub steps: u64,
    /// ... the tokens they fed (one per sequence and step), ...
    pub tokens: u64,
    /// ... and the most sequences one step carried.
    pub widest: u64,
}

impl Session {
    /// Sequences the session holds (`SessionOptions::n_seq`).
    pub fn sequences(&self) -> usize {
        self.pos.len()
    }

    /// The most sequences one decode step carries: the GEMV's columns (the int8 GEMV's where
    /// decode runs on it) where every layer can run a batched step, else 1 (`decode_slots`
    /// then steps them one after another).
    pub fn batch_columns(&self) -> usize {
        self.batch_cols
    }

    pub fn batch_stats(&self) -> BatchStats {
        self.batches
    }

    /// The counts so far, and fresh ones from now on.
    pub fn take_batch_stats(&mut self) -> BatchStats {
        std::mem::take(&mut self.batches)
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.pos.len() {
            return Err(KilnError::invalid("slot", format!("no slot {slot} (the session has {})", self.pos.len())));
        }
        Ok(())
    }

    /// Tokens in `slot`'s region of the cache.
    pub fn slot_position(&self, slot: usize) -> Result<u32> {
        self.check_slot(slot)?;
        Ok(self.pos[slot])
    }

    /// Rewinds `slot` to its first `keep` tokens (they stay valid in its region).
    pub fn truncate_slot(&mut self, slot: usize, keep: u32) -> Result<()> {
        self.check_slot(slot)?;
        self.pos[slot] = self.pos[slot].min(keep);
        Ok(())
    }

    /// Configures `slot`'s sampler as `sampler` is, with `history` (the prompt) for the
    /// penalties (`set_sampling` for one slot).
    pub fn set_slot_sampling(&mut self, slot: usize, sampler: &Sampler, history: &[u32]) -> Result<()> {
        self.check_slot(slot)?;
        self.set_sampling_in(slot, sampler, history);
        Ok(())
    }

    /// Feeds `tokens` to `slot`'s sequence (`forward` in its region: a prompt chunk), and
    /// returns what `out` asks for (`Sampled`: its sampler's pick).
    pub fn forward_slot(&mut self, slot: usize, tokens: &[u32], out: Output) -> Result<Vec<f32>> {
        self.check_slot(slot)?;
        if out == Output::AllLogits {
            return Err(KilnError::invalid("slot", "a slot's steps return the last position's output"));
        }
        self.forward_in(slot, tokens, out)
    }

    /// Whether `slot` can take `token` in a decode step: a slot of this session, a token of
    /// the vocabulary, room in its region.
    pub fn check_column(&self, slot: usize, token: u32) -> Result<()> {
        self.check_slot(slot)?;
        if token >= self.cfg.n_vocab {
            return Err(KilnError::invalid(
                "input",
                format!("token id {token} is outside the vocabulary of {}", self.cfg.n_vocab),
            ));
        }
        if self.pos[slot] >= self.opts.n_ctx {
            return Err(KilnError::invalid("input", format!("slot {slot}'s context of {} is full", self.opts.n_ctx)));
        }
        Ok(())
    }

    /// Decode steps feeding each `(slot, token)` of `batch` (distinct slots) and returning
    /// each slot's sampled token, in `batch`'s order: batched steps of up to `batch_columns`
    /// sequences each.
    pub fn decode_slots(&mut self, batch: &[(usize, u32)]) -> Result<Vec<u32>> {
        let got = self.decode_batch(batch, Output::Sampled)?;
        Ok(got.into_iter().map(|id| id as u32).collect())
    }

    /// As `decode_slots`, returning each column's logits ([batch, n_vocab]) instead of a pick
    /// (tests: a batched step's logits against each sequence's own session).
    pub fn decode_slots_logits(&mut self, batch: &[(usize, u32)]) -> Result<Vec<f32>> {
        self.decode_batch(batch, Output::LastLogits)
    }

    fn decode_batch(&mut self, batch: &[(usize, u32)], out: Output) -> Result<Vec<f32>> {
        if batch.is_empty() {
            return Err(KilnError::invalid("input", "no sequences to decode"));
        }
        for (i, &(slot, token)) in batch.iter().enumerate() {
            self.check_column(slot, token)?;
            if batch[..i].iter().any(|b| b.0 == slot) {
                return Err(KilnError::invalid("slot", format!("slot {slot} appears twice in one step")));
            }
        }
        let mut got = Vec::new();
        if self.batch_cols == 1 {
            // One step per sequence.
            for &(slot, token) in batch {
                got.extend(self.forward_in(slot, &[token], out)?);
                self.count_step(1);
            }
            return Ok(got);
        }
        for group in batch.chunks(self.batch_columns()) {
            got.extend(self.batch_step(group, out)?);
        }
        Ok(got)
    }

    /// One batched decode step over `group` (checked; at most `batch_columns`): the step
    /// buffer's table says each column's position, region and slot.
    fn batch_step(&mut self, group: &[(usize, u32)], out: Output) -> Result<Vec<f32>> {
        let n_ctx = self.opts.n_ctx;
        let cols: Vec<StepColumn> = group
            .iter()
            .map(|&(slot, _)| {
                let pos = self.pos[slot];
                StepColumn { pos, kv_len: pos + 1, kv_base: slot as u32 * n_ctx, slot: slot as u32 }
            })
            .collect();
        let ids: Vec<u32> = group.iter().map(|g| g.1).collect();
        self.ctx.queue.write_buffer(&self.step_state, 0, &step_table(&cols));
        let longest = cols.iter().map(|c| c.kv_len).max().unwrap_or(1);
        let shape =
            StepShape { m: cols.len() as u32, pos0: 0, kv_base: 0, batched: Some(longest), table_sampler: true };
        let got = self.run_step(&ids, &shape, out, true)?;
        for &(slot, _) in group {
            self.pos[slot] += 1;
        }
        self.count_step(group.len() as u64);
        Ok(got)
    }

    fn count_step(&mut self, sequences: u64) {
        self.batches.steps += 1;
        self.batches.tokens += sequences;
        self.batches.widest = self.batches.widest.max(sequences);
    }
}
