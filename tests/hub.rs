//! `-hf REPO[:QUANT]` and `kiln pull` against a hub served from this test (127.0.0.1 only):
//! the file list picks the quant, a broken transfer resumes with an HTTP Range request (in the
//! same run, and in the next one), the cached file is used with no network, gated
//! repositories need HF_TOKEN, and a wrong checksum removes the download.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use common::testdata;

const TOKEN: &str = "hf_test_token";

/// One file of a served repository.
struct File {
    bytes: Vec<u8>,
    /// The sha256 the file list gives (the real one unless a test lies).
    sha256: String,
}

struct Repo {
    files: BTreeMap<String, File>,
    /// Needs `Authorization: Bearer TOKEN`.
    gated: bool,
}

/// What the server saw of each request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

#[derive(Default)]
struct State {
    repos: BTreeMap<String, Repo>,
    seen: Vec<Seen>,
    /// File transfers still to break off, and after how many bytes.
    cuts: usize,
    cut_after: usize,
}

/// A hub on 127.0.0.1: `GET /api/models/{repo}/tree/main` lists files as huggingface.co does
/// (LFS oid = sha256; two entries a page, the next page behind a `Link` header),
/// `GET /{repo}/resolve/main/{file}` redirects to `/cdn/…`, which serves the bytes with Range
/// support, or breaks off while `cuts` lasts.
struct Hub {
    endpoint: String,
    state: Arc<Mutex<State>>,
}

impl Hub {
    fn start(repos: BTreeMap<String, Repo>) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State { repos, ..Default::default() }));
        let (s, e) = (state.clone(), endpoint.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, e) = (s.clone(), e.clone());
                std::thread::spawn(move || serve(conn, &s, &e));
            }
        });
        Hub { endpoint, state }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// The Range headers of the byte transfers so far.
    fn ranges(&self) -> Vec<Option<String>> {
        self.seen().into_iter().filter(|s| s.path.starts_with("/cdn/")).map(|s| s.range).collect()
    }
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
}

