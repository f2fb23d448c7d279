//! The server's engine loop on scripted slots (no GPU): chunked prefill within the tick's
//! budget beside running streams, prefix reuse by the next request, cancellation freeing a
//! slot at once, a fault failing only its request, limits and end of generation. Each runs
//! twice: with steps run one by one, and pipelined (the next step submitted before the last
//! one is read, fed that step's picks), which must give the same text.

mod common;

use std::time::Instant;

use kiln::error::{KilnError, Result};
use kiln::gguf::GgufFile;
use kiln::model::session::Feed;
use kiln::sample::{Sampler, SamplerConfig};
use kiln::server::engine::{Engine, Event, FinishReason, Generation, Job, PREFILL_BUDGET};
use kiln::server::metrics::Metrics;
use kiln::server::slots::{SlotId, Slots};
use kiln::tokenizer::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// A stand-in for the GPU: the token after `t` is a fixed function of `t`; every call is
/// logged.
struct Scripted {
    n_ctx: u32,
    /// Tokens in each slot's cache, as the engine must keep them.
    pos: Vec<u32>,
    calls: Vec<Call>,
    /// (slot, decode call number) at which that slot's step fails.
    fail: Option<(SlotId, usize)>,
    /// After this many decode steps of a slot's request, it picks the end-of-generation token.
    eog_after: Option<usize>,
    steps: Vec<usize>,
    decode_calls: usize,
    /// Pipelined steps: submitted ones' picks (computed at once, read by `finish_step`) ...
    pipelined: bool,
    submitted: std::collections::VecDeque<Result<Vec<u32>>>,
    /// ... and each slot's pick in the last submitted step (what `Feed::Picked` feeds).
    last_picks: Vec<Option<u32>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Start { slot: SlotId, keep: u32 },
    Prefill { slot: SlotId, n: usize, last: bool },
    Decode { slots: Vec<SlotId> },
}

const EOG: u32 = 2;

fn next_token(t: u32) -> u32 {
    259 + (t * 31 + 7) % 200
}

impl Scripted {
    fn with(count: usize, n_ctx: u32, pipelined: bool) -> Scripted {
        Scripted {
            pipelined,
            submitted: Default::default(),
            last_picks: vec![None; count],
            n_ctx,
            pos: vec![0; count],
            calls: Vec::new(),
            fail: None,
            eog_after: None,
            steps: vec![0; count],
            decode_calls: 0,
        }
    }
}

impl Slots for Scripted {
    fn count(&self) -> usize {
        self.pos.len()
    }
    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }
    fn start(&mut self, slot: SlotId, keep: u32, _: &Sampler, _: &[u32]) -> Result<()> {
        assert!(keep <= self.pos[slot], "keeps {keep} tokens of {}", self.pos[slot]);
        self.pos[slot] = keep;
        self.steps[slot] = 0;
        self.calls.push(Call::Start { slot, keep });
        Ok(())
    }
    fn prefill(&mut self, slot: SlotId, tokens: &[u32], last: bool) -> Result<Option<u32>> {
        self.pos[slot] += tokens.len() as u32;
        assert!(self.pos[slot] <= self.n_ctx);
        self.calls.push(Call::Prefill { slot, n: tokens.len(), last });
        Ok(last.then(|| next_token(tokens[tokens.len() - 1])))
    }
    fn decode_step(&mut self, batch: &[(SlotId, u32)]) -> Vec<Result<u32>> {
        self.decode_calls += 1;
        self.calls.push(Call::Decode { slots: batch.iter().map(|b| b.0).collect() });
        batch.iter().map(|&(slot, t)| self.feed(slot, t)).collect()
    }
    fn pipelined(&self) -> bool {
        self.pipelined
    }
    fn submit_step(&mut self, batch: &[(SlotId, Feed)]) -> Result<()> {
        assert!(self.pipelined && self.submitted.len() < 2, "at most two steps in flight");
        self.decode_calls += 1;
        self.calls.push(Call::Decode { slots: batch.iter().map(|b| b.0).collect() });
        let fed: Vec<(SlotId, u32)> = batch
            .iter()
            .map(|&(slot, f)| match f {
                Feed::Token(t) => (slot, t),
                // After a failed step, what the GPU holds is garbage (the engine drops the pick).
                Feed::Picked => (slot, self.last_picks[slot].unwrap_or(0)),
            })
            .collect();
        self.last_picks = vec![None; self.pos.len()];
        // A shared step: one column's fault is every column's.
        let picks: Result<Vec<u32>> = fed.iter().map(|&(slot, t)| self.feed(slot, t)).collect();
        if let Ok(p) = &picks {
            for (&(slot, _), &pick) in fed.iter().zip(p) {
                self.last_picks[slot] = Some(pick);
            }
        }
        self.submitted.push_back(picks);
        Ok(())
    }
    fn finish_step(&mut self) -> Result<Vec<u32>> {
        self.submitted.pop_front().expect("a step in flight")
    }
}

