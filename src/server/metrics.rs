//! The server's counters and gauges, rendered in Prometheus' text format for `GET /metrics`.
//! The engine thread and the HTTP handlers update them with atomics (no locks on the token
//! path); the few maps behind a mutex change once per request.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds (seconds) of the time-to-first-token buckets: 10 ms to 2 minutes.
const TTFT_BUCKETS: [f64; 14] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];

/// The window `kiln_generation_tokens_per_second` averages over.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// How a request the engine took ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Stop,
    Length,
    Cancelled,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

/// A Prometheus histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; TTFT_BUCKETS.len()],
    count: AtomicU64,
    /// The sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        for (bound, count) in TTFT_BUCKETS.iter().zip(&self.counts) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add((seconds.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in TTFT_BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", count.load(Ordering::Relaxed));
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

/// What the GPU's decode steps carried (`Slots::batch_counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Decode steps the GPU ran, ...
    pub steps: u64,
    /// ... the tokens they fed (one per sequence and step), ...
    pub tokens: u64,
    /// ... and the most sequences one step carried.
    pub widest: u64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP responses by route and status code.
    http: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Requests the engine took, by how they ended.
    outcomes: Mutex<BTreeMap<Outcome, u64>>,
    /// Prompt tokens of the requests the engine took ...
    pub prompt_tokens: AtomicU64,
    /// ... of which a slot's cache already held this many (not evaluated again).
    pub prompt_tokens_cached: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicU64,
    pub slots_busy: AtomicU64,
    pub slots_total: AtomicU64,
    /// Context of each slot, in tokens.
    pub slot_context: AtomicU64,
    /// GPU memory in live buffers (weights, KV caches, activations).
    pub gpu_memory_bytes: AtomicU64,
    /// From a request's arrival to its first generated token (queueing included).
    pub time_to_first_token: Histogram,
    /// Tokens generated per engine step over the last `RATE_WINDOW`.
    recent: Mutex<VecDeque<(Instant, u64)>>,
    /// The GPU fault that stopped generation (a lost device), once one happened.
    pub gpu_fault: std::sync::OnceLock<String>,
    /// What the decode steps carried (written by the engine from its slots).
    pub batches: Mutex<BatchCounts>,
    /// The engine thread's time by what it did, in microseconds (`EnginePhase`).
    engine_us: [AtomicU64; 4],
}

/// What the engine thread spends its time on (`kiln_engine_seconds_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnginePhase {
    /// Prompt chunks, each a step waited for.
    Prefill,
    /// Recording and submitting decode steps (for pipelined steps, while the GPU runs the last).
    Submit,
    /// Waiting for a decode step's tokens.
    Wait,
    /// The rest of its ticks: admitting, cancelling, turning tokens into text and events.
    Other,
}

impl EnginePhase {
    const ALL: [EnginePhase; 4] = [EnginePhase::Prefill, EnginePhase::Submit, EnginePhase::Wait, EnginePhase::Other];
    fn label(self) -> &'static str {
        match self {
            EnginePhase::Prefill => "prefill",
            EnginePhase::Submit => "submit",
            EnginePhase::Wait => "wait",
            EnginePhase::Other => "other",
        }
    }
}

impl Metrics {
    pub fn count_http(&self, route: &'static str, status: u16) {
        if let Ok(mut m) = self.http.lock() {
            *m.entry((route, status)).or_default() += 1;
        }
    }

    pub fn count_outcome(&self, outcome: Outcome) {
        if let Ok(mut m) = self.outcomes.lock() {
            *m.entry(outcome).or_default() += 1;
        }
    }

    /// Responses counted so far for `route` with `status`.
    pub fn http_count(&self, route: &str, status: u16) -> u64 {
        self.http
            .lock()
            .map(|m| m.iter().filter(|((r, s), _)| *r == route && *s == status).map(|e| e.1).sum())
            .unwrap_or(0)
    }

