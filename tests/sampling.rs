//! GPU sampling (wgsl/sample.wgsl) against its CPU reference (`kiln::sample::Sampler`): the
//! same tokens for the same seed, history and logits, through greedy, top-k (the threshold
//! search, every logit of a small vocabulary, and the exact radix select), top-p, min-p,
//! temperature and the three penalties; and draws that follow the distribution.

mod common;

use common::*;
use kiln::doctor::checks::sampler_configs;
use kiln::doctor::data::model_logits;
use kiln::doctor::ops::{cpu_tokens, gpu_tokens};
use kiln::gpu::run_dispatches;
use kiln::kernels::sample::{self, initial_state, SampleConfig, STATE_WORDS};
use kiln::sample::{Sampler, SamplerConfig};

#[test]
fn gpu_sampler_picks_the_reference_tokens() {
    for g in gpus() {
        picks_the_reference_tokens(&g.ctx, g.name);
    }
}

/// The same with the first pass only finding each slice's floor and the second reading the
/// whole row again to gather and rank the candidates (`Caps::sample_tops` off; the default
/// merges the slices' ranked lists, and falls back to this where a slice kept none).
#[test]
fn candidates_gathered_from_the_row_pick_the_reference_tokens() {
    let opts = kiln::gpu::ContextOptions { sample_tops: Some(false), ..Default::default() };
    let ctx = kiln::gpu::GpuContext::new(&opts).unwrap();
    assert!(!ctx.caps.sample_tops);
    picks_the_reference_tokens(&ctx, "native, candidates gathered from the row");
}

/// Chained decode steps' sampler (`KernelKey::Sample::chained`): the same tokens as the CPU
/// reference, and each pick moves the step state on by one position (what the next step's
/// kernels read) and appends the token to the chain's list (count first), which the host
/// reads once per group of steps.
#[test]
fn chained_sampler_moves_the_step_on_and_lists_its_picks() {
    use kiln::kernels::matmul::StepState;
    for g in gpus() {
        for (name, base) in sampler_configs() {
            let vocab = 1000;
            let mut r = rng(7);
            let logits = model_logits(&mut r, vocab, 12.0);
            let history: Vec<u32> = (0..20).map(|_| r.range(0, vocab as i64) as u32).collect();
            let cfg = SamplerConfig { seed: 0x5eed, ..base };
            let steps = 5;
            let want = cpu_tokens(&cfg, &logits, &history, steps);
            let k = SampleConfig::new(&cfg, vocab as u32, vocab as u32);
            let state = g.ctx.upload(bytemuck::cast_slice(&initial_state(0, &history, &[])), "state").unwrap();
            let ids = g.ctx.storage(4, "ids").unwrap();
            let first = StepState { n_tokens: 1, pos0: 41, kv_len: 42, kv_base: 300 };
            let step = g.ctx.upload(bytemuck::bytes_of(&first), "step").unwrap();
            let chain = g.ctx.upload(bytemuck::cast_slice(&[0u32; 1 + 8]), "chain").unwrap();
            for _ in 0..steps {
                let lb = g.ctx.upload_f32(&logits, "logits").unwrap();
                let d = sample::prepare_chained(&g.ctx, &k, [&lb, &ids, &state], &step, &chain).unwrap();
                run_dispatches(&g.ctx, &d.iter().collect::<Vec<_>>()).unwrap();
            }
            let what = format!("[{}] {name}", g.name);
            let listed = g.ctx.read_u32(&chain, 1 + steps).unwrap();
            assert_eq!(listed[0] as usize, steps, "{what}: tokens listed");
            assert_eq!(&listed[1..], &want[..], "{what}: the listed tokens");
            assert_eq!(g.ctx.read_u32(&ids, 1).unwrap()[0], want[steps - 1], "{what}: the last pick in ids");
            let moved = g.ctx.read_u32(&step, 4).unwrap();
            assert_eq!(moved, vec![1, 41 + steps as u32, 42 + steps as u32, 300], "{what}: the step state");
        }
    }
}