impl Scripted {
    /// Feeds `t` to `slot`: its pick, or the scripted fault.
    fn feed(&mut self, slot: SlotId, t: u32) -> Result<u32> {
        if self.fail == Some((slot, self.decode_calls)) {
            return Err(KilnError::Gpu { context: "a decode step".into(), message: "scripted fault".into() });
        }
        self.pos[slot] += 1;
        assert!(self.pos[slot] <= self.n_ctx, "slot {slot} fed past its context");
        self.steps[slot] += 1;
        Ok(if self.eog_after == Some(self.steps[slot]) { EOG } else { next_token(t) })
    }
}

fn tokenizer() -> Tokenizer {
    let file = GgufFile::open(common::testdata().join("stories260K/stories260K.gguf")).unwrap();
    Tokenizer::from_gguf(&file).unwrap()
}

fn job(prompt: Vec<u32>, max_tokens: Option<usize>, stop: &[&str]) -> (Job, UnboundedReceiver<Event>) {
    let (events, rx) = unbounded_channel();
    let generation = Generation {
        max_tokens,
        sampling: SamplerConfig { temperature: 0.0, ..SamplerConfig::default() },
        ignore_eos: false,
        stop: stop.iter().map(|s| s.to_string()).collect(),
    };
    (Job { prompt, generation, events, received: Instant::now(), permit: None }, rx)
}

/// Everything received so far: the text and the final event.
fn drain(rx: &mut UnboundedReceiver<Event>) -> (String, Option<Event>) {
    let mut text = String::new();
    let mut last = None;
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Text(t) => text.push_str(&t),
            other => last = Some(other),
        }
    }
    (text, last)
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    std::iter::once(1).chain((1..n as u32).map(|i| 259 + (i * 7 + seed) % 200)).collect()
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_while_other_streams_decode() {
    a_long_prompt_is_prefilled_in_chunks_while_other_streams_decode_with(false);
    a_long_prompt_is_prefilled_in_chunks_while_other_streams_decode_with(true);
}

