//! The sequence slots the engine schedules, behind one small interface. `BatchedSlots` (the
//! default): the slots are the sequences of one session, each with a region of one shared KV
//! cache, and a decode step advances up to eight of them in one pass over the weights
//! (`Session::decode_slots`). `SessionSlots` (`KILN_SERVE_SLOTS=sessions`): one session per
//! slot, stepped one after another, kept to compare against.

use crate::engine::Model;
use crate::error::{KilnError, Result};
use crate::gpu::kv_storage_size;
use crate::model::session::{Feed, PromptChunk};
use crate::model::{Output, Session, SessionOptions, SessionSizes};
use crate::sample::Sampler;
use crate::server::metrics::BatchCounts;

/// Index of a slot, `0..Slots::count()`.
pub type SlotId = usize;

/// What the engine needs of the GPU: slots with a KV cache of `n_ctx()` tokens each and a
/// sampler each.
pub trait Slots {
    fn count(&self) -> usize;
    /// Context of each slot, in tokens.
    fn n_ctx(&self) -> u32;
    /// Starts a request on `slot`: its cache keeps its first `keep` tokens (still valid from
    /// the last request) and its sampler is configured as `sampler`, with `history` (the
    /// whole prompt) as what the penalties look back on.
    fn start(&mut self, slot: SlotId, keep: u32, sampler: &Sampler, history: &[u32]) -> Result<()>;
    /// Appends a chunk of the prompt to `slot`'s cache; for the last chunk, returns the token
    /// sampled after it.
    fn prefill(&mut self, slot: SlotId, tokens: &[u32], last: bool) -> Result<Option<u32>>;
    /// Appends a chunk of the prompt to each of several slots' caches (distinct slots), as
    /// `prefill` for each: one step for all of them where the slots can. Returns each chunk's
    /// result in order (a step that fails fails all of its chunks).
    fn prefill_many(&mut self, chunks: &[(SlotId, &[u32], bool)]) -> Vec<Result<Option<u32>>> {
        chunks.iter().map(|&(slot, tokens, last)| self.prefill(slot, tokens, last)).collect()
    }
    /// One decode step: feeds each slot its token and returns the token sampled next, in the
    /// order of `batch`. One slot's failure does not fail the others.
    fn decode_step(&mut self, batch: &[(SlotId, u32)]) -> Vec<Result<u32>>;
    /// Whether decode steps can be pipelined (`submit_step`, `finish_step`): the next step
    /// submitted before the last one's picks are read, so the GPU never waits for the host.
    /// Else the engine runs each step with `decode_step`.
    fn pipelined(&self) -> bool {
        false
    }
    /// Submits one decode step over `batch` without waiting for it (pipelined slots): each
    /// slot is fed a token the host knows, or (`Feed::Picked`) the one the last submitted
    /// step picked for it. At most two steps are in flight.
    fn submit_step(&mut self, _batch: &[(SlotId, Feed)]) -> Result<()> {
        Err(KilnError::invalid("decode step", "these slots do not pipeline their steps"))
    }
    /// The picks of the oldest submitted step, in the order of its batch.
    fn finish_step(&mut self) -> Result<Vec<u32>> {
        Err(KilnError::invalid("decode step", "these slots do not pipeline their steps"))
    }
    /// GPU memory in live buffers, for the metrics.
    fn gpu_memory_bytes(&self) -> u64 {
        0
    }
    /// A fault that leaves the slots unusable (a lost device), once one happened.
    fn fault(&self) -> Option<String> {
        None
    }
    /// What the GPU's decode steps carried so far: steps, tokens, the widest step.
    fn batch_counts(&self) -> BatchCounts {
        BatchCounts::default()
    }
}

/// The slots as the sequences of one session: one KV cache of `count` regions, and decode
/// steps that feed every generating slot at once (up to the GEMV's columns per step).
pub struct BatchedSlots {
    session: Session,
}

impl BatchedSlots {
    /// `count` slots of `opts.n_ctx` tokens each on `model` (one session of `count` sequences).
    pub fn open(model: &Model, opts: SessionOptions, count: usize) -> Result<BatchedSlots> {
        let mut session = model.session(SessionOptions { n_seq: count as u32, ..opts })?;
        // The server's steps after a prompt are its own, not a chained generation.
        session.set_prerecord(false);
        Ok(BatchedSlots { session })
    }

