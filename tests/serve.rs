//! `kiln serve` through a real HTTP client (ureq) against servers started on ephemeral ports
//! with stories260K: chat and text completions, streamed and not; greedy output equal to
//! `kiln run --temp 0` alone and beside seven other requests; stop strings; usage; every bad
//! input with its status; auth; a disconnect freeing its slot; queue overflow; SIGTERM during a
//! stream; flat memory over 200 requests; two servers behind a round-robin client; a GPU fault.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn stories() -> std::path::PathBuf {
    common::testdata().join("stories260K/stories260K.gguf")
}

/// A `kiln serve` process on a free port, killed when dropped; or a server run in this
/// process (`child` None), stopped when dropped.
struct Server {
    child: Option<Child>,
    addr: String,
    log: Arc<Mutex<String>>,
    in_process: Option<InProcess>,
}

struct InProcess {
    shutdown: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<kiln::Result<()>>,
}

impl Server {
    /// Starts `kiln serve -m stories260K --port 0 ARGS` and waits until /health says ok.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "-m"])
            .arg(stories())
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kiln serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        // Reads stderr to its end (a full pipe would block the server).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                sink.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => panic!("kiln serve printed no address: {}", log.lock().unwrap()),
        };
        let server = Server { child: Some(child), addr, log, in_process: None };
        server.wait_ready();
        server
    }

    /// `kiln::server::serve` on a thread of this process, with the model `load` loads.
    fn in_process(load: kiln::server::Loader) -> Server {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let _ = addr_tx.send(listener.local_addr()?.to_string());
                let cfg = kiln::server::ServeConfig {
                    model_id: "stories260K".into(),
                    api_key: None,
                    queue_size: 4,
                    timeout: Duration::from_secs(60),
                    body_limit: 1 << 20,
                };
                kiln::server::serve(listener, cfg, load, async move {
                    let _ = shutdown_rx.await;
                })
                .await
            })
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(60)).expect("no address");
        let server =
            Server { child: None, addr, log: Arc::default(), in_process: Some(InProcess { shutdown, thread }) };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let t = Instant::now();
        while get(self, "/health").0 != 200 {
            assert!(t.elapsed() < Duration::from_secs(120), "not ready: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("a server process").id()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// A metric's value from /metrics (the first line that starts with `name`).
    fn metric(&self, name: &str) -> f64 {
        let (_, text) = get(self, "/metrics");
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
    }

    /// Resident memory of the server process in bytes.
    fn rss(&self) -> u64 {
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.pid())).unwrap_or_default();
        statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.pid().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(p) = self.in_process.take() {
            let _ = p.shutdown.send(());
            let _ = p.thread.join();
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(180)))
        .build()
        .into()
}

fn get(s: &Server, path: &str) -> (u16, String) {
    get_with(s, path, None)
}