/// The first pass starts each slice's search from the floor it found at the step before (its
/// header in the slices' buffer, kept between steps as a session keeps it): whatever that
/// hint is, the picks stay the reference's. One set of dispatches over one buffer of logits,
/// rewritten between steps with rows of very different spreads (a hint far too wide, far too
/// narrow, a ramp 1e-5 apart), against the CPU sampler stepped along the same history.
#[test]
fn a_floor_carried_from_the_step_before_never_changes_a_pick() {
    for g in gpus() {
        for (name, base) in sampler_configs() {
            let vocab = 32000;
            let mut r = rng(11);
            let rows: Vec<Vec<f32>> =
                [0.5f32, 14.0, 0.0, 12.0, 0.5, 0.0, 14.0].iter().map(|&s| model_logits(&mut r, vocab, s)).collect();
            let history: Vec<u32> = (0..30).map(|_| r.range(0, vocab as i64) as u32).collect();
            let cfg = SamplerConfig { seed: 0xf100_7000, ..base };
            let mut cpu = Sampler::new(cfg);
            let mut h = history.clone();
            let k = SampleConfig::new(&cfg, vocab as u32, vocab as u32);
            let state = g.ctx.upload(bytemuck::cast_slice(&initial_state(0, &history, &[])), "state").unwrap();
            let ids = g.ctx.storage(4, "ids").unwrap();
            let lb = g.ctx.upload_f32(&rows[0], "logits").unwrap();
            let d = sample::prepare(&g.ctx, &k, &lb, &ids, &state, 1).unwrap();
            for (step, row) in rows.iter().enumerate() {
                g.ctx.queue.write_buffer(&lb, 0, bytemuck::cast_slice(row));
                run_dispatches(&g.ctx, &d.iter().collect::<Vec<_>>()).unwrap();
                let want = cpu.sample(row, &h);
                h.push(want);
                assert_eq!(g.ctx.read_u32(&ids, 1).unwrap()[0], want, "[{}] {name}, step {step}", g.name);
            }
        }
    }
}

fn picks_the_reference_tokens(ctx: &kiln::gpu::GpuContext, gpu: &str) {
    let configs = sampler_configs();
    // Candidates by the threshold search in one round (spread 12, 14, 0.5) or narrowed
    // over several (spread 0: a shuffled ramp 1e-5 apart), every logit (top-k off on 512
    // and 1000), the exact radix select (top-k off on the larger vocabularies: no
    // threshold holds exactly 1024).
    for (vocab, spread) in [(512usize, 12.0f32), (32000, 14.0), (1000, 0.5), (5000, 0.0), (151936, 14.0)] {
        let mut r = rng(vocab as u64);
        let logits = model_logits(&mut r, vocab, spread);
        let history: Vec<u32> = (0..40).map(|_| r.range(0, vocab as i64) as u32).collect();
        for (name, base) in &configs {
            let cfg = SamplerConfig { seed: 0x5eed_0000_0000_0000 + vocab as u64, ..*base };
            let steps = if vocab > 100_000 { 3 } else { 12 };
            let want = cpu_tokens(&cfg, &logits, &history, steps);
            let got = gpu_tokens(ctx, &cfg, &logits, &history, steps).unwrap();
            assert_eq!(got, want, "[{gpu}] {name}, vocab {vocab}, spread {spread}");
        }
    }
    eprintln!("[{gpu}] sampler: reference tokens for every configuration");
}

