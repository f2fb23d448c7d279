//! The engine: one thread owns the slots (the GPU); HTTP handlers send it `Job`s and read
//! `Event`s back. Each tick it drops requests whose client went away, admits waiting requests
//! into free slots (the slot whose cache shares the longest prefix with the prompt), prefills
//! at most `PREFILL_BUDGET` prompt tokens (so a long prompt never stalls the other streams for
//! long; several prompts' chunks in one step, the weights read once for all), then runs one
//! decode step for every generating slot (the slots batch it: one pass over the weights for
//! all of them) and sends each its text. Where the slots pipeline their
//! steps, a tick submits the next step before it reads the last one's picks: a sequence in
//! the step in flight is fed the token that step picks for it, on the GPU, so the GPU never
//! waits while the host records, submits and reads back. A sequence that ends (end of
//! generation, a stop string, cancelled) has then had one more step run ahead for it, whose
//! pick is dropped; limits (max_tokens, the slot's context) are never run past.

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::OwnedSemaphorePermit;

use crate::model::session::Feed;
use crate::sample::{Sampler, SamplerConfig};
use crate::server::metrics::{EnginePhase, Metrics, Outcome};
use crate::server::slots::{SlotId, Slots};
use crate::server::stop::StopFilter;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Most prompt tokens prefilled per tick, over all slots (in one step where the slots can).
/// `kiln bench-serve --concurrency 1,8,16 --input-len 128 --output-len 256` on an H200 (run 58,
/// profiling/results/h200-serve-2026-11-24-run58-*, each prompt a step of its own), budgets 128
/// / 256 / 384: time to first token p99 at 8 streams 85-87 / 71 / 68 ms, at 16 streams 217-227
/// / 192 / 174, inter-token p99 at 16 streams 15 / 24 / 32 ms; throughput within 1%. With the
/// tick's prompts in one step (run 115, profiling/results/h200-serve-prefill-together-*), 256 /
/// 512: 8 streams 3,277-3,331 / 3,316 tok/s, 16 streams 4,793-4,868 / 4,889, time to first token
/// p99 at 16 streams 122-133 / 97 ms, inter-token p99 14-15 / 16 ms.
pub const PREFILL_BUDGET: usize = 512;

/// The budget in force: `KILN_PREFILL_BUDGET` or `PREFILL_BUDGET`.
pub fn prefill_budget() -> usize {
    crate::config::prefill_budget_from_env().unwrap_or(PREFILL_BUDGET)
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct Generation {
    /// None: until end of generation or a full slot.
    pub max_tokens: Option<usize>,
    pub sampling: SamplerConfig,
    /// Never sample the end-of-generation tokens (llama.cpp's extension).
    pub ignore_eos: bool,
    pub stop: Vec<String>,
}

/// A request for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    pub generation: Generation,
    pub events: UnboundedSender<Event>,
    /// When the request arrived (time to first token counts from here).
    pub received: Instant,
    /// The request's place in the server's capacity, given back when the job ends.
    pub permit: Option<OwnedSemaphorePermit>,
}

/// Why generation ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The end of a successful request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens the slot's cache already held.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What the engine sends a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Generated text (never part of a stop string, never a broken UTF-8 sequence).
    Text(String),
    Done(Finish),
    /// The request failed on the server's side (a GPU fault); the message says why.
    Failed(String),
}

/// How a running request ends.
#[derive(Debug)]
enum Ending {
    /// The model ended its text (an end-of-generation token).
    EndOfGeneration,
    /// A stop string appeared: what the filter holds is part of it and is never shown.
    StopString,
    /// max_tokens, or the slot's context is full.
    Length,
    Cancelled,
    /// The slot's cache may no longer hold what the engine thinks it does.
    Failed(String),
}