fn a_long_prompt_is_prefilled_in_chunks_while_other_streams_decode_with(pipelined: bool) {
    let tok = tokenizer();
    let metrics = Metrics::default();
    let mut slots = Scripted::with(2, 4 * PREFILL_BUDGET as u32, pipelined);
    // Two whole budgets and a ragged rest.
    let long_len = 2 * PREFILL_BUDGET + 44;
    let (long, mut long_rx) = job(prompt(long_len, 1), Some(4), &[]);
    let (short, mut short_rx) = job(prompt(5, 2), Some(20), &[]);
    {
        let mut engine = Engine::new(&mut slots, &tok, &metrics);
        engine.enqueue(short);
        engine.tick();
        engine.enqueue(long);
        for _ in 0..30 {
            engine.tick();
        }
        assert!(engine.is_idle());
    }
    // The short request decodes every tick while the long prompt goes in chunks of the budget.
    let long_prefills: Vec<&Call> = slots.calls.iter().filter(|c| matches!(c, Call::Prefill { slot: 1, .. })).collect();
    assert_eq!(
        long_prefills,
        [
            &Call::Prefill { slot: 1, n: PREFILL_BUDGET, last: false },
            &Call::Prefill { slot: 1, n: PREFILL_BUDGET, last: false },
            &Call::Prefill { slot: 1, n: 44, last: true }
        ]
    );
    let decodes_with_short =
        slots.calls.iter().filter(|c| matches!(c, Call::Decode { slots } if slots.contains(&0))).count();
    assert_eq!(decodes_with_short, 19, "{:?}", slots.calls);
    // Ticks 2-4 prefilled the long prompt and decoded the short one in each.
    let first_long = slots.calls.iter().position(|c| matches!(c, Call::Prefill { slot: 1, .. })).unwrap();
    assert_eq!(slots.calls[first_long + 1], Call::Decode { slots: vec![0] });
    for rx in [&mut long_rx, &mut short_rx] {
        let (text, last) = drain(rx);
        assert!(!text.is_empty());
        assert!(matches!(last, Some(Event::Done(f)) if f.reason == FinishReason::Length), "{last:?}");
    }
}

#[test]
fn the_next_turn_reuses_the_slot_that_holds_its_prefix() {
    the_next_turn_reuses_the_slot_that_holds_its_prefix_with(false);
    the_next_turn_reuses_the_slot_that_holds_its_prefix_with(true);
}

fn the_next_turn_reuses_the_slot_that_holds_its_prefix_with(pipelined: bool) {
    let tok = tokenizer();
    let metrics = Metrics::default();
    let mut slots = Scripted::with(3, 512, pipelined);
    let first = prompt(40, 3);
    let other = prompt(30, 4);
    let (a, _a_rx) = job(first.clone(), Some(5), &[]);
    let (b, _b_rx) = job(other, Some(5), &[]);
    let mut engine = Engine::new(&mut slots, &tok, &metrics);
    engine.enqueue(a);
    engine.enqueue(b);
    for _ in 0..10 {
        engine.tick();
    }
    // Slot 0 holds the first prompt and four of its five tokens (the last was never fed).
    let held = engine.cached(0).to_vec();
    assert_eq!(held.len(), 44);
    assert_eq!(held[..40], first[..]);
    // The next turn: the whole history plus a new message.
    let mut next = held.clone();
    next.extend([300, 301, 302]);
    let (c, mut c_rx) = job(next, Some(3), &[]);
    engine.enqueue(c);
    for _ in 0..6 {
        engine.tick();
    }
    // A new conversation shares only BOS with the slots' caches: it takes the unused slot
    // and leaves the others' conversations in place.
    let (d, _d_rx) = job(prompt(20, 9), Some(2), &[]);
    engine.enqueue(d);
    for _ in 0..4 {
        engine.tick();
    }
    assert_eq!(engine.cached(0).len(), 49);
    assert_eq!(engine.cached(2).len(), 21);
    drop(engine);
    assert!(matches!(drain(&mut c_rx).1, Some(Event::Done(f)) if f.cached_tokens == 44 && f.prompt_tokens == 47));
    assert!(slots.calls.contains(&Call::Start { slot: 0, keep: 44 }));
    assert!(slots.calls.contains(&Call::Start { slot: 2, keep: 0 }));
    assert!(slots.calls.contains(&Call::Prefill { slot: 0, n: 3, last: true }));
    // The same prompt again keeps all but its last token (whose step gives the first pick).
    assert_eq!(metrics.prompt_tokens_cached.load(std::sync::atomic::Ordering::Relaxed), 44);
}

#[test]
fn a_cancelled_request_frees_its_slot_for_the_next_at_once() {
    a_cancelled_request_frees_its_slot_for_the_next_at_once_with(false);
    a_cancelled_request_frees_its_slot_for_the_next_at_once_with(true);
}

