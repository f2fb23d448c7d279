//! Sequences sharing one session (the server's slots). Sequence s owns rows
//! [s * n_ctx, (s + 1) * n_ctx) of the one preallocated KV cache, and has its own position and
//! sampler (configuration and state). Its prompt goes into its region through the usual steps
//! with that region's first row as the KV base. A batched decode step feeds one token to each
//! of up to `sizes::batch_columns` sequences: the GEMVs read the weights once for all of them,
//! and the Q/K/V epilogue, decode attention and the sampler take each column's position,
//! region and slot from the table the step buffer holds, written once per step. Sequence 0 is
//! the one the single-sequence API (`forward`, chained decoding) works on.

use super::forward::StepShape;
use super::{Output, Picker, PrefillAttnOps, Session};
use crate::error::{KilnError, Result};
use crate::kernels::flash_attention::{self, Chunk};
use crate::kernels::matmul::{step_table, StepColumn, StepState};
use crate::model::sizes::pad4;
use crate::profile::Recorder;
use crate::sample::Sampler;

/// A chunk of one sequence's prompt for `Session::prefill_slots`.
#[derive(Debug, Clone, Copy)]
pub struct PromptChunk<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    /// The prompt's last chunk: its slot's sampler picks the token after it.
    pub pick: bool,
}