/// Many rows at once, each its own draw counter: the picks' frequencies follow the
/// distribution that top-k, top-p, min-p and the temperature leave.
#[test]
fn gpu_draws_follow_the_distribution() {
    let g = &gpus()[0];
    let logits = [0.0f32, 1.0, 2.0, 2.5, -1.0, 3.0, -3.0, 0.5];
    let cfg = SamplerConfig { top_k: 6, top_p: 0.95, min_p: 0.05, temperature: 0.9, seed: 99, ..Default::default() };
    // The distribution left, by the reference's own arithmetic.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top: Vec<usize> = order[..6].to_vec();
    let z: f32 = top.iter().map(|&i| (logits[i] - 3.0).exp()).sum();
    let (mut keep, mut acc) = (top.len(), 0f32);
    for (j, &i) in top.iter().enumerate() {
        acc += (logits[i] - 3.0).exp() / z;
        if acc >= 0.95 {
            keep = j + 1;
            break;
        }
    }
    let keep = keep.min(top.iter().take_while(|&&i| (logits[i] - 3.0).exp() / z >= 0.05 / z).count());
    let w: Vec<f32> = top[..keep].iter().map(|&i| ((logits[i] - 3.0) / 0.9).exp()).collect();
    let wsum: f32 = w.iter().sum();
    let rows = 8192u32;
    let n = logits.len();
    let all: Vec<f32> = (0..rows).flat_map(|_| logits).collect();
    let mut states = Vec::new();
    for row in 0..rows {
        states.extend(initial_state(row, &[], &[]));
    }
    let k = SampleConfig::new(&cfg, n as u32, n as u32);
    let lb = g.ctx.upload_f32(&all, "logits").unwrap();
    let ids = g.ctx.storage(rows as u64 * 4, "ids").unwrap();
    let state = g.ctx.upload(bytemuck::cast_slice(&states), "state").unwrap();
    assert_eq!(states.len(), rows as usize * STATE_WORDS);
    let d = sample::prepare(&g.ctx, &k, &lb, &ids, &state, rows).unwrap();
    run_dispatches(&g.ctx, &d.iter().collect::<Vec<_>>()).unwrap();
    let picks = g.ctx.read_u32(&ids, rows as usize).unwrap();
    let mut counts = vec![0usize; n];
    picks.iter().for_each(|&t| counts[t as usize] += 1);
    for (j, &i) in top.iter().enumerate() {
        let want = if j < keep { w[j] / wsum } else { 0.0 };
        let got = counts[i] as f32 / rows as f32;
        assert!((got - want).abs() < 0.02, "token {i}: drawn {got:.4}, probability {want:.4} ({counts:?})");
    }
    for &i in &order[6..] {
        assert_eq!(counts[i], 0, "token {i} is outside the top-k");
    }
}

/// Sampled generation on stories260K (every step chained on the GPU, the GPU sampler picking)
/// gives the tokens of the CPU reference sampler fed the same logits step by step, for a
/// fixed seed, with and without penalties.
#[test]
fn stories260k_sampled_generation_matches_the_cpu_sampler() {
    use kiln::engine::Model;
    use kiln::model::{Output, SessionOptions};
    let configs = [
        SamplerConfig { seed: 7, ..Default::default() },
        SamplerConfig { seed: 11, temperature: 1.2, top_k: 0, top_p: 0.9, min_p: 0.0, ..Default::default() },
        SamplerConfig {
            seed: 3,
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            repeat_last_n: 32,
            ..Default::default()
        },
    ];
    for g in gpus() {
        let model = Model::load(g.ctx.clone(), testdata().join("stories260K/stories260K.gguf"), &mut |_| {}).unwrap();
        let opts = SessionOptions { n_ctx: 256, ubatch: 64, f16_kv: false, all_logits: false, n_seq: 1 };
        // Each config with its own count of steps per submit (groups that do and do not
        // divide the generation).
        for (cfg, per) in configs.iter().zip([1, 3, 64]) {
            let prompt = [1u32, 403, 407];
            let n = 40;
            // GPU: the prompt's token, then chained steps.
            let mut s = model.session(opts).unwrap();
            s.set_steps_per_submit(per);
            s.set_sampling(&Sampler::new(*cfg), &prompt);
            let first = s.forward(&prompt, Output::Sampled).unwrap()[0] as u32;
            let mut got = vec![first];
            got.extend(s.generate_chained(first, n - 1, &mut |_| true).unwrap());
            // CPU: the logits of each step, sampled by the reference.
            let mut r = model.session(opts).unwrap();
            let mut sampler = Sampler::new(*cfg);
            let mut history = prompt.to_vec();
            let mut logits = r.forward(&prompt, Output::LastLogits).unwrap();
            let mut want = Vec::new();
            for _ in 0..n {
                let t = sampler.sample(&logits, &history);
                want.push(t);
                history.push(t);
                logits = r.forward(&[t], Output::LastLogits).unwrap();
            }
            assert_eq!(got, want, "[{}] {cfg:?}, {per} steps per submit", g.name);
            assert!(want.iter().collect::<std::collections::HashSet<_>>().len() > 10, "too few distinct tokens");
        }
    }
}

