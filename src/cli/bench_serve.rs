//! `kiln bench-serve URL`: a load generator for OpenAI-compatible servers in the manner of
//! vLLM's serving benchmark. N clients at a time send streaming completions of a fixed prompt
//! length (random token ids) and output length (`ignore_eos`, greedy) and time each token as it
//! arrives: aggregate output tokens/s, time to first token, inter-token latency and end-to-end
//! latency (p50/p99), for each concurrency level asked for.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct BenchServeArgs {
    /// The server's base URL, e.g. http://127.0.0.1:8080.
    pub url: String,
    /// Requests in flight at once; a comma-separated list runs one test per level.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    pub concurrency: Vec<usize>,
    /// Requests per level (default: 4 per concurrent client).
    #[arg(short = 'n', long = "num-prompts")]
    pub num_prompts: Option<usize>,
    /// Prompt length in tokens.
    #[arg(long = "input-len", default_value_t = 128)]
    pub input_len: usize,
    /// Tokens generated per request (end of generation ignored).
    #[arg(long = "output-len", default_value_t = 128)]
    pub output_len: usize,
    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// API key (default: KILN_API_KEY).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Output: md (a table) or json (one record per level, a line each).
    #[arg(short = 'o', long, default_value = "md")]
    pub output: String,
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
struct Timing {
    ttft: f64,
    /// Gaps between successive chunks of text.
    itl: Vec<f64>,
    e2e: f64,
    output_tokens: usize,
}

/// One concurrency level's results.
#[derive(Debug, Clone)]
pub struct LevelReport {
    pub concurrency: usize,
    pub requests: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub output_tok_s: f64,
    pub requests_per_s: f64,
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    /// Mean, median and 99th percentile (nearest rank) of `v`, in milliseconds.
    fn of_seconds(v: &[f64]) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        let mut s: Vec<f64> = v.iter().map(|x| x * 1e3).collect();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        Percentiles { mean: s.iter().sum::<f64>() / s.len() as f64, p50: at(0.5), p99: at(0.99) }
    }

    fn json(&self) -> Value {
        json!({"mean": self.mean, "p50": self.p50, "p99": self.p99})
    }
}