fn a_cancelled_request_frees_its_slot_for_the_next_at_once_with(pipelined: bool) {
    let tok = tokenizer();
    let metrics = Metrics::default();
    let mut slots = Scripted::with(1, 512, pipelined);
    let (a, a_rx) = job(prompt(8, 5), Some(400), &[]);
    let (b, mut b_rx) = job(prompt(8, 6), Some(3), &[]);
    let mut engine = Engine::new(&mut slots, &tok, &metrics);
    engine.enqueue(a);
    engine.enqueue(b);
    for _ in 0..5 {
        engine.tick();
    }
    assert!(b_rx.try_recv().is_err(), "the second request ran beside the first in one slot");
    drop(a_rx);
    // The next tick drops the first request and starts the second.
    engine.tick();
    assert_eq!(metrics.slots_busy.load(std::sync::atomic::Ordering::Relaxed), 1);
    for _ in 0..4 {
        engine.tick();
    }
    assert!(engine.is_idle());
    drop(engine);
    assert!(matches!(drain(&mut b_rx).1, Some(Event::Done(f)) if f.completion_tokens == 3));
    let rendered = metrics.render();
    assert!(rendered.contains("kiln_requests_total{outcome=\"cancelled\"} 1\n"), "{rendered}");
}

#[test]
fn a_fault_fails_only_its_request_and_clears_its_slot() {
    a_fault_fails_only_its_request_and_clears_its_slot_with(false);
    a_fault_fails_only_its_request_and_clears_its_slot_with(true);
}

fn a_fault_fails_only_its_request_and_clears_its_slot_with(pipelined: bool) {
    let tok = tokenizer();
    let metrics = Metrics::default();
    let mut slots = Scripted::with(2, 512, pipelined);
    slots.fail = Some((1, 3));
    let (a, mut a_rx) = job(prompt(6, 7), Some(8), &[]);
    let (b, mut b_rx) = job(prompt(6, 8), Some(8), &[]);
    let mut engine = Engine::new(&mut slots, &tok, &metrics);
    engine.enqueue(a);
    engine.enqueue(b);
    for _ in 0..12 {
        engine.tick();
    }
    assert!(engine.cached(1).is_empty(), "a failed slot keeps what its cache may no longer hold");
    if pipelined {
        // A pipelined step is shared: its fault fails every request in it, and clears their slots.
        assert!(engine.cached(0).is_empty());
        assert!(engine.is_idle());
        drop(engine);
        for rx in [&mut a_rx, &mut b_rx] {
            assert!(matches!(drain(rx).1, Some(Event::Failed(m)) if m.contains("scripted fault")));
        }
        return;
    }
    assert_eq!(engine.cached(0).len(), 6 + 7);
    drop(engine);
    assert!(matches!(drain(&mut a_rx).1, Some(Event::Done(f)) if f.completion_tokens == 8));
    match drain(&mut b_rx).1 {
        Some(Event::Failed(m)) => assert!(m.contains("scripted fault"), "{m}"),
        other => panic!("the faulty slot's request ended with {other:?}"),
    }
}

#[test]
fn generation_ends_at_eog_max_tokens_a_stop_string_or_a_full_slot() {
    generation_ends_at_eog_max_tokens_a_stop_string_or_a_full_slot_with(false);
    generation_ends_at_eog_max_tokens_a_stop_string_or_a_full_slot_with(true);
}

