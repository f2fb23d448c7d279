//! Drives the library API through a prefill and N decode steps and logs each token's time.
//!
//!   cargo run --release --example benchmark_inference_profile -- MODEL.gguf [PROMPT_TOKENS] [DECODE_STEPS]
//!
//! Without a model path it builds the synthetic tinyllama-1.1b:q4_k_m model in memory.

use std::time::Instant;

use kiln::engine::Model;
use kiln::gpu::{ContextOptions, GpuContext};
use kiln::model::{Output, SessionOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "synthetic".into());
    let n_prompt: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let n_decode: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let ctx = GpuContext::new(&ContextOptions::from_env()?)?;
    eprintln!("adapter: {}", ctx.describe());
    let path = if path == "synthetic" {
        let p = std::env::temp_dir().join("kiln-synthetic-tinyllama-q4_k_m.gguf");
        let (preset, ft) = kiln::synth::parse_spec("tinyllama-1.1b:q4_k_m")?;
        kiln::synth::build(&preset, ft)?.write(&mut std::io::BufWriter::new(std::fs::File::create(&p)?))?;
        p.to_string_lossy().to_string()
    } else {
        path
    };
    let t = Instant::now();
    let model = Model::load(ctx, &path, &mut |_| {})?;
    eprintln!("loaded {} in {:.2} s", path, t.elapsed().as_secs_f64());
    let n_ctx = (n_prompt + n_decode + 1) as u32;
    let mut s = model.session(SessionOptions { n_ctx, ubatch: 512, f16_kv: true, all_logits: false })?;
    // A fixed prompt: token ids spread over the vocabulary.
    let v = model.cfg.n_vocab as usize;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| (1 + (i * 7919) % (v - 1)) as u32).collect();
    // Warm-up step, so pipeline compilation is not timed.
    s.forward(&prompt[..1], Output::Argmax)?;
    s.reset();
    let t = Instant::now();
    let mut tok = s.forward(&prompt, Output::Argmax)?[0] as u32;
    let prefill = t.elapsed().as_secs_f64();
    println!("prefill: {n_prompt} tokens in {:.2} ms ({:.1} tok/s)", prefill * 1e3, n_prompt as f64 / prefill);
    let t = Instant::now();
    let mut times = Vec::with_capacity(n_decode);
    let mut sum = kiln::model::StepTiming::default();
    for i in 0..n_decode {
        let ts = Instant::now();
        tok = s.forward(&[tok], Output::Argmax)?[0] as u32;
        times.push(ts.elapsed().as_secs_f64() * 1e3);
        let st = s.timing;
        sum.encode += st.encode;
        sum.submit += st.submit;
        sum.wait += st.wait;
        if std::env::var("PROFILE").as_deref() == Ok("1") {
            println!(
                "token {i}: id {tok}, {:.3} ms (encode {:.3}, submit {:.3}, wait {:.3})",
                times[i],
                st.encode * 1e3,
                st.submit * 1e3,
                st.wait * 1e3
            );
        }
    }
    let n = n_decode as f64;
    // Chained greedy decoding: the next step is queued before the host reads a token.
    s.reset();
    let tok0 = s.forward(&prompt, Output::Argmax)?[0] as u32;
    let t_chain = Instant::now();
    let toks = s.generate_greedy_chained(tok0, n_decode, &mut |_| true)?;
    let chain = t_chain.elapsed().as_secs_f64();
    println!(
        "decode, chained steps: {} tokens in {:.2} ms ({:.1} tok/s)",
        toks.len(),
        chain * 1e3,
        toks.len() as f64 / chain
    );
    println!(
        "per decode token: encode {:.3} ms, submit {:.3} ms, wait+readback {:.3} ms",
        sum.encode / n * 1e3,
        sum.submit / n * 1e3,
        sum.wait / n * 1e3
    );
    // GPU time of one decode step from timestamp queries (a separate step, so the timing
    // readback does not slow the loop above).
    if s.enable_gpu_timing().is_ok() {
        s.forward(&[tok], Output::Argmax)?;
        println!("GPU time of one decode step: {:.3} ms", s.timing.gpu * 1e3);
    }
    let decode = t.elapsed().as_secs_f64();
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "decode: {n_decode} tokens in {:.2} ms ({:.1} tok/s); per token median {:.3} ms, min {:.3} ms",
        decode * 1e3,
        n_decode as f64 / decode,
        times[times.len() / 2],
        times[0]
    );
    println!("submits per decode step: 1, readbacks per decode step: 1 (4 bytes)");
    Ok(())
}