    /// The session (tests).
    pub fn session(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Builds every pipeline the engine uses before the first request (see
    /// `SessionSlots::warm_up`): prompt chunks of the planner's kinds on slot 0, two prompts
    /// prefilled together, then decode steps of one slot and of as many as one step carries;
    /// then every slot is emptied.
    pub fn warm_up(&mut self) -> Result<()> {
        let s = &mut self.session;
        s.build_pipelines()?;
        let n_vocab = s.cfg.n_vocab;
        let ids = |n: u32| (0..n).map(|i| i % n_vocab).collect::<Vec<u32>>();
        let sampler = Sampler::new(crate::sample::SamplerConfig { temperature: 0.0, ..Default::default() });
        let wide = s.batch_columns().min(s.sequences());
        for slot in 0..wide {
            s.set_slot_sampling(slot, &sampler, &[])?;
        }
        let n_ctx = s.opts.n_ctx;
        // A GEMM-sized chunk, a few-token chunk (leaving room for the decode steps).
        for n in [s.opts.ubatch.min(16), 4] {
            if s.slot_position(0)? + n + 2 <= n_ctx {
                s.forward_slot(0, &ids(n), Output::Argmax)?;
            }
        }
        // Two prompts prefilled together (what a burst of requests starts with).
        if s.can_prefill_together() && s.sequences() > 1 {
            let n = s.opts.ubatch.min(16) / 2 + 1;
            if s.slot_position(0)? + n + 2 <= n_ctx && n + 2 <= n_ctx {
                let tokens = ids(n);
                let chunks = [
                    PromptChunk { slot: 0, tokens: &tokens, pick: false },
                    PromptChunk { slot: 1, tokens: &tokens, pick: false },
                ];
                s.prefill_slots(&chunks)?;
            }
        }
        // A sampled pick of the last slot the table sampler serves, decode steps of one
        // slot and of the widest batch.
        s.forward_slot(wide - 1, &ids(1), Output::Sampled)?;
        s.decode_slots(&[(0, 1)])?;
        if wide > 1 {
            s.decode_slots(&(0..wide).map(|slot| (slot, 1)).collect::<Vec<_>>())?;
        }
        s.reset();
        // The metrics count the requests' steps.
        s.take_batch_stats();
        Ok(())
    }
}

impl Slots for BatchedSlots {
    fn count(&self) -> usize {
        self.session.sequences()
    }

    fn n_ctx(&self) -> u32 {
        self.session.opts.n_ctx
    }

    fn start(&mut self, slot: SlotId, keep: u32, sampler: &Sampler, history: &[u32]) -> Result<()> {
        self.session.truncate_slot(slot, keep)?;
        self.session.set_slot_sampling(slot, sampler, history)
    }

    fn prefill(&mut self, slot: SlotId, tokens: &[u32], last: bool) -> Result<Option<u32>> {
        if last {
            Ok(Some(self.session.forward_slot(slot, tokens, Output::Sampled)?[0] as u32))
        } else {
            // A pick is needed to end the step; greedy leaves the sampler's state alone.
            self.session.forward_slot(slot, tokens, Output::Argmax)?;
            Ok(None)
        }
    }

    fn prefill_many(&mut self, chunks: &[(SlotId, &[u32], bool)]) -> Vec<Result<Option<u32>>> {
        let prompts: Vec<PromptChunk> =
            chunks.iter().map(|&(slot, tokens, pick)| PromptChunk { slot, tokens, pick }).collect();
        match self.session.prefill_slots(&prompts) {
            Ok(picks) => picks.into_iter().map(Ok).collect(),
            // One step (or the first of several that failed): every chunk's cache is unknown.
            Err(e) => {
                let message = e.to_string();
                (0..chunks.len())
                    .map(|_| Err(KilnError::Gpu { context: "prefilling".into(), message: message.clone() }))
                    .collect()
            }
        }
    }

    fn decode_step(&mut self, batch: &[(SlotId, u32)]) -> Vec<Result<u32>> {
        // A slot that cannot take its token fails alone; the others step together.
        let mut out: Vec<Option<Result<u32>>> =
            batch.iter().map(|&(slot, token)| self.session.check_column(slot, token).err().map(Err)).collect();
        let ok: Vec<(SlotId, u32)> = batch.iter().zip(&out).filter(|(_, r)| r.is_none()).map(|(b, _)| *b).collect();
        if !ok.is_empty() {
            let mut got = match self.session.decode_slots(&ok) {
                Ok(tokens) => tokens.into_iter().map(Ok).collect::<Vec<_>>(),
                // The step is shared: its failure is every column's.
                Err(e) => {
                    let message = e.to_string();
                    (0..ok.len())
                        .map(|_| {
                            Err(KilnError::Gpu { context: "a batched decode step".into(), message: message.clone() })
                        })
                        .collect()
                }
            }
            .into_iter();
            for r in out.iter_mut().filter(|r| r.is_none()) {
                *r = got.next();
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(KilnError::invalid("decode step", "no result for this slot"))))
            .collect()
    }

    fn pipelined(&self) -> bool {
        // Every slot's column fits one step.
        self.session.can_pipeline() && self.session.sequences() <= self.session.batch_columns()
    }

    fn submit_step(&mut self, batch: &[(SlotId, Feed)]) -> Result<()> {
        self.session.submit_slots(batch)
    }

    fn finish_step(&mut self) -> Result<Vec<u32>> {
        self.session.finish_slots()
    }

    fn gpu_memory_bytes(&self) -> u64 {
        self.session.context().buffers_alive().bytes
    }

    fn fault(&self) -> Option<String> {
        self.session.context().check_fault("serving").err().map(|e| e.to_string())
    }

    fn batch_counts(&self) -> BatchCounts {
        let b = self.session.batch_stats();
        BatchCounts { steps: b.steps, tokens: b.tokens, widest: b.widest }
    }
}

/// One session per slot (`KILN_SERVE_SLOTS=sessions`): each its own KV cache, decode steps
/// one slot after another.
pub struct SessionSlots {
    sessions: Vec<Session>,
    counts: BatchCounts,
}

impl SessionSlots {
    /// `count` sessions of `opts` on `model`.
    pub fn open(model: &Model, opts: SessionOptions, count: usize) -> Result<SessionSlots> {
        let mut sessions = (0..count).map(|_| model.session(opts)).collect::<Result<Vec<_>>>()?;
        // The server's steps after a prompt are its own, not a chained generation.
        sessions.iter_mut().for_each(|s| s.set_prerecord(false));
        Ok(SessionSlots { sessions, counts: BatchCounts::default() })
    }

    /// Builds every pipeline the engine uses before the first request: the session's own
    /// `build_pipelines` (every size class the planner distinguishes, recorded but never
    /// submitted; kept on disk where the adapter caches pipelines), then a prefill and a
    /// decode step run on the first slot and forgotten, which is what compiles them on a CPU
    /// adapter (seconds, that the first request would otherwise wait for). The slots share
    /// the device's pipelines, so one slot is enough.
    pub fn warm_up(&mut self) -> Result<()> {
        let Some(s) = self.sessions.first_mut() else { return Ok(()) };
        s.build_pipelines()?;
        let n_vocab = s.cfg.n_vocab;
        let ids = |n: u32| (0..n).map(|i| i % n_vocab).collect::<Vec<u32>>();
        let sampler = Sampler::new(crate::sample::SamplerConfig { temperature: 0.0, ..Default::default() });
        s.set_sampling(&sampler, &[]);
        // A GEMM-sized chunk, a few-token chunk and a decode step (the planner's three kinds).
        for n in [s.opts.ubatch.min(16), 4, 1] {
            if s.position() + n <= s.opts.n_ctx {
                s.forward(&ids(n), Output::Sampled)?;
            }
        }
        s.reset();
        Ok(())
    }

    fn session(&mut self, slot: SlotId) -> Result<&mut Session> {
        self.sessions.get_mut(slot).ok_or_else(|| KilnError::invalid("slot", format!("no slot {slot}")))
    }
}

impl Slots for SessionSlots {
    fn count(&self) -> usize {
        self.sessions.len()
    }

    fn n_ctx(&self) -> u32 {
        self.sessions.first().map_or(0, |s| s.opts.n_ctx)
    }

    fn start(&mut self, slot: SlotId, keep: u32, sampler: &Sampler, history: &[u32]) -> Result<()> {
        let s = self.session(slot)?;
        s.truncate(keep);
        s.set_sampling(sampler, history);
        Ok(())
    }

    fn prefill(&mut self, slot: SlotId, tokens: &[u32], last: bool) -> Result<Option<u32>> {
        let s = self.session(slot)?;
        if last {
            Ok(Some(s.forward(tokens, Output::Sampled)?[0] as u32))
        } else {
            // A pick is needed to end the step; greedy leaves the sampler's state alone.
            s.forward(tokens, Output::Argmax)?;
            Ok(None)
        }
    }

    fn decode_step(&mut self, batch: &[(SlotId, u32)]) -> Vec<Result<u32>> {
        let got: Vec<Result<u32>> = batch
            .iter()
            .map(|&(slot, token)| Ok(self.session(slot)?.forward(&[token], Output::Sampled)?[0] as u32))
            .collect();
        self.counts.steps += got.len() as u64;
        self.counts.tokens += got.len() as u64;
        self.counts.widest = self.counts.widest.max(!got.is_empty() as u64);
        got
    }

    fn batch_counts(&self) -> BatchCounts {
        self.counts
    }

    fn gpu_memory_bytes(&self) -> u64 {
        self.sessions.first().map_or(0, |s| s.context().buffers_alive().bytes)
    }

    fn fault(&self) -> Option<String> {
        self.sessions.first().and_then(|s| s.context().check_fault("serving").err()).map(|e| e.to_string())
    }
}

/// How the slots are sized, and what was reduced to get there.
#[derive(Debug, Clone)]
pub struct SlotPlan {
    pub opts: SessionOptions,
    pub count: usize,
    pub notes: Vec<String>,
}

/// Sizes `count` slots sharing a KV budget of `total_ctx` tokens (`-c`; None: the model's
/// training context for each slot), with `ubatch` tokens per step. `shared`: the slots are
/// regions of one session's KV cache (`BatchedSlots`: one layer's cache for every slot must
/// fit one binding, the activations are allocated once), else a session each
/// (`SessionSlots`). Where the adapter reports its memory, the KV caches and activations must
/// fit beside the weights: an explicit `-c` that does not fit is refused with the sizes, the
/// default is reduced with a note. The session(s) are then fitted to the binding limits by
/// `Model::session`.
pub fn plan_slots(
    model: &Model,
    total_ctx: Option<u32>,
    count: u32,
    ubatch: u32,
    f16_kv: bool,
    shared: bool,
) -> Result<SlotPlan> {
    if count == 0 {
        return Err(KilnError::invalid("--parallel", "at least one slot is needed"));
    }
    let cfg = &model.cfg;
    let mut n_ctx = match total_ctx {
        Some(total) => total / count,
        None => cfg.n_ctx_train,
    };
    if n_ctx < 2 {
        return Err(KilnError::invalid(
            "-c",
            format!("a context of {} tokens gives each of {count} slots fewer than 2 tokens", total_ctx.unwrap_or(0)),
        ));
    }
    let opts = |n_ctx: u32| SessionOptions { n_ctx, ubatch: ubatch.max(1), f16_kv, all_logits: false, n_seq: 1 };
    // The sizes of what is allocated: one session of `count` sequences, or one of one.
    let sizes = |n_ctx: u32| {
        let n_seq = if shared { count } else { 1 };
        SessionSizes::new(cfg, &SessionOptions { n_seq, ..opts(n_ctx) }, &model.ctx.caps)
    };
    let total = |n_ctx: u32| {
        let s = sizes(n_ctx);
        (s.kv_bytes() + s.activation_bytes()) * if shared { 1 } else { count as u64 }
    };
    let fits_binding = |n_ctx: u32| model.ctx.fits_kv_storage(sizes(n_ctx).kv_layer);
    let left = model.ctx.device_memory.map(|m| m.saturating_sub(model.weight_gpu_bytes));
    let fits = |n_ctx: u32| fits_binding(n_ctx) && left.is_none_or(|l| total(n_ctx) <= l);
    let mut notes = Vec::new();
    if !fits(n_ctx) {
        if total_ctx.is_some() {
            let why = match left {
                Some(l) if fits_binding(n_ctx) => format!(
                    "{count} slots of {n_ctx} tokens need {:.1} MiB of KV cache and activations, and {:.1} MiB are left beside the weights",
                    total(n_ctx) as f64 / MIB,
                    l as f64 / MIB
                ),
                _ => format!(
                    "one layer's keys for {} tokens take {} bytes, more than the adapter binds at once ({})",
                    if shared { n_ctx * count } else { n_ctx },
                    kv_storage_size(sizes(n_ctx).kv_layer),
                    model.ctx.max_storage()
                ),
            };
            return Err(KilnError::invalid("-c", format!("{why}; lower -c or --parallel")));
        }
        let wanted = n_ctx;
        while n_ctx > 16 && !fits(n_ctx) {
            n_ctx -= (n_ctx / 8).max(1);
        }
        if !fits(n_ctx) {
            return Err(KilnError::invalid("--parallel", format!("{count} slots do not fit the adapter's memory")));
        }
        notes.push(format!(
            "each of the {count} slots holds {n_ctx} tokens (the model's {wanted} would not fit {count} times); use -c to choose the total"
        ));
    }
    Ok(SlotPlan { opts: opts(n_ctx), count: count as usize, notes })
}

const MIB: f64 = (1 << 20) as f64;