    /// Adds `seconds` of the engine thread's time to `phase`.
    pub fn add_engine_time(&self, phase: EnginePhase, seconds: f64) {
        self.engine_us[phase as usize].fetch_add((seconds.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// Records the tokens an engine step generated (for the rate gauge).
    pub fn record_step(&self, tokens: u64) {
        self.generated_tokens.fetch_add(tokens, Ordering::Relaxed);
        let now = Instant::now();
        if let Ok(mut r) = self.recent.lock() {
            r.push_back((now, tokens));
            while r.front().is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW) {
                r.pop_front();
            }
        }
    }

    /// Generated tokens per second over the last `RATE_WINDOW`.
    pub fn tokens_per_second(&self) -> f64 {
        let now = Instant::now();
        let Ok(r) = self.recent.lock() else { return 0.0 };
        let n: u64 = r.iter().filter(|(t, _)| now.duration_since(*t) <= RATE_WINDOW).map(|e| e.1).sum();
        n as f64 / RATE_WINDOW.as_secs_f64()
    }

    /// Everything in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.push_str("# HELP kiln_http_requests_total HTTP responses by route and status code.\n");
        out.push_str("# TYPE kiln_http_requests_total counter\n");
        if let Ok(m) = self.http.lock() {
            for ((route, status), n) in m.iter() {
                let _ = writeln!(out, "kiln_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
        }
        out.push_str("# HELP kiln_requests_total Generation requests the engine took, by how they ended.\n");
        out.push_str("# TYPE kiln_requests_total counter\n");
        if let Ok(m) = self.outcomes.lock() {
            for o in [Outcome::Stop, Outcome::Length, Outcome::Cancelled, Outcome::Error] {
                let n = m.get(&o).copied().unwrap_or(0);
                let _ = writeln!(out, "kiln_requests_total{{outcome=\"{}\"}} {n}", o.label());
            }
        }
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        };
        metric(
            "kiln_prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests taken.",
            get(&self.prompt_tokens) as f64,
        );
        metric(
            "kiln_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens a slot's KV cache already held (not evaluated again).",
            get(&self.prompt_tokens_cached) as f64,
        );
        metric("kiln_generated_tokens_total", "counter", "Tokens generated.", get(&self.generated_tokens) as f64);
        metric("kiln_queue_depth", "gauge", "Requests waiting for a slot.", get(&self.queue_depth) as f64);
        metric("kiln_slots_busy", "gauge", "Slots generating or prefilling.", get(&self.slots_busy) as f64);
        metric("kiln_slots_total", "gauge", "Sequence slots (--parallel).", get(&self.slots_total) as f64);
        metric("kiln_slot_context_tokens", "gauge", "Context of each slot in tokens.", get(&self.slot_context) as f64);
        metric(
            "kiln_gpu_memory_bytes",
            "gauge",
            "GPU memory in live buffers (weights, KV caches, activations).",
            get(&self.gpu_memory_bytes) as f64,
        );
        metric(
            "kiln_generation_tokens_per_second",
            "gauge",
            "Tokens generated per second over the last 10 seconds, all slots together.",
            self.tokens_per_second(),
        );
        let b = self.batches.lock().map(|b| *b).unwrap_or_default();
        metric("kiln_decode_steps_total", "counter", "Decode steps the GPU ran.", b.steps as f64);
        metric(
            "kiln_decode_step_sequences_total",
            "counter",
            "Sequences those decode steps advanced (one token each); over the steps, the mean batch.",
            b.tokens as f64,
        );
        metric(
            "kiln_decode_step_sequences_max",
            "gauge",
            "The most sequences one decode step advanced (1 without batching).",
            b.widest as f64,
        );
        metric(
            "kiln_gpu_fault",
            "gauge",
            "1 once the GPU failed so that this server cannot generate (restart it).",
            self.gpu_fault.get().is_some() as u8 as f64,
        );
        let _ = writeln!(
            out,
            "# HELP kiln_engine_seconds_total The engine thread's time: prefill steps, recording and submitting decode steps, waiting for their tokens, the rest.\n# TYPE kiln_engine_seconds_total counter"
        );
        for phase in EnginePhase::ALL {
            let us = self.engine_us[phase as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "kiln_engine_seconds_total{{phase=\"{}\"}} {}", phase.label(), us as f64 / 1e6);
        }
        self.time_to_first_token.render(
            &mut out,
            "kiln_time_to_first_token_seconds",
            "From a request's arrival to its first generated token, queueing included.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.count_http("/v1/chat/completions", 200);
        m.count_http("/v1/chat/completions", 200);
        m.count_outcome(Outcome::Length);
        m.time_to_first_token.observe(0.03);
        m.time_to_first_token.observe(3.0);
        m.record_step(5);
        let text = m.render();
        assert!(text.contains("kiln_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n"), "{text}");
        assert!(text.contains("kiln_requests_total{outcome=\"length\"} 1\n"), "{text}");
        assert!(text.contains("kiln_requests_total{outcome=\"stop\"} 0\n"), "{text}");
        assert!(text.contains("kiln_generated_tokens_total 5\n"), "{text}");
        assert!(text.contains("kiln_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n"), "{text}");
        assert!(text.contains("kiln_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"), "{text}");
        assert!(text.contains("kiln_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"), "{text}");
        assert!(text.contains("kiln_time_to_first_token_seconds_count 2\n"), "{text}");
        assert!(text.contains("kiln_generation_tokens_per_second 0.5\n"), "{text}");
        m.add_engine_time(EnginePhase::Wait, 0.25);
        m.add_engine_time(EnginePhase::Wait, 0.5);
        let text = m.render();
        assert!(text.contains("kiln_engine_seconds_total{phase=\"wait\"} 0.75\n"), "{text}");
        assert!(text.contains("kiln_engine_seconds_total{phase=\"submit\"} 0\n"), "{text}");
        assert_eq!(m.http_count("/v1/chat/completions", 200), 2);
    }
}