/// Generation stopped in the middle of a group of chained steps drops the steps queued past
/// the stop: continued from there (the sampler given the true history, as chat does), it
/// gives the tokens of a generation never stopped.
#[test]
fn chained_generation_stopped_mid_group_continues_exactly() {
    use kiln::engine::Model;
    use kiln::model::{Output, SessionOptions};
    let cfg = SamplerConfig { temperature: 0.0, repeat_penalty: 1.3, repeat_last_n: 64, ..Default::default() };
    for g in gpus() {
        let model = Model::load(g.ctx.clone(), testdata().join("stories260K/stories260K.gguf"), &mut |_| {}).unwrap();
        let opts = SessionOptions { n_ctx: 128, ubatch: 64, f16_kv: true, all_logits: false, n_seq: 1 };
        let prompt = [1u32, 403, 407];
        let run = |per: usize, stop_after: Option<usize>| {
            let mut s = model.session(opts).unwrap();
            s.set_steps_per_submit(per);
            s.set_sampling(&Sampler::new(cfg), &prompt);
            let first = s.forward(&prompt, Output::Sampled).unwrap()[0] as u32;
            let mut got = vec![first];
            let mut seen = 0;
            got.extend(
                s.generate_chained(first, 30, &mut |_| {
                    seen += 1;
                    stop_after != Some(seen)
                })
                .unwrap(),
            );
            if stop_after.is_some() {
                let history: Vec<u32> = prompt.iter().chain(&got).copied().collect();
                s.set_sampling(&Sampler::new(cfg), &history);
                let last = *got.last().unwrap();
                let more = 31 - got.len();
                got.extend(s.generate_chained(last, more, &mut |_| true).unwrap());
            }
            got
        };
        let whole = run(1, None);
        assert_eq!(whole.len(), 31);
        for (per, stop) in [(5, 7), (4, 1), (64, 12)] {
            assert_eq!(run(per, Some(stop)), whole, "[{}] {per} steps per submit, stopped after {stop}", g.name);
        }
    }
}

/// A chained generation after a prompt starts from the decode step recorded while the prompt
/// ran (`Session::set_prerecord`): the same tokens as without it, greedy and sampled; and a
/// step recorded for one kind of sampler, or one that another step has passed, is not used.
#[test]
fn generation_from_the_step_recorded_during_the_prompt_gives_the_same_tokens() {
    use kiln::engine::Model;
    use kiln::model::{Output, SessionOptions};
    let greedy = SamplerConfig { temperature: 0.0, repeat_penalty: 1.3, repeat_last_n: 64, ..Default::default() };
    let sampled = SamplerConfig { seed: 11, top_k: 40, temperature: 0.9, ..Default::default() };
    for g in gpus() {
        let model = Model::load(g.ctx.clone(), testdata().join("stories260K/stories260K.gguf"), &mut |_| {}).unwrap();
        let opts = SessionOptions { n_ctx: 128, ubatch: 64, f16_kv: true, all_logits: false, n_seq: 1 };
        let prompt = [1u32, 403, 407, 9];
        // `then`: what happens between the prompt and the generation; `cfg_after`: the sampler
        // the generation takes (the prompt's is `cfg`).
        let run = |prerecord: bool, cfg: SamplerConfig, cfg_after: SamplerConfig, then: Option<u32>| {
            let mut s = model.session(opts).unwrap();
            s.set_prerecord(prerecord);
            s.set_sampling(&Sampler::new(cfg), &prompt);
            let first = s.forward(&prompt, Output::Sampled).unwrap()[0] as u32;
            assert_eq!(s.has_prerecorded(), prerecord, "[{}] after the prompt", g.name);
            let mut history: Vec<u32> = prompt.iter().copied().chain([first]).collect();
            let mut next = first;
            if let Some(extra) = then {
                s.forward(&[extra], Output::Sampled).unwrap();
                assert!(!s.has_prerecorded(), "[{}] a one-token step records none", g.name);
                history.push(extra);
                next = extra;
            }
            s.set_sampling(&Sampler::new(cfg_after), &history);
            let got = s.generate_chained(next, 24, &mut |_| true).unwrap();
            assert!(!s.has_prerecorded());
            (first, got)
        };
        for (cfg, cfg_after, then) in [
            (greedy, greedy, None),
            (sampled, sampled, None),
            (sampled, greedy, None),
            (greedy, sampled, None),
            (sampled, sampled, Some(77)),
        ] {
            let want = run(false, cfg, cfg_after, then);
            assert_eq!(run(true, cfg, cfg_after, then), want, "[{}] {cfg:?} then {cfg_after:?}, fed {then:?}", g.name);
        }
    }
}

