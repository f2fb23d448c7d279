//! Drives the library API through a prefill and N decode steps and logs each token's time;
//! with `PROFILE=1`, each step's GPU time and the per-stage tables at the end.
//!
//!   cargo run --release --example benchmark_inference_profile -- [MODEL.gguf|PRESET:FORMAT] [PROMPT_TOKENS] [DECODE_STEPS]
//!
//! Without a model it builds the synthetic tinyllama-1.1b:q4_k_m model in memory.

use std::time::Instant;

use kiln::engine::Model;
use kiln::gpu::{ContextOptions, GpuContext};
use kiln::model::{Output, SessionOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let source = args.get(1).cloned().unwrap_or_else(|| "tinyllama-1.1b:q4_k_m".into());
    let n_prompt: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let n_decode: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let profile = kiln::profile::profile_env();
    let ctx = GpuContext::new(&ContextOptions::from_env()?)?;
    eprintln!("adapter: {}", ctx.describe());
    let t = Instant::now();
    let model = if source.ends_with(".gguf") {
        Model::load(ctx.clone(), &source, &mut |_| {})?
    } else {
        let (preset, ft) = kiln::synth::parse_spec(&source)?;
        Model::load_file(ctx.clone(), kiln::synth::build(&preset, ft)?.into_gguf(&source)?, &mut |_| {})?
    };
    eprintln!("loaded {source} in {:.2} s", t.elapsed().as_secs_f64());
    let n_ctx = (n_prompt + 2 * n_decode + 2) as u32;
    let mut s = model.session(SessionOptions { n_ctx, ubatch: 512, f16_kv: true, all_logits: false, n_seq: 1 })?;
    // A fixed prompt: token ids spread over the vocabulary.
    let v = model.cfg.n_vocab as usize;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| (3 + (i * 7919) % (v - 3)) as u32).collect();
    // Warm-up steps, so pipeline compilation is not timed.
    s.forward(&prompt, Output::Argmax)?;
    s.forward(&prompt[..1], Output::Argmax)?;
    s.reset();
    if profile {
        s.enable_profiling()?;
    }

    let t = Instant::now();
    let mut tok = s.forward(&prompt, Output::Argmax)?[0] as u32;
    let prefill = t.elapsed().as_secs_f64();
    println!("prefill: {n_prompt} tokens in {:.2} ms ({:.1} tok/s)", prefill * 1e3, n_prompt as f64 / prefill);

    // One step at a time: each token's wall time and where it went on the host.
    let mut times = Vec::with_capacity(n_decode);
    let mut sum = kiln::model::StepTiming::default();
    let t = Instant::now();
    for i in 0..n_decode {
        let ts = Instant::now();
        tok = s.forward(&[tok], Output::Argmax)?[0] as u32;
        times.push(ts.elapsed().as_secs_f64() * 1e3);
        let st = s.timing;
        sum.encode += st.encode;
        sum.submit += st.submit;
        sum.wait += st.wait;
        sum.gpu += st.gpu;
        println!(
            "token {i}: id {tok}, {:.3} ms (encode {:.3}, submit {:.3}, wait+readback {:.3}{})",
            times[i],
            st.encode * 1e3,
            st.submit * 1e3,
            st.wait * 1e3,
            if profile { format!(", GPU {:.3}", st.gpu * 1e3) } else { String::new() }
        );
    }
    let decode = t.elapsed().as_secs_f64();
    let n = n_decode.max(1) as f64;
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "decode, one step at a time: {n_decode} tokens in {:.2} ms ({:.1} tok/s); median {:.3} ms, min {:.3} ms",
        decode * 1e3,
        n_decode as f64 / decode,
        times.get(times.len() / 2).copied().unwrap_or(0.0),
        times.first().copied().unwrap_or(0.0)
    );
    println!(
        "per token: encode {:.3} ms, submit {:.3} ms, wait+readback {:.3} ms{}; 1 submit and 1 readback (4 bytes) per step",
        sum.encode / n * 1e3,
        sum.submit / n * 1e3,
        sum.wait / n * 1e3,
        if profile { format!(", GPU {:.3} ms", sum.gpu / n * 1e3) } else { String::new() }
    );

    // Chained greedy decoding: the next step is queued before the host reads a token.
    let t_chain = Instant::now();
    let toks = s.generate_greedy_chained(tok, n_decode, &mut |_| true)?;
    let chain = t_chain.elapsed().as_secs_f64();
    println!(
        "decode, chained steps: {} tokens in {:.2} ms ({:.1} tok/s)",
        toks.len(),
        chain * 1e3,
        toks.len() as f64 / chain
    );
    if let Some(p) = s.profile() {
        let peak = kiln::kernels::probe::run(&ctx)?.peak;
        print!("{}", p.tables(Some(&peak)));
    }
    Ok(())
}
