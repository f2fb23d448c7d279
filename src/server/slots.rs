//! The sequence slots the engine schedules, behind one small interface: today one `Session`
//! per slot (sessions share the model's weights), stepped one after another; a batched step
//! (one pass over the weights for every slot) replaces `SessionSlots` without touching the
//! engine.

use crate::engine::Model;
use crate::error::{KilnError, Result};
use crate::gpu::storage_size;
use crate::model::{Output, Session, SessionOptions, SessionSizes};
use crate::sample::Sampler;

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
    /// One decode step: feeds each slot its token and returns the token sampled next, in the
    /// order of `batch`. One slot's failure does not fail the others.
    fn decode_step(&mut self, batch: &[(SlotId, u32)]) -> Vec<Result<u32>>;
    /// GPU memory in live buffers, for the metrics.
    fn gpu_memory_bytes(&self) -> u64 {
        0
    }
    /// A fault that leaves the slots unusable (a lost device), once one happened.
    fn fault(&self) -> Option<String> {
        None
    }
}

/// One session per slot.
pub struct SessionSlots {
    sessions: Vec<Session>,
}

impl SessionSlots {
    /// `count` sessions of `opts` on `model`.
    pub fn open(model: &Model, opts: SessionOptions, count: usize) -> Result<SessionSlots> {
        let sessions = (0..count).map(|_| model.session(opts)).collect::<Result<Vec<_>>>()?;
        Ok(SessionSlots { sessions })
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
        batch
            .iter()
            .map(|&(slot, token)| Ok(self.session(slot)?.forward(&[token], Output::Sampled)?[0] as u32))
            .collect()
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
/// training context for each slot), each slot a session of `ubatch` tokens per step. Where
/// the adapter reports its memory, every slot's KV cache and activations must fit beside the
/// weights: an explicit `-c` that does not fit is refused with the sizes, the default is
/// reduced with a note. Each session is then fitted to the binding limits by `Model::session`.
pub fn plan_slots(model: &Model, total_ctx: Option<u32>, count: u32, ubatch: u32, f16_kv: bool) -> Result<SlotPlan> {
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
    let opts = |n_ctx: u32| SessionOptions { n_ctx, ubatch: ubatch.max(1), f16_kv, all_logits: false };
    let per_slot = |n_ctx: u32| {
        let s = SessionSizes::new(cfg, &opts(n_ctx));
        s.kv_bytes() + s.activation_bytes()
    };
    let fits_binding = |n_ctx: u32| model.ctx.fits_storage(SessionSizes::new(cfg, &opts(n_ctx)).kv_layer);
    let left = model.ctx.device_memory.map(|m| m.saturating_sub(model.weight_gpu_bytes));
    let fits = |n_ctx: u32| fits_binding(n_ctx) && left.is_none_or(|l| per_slot(n_ctx) * count as u64 <= l);
    let mut notes = Vec::new();
    if !fits(n_ctx) {
        if total_ctx.is_some() {
            let why = match left {
                Some(l) if fits_binding(n_ctx) => format!(
                    "{count} slots of {n_ctx} tokens need {:.1} MiB of KV cache and activations, and {:.1} MiB are left beside the weights",
                    (per_slot(n_ctx) * count as u64) as f64 / MIB,
                    l as f64 / MIB
                ),
                _ => format!(
                    "one layer's keys for {n_ctx} tokens take {} bytes, more than the adapter binds at once ({})",
                    storage_size(SessionSizes::new(cfg, &opts(n_ctx)).kv_layer),
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