fn get_with(s: &Server, path: &str, key: Option<&str>) -> (u16, String) {
    let mut req = agent().get(s.url(path));
    if let Some(k) = key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    match req.call() {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.into_body().read_to_string().unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// POSTs `body`; returns the response (any status).
fn post_raw(s: &Server, path: &str, body: &str, key: Option<&str>) -> ureq::http::Response<ureq::Body> {
    let mut req = agent().post(s.url(path)).content_type("application/json");
    if let Some(k) = key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    req.send(body).expect("request")
}

/// POSTs a JSON body; returns the status and the JSON answer.
fn post(s: &Server, path: &str, body: &Value) -> (u16, Value) {
    post_key(s, path, &body.to_string(), None)
}

fn post_key(s: &Server, path: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let r = post_raw(s, path, body, key);
    let status = r.status().as_u16();
    let text = r.into_body().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// A server-sent event stream, one `data:` payload at a time.
struct Events {
    lines: std::io::Lines<BufReader<Box<dyn Read + Send>>>,
}

impl Events {
    fn open(s: &Server, path: &str, body: &Value, key: Option<&str>) -> Events {
        let r = post_raw(s, path, &body.to_string(), key);
        assert_eq!(r.status().as_u16(), 200);
        let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let reader: Box<dyn Read + Send> = Box::new(r.into_body().into_reader());
        Events { lines: BufReader::new(reader).lines() }
    }

    /// The next payload (None at the end of the stream).
    fn next(&mut self) -> Option<String> {
        for line in self.lines.by_ref() {
            let line = line.ok()?;
            if let Some(data) = line.strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
        None
    }

    /// The next chunk with text (a content delta or a completion's text).
    fn next_text(&mut self) -> Option<String> {
        while let Some(d) = self.next() {
            let v: Value = serde_json::from_str(&d).ok()?;
            if let Some(t) = chunk_text(&v).filter(|t| !t.is_empty()) {
                return Some(t);
            }
        }
        None
    }

    /// Every payload to the end.
    fn rest(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

fn chunk_text(v: &Value) -> Option<String> {
    let c = v["choices"].get(0)?;
    c["delta"]["content"].as_str().or(c["text"].as_str()).map(str::to_string)
}

/// What a finished stream said: the text, the finish reason, the usage chunk, and whether it
/// ended with [DONE].
#[derive(Debug, Default)]
struct Streamed {
    text: String,
    chunks: Vec<String>,
    finish: Option<String>,
    usage: Option<Value>,
    role: Option<String>,
    done: bool,
}

fn read_stream(payloads: &[String]) -> Streamed {
    let mut s = Streamed::default();
    for (i, p) in payloads.iter().enumerate() {
        if p == "[DONE]" {
            assert_eq!(i + 1, payloads.len(), "[DONE] is not last");
            s.done = true;
            continue;
        }
        let v: Value = serde_json::from_str(p).unwrap_or_else(|e| panic!("chunk not JSON ({e}): {p}"));
        assert!(v.get("error").is_none(), "error in the stream: {p}");
        if v["usage"].is_object() {
            s.usage = Some(v["usage"].clone());
        }
        let Some(c) = v["choices"].get(0) else { continue };
        if let Some(r) = c["delta"]["role"].as_str() {
            s.role = Some(r.to_string());
        }
        if let Some(t) = chunk_text(&v).filter(|t| !t.is_empty()) {
            s.text.push_str(&t);
            s.chunks.push(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            s.finish = Some(f.to_string());
        }
    }
    s
}

fn greedy(prompt: &str, max_tokens: u32) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

/// `kiln run --temp 0` on the same model: the text it prints.
fn kiln_run(prompt: &str, n: u32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "-m"])
        .arg(stories())
        .args(["-p", prompt, "-n", &n.to_string(), "--temp", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

const PROMPT: &str = "Once upon a time";

#[test]
fn chat_streamed_and_not_say_the_same() {
    let s = Server::start(&["--parallel", "2", "-c", "512"]);
    let messages = json!([{"role": "system", "content": "You tell stories."}, {"role": "user", "content": PROMPT}]);
    let body = json!({"model": "any", "messages": messages, "max_tokens": 12, "temperature": 0});
    let (status, whole) = post(&s, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "stories260K");
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!content.is_empty());
    let usage = &whole["usage"];
    let (prompt_tokens, completion_tokens) =
        (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt_tokens + completion_tokens));
    match choice["finish_reason"].as_str() {
        Some("length") => assert_eq!(completion_tokens, 12),
        Some("stop") => assert!(completion_tokens < 12),
        other => panic!("finish_reason {other:?}"),
    }
    // The prompt is the conversation rendered with the template (ChatML here), BOS first.
    let file = kiln::gguf::GgufFile::open(stories()).unwrap();
    let tok = kiln::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    let tmpl = kiln::chat::ChatTemplate::select(&file, None, "<s>".into(), "</s>".into()).unwrap();
    let msgs = [kiln::chat::Message::new("system", "You tell stories."), kiln::chat::Message::new("user", PROMPT)];
    let ids = kiln::chat::render_tokens(&tmpl, &tok, &msgs).unwrap();
    assert_eq!(prompt_tokens, ids.len() as u64);

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    streamed_body["stream_options"] = json!({"include_usage": true});
    let st = read_stream(&Events::open(&s, "/v1/chat/completions", &streamed_body, None).rest());
    assert_eq!(st.role.as_deref(), Some("assistant"));
    assert_eq!(st.text, content, "streamed {:?}", st.chunks);
    assert_eq!(st.finish.as_deref(), choice["finish_reason"].as_str());
    let su = st.usage.expect("a usage chunk");
    assert_eq!(
        (su["prompt_tokens"].as_u64(), su["completion_tokens"].as_u64()),
        (Some(prompt_tokens), Some(completion_tokens))
    );
    // The second request found the whole prompt but its last token in a slot's cache.
    assert_eq!(su["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt_tokens - 1));
    assert!(st.done, "no [DONE]");
    // Without include_usage: no usage chunk.
    streamed_body["stream_options"] = json!({"include_usage": false});
    let st = read_stream(&Events::open(&s, "/v1/chat/completions", &streamed_body, None).rest());
    assert!(st.usage.is_none() && st.done && st.text == content);
}

#[test]
fn greedy_output_equals_kiln_run_alone_and_beside_seven_other_requests() {
    let n = 24;
    let want = kiln_run(PROMPT, n);
    let s = Server::start(&["--parallel", "8", "-c", "2048"]);
    let (status, alone) = post(&s, "/v1/completions", &greedy(PROMPT, n));
    assert_eq!(status, 200, "{alone}");
    assert_eq!(alone["choices"][0]["text"].as_str(), Some(want.as_str()), "alone");
    let steps_alone = s.metric("kiln_decode_steps_total");
    assert_eq!(s.metric("kiln_decode_step_sequences_max"), 1.0, "a request alone steps alone");
    // The same request again (a slot holds its prompt now), in the middle of seven others:
    // sampled ones, streamed and not, with other prompts of other lengths.
    let barrier = Arc::new(Barrier::new(8));
    let spans: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let results: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (barrier, spans, s) = (barrier.clone(), spans.clone(), &s);
                scope.spawn(move || {
                    let body = if i == 3 {
                        greedy(PROMPT, n)
                    } else {
                        let story = "Once there was a big dog. ".repeat(i);
                        json!({"prompt": format!("{story}Lily and her friend number {i}"), "max_tokens": 20 + i,
                               "temperature": 0.9, "seed": i, "ignore_eos": true})
                    };
                    let stream = i % 2 == 1;
                    barrier.wait();
                    let t0 = Instant::now();
                    let text = if stream {
                        let mut b = body.clone();
                        b["stream"] = json!(true);
                        let st = read_stream(&Events::open(s, "/v1/completions", &b, None).rest());
                        assert!(st.done);
                        st.text
                    } else {
                        let (status, v) = post(s, "/v1/completions", &body);
                        assert_eq!(status, 200, "{v}");
                        v["choices"][0]["text"].as_str().unwrap().to_string()
                    };
                    spans.lock().unwrap().push((t0, Instant::now()));
                    text
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[3], want, "beside seven other requests");
    // They did run together: every request's span overlaps the others'.
    let spans = spans.lock().unwrap();
    let latest_start = spans.iter().map(|s| s.0).max().unwrap();
    let earliest_end = spans.iter().map(|s| s.1).min().unwrap();
    assert!(latest_start < earliest_end, "the eight requests did not overlap");
    assert!(s.metric("kiln_prompt_tokens_cached_total") >= 4.0, "the repeated prompt was evaluated again");
    // And they were batched: decode steps carried several sequences at once.
    let (steps, sequences) =
        (s.metric("kiln_decode_steps_total") - steps_alone, s.metric("kiln_decode_step_sequences_total"));
    let widest = s.metric("kiln_decode_step_sequences_max");
    eprintln!("{steps} decode steps beside each other, the widest of {widest} sequences ({sequences} in all)");
    assert!(widest >= 4.0, "no decode step carried more than {widest} sequences");
}

#[test]
fn stop_strings_end_the_text_before_them_and_never_reach_a_chunk() {
    let s = Server::start(&["--parallel", "2", "-c", "512"]);
    let n = 24;
    let (_, v) = post(&s, "/v1/completions", &greedy(PROMPT, n));
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string of several tokens from the middle of the text.
    let words: Vec<&str> = full.split_inclusive(' ').collect();
    assert!(words.len() > 6, "{full:?}");
    let stop = format!(" {}", words[4..6].concat().trim_end());
    let at = full.find(&stop).unwrap();
    let before = &full[..at];
    for stream in [false, true] {
        for stops in [json!(stop), json!(["never seen", stop])] {
            let mut body = greedy(PROMPT, n);
            body["stop"] = stops;
            body["stream"] = json!(stream);
            let (text, finish) = if stream {
                // Held back, the stop string's first tokens never reach a chunk: the chunks
                // add up to the text before it.
                let st = read_stream(&Events::open(&s, "/v1/completions", &body, None).rest());
                assert!(st.done);
                (st.text, st.finish)
            } else {
                let (_, v) = post(&s, "/v1/completions", &body);
                (
                    v["choices"][0]["text"].as_str().unwrap().to_string(),
                    v["choices"][0]["finish_reason"].as_str().map(str::to_string),
                )
            };
            assert_eq!(text, before, "stop {stop:?} (stream: {stream}) in {full:?}");
            assert_eq!(finish.as_deref(), Some("stop"));
        }
    }
    // A stop string that begins in the text but never completes: everything held back is
    // released, nothing lost.
    let mut body = greedy(PROMPT, n);
    body["stop"] = json!(format!("{stop}\u{7}"));
    body["stream"] = json!(true);
    let st = read_stream(&Events::open(&s, "/v1/completions", &body, None).rest());
    assert_eq!(st.text, full);
    assert_eq!(st.finish.as_deref(), Some("length"));
}

#[test]
fn usage_counts_prompt_and_completion_tokens() {
    let s = Server::start(&["--parallel", "1", "-c", "256"]);
    // Token ids as the prompt: exactly those.
    let body = json!({"prompt": [1, 403, 407, 261], "max_tokens": 7, "ignore_eos": true, "temperature": 0});
    let (status, v) = post(&s, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(v["usage"]["total_tokens"], 11);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Text: as `kiln tokenize` counts it.
    let out =
        Command::new(env!("CARGO_BIN_EXE_kiln")).args(["tokenize", "-m"]).arg(stories()).arg(PROMPT).output().unwrap();
    let ids = String::from_utf8(out.stdout).unwrap().split_whitespace().count();
    assert!(ids > 1);
    let (_, v) = post(&s, "/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 3, "ignore_eos": true}));
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(ids as u64));
    assert_eq!(v["usage"]["completion_tokens"], 3);
    // Counted in /metrics too.
    assert_eq!(s.metric("kiln_prompt_tokens_total"), (4 + ids) as f64);
    assert_eq!(s.metric("kiln_generated_tokens_total"), 10.0);
    assert_eq!(s.metric("kiln_requests_total{outcome=\"length\"}"), 2.0);
}

/// The error object of a 4xx/5xx answer, checked for OpenAI's shape.
fn error_of(status: u16, v: &Value, want_status: u16) -> (String, String) {
    assert_eq!(status, want_status, "{v}");
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string() && e.get("code").is_some(), "{v}");
    (e["message"].as_str().unwrap().to_string(), e["param"].as_str().unwrap_or("").to_string())
}

#[test]
fn bad_input_gets_the_status_and_names_the_field() {
    let s = Server::start(&["--parallel", "1", "-c", "256"]);
    let chat = "/v1/chat/completions";
    let user = json!([{"role": "user", "content": "Hi"}]);
    for (body, field) in [
        (r#"{"messages": [{"role": "user", "content": "Hi"}"#.to_string(), "body"),
        (json!({"messages": user, "max_tokens": "ten"}).to_string(), "max_tokens"),
        (json!({"messages": user, "temperature": "hot"}).to_string(), "temperature"),
        (json!({"messages": [{"role": "wizard", "content": "Hi"}]}).to_string(), "messages[0].role"),
        (json!({"messages": []}).to_string(), "messages"),
        (json!({"messages": user, "n": 2}).to_string(), "n"),
        (json!({"messages": user, "stop": 7}).to_string(), "stop"),
    ] {
        let (status, v) = post_key(&s, chat, &body, None);
        let (message, param) = error_of(status, &v, 400);
        assert_eq!(param, field, "{body}: {message}");
        assert!(message.contains(field), "{message}");
    }
    // Prompt plus max_tokens beyond a slot's context (256): the sizes are said.
    let (status, v) = post(&s, chat, &json!({"messages": user, "max_tokens": 250}));
    let (message, _) = error_of(status, &v, 400);
    assert!(message.contains("250") && message.contains("256"), "{message}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let long: Vec<u32> = (0..300).map(|i| 300 + i % 100).collect();
    let (status, v) = post(&s, "/v1/completions", &json!({"prompt": long}));
    let (message, _) = error_of(status, &v, 400);
    assert!(message.contains("300") && message.contains("256"), "{message}");
    let (status, v) = post(&s, "/v1/completions", &json!({"prompt": [1, 99999]}));
    assert_eq!(error_of(status, &v, 400).1, "prompt[1]");
    // A body over the limit (8 MiB), declared: 413 before it is read.
    let mut tcp = TcpStream::connect(&s.addr).unwrap();
    write!(tcp, "POST {chat} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9000000\r\n\r\n")
        .unwrap();
    tcp.write_all(&[b' '; 4096]).unwrap();
    let mut answer = String::new();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = tcp.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    assert!(body.contains("\"request_too_large\""), "{answer}");
    // Unknown routes and methods.
    let (status, text) = get(&s, "/v1/nothing");
    error_of(status, &serde_json::from_str(&text).unwrap(), 404);
    let (status, text) = get(&s, chat);
    error_of(status, &serde_json::from_str(&text).unwrap(), 405);
    // None of it hurt the server.
    let (status, v) = post(&s, "/v1/completions", &greedy(PROMPT, 2));
    assert_eq!(status, 200, "{v}");
    assert!(s.metric("kiln_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"}") >= 8.0);
}

#[test]
fn auth_disconnect_and_queue_overflow() {
    let key = "sekret-key";
    let s = Server::start(&["--parallel", "1", "--queue-size", "1", "-c", "512", "--api-key", key]);
    // Auth: /v1 needs the key; /health and /metrics do not.
    assert_eq!(get(&s, "/health").0, 200);
    assert_eq!(get(&s, "/metrics").0, 200);
    let (status, text) = get(&s, "/v1/models");
    error_of(status, &serde_json::from_str(&text).unwrap(), 401);
    let (status, text) = get_with(&s, "/v1/models", Some("wrong"));
    error_of(status, &serde_json::from_str(&text).unwrap(), 401);
    let (status, text) = get_with(&s, "/v1/models", Some(key));
    assert_eq!(status, 200, "{text}");
    let (status, v) = post_key(&s, "/v1/completions", &greedy(PROMPT, 2).to_string(), None);
    error_of(status, &v, 401);
    let (status, v) = post_key(&s, "/v1/completions", &greedy(PROMPT, 2).to_string(), Some("sekret-kez"));
    error_of(status, &v, 401);
    let (status, _) = post_key(&s, "/v1/completions", &greedy(PROMPT, 2).to_string(), Some(key));
    assert_eq!(status, 200);

    // A long stream, dropped after a few chunks: its slot is free at once.
    let long = json!({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": true, "stream": true});
    let mut events = Events::open(&s, "/v1/completions", &long, Some(key));
    for _ in 0..3 {
        events.next_text().expect("text");
    }
    let generated_before = s.metric("kiln_generated_tokens_total");
    drop(events);
    let t = Instant::now();
    while s.metric("kiln_slots_busy") != 0.0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the slot of a disconnected client is still busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    let freed_after = t.elapsed();
    assert_eq!(s.metric("kiln_requests_total{outcome=\"cancelled\"}"), 1.0);
    assert!(s.metric("kiln_generated_tokens_total") < generated_before + 100.0);
    let (status, _) = post_key(&s, "/v1/completions", &greedy(PROMPT, 2).to_string(), Some(key));
    assert_eq!(status, 200);
    eprintln!("slot freed {freed_after:?} after the disconnect");

    // Queue overflow: one request generating, one waiting, the third gets 503.
    let mut running = Events::open(&s, "/v1/completions", &long, Some(key));
    running.next_text().expect("text");
    let mut waiting = Events::open(&s, "/v1/completions", &long, Some(key));
    let t = Instant::now();
    while s.metric("kiln_queue_depth") != 1.0 {
        assert!(t.elapsed() < Duration::from_secs(10), "the second request is not queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = post_raw(&s, "/v1/completions", &greedy(PROMPT, 2).to_string(), Some(key));
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().get("retry-after").is_some(), "no Retry-After");
    let v: Value = serde_json::from_str(&r.into_body().read_to_string().unwrap()).unwrap();
    error_of(503, &v, 503);
    // The waiting request starts as soon as the running one goes.
    drop(running);
    waiting.next_text().expect("the queued request never started");
    drop(waiting);
    let t = Instant::now();
    while s.metric("kiln_slots_busy") != 0.0 || s.metric("kiln_queue_depth") != 0.0 {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = post_key(&s, "/v1/completions", &greedy(PROMPT, 2).to_string(), Some(key));
    assert_eq!(status, 200);
    assert!(s.metric("kiln_http_requests_total{route=\"/v1/completions\",status=\"503\"}") == 1.0);
}

#[test]
fn sigterm_lets_the_stream_in_flight_finish_then_exits_0() {
    let mut s = Server::start(&["--parallel", "2", "-c", "512"]);
    let n = 40;
    let body = json!({"prompt": PROMPT, "max_tokens": n, "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true}});
    let mut events = Events::open(&s, "/v1/completions", &body, None);
    let first = events.next_text().expect("text");
    s.signal("-TERM");
    let st = read_stream(&events.rest());
    assert!(st.done, "the stream did not end with [DONE]");
    assert_eq!(st.finish.as_deref(), Some("length"));
    assert_eq!(st.usage.unwrap()["completion_tokens"], n);
    assert!(!first.is_empty() && !st.text.is_empty());
    let t = Instant::now();
    let status = loop {
        if let Some(status) = s.child.as_mut().unwrap().try_wait().unwrap() {
            break status;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "still running after SIGTERM: {}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{}", s.log());
    assert!(!s.log().contains("panicked"), "{}", s.log());
    // Nothing listens any more.
    assert!(TcpStream::connect(&s.addr).is_err());
}

#[test]
fn two_hundred_requests_leave_memory_flat() {
    let s = Server::start(&["--parallel", "1", "-c", "128"]);
    let gpu0 = s.metric("kiln_gpu_memory_bytes");
    let mut rss = Vec::new();
    for i in 0..200 {
        let body = json!({"prompt": format!("Story {i}:"), "max_tokens": 2, "temperature": 0.5, "seed": i,
                          "stream": i % 4 == 0});
        if i % 4 == 0 {
            let st = read_stream(&Events::open(&s, "/v1/completions", &body, None).rest());
            assert!(st.done);
        } else {
            let (status, v) = post(&s, "/v1/completions", &body);
            assert_eq!(status, 200, "{v}");
        }
        if i % 20 == 19 {
            rss.push(s.rss());
        }
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!("server RSS every 20 requests (MiB): {:?}", rss.iter().map(|&r| mib(r) as u32).collect::<Vec<_>>());
    // After the first 40 (warm-up), resident memory stays within 8 MiB; GPU memory is exact.
    let warm = rss[1];
    let peak = *rss[1..].iter().max().unwrap();
    assert!(peak <= warm + (8 << 20), "RSS grew from {:.1} to {:.1} MiB", mib(warm), mib(peak));
    assert_eq!(s.metric("kiln_gpu_memory_bytes"), gpu0);
    assert_eq!(s.metric("kiln_requests_total{outcome=\"error\"}"), 0.0);
}

#[test]
fn two_servers_behind_a_round_robin_client() {
    let servers = [Server::start(&["--parallel", "2", "-c", "512"]), Server::start(&["--parallel", "2", "-c", "512"])];
    // The client sends to the servers in turn, skipping one whose /health is not 200, as a
    // load balancer does.
    let mut next = 0;
    let mut send = |body: &Value| -> (usize, Value) {
        for _ in 0..servers.len() {
            let i = next % servers.len();
            next += 1;
            if get(&servers[i], "/health").0 == 200 {
                let (status, v) = post(&servers[i], "/v1/completions", body);
                assert_eq!(status, 200, "{v}");
                return (i, v);
            }
        }
        panic!("no healthy server");
    };
    let mut texts = Vec::new();
    for _ in 0..6 {
        let (i, v) = send(&greedy(PROMPT, 8));
        texts.push((i, v["choices"][0]["text"].as_str().unwrap().to_string()));
    }
    assert_eq!(texts.iter().filter(|t| t.0 == 0).count(), 3);
    assert!(texts.iter().all(|t| t.1 == texts[0].1), "the servers answered differently: {texts:?}");
    for s in &servers {
        assert_eq!(s.metric("kiln_http_requests_total{route=\"/v1/completions\",status=\"200\"}"), 3.0);
    }
    // One server goes away: the client sends everything to the other.
    servers[0].signal("-TERM");
    let t = Instant::now();
    while get(&servers[0], "/health").0 == 200 {
        assert!(t.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..3 {
        assert_eq!(send(&greedy(PROMPT, 4)).0, 1);
    }
    assert_eq!(servers[1].metric("kiln_http_requests_total{route=\"/v1/completions\",status=\"200\"}"), 6.0);
}

#[test]
fn a_gpu_fault_fails_the_requests_in_flight_with_an_error_and_health_turns_503() {
    use kiln::server::slots::{plan_slots, BatchedSlots};
    // As main.rs does: Mesa's drivers probe Wayland and complain without a runtime dir.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let (ctx_tx, ctx_rx) = std::sync::mpsc::channel();
    let load: kiln::server::Loader = Box::new(move || {
        let ctx = kiln::gpu::GpuContext::new(&kiln::gpu::ContextOptions::default())?;
        let model = kiln::engine::Model::load(ctx.clone(), stories(), &mut |_| {})?;
        let tokenizer = kiln::tokenizer::Tokenizer::from_gguf(&model.file)?;
        let template = kiln::chat::ChatTemplate::select(&model.file, None, "<s>".into(), "</s>".into())?;
        let plan = plan_slots(&model, Some(1024), 2, 64, true, true)?;
        let slots = BatchedSlots::open(&model, plan.opts, plan.count)?;
        let _ = ctx_tx.send(ctx);
        Ok(kiln::server::Loaded { slots: Box::new(slots), tokenizer, template, n_ctx_train: model.cfg.n_ctx_train })
    });
    let s = Server::in_process(load);
    let ctx = ctx_rx.recv().unwrap();
    let long = json!({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": true, "stream": true});
    let mut events = Events::open(&s, "/v1/completions", &long, None);
    events.next_text().expect("text");
    ctx.device.destroy();
    // The stream ends with an error object (and no [DONE]).
    let rest = events.rest();
    let last: Value = serde_json::from_str(rest.last().expect("the stream ended without a word")).unwrap();
    assert!(last["error"]["message"].is_string(), "{rest:?}");
    assert_eq!(last["error"]["type"], "server_error");
    assert!(!rest.contains(&"[DONE]".to_string()));
    // The server stands, says it cannot generate, and refuses work with 503.
    let t = Instant::now();
    while get(&s, "/health").0 != 503 {
        assert!(t.elapsed() < Duration::from_secs(10), "/health still says ok");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(get(&s, "/health").1.contains("gpu fault"));
    let (status, v) = post(&s, "/v1/completions", &greedy(PROMPT, 2));
    let (message, _) = error_of(status, &v, 503);
    assert!(message.contains("GPU"), "{message}");
    assert_eq!(s.metric("kiln_gpu_fault"), 1.0);
    assert_eq!(s.metric("kiln_requests_total{outcome=\"error\"}"), 1.0);
}

#[test]
fn bench_serve_reports_throughput_and_latencies_per_concurrency() {
    let s = Server::start(&["--parallel", "2", "-c", "512"]);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "bench-serve",
            &s.url(""),
            "--concurrency",
            "1,2",
            "-n",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "5",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let records: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 2);
    for (r, c) in records.iter().zip([1, 2]) {
        assert_eq!(r["concurrency"], c);
        assert_eq!((r["requests"].as_u64(), r["failed"].as_u64()), (Some(2), Some(0)), "{r}");
        assert_eq!((r["input_tokens"].as_u64(), r["output_tokens"].as_u64()), (Some(16), Some(10)), "{r}");
        let (ttft, itl, e2e) = (&r["ttft_ms"], &r["itl_ms"], &r["e2e_ms"]);
        assert!(ttft["p50"].as_f64().unwrap() > 0.0 && ttft["p99"].as_f64() >= ttft["p50"].as_f64(), "{r}");
        assert!(itl["p50"].as_f64().unwrap() > 0.0 && e2e["p50"].as_f64() > ttft["p50"].as_f64(), "{r}");
        let rate = r["output_tok_s"].as_f64().unwrap();
        let expected = 10.0 / r["duration_s"].as_f64().unwrap();
        assert!((rate - expected).abs() < 1e-6 * expected, "{r}");
    }
    // The server saw the warm-up request and the four measured ones, each with 8 prompt tokens
    // (the warm-up's too) and the tokens asked for.
    assert_eq!(s.metric("kiln_http_requests_total{route=\"/v1/completions\",status=\"200\"}"), 5.0);
    assert_eq!(s.metric("kiln_generated_tokens_total"), 24.0);
}