fn serve(mut conn: TcpStream, state: &Mutex<State>, endpoint: &str) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "range" => range = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let mut st = state.lock().unwrap();
    st.seen.push(Seen { path: path.clone(), range: range.clone(), auth: auth.clone() });
    let authorized = auth.as_deref() == Some(&format!("Bearer {TOKEN}"));
    let find_repo = |st: &State, rest: &str| -> Option<(String, String)> {
        st.repos.keys().find_map(|r| rest.strip_prefix(&format!("{r}/")).map(|f| (r.clone(), f.to_string())))
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some(repo) = rest.split("/tree/main").next().filter(|r| st.repos.contains_key(*r)).map(str::to_string)
        else {
            return respond(&mut conn, "404 Not Found", &[], br#"{"error":"Repository not found"}"#);
        };
        let r = &st.repos[&repo];
        if r.gated && !authorized {
            return respond(&mut conn, "401 Unauthorized", &[], br#"{"error":"Access to model is restricted"}"#);
        }
        let mut list = vec![serde_json::json!({"type": "directory", "oid": "0", "size": 0, "path": "docs"})];
        for (name, f) in &r.files {
            let mut e = serde_json::json!({"type": "file", "oid": "1234abcd", "size": f.bytes.len(), "path": name});
            if name.ends_with(".gguf") {
                e["lfs"] = serde_json::json!({"oid": f.sha256, "size": f.bytes.len(), "pointerSize": 134});
            }
            list.push(e);
        }
        // Two entries a page, the rest behind a Link header, as the hub pages long lists.
        let (page, link) = if path.contains("cursor=2") {
            (list.split_off(2.min(list.len())), vec![])
        } else {
            list.truncate(2);
            let next = format!("<{endpoint}/api/models/{repo}/tree/main?recursive=true&cursor=2>; rel=\"next\"");
            (list, vec![("Link", next)])
        };
        return respond(&mut conn, "200 OK", &link, serde_json::to_string(&page).unwrap().as_bytes());
    }
    // resolve/main redirects to the CDN, as huggingface.co does for LFS files.
    if let Some((repo, file)) = path.strip_prefix('/').and_then(|p| find_repo(&st, p)) {
        let Some(file) = file.strip_prefix("resolve/main/") else {
            return respond(&mut conn, "404 Not Found", &[], b"");
        };
        if st.repos[&repo].gated && !authorized {
            return respond(&mut conn, "401 Unauthorized", &[], b"");
        }
        return respond(&mut conn, "302 Found", &[("Location", format!("/cdn/{repo}/{file}"))], b"");
    }
    let Some((repo, file)) = path.strip_prefix("/cdn/").and_then(|p| find_repo(&st, p)) else {
        return respond(&mut conn, "404 Not Found", &[], b"");
    };
    let Some(f) = st.repos[&repo].files.get(&file) else {
        return respond(&mut conn, "404 Not Found", &[], b"");
    };
    let bytes = f.bytes.clone();
    let from = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok())
        .unwrap_or(0);
    if from >= bytes.len() && from > 0 {
        return respond(&mut conn, "416 Range Not Satisfiable", &[], b"");
    }
    let (status, body) = if from > 0 { ("206 Partial Content", &bytes[from..]) } else { ("200 OK", &bytes[..]) };
    let content_range = ("Content-Range", format!("bytes {from}-{}/{}", bytes.len() - 1, bytes.len()));
    if st.cuts > 0 {
        // Promise the whole body, send part of it, and close the connection.
        st.cuts -= 1;
        let n = st.cut_after.min(body.len());
        let head = format!(
            "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n{}: {}\r\n\r\n",
            body.len(),
            content_range.0,
            content_range.1
        );
        let _ = conn.write_all(head.as_bytes());
        let _ = conn.write_all(&body[..n]);
        let _ = conn.shutdown(std::net::Shutdown::Both);
        return;
    }
    drop(st);
    respond(&mut conn, status, &[content_range], body);
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn file(path: &Path) -> File {
    let bytes = std::fs::read(path).unwrap();
    File { sha256: sha256(&bytes), bytes }
}

fn q4() -> PathBuf {
    testdata().join("derived/stories260K-pad256-Q4_K_M.gguf")
}

fn q8() -> PathBuf {
    testdata().join("derived/stories260K-pad256-Q8_0.gguf")
}

/// The repositories every test serves.
fn repos() -> BTreeMap<String, Repo> {
    let readme = || File { bytes: b"# readme\n".to_vec(), sha256: String::new() };
    let mut m = BTreeMap::new();
    let files = BTreeMap::from([
        ("stories260K-Q4_K_M.gguf".to_string(), file(&q4())),
        ("stories260K-Q8_0.gguf".to_string(), file(&q8())),
        ("README.md".to_string(), readme()),
    ]);
    m.insert("kiln-test/stories".to_string(), Repo { files, gated: false });
    let gated = BTreeMap::from([("sub/stories260K.Q8_0.gguf".to_string(), file(&q8()))]);
    m.insert("kiln-test/gated".to_string(), Repo { files: gated, gated: true });
    m.insert(
        "kiln-test/docs".to_string(),
        Repo { files: BTreeMap::from([("README.md".into(), readme())]), gated: false },
    );
    let mut wrong = file(&q4());
    wrong.sha256 = sha256(b"something else");
    let corrupt = BTreeMap::from([("stories260K-Q4_K_M.gguf".to_string(), wrong)]);
    m.insert("kiln-test/corrupt".to_string(), Repo { files: corrupt, gated: false });
    m
}

fn cache_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-test-hub-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// kiln with the hub at `endpoint` and its cache in `cache`; no proxy, no token.
fn kiln(endpoint: &str, cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.env("HF_ENDPOINT", endpoint).env("KILN_CACHE", cache).env_remove("HF_TOKEN");
    for v in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
        c.env_remove(v);
    }
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An endpoint where nothing listens.
fn dead_endpoint() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

const RUN: [&str; 6] = ["-p", "Once upon a time", "-n", "12", "--temp", "0"];

#[test]
fn a_broken_download_resumes_and_the_cached_file_needs_no_network() {
    let hub = Hub::start(repos());
    let cache = cache_dir("resume");
    // Every try of the first run breaks off after 400,000 bytes: it resumes twice, then
    // gives up keeping what it has.
    {
        let mut st = hub.state.lock().unwrap();
        st.cuts = 3;
        st.cut_after = 400_000;
    }
    let first = kiln(&hub.endpoint, &cache).args(["pull", "kiln-test/stories"]).output().unwrap();
    assert_eq!(first.status.code(), Some(1), "{}", stderr(&first));
    assert!(stderr(&first).contains("run the command again to resume"), "{}", stderr(&first));
    assert_eq!(
        hub.ranges(),
        [None, Some("bytes=400000-".to_string()), Some("bytes=800000-".to_string())],
        "each try resumes where the last one stopped"
    );
    let part = cache.join("hf/kiln-test/stories/stories260K-Q4_K_M.gguf.part");
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 1_200_000);

    // The next run (a model command, default quant Q4_K_M) resumes from the part file.
    let run = kiln(&hub.endpoint, &cache).args(["run", "-hf", "kiln-test/stories"]).args(RUN).output().unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(hub.ranges().last().unwrap().as_deref(), Some("bytes=1200000-"));
    let cached = cache.join("hf/kiln-test/stories/stories260K-Q4_K_M.gguf");
    assert_eq!(std::fs::read(&cached).unwrap(), std::fs::read(q4()).unwrap());
    assert!(!part.exists());
    let want = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["run", "-m"]).arg(q4()).args(RUN).output().unwrap();
    assert!(!want.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&want.stdout));

    // Offline: the same reference, and the inspect command, need no hub.
    let seen = hub.seen().len();
    let offline = dead_endpoint();
    let again = kiln(&offline, &cache).args(["run", "-hf", "kiln-test/stories"]).args(RUN).output().unwrap();
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(again.stdout, run.stdout);
    let inspect = kiln(&offline, &cache).args(["inspect", "-hf", "kiln-test/stories"]).output().unwrap();
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    assert_eq!(hub.seen().len(), seen, "the cached model was fetched again");
    // A quant never downloaded needs the network: one clear line.
    let q8 = kiln(&offline, &cache).args(["pull", "kiln-test/stories:Q8_0"]).output().unwrap();
    assert_eq!(q8.status.code(), Some(1));
    assert_eq!(stderr(&q8).lines().count(), 1, "{}", stderr(&q8));
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn quant_tags_gated_repositories_and_clear_errors() {
    let hub = Hub::start(repos());
    let cache = cache_dir("quant");
    // The tag picks the file, case-insensitively; pull prints where it is.
    let pull = kiln(&hub.endpoint, &cache).args(["pull", "kiln-test/stories:q8_0"]).output().unwrap();
    assert!(pull.status.success(), "{}", stderr(&pull));
    let path = PathBuf::from(String::from_utf8(pull.stdout).unwrap().trim());
    assert_eq!(path, cache.join("hf/kiln-test/stories/stories260K-Q8_0.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(q8()).unwrap());
    let inspect = kiln(&hub.endpoint, &cache).args(["inspect", "-hf", "kiln-test/stories:Q8_0"]).output().unwrap();
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("Q8_0"));

    let fails = |args: &[&str], code: i32, says: &[&str]| {
        let o = kiln(&hub.endpoint, &cache).args(args).output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{args:?}: one line: {e}");
        for s in says {
            assert!(e.contains(s), "{args:?}: {e:?} lacks {s:?}");
        }
    };
    fails(&["pull", "kiln-test/stories:Q5_K_M"], 2, &["no Q5_K_M file", "Q4_K_M, Q8_0"]);
    fails(&["pull", "kiln-test/missing"], 2, &["no such repository"]);
    fails(&["pull", "kiln-test/docs"], 2, &["no GGUF file"]);
    fails(&["pull", "not-a-repo"], 2, &["OWNER/NAME"]);
    fails(&["run", "-hf", "kiln-test/gated", "-p", "hi"], 2, &["HF_TOKEN", "gated"]);
    // With the token: sent as a Bearer token, and the one file of the repository is taken.
    let o = kiln(&hub.endpoint, &cache).env("HF_TOKEN", TOKEN).args(["pull", "kiln-test/gated"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(cache.join("hf/kiln-test/gated/sub/stories260K.Q8_0.gguf").exists());
    let auth: Vec<_> = hub.seen().into_iter().filter(|s| s.path.contains("gated")).filter_map(|s| s.auth).collect();
    assert!(auth.iter().any(|a| a == &format!("Bearer {TOKEN}")), "{auth:?}");
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn a_wrong_checksum_removes_the_download() {
    let hub = Hub::start(repos());
    let cache = cache_dir("checksum");
    let o = kiln(&hub.endpoint, &cache).args(["pull", "kiln-test/corrupt"]).output().unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("checksum mismatch") && e.contains("removed"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    let left: Vec<_> = files_under(&cache).into_iter().filter(|p| !p.ends_with("kiln-refs.json")).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&cache);
}