/// Banned tokens (`--ignore-eos`) are never drawn, greedy or sampled, on the GPU as by the
/// reference.
#[test]
fn banned_tokens_are_never_drawn_on_the_gpu() {
    let g = &gpus()[0];
    let mut r = rng(77);
    let logits = model_logits(&mut r, 2000, 12.0);
    let top = logits.iter().enumerate().fold(0, |b, (i, &v)| if v > logits[b] { i } else { b }) as u32;
    for cfg in [
        SamplerConfig { temperature: 0.0, ..Default::default() },
        SamplerConfig { seed: 5, top_k: 3, ..Default::default() },
    ] {
        let mut cpu = Sampler::new(cfg);
        cpu.ban([top, 7]).unwrap();
        let k = SampleConfig::new(&cfg, logits.len() as u32, logits.len() as u32);
        let state = g.ctx.upload(bytemuck::cast_slice(&initial_state(0, &[], &cpu.banned)), "state").unwrap();
        let ids = g.ctx.storage(4, "ids").unwrap();
        let mut got = Vec::new();
        for _ in 0..10 {
            let lb = g.ctx.upload_f32(&logits, "logits").unwrap();
            let d = sample::prepare(&g.ctx, &k, &lb, &ids, &state, 1).unwrap();
            run_dispatches(&g.ctx, &d.iter().collect::<Vec<_>>()).unwrap();
            got.push(g.ctx.read_u32(&ids, 1).unwrap()[0]);
        }
        let want: Vec<u32> = (0..10).map(|_| cpu.sample(&logits, &[])).collect();
        assert_eq!(got, want, "{cfg:?}");
        assert!(!got.contains(&top), "{cfg:?}: drew the banned top token");
    }
}

/// The sampler of a batched decode step: each row a column whose slot (in another order than
/// the rows) has its own configuration, history and draws; over several steps each slot's
/// picks are those of the CPU reference sampler alone on its logits.
#[test]
fn batched_sampler_picks_each_slots_reference_tokens() {
    use kiln::kernels::matmul::StepColumn;
    let configs = sampler_configs();
    let n_slots = configs.len().min(8);
    let vocab = 1000usize;
    let steps = 6;
    for g in gpus() {
        let mut r = rng(4242);
        let logits: Vec<Vec<f32>> = (0..n_slots).map(|i| model_logits(&mut r, vocab, [12.0, 0.5][i % 2])).collect();
        let histories: Vec<Vec<u32>> =
            (0..n_slots).map(|_| (0..30).map(|_| r.range(0, vocab as i64) as u32).collect()).collect();
        let cfgs: Vec<SamplerConfig> =
            configs[..n_slots].iter().enumerate().map(|(i, c)| SamplerConfig { seed: 900 + i as u64, ..c.1 }).collect();
        let kernel_cfgs: Vec<SampleConfig> =
            cfgs.iter().map(|c| SampleConfig::new(c, vocab as u32, vocab as u32)).collect();
        let states: Vec<u32> = histories.iter().flat_map(|h| initial_state(0, h, &[])).collect();
        let configs_buf = g.ctx.upload(bytemuck::cast_slice(&kernel_cfgs), "configs").unwrap();
        let state = g.ctx.upload(bytemuck::cast_slice(&states), "state").unwrap();
        let ids = g.ctx.storage(n_slots as u64 * 4, "ids").unwrap();
        // Row c samples for slot n - 1 - c.
        let cols: Vec<StepColumn> = (0..n_slots)
            .map(|c| StepColumn { pos: 0, kv_len: 1, kv_base: 0, slot: (n_slots - 1 - c) as u32 })
            .collect();
        let rows: Vec<f32> = cols.iter().flat_map(|c| logits[c.slot as usize].clone()).collect();
        let mut got = vec![Vec::new(); n_slots];
        for _ in 0..steps {
            // The sampler rewrites the logits it penalizes: fresh ones each step.
            let lb = g.ctx.upload_f32(&rows, "logits").unwrap();
            let d = sample::prepare_columns(&g.ctx, &configs_buf, &lb, &ids, &state, &cols, vocab as u32).unwrap();
            run_dispatches(&g.ctx, &d.iter().collect::<Vec<_>>()).unwrap();
            for (c, t) in g.ctx.read_u32(&ids, n_slots).unwrap().into_iter().enumerate() {
                got[cols[c].slot as usize].push(t);
            }
        }
        for slot in 0..n_slots {
            let want = cpu_tokens(&cfgs[slot], &logits[slot], &histories[slot], steps);
            assert_eq!(got[slot], want, "[{}] slot {slot}: {}", g.name, configs[slot].0);
        }
    }
}