/// A request in a slot.
struct Running<'t> {
    /// Tells this request's columns of a step in flight from those of the slot's next request.
    id: u64,
    job: Job,
    slot: SlotId,
    /// Prompt tokens in the slot's cache (the reused prefix included).
    fed: usize,
    reused: usize,
    /// The last token picked, to be fed by the next decode step (never while the request has a
    /// column in the step in flight: that step feeds it).
    next: Option<u32>,
    /// The last token picked (what a column fed `Feed::Picked` was fed).
    last: Option<u32>,
    /// The request has a column in the pipelined step in flight.
    in_step: bool,
    generated: usize,
    decoder: StreamDecoder<'t>,
    stops: StopFilter,
    end: Option<Ending>,
}

/// The engine's state between ticks.
pub struct Engine<'a, S: Slots + ?Sized> {
    slots: &'a mut S,
    tok: &'a Tokenizer,
    metrics: &'a Metrics,
    /// Per slot: the tokens its KV cache holds.
    cached: Vec<Vec<u32>>,
    busy: Vec<bool>,
    /// Per slot: the tick it was last released (the least recently used goes first).
    released: Vec<u64>,
    waiting: VecDeque<Job>,
    running: Vec<Running<'a>>,
    ticks: u64,
    next_id: u64,
    /// The pipelined step submitted and not yet read: its columns in order.
    in_flight: Option<Vec<Column>>,
    /// This tick's seconds submitting decode steps and waiting for them (steps run one by
    /// one count as waiting).
    step_times: (f64, f64),
}

/// A column of a pipelined step: whose, and the token it was fed (None: the pick of the step
/// before, the request's `last` once that step is read).
struct Column {
    id: u64,
    slot: SlotId,
    fed: Option<u32>,
}