/// What a column of a pipelined batched step (`Session::submit_slots`) feeds its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// A token the host knows (a prompt's first pick, or one read back).
    Token(u32),
    /// The token the last submitted batched step picked for this slot, still on the GPU.
    Picked,
}

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

    /// Whether prompts of several sequences can go through one step (`prefill_slots`): every
    /// layer has the stacked Q/K/V projection (its epilogue takes each row's position from
    /// the step's table) and flash attention (it takes each chunk's from its own table).
    pub fn can_prefill_together(&self) -> bool {
        self.batch_cols > 1 && self.layers.iter().all(|l| matches!(l.attn_prefill, PrefillAttnOps::Flash { .. }))
    }

    /// Feeds each chunk to its slot's sequence (distinct slots) and returns, for each chunk
    /// that `pick`s, its slot's sampled next token, in `chunks`' order. Where the session can
    /// (`can_prefill_together`) and the chunks together fill more than the GEMV's columns and at
    /// most one step (`ubatch` tokens), they go through the model as one step: the weights
    /// read once for all of them, each row at its own position in its own region, attention
    /// per chunk. Else one step per chunk, as `forward_slot`.
    pub fn prefill_slots(&mut self, chunks: &[PromptChunk]) -> Result<Vec<Option<u32>>> {
        self.prerecorded = None;
        let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        for (i, c) in chunks.iter().enumerate() {
            self.check_slot(c.slot)?;
            if chunks[..i].iter().any(|d| d.slot == c.slot) {
                return Err(KilnError::invalid("slot", format!("slot {} appears twice in one step", c.slot)));
            }
        }
        let together = chunks.len() > 1
            && chunks.len() <= self.batch_cols
            && total > self.prefill_gemv_cols as usize
            && total <= self.opts.ubatch as usize
            && self.can_prefill_together()
            && !crate::config::prefill_together_disabled();
        if !together {
            let mut picks = Vec::with_capacity(chunks.len());
            for c in chunks {
                // A pick is needed to end the step; greedy leaves the sampler's state alone.
                let out = if c.pick { Output::Sampled } else { Output::Argmax };
                let got = self.forward_in(c.slot, c.tokens, out)?;
                picks.push(c.pick.then(|| got[0] as u32));
            }
            return Ok(picks);
        }
        let n_ctx = self.opts.n_ctx;
        let mut cols = Vec::with_capacity(total);
        let mut ids = Vec::with_capacity(total);
        let mut attn = Vec::with_capacity(chunks.len());
        // The head's rows: each picking chunk's last.
        let mut heads: Vec<usize> = Vec::new();
        for c in chunks {
            self.check_tokens(c.slot, c.tokens)?;
            let pos0 = self.pos[c.slot];
            let kv_base = c.slot as u32 * n_ctx;
            for (j, &t) in c.tokens.iter().enumerate() {
                let pos = pos0 + j as u32;
                cols.push(StepColumn { pos, kv_len: pos + 1, kv_base, slot: c.slot as u32 });
                ids.push(t);
            }
            attn.push(Chunk { m: c.tokens.len() as u32, pos0, kv_base });
            if c.pick {
                heads.push(cols.len() - 1);
            }
        }
        let t0 = std::time::Instant::now();
        let ctx = self.ctx.clone();
        let (launch, table) = flash_attention::launch_segments(self.kv, &self.shape, &attn, &ctx.caps)?;
        let q = &ctx.queue;
        q.write_buffer(&self.step_state, 0, &step_table(&cols));
        q.write_buffer(&self.chunks, 0, bytemuck::cast_slice(&table));
        q.write_buffer(&self.ids, 0, bytemuck::cast_slice(&ids));
        // The columns the sampler reads for the head's rows.
        let head_cols: Vec<StepColumn> = heads.iter().map(|&row| cols[row]).collect();
        if !head_cols.is_empty() {
            q.write_buffer(&self.head_cols, 0, bytemuck::cast_slice(&head_cols));
        }
        let m = total as u32;
        let shape = StepShape { m, pos0: 0, kv_base: 0, batched: None, table_sampler: true, together: Some(launch) };
        let k = heads.len() as u32;
        let row_bytes = pad4(self.cfg.n_embd) as u64 * 4;
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("prompts") });
        {
            let mut rec = Recorder::new(&mut enc, "prompts", None);
            let mut recorded = self.record_step(&mut rec, &shape, false);
            if recorded.is_ok() && k > 0 {
                // The picking rows' hidden states side by side, and the table the sampler
                // reads for them in place of the layers' (which have read theirs).
                let e = rec.encoder();
                for (i, &row) in heads.iter().enumerate() {
                    e.copy_buffer_to_buffer(
                        &self.x,
                        row as u64 * row_bytes,
                        &self.x_last,
                        i as u64 * row_bytes,
                        row_bytes,
                    );
                }
                let header = std::mem::size_of::<StepState>() as u64;
                let bytes = k as u64 * std::mem::size_of::<StepColumn>() as u64;
                e.copy_buffer_to_buffer(&self.head_cols, 0, &self.step_state, header, bytes);
                recorded = self.record_head(&mut rec, &self.lm_head_last, k, Output::Sampled, Picker::Table);
            }
            rec.finish();
            recorded?;
        }
        if k > 0 {
            enc.copy_buffer_to_buffer(&self.out_id, 0, &self.readback, 0, k as u64 * 4);
        }
        let t1 = std::time::Instant::now();
        ctx.queue.submit([enc.finish()]);
        self.host.steps += 1;
        self.host.encode += (t1 - t0).as_secs_f64();
        self.host.submit += t1.elapsed().as_secs_f64();
        for c in chunks {
            self.pos[c.slot] += c.tokens.len() as u32;
        }
        let mut picks = Vec::new();
        if k > 0 {
            let t = std::time::Instant::now();
            let bytes = self.read(k as u64 * 4)?;
            self.host.wait += t.elapsed().as_secs_f64();
            picks = bytemuck::pod_collect_to_vec::<u8, u32>(&bytes);
        }
        let mut picks = picks.into_iter();
        Ok(chunks.iter().map(|c| if c.pick { picks.next() } else { None }).collect())
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
        let shape = self.write_step_table(group.iter().map(|g| g.0));
        let ids: Vec<u32> = group.iter().map(|g| g.1).collect();
        let got = self.run_step(&ids, &shape, out, true)?;
        for &(slot, _) in group {
            self.pos[slot] += 1;
        }
        self.count_step(group.len() as u64);
        Ok(got)
    }

    /// Writes the step buffer's table for a batched step over `slots` (each column at its
    /// slot's position, in its region) and returns the step's shape.
    fn write_step_table(&self, slots: impl Iterator<Item = usize>) -> StepShape {
        let n_ctx = self.opts.n_ctx;
        let cols: Vec<StepColumn> = slots
            .map(|slot| {
                let pos = self.pos[slot];
                StepColumn { pos, kv_len: pos + 1, kv_base: slot as u32 * n_ctx, slot: slot as u32 }
            })
            .collect();
        self.ctx.queue.write_buffer(&self.step_state, 0, &step_table(&cols));
        let longest = cols.iter().map(|c| c.kv_len).max().unwrap_or(1);
        StepShape {
            m: cols.len() as u32,
            pos0: 0,
            kv_base: 0,
            batched: Some(longest),
            table_sampler: true,
            together: None,
        }
    }

    /// Whether batched steps can be pipelined (`submit_slots`): more than one column a step.
    pub fn can_pipeline(&self) -> bool {
        self.batch_cols > 1
    }

    /// Submits one batched decode step over `batch` (distinct slots, at most
    /// `batch_columns`) without waiting for it: `finish_slots` returns its picks. A column fed
    /// `Feed::Picked` takes the token the last submitted step picked for its slot straight
    /// from GPU memory, so the next step can be submitted before the host has read the last
    /// one and the GPU never waits for the host (as `generate_chained` for one sequence). At
    /// most two steps are in flight. A prompt's step (`forward_slot`) may run in between: it
    /// waits for the steps before it.
    pub fn submit_slots(&mut self, batch: &[(usize, Feed)]) -> Result<()> {
        self.prerecorded = None;
        if batch.is_empty() || batch.len() > self.batch_cols || !self.can_pipeline() {
            return Err(KilnError::invalid(
                "batched step",
                format!(
                    "{} columns for a pipelined step of at most {} (and more than 1)",
                    batch.len(),
                    self.batch_cols
                ),
            ));
        }
        if self.steps_in_flight.len() >= 2 {
            return Err(KilnError::invalid("batched step", "two steps are in flight: finish one first"));
        }
        let mut picked_from = Vec::with_capacity(batch.len());
        for (i, &(slot, feed)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|b| b.0 == slot) {
                return Err(KilnError::invalid("slot", format!("slot {slot} appears twice in one step")));
            }
            match feed {
                Feed::Token(t) => {
                    self.check_column(slot, t)?;
                    picked_from.push(None);
                }
                Feed::Picked => {
                    // Any token: the sampler picked it from the vocabulary.
                    self.check_column(slot, 0)?;
                    let Some(prev) = self.last_step_slots.iter().position(|&s| s == slot) else {
                        return Err(KilnError::invalid(
                            "slot",
                            format!("slot {slot} was not in the last step, so it has no pick to feed"),
                        ));
                    };
                    picked_from.push(Some(prev as u64));
                }
            }
        }
        let t0 = std::time::Instant::now();
        let ctx = self.ctx.clone();
        let shape = self.write_step_table(batch.iter().map(|b| b.0));
        let m = shape.m;
        // Known tokens now; picks are copied over them on the GPU, before the step reads them.
        let ids: Vec<u32> = batch.iter().map(|b| if let Feed::Token(t) = b.1 { t } else { 0 }).collect();
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(&ids));
        let mut enc =
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("batched step") });
        let unchanged = picked_from.iter().enumerate().all(|(i, p)| *p == Some(i as u64));
        if unchanged && self.last_step_slots.len() == batch.len() {
            // The same sequences in the same order (the steady state): one copy.
            enc.copy_buffer_to_buffer(&self.step_picks, 0, &self.ids, 0, m as u64 * 4);
        } else {
            for (i, from) in picked_from.iter().enumerate() {
                if let Some(prev) = from {
                    enc.copy_buffer_to_buffer(&self.step_picks, prev * 4, &self.ids, i as u64 * 4, 4);
                }
            }
        }
        {
            let mut rec = Recorder::new(&mut enc, "batched step", None);
            let recorded = self.record_forward(&mut rec, &shape, Output::Sampled, false);
            rec.finish();
            recorded?;
        }
        let stage = self.next_stage;
        enc.copy_buffer_to_buffer(&self.out_id, 0, &self.step_picks, 0, m as u64 * 4);
        enc.copy_buffer_to_buffer(&self.out_id, 0, &self.chain_stage[stage], 0, m as u64 * 4);
        let t1 = std::time::Instant::now();
        let index = ctx.queue.submit([enc.finish()]);
        self.host.steps += 1;
        self.host.encode += (t1 - t0).as_secs_f64();
        self.host.submit += t1.elapsed().as_secs_f64();
        self.steps_in_flight.push_back((index, stage, m as usize));
        self.next_stage = 1 - stage;
        self.last_step_slots = batch.iter().map(|b| b.0).collect();
        for &(slot, _) in batch {
            self.pos[slot] += 1;
        }
        self.count_step(batch.len() as u64);
        Ok(())
    }

    /// Waits for the oldest step `submit_slots` submitted and returns its picks, in its
    /// columns' order.
    pub fn finish_slots(&mut self) -> Result<Vec<u32>> {
        let Some((index, stage, m)) = self.steps_in_flight.pop_front() else {
            return Err(KilnError::invalid("batched step", "no step in flight"));
        };
        let t = std::time::Instant::now();
        let bytes =
            self.ctx.read_mapped(&self.chain_stage[stage], m as u64 * 4, Some(index), "a batched decode step")?;
        let picks: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        self.host.wait += t.elapsed().as_secs_f64();
        Ok(picks)
    }

    /// Batched steps submitted and not yet finished.
    pub fn slot_steps_in_flight(&self) -> usize {
        self.steps_in_flight.len()
    }

    fn count_step(&mut self, sequences: u64) {
        self.batches.steps += 1;
        self.batches.tokens += sequences;
        self.batches.widest = self.batches.widest.max(sequences);
    }
}