fn generation_ends_at_eog_max_tokens_a_stop_string_or_a_full_slot_with(pipelined: bool) {
    let tok = tokenizer();
    let run = |slots: &mut Scripted, job: Job| {
        let metrics = Metrics::default();
        let mut engine = Engine::new(slots, &tok, &metrics);
        engine.enqueue(job);
        for _ in 0..100 {
            engine.tick();
        }
        assert!(engine.is_idle());
    };
    // End of generation after 3 decode steps: 3 tokens (the EOG is not one).
    let mut slots = Scripted::with(1, 512, pipelined);
    slots.eog_after = Some(3);
    let (j, mut rx) = job(prompt(4, 9), None, &[]);
    run(&mut slots, j);
    let (full, last) = drain(&mut rx);
    assert!(matches!(last, Some(Event::Done(f)) if f.reason == FinishReason::Stop && f.completion_tokens == 3));
    // max_tokens.
    let mut slots = Scripted::with(1, 512, pipelined);
    let (j, mut rx) = job(prompt(4, 9), Some(2), &[]);
    run(&mut slots, j);
    assert!(
        matches!(drain(&mut rx).1, Some(Event::Done(f)) if f.reason == FinishReason::Length && f.completion_tokens == 2)
    );
    // No limit: the slot's context ends it (16 tokens: 4 of prompt, 12 fed of 13 generated).
    let mut slots = Scripted::with(1, 16, pipelined);
    let (j, mut rx) = job(prompt(4, 9), None, &[]);
    run(&mut slots, j);
    assert!(
        matches!(drain(&mut rx).1, Some(Event::Done(f)) if f.reason == FinishReason::Length && f.completion_tokens == 13)
    );
    // A stop string from the middle of the text: what precedes it, finish reason stop.
    let stop: String = full.chars().skip(3).take(3).collect();
    let before = &full[..full.find(&stop).unwrap()];
    let mut slots = Scripted::with(1, 512, pipelined);
    slots.eog_after = Some(3);
    let (j, mut rx) = job(prompt(4, 9), None, &[stop.as_str()]);
    run(&mut slots, j);
    let (text, last) = drain(&mut rx);
    assert_eq!(text, before, "stop {stop:?} in {full:?}");
    assert!(matches!(last, Some(Event::Done(f)) if f.reason == FinishReason::Stop));
    // A prompt that does not fit fails cleanly.
    let mut slots = Scripted::with(1, 16, pipelined);
    let (j, mut rx) = job(prompt(10, 9), Some(10), &[]);
    run(&mut slots, j);
    assert!(matches!(drain(&mut rx).1, Some(Event::Failed(_))));
}

#[test]
fn pipelined_steps_give_the_text_of_steps_one_by_one() {
    let tok = tokenizer();
    let texts = |pipelined: bool| -> (Vec<(String, Option<Event>)>, usize) {
        let metrics = Metrics::default();
        let mut slots = Scripted::with(4, 40, pipelined);
        slots.eog_after = Some(9);
        // End of generation, max_tokens, a full slot, and a request that arrives later and
        // takes the first one's slot once it ends.
        let jobs = [(prompt(5, 1), None), (prompt(7, 2), Some(4)), (prompt(30, 3), None), (prompt(6, 4), Some(12))];
        let mut rxs = Vec::new();
        {
            let mut engine = Engine::new(&mut slots, &tok, &metrics);
            for (i, (p, max)) in jobs.into_iter().enumerate() {
                let (j, rx) = job(p, max, &[]);
                rxs.push(rx);
                engine.enqueue(j);
                if i == 2 {
                    for _ in 0..3 {
                        engine.tick();
                    }
                }
            }
            for _ in 0..60 {
                engine.tick();
            }
            assert!(engine.is_idle());
        }
        (rxs.iter_mut().map(drain).collect(), slots.decode_calls)
    };
    let (one_by_one, steps) = texts(false);
    let (pipelined, pipelined_steps) = texts(true);
    assert_eq!(pipelined, one_by_one);
    for (text, last) in &one_by_one {
        assert!(!text.is_empty() && matches!(last, Some(Event::Done(_))), "{text:?} {last:?}");
    }
    // Run ahead past the end of generation only: at most one step more per request.
    assert!(pipelined_steps >= steps && pipelined_steps <= steps + 4, "{pipelined_steps} against {steps}");
}