/// Runs the engine until `jobs` is closed and every request has ended.
pub fn run<S: Slots + ?Sized>(slots: &mut S, tok: &Tokenizer, jobs: Receiver<Job>, metrics: &Metrics) {
    let mut engine = Engine::new(slots, tok, metrics);
    loop {
        if engine.is_idle() {
            match jobs.recv() {
                Ok(job) => engine.enqueue(job),
                Err(_) => break,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            engine.enqueue(job);
        }
        engine.tick();
    }
}

impl<'a, S: Slots + ?Sized> Engine<'a, S> {
    pub fn new(slots: &'a mut S, tok: &'a Tokenizer, metrics: &'a Metrics) -> Self {
        let n = slots.count();
        metrics.slots_total.store(n as u64, std::sync::atomic::Ordering::Relaxed);
        metrics.slot_context.store(slots.n_ctx() as u64, std::sync::atomic::Ordering::Relaxed);
        metrics.gpu_memory_bytes.store(slots.gpu_memory_bytes(), std::sync::atomic::Ordering::Relaxed);
        Engine {
            slots,
            tok,
            metrics,
            cached: vec![Vec::new(); n],
            busy: vec![false; n],
            released: vec![0; n],
            waiting: VecDeque::new(),
            running: Vec::new(),
            ticks: 0,
            next_id: 0,
            in_flight: None,
            step_times: (0.0, 0.0),
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.in_flight.is_none()
    }

    /// The tokens `slot`'s cache holds.
    pub fn cached(&self, slot: SlotId) -> &[u32] {
        &self.cached[slot]
    }

    pub fn enqueue(&mut self, job: Job) {
        self.waiting.push_back(job);
    }

    /// One round: cancellations, admissions, a prefill budget, one decode step.
    pub fn tick(&mut self) {
        let start = Instant::now();
        self.ticks += 1;
        self.drop_cancelled();
        self.admit();
        self.retire();
        let t = Instant::now();
        let first_tokens = self.prefill();
        let prefill = t.elapsed().as_secs_f64();
        self.metrics.add_engine_time(EnginePhase::Prefill, prefill);
        // Tokens are counted before retire() answers the requests they end: a client that has
        // read its last token then finds it in /metrics.
        self.metrics.record_step(first_tokens);
        self.retire();
        let decoded = self.decode();
        self.metrics.record_step(decoded);
        self.retire();
        if self.metrics.gpu_fault.get().is_none() {
            if let Some(fault) = self.slots.fault() {
                tracing::error!("{fault}: this server can no longer generate; /health answers 503");
                let _ = self.metrics.gpu_fault.set(fault);
            }
        }
        use std::sync::atomic::Ordering::Relaxed;
        self.metrics.slots_busy.store(self.running.len() as u64, Relaxed);
        // The allocator's report walks every block: now and then, not every step.
        if self.ticks % 64 == 1 {
            self.metrics.gpu_memory_bytes.store(self.slots.gpu_memory_bytes(), Relaxed);
        }
        if let Ok(mut b) = self.metrics.batches.lock() {
            *b = self.slots.batch_counts();
        }
        let (submit, wait) = std::mem::take(&mut self.step_times);
        self.metrics.add_engine_time(EnginePhase::Submit, submit);
        self.metrics.add_engine_time(EnginePhase::Wait, wait);
        self.metrics.add_engine_time(EnginePhase::Other, start.elapsed().as_secs_f64() - prefill - submit - wait);
    }

    /// Waiting requests whose client went away leave the queue; running ones end (their
    /// slot is free for the next request at once).
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.events.is_closed());
        for _ in self.waiting.len()..before {
            self.metrics.queue_depth.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.metrics.count_outcome(Outcome::Cancelled);
        }
        for r in self.running.iter_mut().filter(|r| r.end.is_none() && r.job.events.is_closed()) {
            r.end = Some(Ending::Cancelled);
        }
        self.retire();
    }

    fn admit(&mut self) {
        while !self.waiting.is_empty() {
            let Some(job) = self.waiting.front() else { break };
            // The free slot whose cache holds at least half of the prompt, the longest such
            // prefix (as llama-server's slot similarity); else the least recently used one,
            // so that a shared BOS alone does not evict a conversation worth keeping.
            use std::cmp::Reverse;
            let free = (0..self.busy.len()).filter(|&s| !self.busy[s]);
            let reuse = free
                .clone()
                .map(|s| (common_prefix(&self.cached[s], &job.prompt), Reverse(s)))
                .filter(|&(common, _)| common > 1 && 2 * common >= job.prompt.len())
                .max()
                .map(|(_, Reverse(s))| s);
            let Some(slot) = reuse.or_else(|| free.min_by_key(|&s| (self.released[s], s))) else { break };
            let common = common_prefix(&self.cached[slot], &job.prompt);
            let Some(job) = self.waiting.pop_front() else { break };
            self.metrics.queue_depth.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.start(job, slot, common);
        }
    }

    fn start(&mut self, job: Job, slot: SlotId, common: usize) {
        let n_ctx = self.slots.n_ctx() as usize;
        let prompt_len = job.prompt.len();
        self.next_id += 1;
        let mut running = Running {
            id: self.next_id,
            slot,
            fed: 0,
            reused: 0,
            next: None,
            last: None,
            in_step: false,
            generated: 0,
            decoder: StreamDecoder::new(self.tok),
            stops: StopFilter::new(&job.generation.stop),
            end: None,
            job,
        };
        self.busy[slot] = true;
        let needed = prompt_len + running.job.generation.max_tokens.unwrap_or(1);
        if prompt_len == 0 || needed > n_ctx {
            // The HTTP side refuses these; a request that slips through still ends cleanly.
            running.end = Some(Ending::Failed(format!(
                "the prompt ({prompt_len} tokens) and the tokens to generate do not fit a slot's context of {n_ctx}"
            )));
            self.running.push(running);
            return;
        }
        let mut sampler = Sampler::new(running.job.generation.sampling);
        if running.job.generation.ignore_eos {
            if let Err(e) = sampler.ban(self.tok.eog_ids()) {
                running.end = Some(Ending::Failed(e.to_string()));
                self.running.push(running);
                return;
            }
        }
        // Keep at least one prompt token to evaluate: its step produces the first token.
        let keep = common.min(prompt_len - 1);
        match self.slots.start(slot, keep as u32, &sampler, &running.job.prompt) {
            Ok(()) => {
                self.cached[slot].truncate(keep);
                running.fed = keep;
                running.reused = keep;
                use std::sync::atomic::Ordering::Relaxed;
                self.metrics.prompt_tokens.fetch_add(prompt_len as u64, Relaxed);
                self.metrics.prompt_tokens_cached.fetch_add(keep as u64, Relaxed);
            }
            Err(e) => {
                self.cached[slot].clear();
                running.end = Some(Ending::Failed(format!("starting a request: {e}")));
            }
        }
        self.running.push(running);
    }

    /// Feeds prompt chunks, oldest request first, up to the tick's budget, all in one step
    /// where the slots can (`Slots::prefill_many`: the weights read once for every prompt);
    /// returns the tokens generated (the first of each prompt whose last chunk went in).
    fn prefill(&mut self) -> u64 {
        // The budget holds even with no stream generating yet: prefilling a burst of prompts
        // all at once made them finish together and come back as another burst (16 streams
        // on an H200: time to first token p50 33 -> 117 ms, run 42).
        let mut budget = prefill_budget();
        // (index in `running`, tokens of its prompt fed this tick)
        let mut taken: Vec<(usize, usize)> = Vec::new();
        for (i, r) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if r.end.is_some() || r.fed >= r.job.prompt.len() {
                continue;
            }
            let n = (r.job.prompt.len() - r.fed).min(budget);
            taken.push((i, n));
            budget -= n;
        }
        if taken.is_empty() {
            return 0;
        }
        let chunks: Vec<(SlotId, &[u32], bool)> = taken
            .iter()
            .map(|&(i, n)| {
                let r = &self.running[i];
                (r.slot, &r.job.prompt[r.fed..r.fed + n], r.fed + n == r.job.prompt.len())
            })
            .collect();
        let results = self.slots.prefill_many(&chunks);
        let mut generated = 0;
        let n_ctx = self.slots.n_ctx() as usize;
        for (&(i, n), result) in taken.iter().zip(results) {
            let r = &mut self.running[i];
            match result {
                Ok(picked) => {
                    self.cached[r.slot].extend_from_slice(&r.job.prompt[r.fed..r.fed + n]);
                    r.fed += n;
                    if let Some(token) = picked {
                        let ttft = r.job.received.elapsed().as_secs_f64();
                        self.metrics.time_to_first_token.observe(ttft);
                        let room = self.cached[r.slot].len() < n_ctx;
                        r.end = accept(r, token, self.tok, room, &mut generated);
                    }
                }
                Err(e) => {
                    self.cached[r.slot].clear();
                    r.end = Some(Ending::Failed(format!("GPU error while prefilling: {e}")));
                }
            }
        }
        generated
    }

    /// One decode step for every slot with a token to feed; returns the tokens generated.
    fn decode(&mut self) -> u64 {
        if self.slots.pipelined() {
            return self.decode_pipelined();
        }
        let batch: Vec<(SlotId, u32)> =
            self.running.iter().filter(|r| r.end.is_none()).filter_map(|r| r.next.map(|t| (r.slot, t))).collect();
        if batch.is_empty() {
            return 0;
        }
        let n_ctx = self.slots.n_ctx() as usize;
        let t = Instant::now();
        let mut results = self.slots.decode_step(&batch).into_iter();
        self.step_times.1 += t.elapsed().as_secs_f64();
        let mut generated = 0;
        for &(slot, fed) in &batch {
            let Some(r) = self.running.iter_mut().find(|r| r.slot == slot) else { continue };
            r.next = None;
            let result = results.next().unwrap_or_else(|| {
                Err(crate::error::KilnError::invalid("decode step", "it returned no token for this slot"))
            });
            take_result(r, &mut self.cached[slot], fed, result, self.tok, n_ctx, &mut generated);
        }
        generated
    }

    /// A pipelined tick: submits the next step, then reads the one in flight. The next step
    /// feeds each request whose pick the host knows that token, and each request in the
    /// step in flight that step's pick, unless that step may be its last (its max_tokens or
    /// its slot's context reached).
    fn decode_pipelined(&mut self) -> u64 {
        let n_ctx = self.slots.n_ctx() as usize;
        let mut cols = Vec::new();
        let mut feeds = Vec::new();
        for r in self.running.iter_mut() {
            let was_in_step = std::mem::take(&mut r.in_step);
            if r.end.is_some() {
                continue;
            }
            let fed = match r.next.take() {
                Some(t) => Some(t),
                None if was_in_step => {
                    // After the step in flight the cache holds one more token and one more is
                    // generated: run ahead only if the request can go on past that.
                    let room = self.cached[r.slot].len() + 2 <= n_ctx;
                    let below_max = r.job.generation.max_tokens.is_none_or(|m| r.generated + 2 <= m);
                    if !(room && below_max) {
                        continue;
                    }
                    None
                }
                None => continue,
            };
            r.in_step = true;
            cols.push(Column { id: r.id, slot: r.slot, fed });
            feeds.push((r.slot, fed.map_or(Feed::Picked, Feed::Token)));
        }
        let previous = self.in_flight.take();
        if !cols.is_empty() {
            let t = Instant::now();
            let submitted = self.slots.submit_step(&feeds);
            self.step_times.0 += t.elapsed().as_secs_f64();
            match submitted {
                Ok(()) => self.in_flight = Some(cols),
                Err(e) => {
                    // Nothing was submitted: the step's requests fail, their caches unknown.
                    let message = format!("GPU error in a decode step: {e}");
                    for c in &cols {
                        if let Some(r) = self.running.iter_mut().find(|r| r.id == c.id) {
                            r.in_step = false;
                            r.end = Some(Ending::Failed(message.clone()));
                            self.cached[c.slot].clear();
                        }
                    }
                }
            }
        }
        let Some(previous) = previous else { return 0 };
        let t = Instant::now();
        let finished = self.slots.finish_step();
        self.step_times.1 += t.elapsed().as_secs_f64();
        let results: Vec<crate::error::Result<u32>> = match finished {
            Ok(picks) if picks.len() == previous.len() => picks.into_iter().map(Ok).collect(),
            Ok(picks) => {
                let message = format!("a decode step of {} columns returned {}", previous.len(), picks.len());
                previous.iter().map(|_| Err(crate::error::KilnError::invalid("decode step", message.clone()))).collect()
            }
            Err(e) => {
                let message = e.to_string();
                previous
                    .iter()
                    .map(|_| {
                        Err(crate::error::KilnError::Gpu { context: "a decode step".into(), message: message.clone() })
                    })
                    .collect()
            }
        };
        let mut generated = 0;
        for (c, result) in previous.iter().zip(results) {
            // A request that ended (or its slot's next one) takes nothing from this step.
            let Some(r) = self.running.iter_mut().find(|r| r.id == c.id) else { continue };
            if r.end.is_some() {
                continue;
            }
            let fed = match c.fed.or(r.last) {
                Some(t) => t,
                None => {
                    r.end = Some(Ending::Failed("a pipelined step fed a pick the engine never read".into()));
                    self.cached[c.slot].clear();
                    continue;
                }
            };
            r.last = result.as_ref().ok().copied();
            take_result(r, &mut self.cached[c.slot], fed, result, self.tok, n_ctx, &mut generated);
            if r.in_step {
                // The step in flight feeds it.
                r.next = None;
            }
        }
        generated
    }

    /// Ends the requests that are done: their last text and `Done`, or the error; frees
    /// their slots.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].end.is_none() {
                i += 1;
                continue;
            }
            let mut r = self.running.remove(i);
            // Each outcome is counted before the request's last event is sent: a client that
            // has its answer then finds it in /metrics.
            match r.end.take() {
                Some(Ending::EndOfGeneration) => finish(&mut r, FinishReason::Stop, true, self.metrics),
                Some(Ending::Length) => finish(&mut r, FinishReason::Length, true, self.metrics),
                Some(Ending::StopString) => finish(&mut r, FinishReason::Stop, false, self.metrics),
                Some(Ending::Failed(message)) => {
                    tracing::error!("request failed in slot {}: {message}", r.slot);
                    self.metrics.count_outcome(Outcome::Error);
                    let _ = r.job.events.send(Event::Failed(message));
                }
                Some(Ending::Cancelled) | None => self.metrics.count_outcome(Outcome::Cancelled),
            }
            self.busy[r.slot] = false;
            self.released[r.slot] = self.ticks;
        }
    }
}

