//! Long sessions on stories260K: 10,000 generated tokens through context restarts, and a
//! chat of 200 turns through `Conversation` (dropping old turns when the context is full),
//! with no growth of host memory (RSS) or of live GPU buffers after warm-up.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::testdata;
use kiln::chat::{ChatTemplate, Conversation};
use kiln::engine::Model;
use kiln::generate::{generate_shifting, StopReason};
use kiln::gpu::{BufferCount, ContextOptions, GpuContext};
use kiln::model::SessionOptions;
use kiln::sample::{Sampler, SamplerConfig};
use kiln::tokenizer::Tokenizer;

/// Resident memory of this process in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

struct Probe {
    ctx: Arc<GpuContext>,
    warm: Option<(u64, BufferCount)>,
    peak_rss: u64,
    peak_gpu: BufferCount,
    samples: Vec<(usize, u64, BufferCount)>,
}

impl Probe {
    fn new(ctx: Arc<GpuContext>) -> Probe {
        Probe { ctx, warm: None, peak_rss: 0, peak_gpu: BufferCount::default(), samples: Vec::new() }
    }

    fn sample(&mut self, at: usize, warm_up: usize) {
        let (r, g) = (rss(), self.ctx.buffers_alive());
        if self.warm.is_none() && at >= warm_up {
            self.warm = Some((r, g));
        }
        if self.warm.is_some() {
            self.peak_rss = self.peak_rss.max(r);
            self.peak_gpu.buffers = self.peak_gpu.buffers.max(g.buffers);
            self.peak_gpu.bytes = self.peak_gpu.bytes.max(g.bytes);
        }
        self.samples.push((at, r, g));
    }

    fn check(&self, what: &str) {
        let (r0, g0) = self.warm.expect("warmed up");
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let (at, r1, g1) = *self.samples.last().unwrap();
        eprintln!(
            "{what}: warm-up RSS {:.1} MiB, GPU {} buffers {:.2} MiB; at {at}: RSS {:.1} MiB, GPU {} buffers {:.2} MiB; peaks after warm-up: RSS {:.1} MiB, GPU {} buffers {:.2} MiB",
            mib(r0),
            g0.buffers,
            mib(g0.bytes),
            mib(r1),
            g1.buffers,
            mib(g1.bytes),
            mib(self.peak_rss),
            self.peak_gpu.buffers,
            mib(self.peak_gpu.bytes)
        );
        for (at, r, g) in self.samples.iter().step_by((self.samples.len() / 10).max(1)) {
            eprintln!("  {what} {at:>6}: RSS {:.1} MiB, GPU {} buffers {:.2} MiB", mib(*r), g.buffers, mib(g.bytes));
        }
        // Live GPU buffers may only be transient readbacks (a few, small) above the warm-up.
        assert!(
            self.peak_gpu.buffers <= g0.buffers + 4,
            "{what}: GPU buffers grew from {} to {}",
            g0.buffers,
            self.peak_gpu.buffers
        );
        assert!(
            self.peak_gpu.bytes <= g0.bytes + (1 << 20),
            "{what}: GPU memory grew from {} to {}",
            g0.bytes,
            self.peak_gpu.bytes
        );
        assert!(g1.buffers <= g0.buffers, "{what}: GPU buffers at the end {} > warm-up {}", g1.buffers, g0.buffers);
        // Host memory: allocator noise only.
        assert!(
            self.peak_rss <= r0 + (8 << 20),
            "{what}: RSS grew from {:.1} MiB to {:.1} MiB",
            mib(r0),
            mib(self.peak_rss)
        );
    }
}

fn setup(n_ctx: u32) -> (Model, Tokenizer, kiln::model::Session) {
    let ctx = GpuContext::new(&ContextOptions::default()).expect("GPU");
    let model = Model::load(ctx, testdata().join("stories260K/stories260K.gguf"), &mut |_| {}).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let session =
        model.session(SessionOptions { n_ctx, ubatch: 64, f16_kv: true, all_logits: false, n_seq: 1 }).unwrap();
    (model, tok, session)
}

#[test]
fn ten_thousand_tokens_through_context_restarts_without_growth() {
    const TOTAL: usize = 10_000;
    let (model, tok, mut session) = setup(128);
    let mut probe = Probe::new(model.ctx.clone());
    let stop = AtomicBool::new(false);
    let mut sampler = Sampler::new(SamplerConfig { temperature: 0.0, ..SamplerConfig::default() });
    let bos = tok.bos().unwrap();
    let mut generated = 0;
    let mut restarts_at_eos = 0;
    let mut history = Vec::new();
    let t = std::time::Instant::now();
    while generated < TOTAL {
        // Each call runs until the token count or an end of story (then a new story starts).
        let mut pieces = 0usize;
        let base = generated;
        let stats = generate_shifting(
            &mut session,
            &tok,
            &[bos],
            &mut history,
            TOTAL - generated,
            &mut sampler,
            &stop,
            &mut |_| {
                pieces += 1;
                if pieces % 100 == 0 {
                    probe.sample(base + pieces, 1000);
                }
                Ok(())
            },
        )
        .unwrap();
        generated += stats.generated;
        if stats.stop == StopReason::EndOfGeneration {
            restarts_at_eos += 1;
            session.reset();
        }
        assert!(stats.generated > 0);
    }
    probe.sample(generated, 0);
    eprintln!(
        "{generated} tokens in {:.1} s ({restarts_at_eos} new stories after EOS), context 128",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(generated, TOTAL);
    probe.check("10k tokens");
}

#[test]
fn two_hundred_chat_turns_without_growth() {
    let (model, tok, mut session) = setup(256);
    let mut probe = Probe::new(model.ctx.clone());
    let tmpl = ChatTemplate::select(&model.file, Some("chatml"), "<s>".into(), "</s>".into()).unwrap();
    let mut conv = Conversation::new(Some("You tell short stories."));
    let stop = AtomicBool::new(false);
    let mut sampler = Sampler::new(SamplerConfig { temperature: 0.8, seed: 7, ..SamplerConfig::default() });
    let prompts = ["Tell me about a cat.", "What did Lily do?", "And then?", "Why was he sad?", "Once upon a time"];
    let mut dropped = 0;
    let mut tokens = 0;
    let t = std::time::Instant::now();
    for i in 0..200 {
        let turn = conv
            .turn(&mut session, &tmpl, &tok, prompts[i % prompts.len()], Some(12), &mut sampler, &stop, &mut |_| Ok(()))
            .unwrap();
        dropped += turn.dropped;
        tokens += turn.stats.prompt_tokens + turn.stats.generated;
        probe.sample(i + 1, 20);
        // The conversation kept in memory is bounded by the context.
        assert!(conv.messages.len() <= 64, "turn {i}: {} messages kept", conv.messages.len());
    }
    eprintln!(
        "200 turns in {:.1} s: {tokens} tokens evaluated or generated, {dropped} old turns dropped, context 256",
        t.elapsed().as_secs_f64()
    );
    assert!(dropped > 100, "the context never filled up");
    probe.check("200 chat turns");
}