pub fn run(args: &BenchServeArgs) -> Result<()> {
    if args.output != "md" && args.output != "json" {
        return Err(KilnError::invalid("-o", format!("{:?} (expected md or json)", args.output)));
    }
    if args.concurrency.contains(&0) || args.output_len == 0 || args.input_len == 0 {
        return Err(KilnError::invalid("bench-serve", "concurrency, --input-len and --output-len must be at least 1"));
    }
    let base = args.url.trim_end_matches('/').to_string();
    let key = args.api_key.clone().or_else(crate::config::api_key_from_env);
    let agent = agent();
    let model = model_info(&agent, &base, key.as_deref())?;
    eprintln!(
        "bench-serve: {} at {base}: prompts of {} tokens, {} generated each (greedy, end of generation ignored)",
        model.id, args.input_len, args.output_len
    );
    // One short request first, so that no level pays for a cold start.
    let warm = Request::new(&model, &prompt_ids(model.n_vocab, 8.min(args.input_len), args.seed ^ 0xffff), 4);
    send(&agent, &base, key.as_deref(), &warm)?;
    if args.output == "md" {
        println!("| concurrency | requests | failed | duration s | output tok/s | req/s | TTFT mean / p50 / p99 ms | ITL mean / p50 / p99 ms | E2E p50 / p99 ms |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    }
    for &c in &args.concurrency {
        let n = args.num_prompts.unwrap_or(4 * c).max(1);
        let requests: Vec<Request> = (0..n)
            .map(|i| {
                let ids = prompt_ids(model.n_vocab, args.input_len, args.seed.wrapping_add(i as u64 * 7919));
                Request::new(&model, &ids, args.output_len)
            })
            .collect();
        let r = run_level(&agent, &base, key.as_deref(), c, &requests);
        match args.output.as_str() {
            "json" => println!(
                "{}",
                json!({"model": model.id, "url": base, "concurrency": r.concurrency, "requests": r.requests,
                       "failed": r.failed, "input_len": args.input_len, "output_len": args.output_len,
                       "duration_s": r.duration_s, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                       "output_tok_s": r.output_tok_s, "requests_per_s": r.requests_per_s,
                       "ttft_ms": r.ttft_ms.json(), "itl_ms": r.itl_ms.json(), "e2e_ms": r.e2e_ms.json()})
            ),
            _ => println!(
                "| {} | {} | {} | {:.2} | {:.1} | {:.2} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} | {:.0} / {:.0} |",
                r.concurrency,
                r.requests,
                r.failed,
                r.duration_s,
                r.output_tok_s,
                r.requests_per_s,
                r.ttft_ms.mean,
                r.ttft_ms.p50,
                r.ttft_ms.p99,
                r.itl_ms.mean,
                r.itl_ms.p50,
                r.itl_ms.p99,
                r.e2e_ms.p50,
                r.e2e_ms.p99
            ),
        }
    }
    Ok(())
}

/// Sends `requests` with `concurrency` clients at a time.
fn run_level(
    agent: &ureq::Agent,
    base: &str,
    key: Option<&str>,
    concurrency: usize,
    requests: &[Request],
) -> LevelReport {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<std::result::Result<Timing, String>>> = Mutex::new(Vec::new());
    let t = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..concurrency.min(requests.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(req) = requests.get(i) else { break };
                let r = send(agent, base, key, req).map_err(|e| e.to_string());
                if let Ok(mut all) = results.lock() {
                    all.push(r);
                }
            });
        }
    });
    let duration_s = t.elapsed().as_secs_f64();
    let results = results.into_inner().unwrap_or_default();
    let ok: Vec<&Timing> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let failed = results.len() - ok.len();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        eprintln!("bench-serve: {failed} of {} requests failed; the first: {e}", results.len());
    }
    let output_tokens: usize = ok.iter().map(|t| t.output_tokens).sum();
    let itl: Vec<f64> = ok.iter().flat_map(|t| t.itl.iter().copied()).collect();
    LevelReport {
        concurrency,
        requests: results.len(),
        failed,
        duration_s,
        input_tokens: ok.len() * requests.first().map_or(0, |r| r.input_len),
        output_tokens,
        output_tok_s: output_tokens as f64 / duration_s.max(1e-9),
        requests_per_s: ok.len() as f64 / duration_s.max(1e-9),
        ttft_ms: Percentiles::of_seconds(&ok.iter().map(|t| t.ttft).collect::<Vec<_>>()),
        itl_ms: Percentiles::of_seconds(&itl),
        e2e_ms: Percentiles::of_seconds(&ok.iter().map(|t| t.e2e).collect::<Vec<_>>()),
    }
}

/// The served model: its name and vocabulary size (kiln's and llama-server's /v1/models say
/// it in `meta.n_vocab`).
struct ModelInfo {
    id: String,
    n_vocab: Option<u32>,
}

fn model_info(agent: &ureq::Agent, base: &str, key: Option<&str>) -> Result<ModelInfo> {
    let url = format!("{base}/v1/models");
    let mut req = agent.get(&url);
    if let Some(k) = key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    let resp = req.call().map_err(|e| http_err(&url, e.to_string()))?;
    let status = resp.status().as_u16();
    let body = resp.into_body().read_to_string().map_err(|e| http_err(&url, e.to_string()))?;
    if status != 200 {
        return Err(http_err(&url, format!("HTTP {status}: {body}")));
    }
    let v: Value = serde_json::from_str(&body).map_err(|e| http_err(&url, format!("not JSON: {e}")))?;
    let m = &v["data"][0];
    let id = m["id"].as_str().ok_or_else(|| http_err(&url, "no model listed".into()))?.to_string();
    let n_vocab = m["meta"]["n_vocab"].as_u64().map(|n| n as u32);
    Ok(ModelInfo { id, n_vocab })
}