/// Takes a decode step's result for `r`, whose slot was fed `fed` (its cache `cached` now holds
/// it): the picked token goes to `accept`; an error fails the request and clears the cache
/// (it may no longer hold what the engine thinks).
fn take_result(
    r: &mut Running,
    cached: &mut Vec<u32>,
    fed: u32,
    result: crate::error::Result<u32>,
    tok: &Tokenizer,
    n_ctx: usize,
    generated: &mut u64,
) {
    match result {
        Ok(token) => {
            cached.push(fed);
            r.end = accept(r, token, tok, cached.len() < n_ctx, generated);
        }
        Err(e) => {
            cached.clear();
            r.end = Some(Ending::Failed(format!("GPU error in a decode step: {e}")));
        }
    }
}

/// Takes a newly picked token: end of generation, text out (held back where it could begin
/// a stop string), limits; `generated` counts the tokens of text. Returns how the request
/// ends, if it does.
fn accept(r: &mut Running, token: u32, tok: &Tokenizer, room: bool, generated: &mut u64) -> Option<Ending> {
    if tok.is_eog(token) && !r.job.generation.ignore_eos {
        return Some(Ending::EndOfGeneration);
    }
    r.generated += 1;
    *generated += 1;
    let piece = match r.decoder.push(token) {
        Ok(p) => p,
        Err(e) => return Some(Ending::Failed(format!("detokenizing: {e}"))),
    };
    let (text, hit) = r.stops.push(&piece);
    if !text.is_empty() && r.job.events.send(Event::Text(text)).is_err() {
        return Some(Ending::Cancelled);
    }
    if hit {
        return Some(Ending::StopString);
    }
    if r.job.generation.max_tokens.is_some_and(|m| r.generated >= m) || !room {
        return Some(Ending::Length);
    }
    r.next = Some(token);
    None
}

/// Sends what the decoder and the stop filter still hold (unless a stop string ended the
/// text: then it is part of the stop string), counts the outcome, then sends `Done`.
fn finish(r: &mut Running, mut reason: FinishReason, flush: bool, metrics: &Metrics) {
    let mut text = String::new();
    if flush {
        let piece = r.decoder.finish().unwrap_or_default();
        let (shown, hit) = r.stops.push(&piece);
        text.push_str(&shown);
        if hit {
            reason = FinishReason::Stop;
        } else {
            text.push_str(&r.stops.finish());
        }
    }
    if !text.is_empty() {
        let _ = r.job.events.send(Event::Text(text));
    }
    metrics.count_outcome(match reason {
        FinishReason::Stop => Outcome::Stop,
        FinishReason::Length => Outcome::Length,
    });
    let done =
        Finish { reason, prompt_tokens: r.job.prompt.len(), cached_tokens: r.reused, completion_tokens: r.generated };
    let _ = r.job.events.send(Event::Done(done));
}

/// Length of the common prefix of two token sequences.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