/// One request's body.
struct Request {
    body: String,
    input_len: usize,
}

impl Request {
    fn new(model: &ModelInfo, prompt: &Value, output_len: usize) -> Request {
        let input_len = prompt.as_array().map_or(0, Vec::len);
        let body = json!({"model": model.id, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
                          "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
        Request { body: body.to_string(), input_len }
    }
}

/// `n` random token ids from the upper part of the vocabulary (clear of special and byte
/// tokens); a text of `n` words where the vocabulary size is unknown.
fn prompt_ids(n_vocab: Option<u32>, n: usize, seed: u64) -> Value {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33
    };
    match n_vocab {
        Some(v) if v > 16 => {
            let lo = (v / 2).min(1000) as u64;
            json!((0..n).map(|_| lo + next() % (v as u64 - lo)).collect::<Vec<u64>>())
        }
        _ => {
            const WORDS: [&str; 8] = ["the", "cat", "sat", "on", "a", "warm", "red", "mat"];
            json!((0..n).map(|_| WORDS[next() as usize % WORDS.len()]).collect::<Vec<_>>().join(" "))
        }
    }
}

/// Sends one streaming request and times its chunks.
fn send(agent: &ureq::Agent, base: &str, key: Option<&str>, req: &Request) -> Result<Timing> {
    let url = format!("{base}/v1/completions");
    let t0 = Instant::now();
    let mut r = agent.post(&url).content_type("application/json");
    if let Some(k) = key {
        r = r.header("Authorization", format!("Bearer {k}"));
    }
    let resp = r.send(&req.body).map_err(|e| http_err(&url, e.to_string()))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.into_body().read_to_string().unwrap_or_default();
        return Err(http_err(&url, format!("HTTP {status}: {body}")));
    }
    let mut timing = Timing::default();
    let mut last: Option<Instant> = None;
    let mut chunks = 0;
    let mut done = false;
    for line in BufReader::new(resp.into_body().into_reader()).lines() {
        let line = line.map_err(|e| http_err(&url, e.to_string()))?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| http_err(&url, format!("bad chunk: {e}")))?;
        if v.get("error").is_some() {
            return Err(http_err(&url, format!("error in the stream: {data}")));
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            timing.output_tokens = n as usize;
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if text.is_empty() {
            continue;
        }
        let now = Instant::now();
        match last {
            None => timing.ttft = (now - t0).as_secs_f64(),
            Some(prev) => timing.itl.push((now - prev).as_secs_f64()),
        }
        last = Some(now);
        chunks += 1;
    }
    if !done {
        return Err(http_err(&url, "the stream ended without [DONE]".into()));
    }
    if timing.output_tokens == 0 {
        timing.output_tokens = chunks;
    }
    timing.e2e = t0.elapsed().as_secs_f64();
    Ok(timing)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .build()
        .into()
}

fn http_err(url: &str, message: String) -> KilnError {
    KilnError::invalid("bench-serve", format!("{url}: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|i| i as f64 / 1e3).collect();
        let p = Percentiles::of_seconds(&v);
        assert_eq!((p.p50, p.p99), (50.0, 99.0));
        assert!((p.mean - 50.5).abs() < 1e-9);
        let p = Percentiles::of_seconds(&[0.002]);
        assert_eq!((p.mean, p.p50, p.p99), (2.0, 2.0, 2.0));
    }

    #[test]
    fn prompts_have_the_length_asked_for_within_the_vocabulary() {
        let ids = prompt_ids(Some(512), 100, 3);
        let ids: Vec<u64> = ids.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|&i| (256..512).contains(&i)), "{ids:?}");
        assert_ne!(prompt_ids(Some(512), 10, 3), prompt_ids(Some(512), 10, 4));
        assert_eq!(prompt_ids(None, 5, 1).as_str().unwrap().split(' ').count(), 5);
    }
}
