//! Model files from Hugging Face repositories (`-hf REPO[:QUANT]`, `kiln pull`), as llama.cpp
//! fetches them: the repository's file list (`GET {endpoint}/api/models/{repo}/tree/main`)
//! picks the GGUF file of the quant asked for (default Q4_K_M), which is downloaded from
//! `{endpoint}/{repo}/resolve/main/{file}` into the cache directory, resuming a partial
//! download (`.part`, HTTP Range), and checked against the size and sha256 the hub lists.
//! A file once downloaded is used without the network.
//!
//! Layout of the cache: `{cache}/hf/{owner}/{name}/{file}`, beside `kiln-refs.json`, which
//! records what each `REPO[:QUANT]` resolved to, so a later run needs no file list.

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{KilnError, Result};

/// The quant picked when `-hf REPO` names none (llama.cpp's default).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// What is tried, in order, when a repository has several files and no Q4_K_M: the formats
/// kiln runs, smallest first.
const FALLBACK_QUANTS: &[&str] = &["Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "F16", "BF16", "F32"];

/// How many times one run tries a download (each try resumes where the last one stopped).
const ATTEMPTS: u32 = 3;

/// Where and how to reach the hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// `HF_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    /// `HF_TOKEN` (or `--hf-token`), sent as a Bearer token.
    pub token: Option<String>,
    /// `KILN_CACHE`, or the platform's cache directory.
    pub cache_dir: PathBuf,
}

impl HubOptions {
    pub fn from_env() -> Result<HubOptions> {
        let cache_dir = crate::config::cache_dir_from_env().ok_or_else(|| {
            KilnError::invalid("cache directory", "this system has no cache directory; set KILN_CACHE to one")
        })?;
        Ok(HubOptions {
            endpoint: crate::config::hf_endpoint_from_env(),
            token: crate::config::hf_token_from_env(),
            cache_dir,
        })
    }
}

/// `owner/name[:QUANT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub repo: String,
    pub quant: Option<String>,
}

impl ModelRef {
    pub fn parse(s: &str) -> Result<ModelRef> {
        let bad = |why: &str| {
            KilnError::invalid(
                "-hf",
                format!("{s:?}: {why} (expected OWNER/NAME[:QUANT], e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0)"),
            )
        };
        let (repo, quant) = match s.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (s, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let name_ok = |p: &str| {
            !p.is_empty() && p != "." && p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if parts.len() != 2 || !parts.iter().all(|p| name_ok(p)) {
            return Err(bad("not a repository name"));
        }
        let quant = match quant {
            Some(q) if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                return Err(bad("not a quant tag"))
            }
            q => q.map(str::to_string),
        };
        Ok(ModelRef { repo: repo.to_string(), quant })
    }
}

/// A file of a repository, as the hub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFile {
    pub path: String,
    pub size: u64,
    /// sha256 of the content (from the LFS pointer), when the hub gives one.
    pub sha256: Option<String>,
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    lfs: Option<LfsPointer>,
}

#[derive(Deserialize)]
struct LfsPointer {
    oid: String,
    size: u64,
}

/// Progress of one download, for the caller's progress bar.
#[derive(Debug, Clone)]
pub enum Progress<'a> {
    /// Starting (or resuming from `done` bytes) a file of `total` bytes.
    Start {
        file: &'a str,
        total: u64,
        done: u64,
    },
    /// Bytes of the file present so far.
    Bytes(u64),
    /// A try failed and the next one resumes.
    Retry {
        error: String,
    },
    Finish,
}

/// Whether to ask the hub when the cache already has what `REPO[:QUANT]` resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Use the cached file without the network (`-hf`).
    IfMissing,
    /// Ask the hub which file is current, and download it if the cache lacks it (`kiln pull`).
    Always,
}

/// What `fetch` found.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub path: PathBuf,
    pub file: RemoteFile,
    /// Taken from the cache without the network.
    pub cached: bool,
    /// No file of the quant asked for (none named, no Q4_K_M): another format was chosen.
    pub fallback: bool,
}

/// The local path of `REPO[:QUANT]` (or of `file` in REPO), downloading it if needed.
pub fn fetch(
    r: &ModelRef,
    file: Option<&str>,
    opts: &HubOptions,
    refresh: Refresh,
    progress: &mut dyn FnMut(Progress),
) -> Result<Fetched> {
    let dir = repo_dir(&opts.cache_dir, &r.repo);
    let key = match file {
        Some(f) => format!("file:{f}"),
        None => r.quant.as_deref().unwrap_or("").to_ascii_uppercase(),
    };
    let mut refs = Refs::load(&dir);
    if refresh == Refresh::IfMissing {
        if let Some(known) = refs.0.get(&key) {
            let path = local_path(&dir, &known.path)?;
            if std::fs::metadata(&path).is_ok_and(|m| m.len() == known.size) {
                return Ok(Fetched { path, file: known.clone(), cached: true, fallback: false });
            }
        }
    }
    let agent = agent();
    let files = list_files(&agent, opts, &r.repo)?;
    let (chosen, fallback) = match file {
        Some(f) => match files.iter().find(|x| x.path == f) {
            Some(x) => (x.clone(), false),
            None => {
                return Err(KilnError::invalid("--hf-file", format!("{}: no file {f:?} in the repository", r.repo)))
            }
        },
        None => select_file(&r.repo, &files, r.quant.as_deref())?,
    };
    let path = local_path(&dir, &chosen.path)?;
    let complete = std::fs::metadata(&path).is_ok_and(|m| m.len() == chosen.size);
    if !complete {
        download(&agent, opts, &r.repo, &chosen, &path, progress)?;
    }
    refs.0.insert(key, chosen.clone());
    refs.save(&dir)?;
    Ok(Fetched { path, file: chosen, cached: false, fallback })
}

/// What each `REPO[:QUANT]` resolved to, kept beside the files.
#[derive(Default, Serialize, Deserialize)]
struct Refs(BTreeMap<String, RemoteFile>);

const REFS_FILE: &str = "kiln-refs.json";

impl Refs {
    fn load(dir: &Path) -> Refs {
        std::fs::read(dir.join(REFS_FILE)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(REFS_FILE);
        let json = serde_json::to_vec_pretty(self).map_err(|e| file_err(&path, e.to_string()))?;
        std::fs::write(&path, json).map_err(|e| file_err(&path, format!("cannot write: {e}")))
    }
}

fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    // `repo` was checked by ModelRef::parse: two plain names.
    cache.join("hf").join(repo)
}

/// The cache path of a file the hub listed; its name comes from the network, so it must stay
/// inside the repository's directory.
fn local_path(dir: &Path, remote: &str) -> Result<PathBuf> {
    let p = Path::new(remote);
    let plain = !remote.is_empty()
        && !remote.contains('\\')
        && p.components().all(|c| matches!(c, Component::Normal(n) if n.to_str().is_some_and(|s| !s.starts_with('.'))));
    if !plain {
        return Err(KilnError::Download {
            what: remote.to_string(),
            message: "the hub listed a file name that is not a plain relative path".into(),
        });
    }
    Ok(dir.join(p))
}

fn file_err(path: &Path, message: String) -> KilnError {
    KilnError::File { path: path.to_path_buf(), message }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn get(agent: &ureq::Agent, opts: &HubOptions, url: &str, range_from: u64) -> Result<ureq::http::Response<ureq::Body>> {
    let mut req = agent.get(url);
    if let Some(t) = &opts.token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    if range_from > 0 {
        req = req.header("Range", format!("bytes={range_from}-"));
    }
    req.call().map_err(|e| KilnError::Download {
        what: url.to_string(),
        message: format!("{e} (check the network, or HF_ENDPOINT)"),
    })
}

/// One line for an HTTP error status from the hub; `what` is "repository" or "file NAME".
fn status_error(repo: &str, status: u16, what: &str) -> KilnError {
    match status {
        401 | 403 => KilnError::invalid(
            "-hf",
            format!(
                "{repo}: access denied (HTTP {status}): the repository is gated or private, or does not exist; \
                 set HF_TOKEN to a token with access to it (and accept the model's terms on its page)"
            ),
        ),
        404 => KilnError::invalid("-hf", format!("{repo}: no such {what} (HTTP 404); check the name")),
        _ => KilnError::Download { what: repo.to_string(), message: format!("HTTP {status} for the {what}") },
    }
}

/// Every file of the repository's main revision, with sizes and sha256 (following the hub's
/// pages, `Link: <…>; rel="next"`, for repositories of more than a thousand files).
pub fn list_files(agent: &ureq::Agent, opts: &HubOptions, repo: &str) -> Result<Vec<RemoteFile>> {
    let mut url = format!("{}/api/models/{repo}/tree/main?recursive=true", opts.endpoint);
    let mut files = Vec::new();
    for _page in 0..100 {
        let resp = get(agent, opts, &url, 0)?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(status_error(repo, status, "repository"));
        }
        let next = resp.headers().get("link").and_then(|l| l.to_str().ok()).and_then(next_page);
        let body = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .map_err(|e| KilnError::Download { what: url.clone(), message: e.to_string() })?;
        let entries: Vec<TreeEntry> = serde_json::from_slice(&body).map_err(|e| KilnError::Download {
            what: url.clone(),
            message: format!("the hub's file list is not what kiln expects: {e}"),
        })?;
        files.extend(entries.into_iter().filter(|e| e.kind == "file").map(|e| match e.lfs {
            Some(l) => RemoteFile { path: e.path, size: l.size, sha256: Some(l.oid.to_ascii_lowercase()) },
            None => RemoteFile { path: e.path, size: e.size, sha256: None },
        }));
        match next {
            Some(n) => url = n,
            None => break,
        }
    }
    Ok(files)
}

/// The `rel="next"` address of an HTTP Link header.
fn next_page(link: &str) -> Option<String> {
    link.split(',').find(|part| part.contains("rel=\"next\"")).and_then(|part| {
        let (start, end) = (part.find('<')?, part.find('>')?);
        (start < end).then(|| part[start + 1..end].to_string())
    })
}

/// The parts of a file name that may name a quant: `a/Llama-3-8B.Q4_K_M.gguf` has "Llama",
/// "3", "8B", "Q4_K_M".
fn name_parts(path: &str) -> impl Iterator<Item = &str> {
    let stem = path.strip_suffix(".gguf").or_else(|| path.strip_suffix(".GGUF")).unwrap_or(path);
    stem.split(['/', '-', '.']).filter(|p| !p.is_empty())
}

/// The quant tag in a file name ("Q4_K_M", "IQ4_XS", "F16", "BF16"), upper-cased.
pub fn quant_tag(path: &str) -> Option<String> {
    name_parts(path).map(|p| p.to_ascii_uppercase()).filter(|p| looks_like_quant(p)).last()
}

fn looks_like_quant(p: &str) -> bool {
    if matches!(p, "F16" | "F32" | "BF16") {
        return true;
    }
    let rest = p.strip_prefix("IQ").or_else(|| p.strip_prefix('Q'));
    rest.is_some_and(|r| {
        r.starts_with(|c: char| c.is_ascii_digit()) && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Whether the file is one shard of a split GGUF (`-00001-of-00003.gguf`).
fn is_shard(path: &str) -> bool {
    let parts: Vec<&str> = name_parts(path).collect();
    parts
        .windows(3)
        .any(|w| w[1] == "of" && [w[0], w[2]].iter().all(|n| n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit())))
}

/// Picks the GGUF file of `quant` (case-insensitive; default Q4_K_M) among `files`. A
/// repository with a single GGUF file gives that one whatever its quant, when none is named.
/// Returns the file and whether it is a fallback (no quant named, no Q4_K_M in the repository).
pub fn select_file(repo: &str, files: &[RemoteFile], quant: Option<&str>) -> Result<(RemoteFile, bool)> {
    // Vision projectors (mmproj) are GGUF files too, but not models.
    let ggufs: Vec<&RemoteFile> = files
        .iter()
        .filter(|f| f.path.to_ascii_lowercase().ends_with(".gguf") && !f.path.to_ascii_lowercase().contains("mmproj"))
        .collect();
    if ggufs.is_empty() {
        return Err(KilnError::invalid(
            "-hf",
            format!("{repo} has no GGUF file; kiln needs a repository of GGUF models"),
        ));
    }
    let of_quant = |q: &str| -> Vec<&RemoteFile> {
        ggufs.iter().copied().filter(|f| name_parts(&f.path).any(|p| p.eq_ignore_ascii_case(q))).collect()
    };
    let available = || {
        let mut tags: Vec<String> =
            ggufs.iter().map(|f| quant_tag(&f.path).unwrap_or_else(|| f.path.clone())).collect();
        tags.sort();
        tags.dedup();
        tags.join(", ")
    };
    let pick = |q: &str, matches: Vec<&RemoteFile>| -> Result<RemoteFile> {
        let singles: Vec<&RemoteFile> = matches.iter().copied().filter(|f| !is_shard(&f.path)).collect();
        match singles.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(KilnError::invalid(
                "-hf",
                format!(
                    "{repo}:{q} is split into {} files, which kiln cannot load; choose another quant ({})",
                    matches.len(),
                    available()
                ),
            )),
            many => Err(KilnError::invalid(
                "-hf",
                format!(
                    "{repo}: {} files match {q} ({}); name one with --hf-file",
                    many.len(),
                    many.iter().map(|f| f.path.as_str()).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    };
    if let Some(q) = quant {
        let matches = of_quant(q);
        if matches.is_empty() {
            return Err(KilnError::invalid(
                "-hf",
                format!("{repo} has no {} file; it has: {}", q.to_ascii_uppercase(), available()),
            ));
        }
        return pick(q, matches).map(|f| (f, false));
    }
    if let [one] = ggufs.as_slice() {
        if !is_shard(&one.path) {
            return Ok(((*one).clone(), false));
        }
    }
    let default = of_quant(DEFAULT_QUANT);
    if !default.is_empty() {
        return pick(DEFAULT_QUANT, default).map(|f| (f, false));
    }
    for q in FALLBACK_QUANTS {
        let m = of_quant(q);
        if !m.is_empty() && m.iter().any(|f| !is_shard(&f.path)) {
            return pick(q, m).map(|f| (f, true));
        }
    }
    Err(KilnError::invalid(
        "-hf",
        format!("{repo} has no {DEFAULT_QUANT} file; choose one with -hf {repo}:QUANT ({})", available()),
    ))
}

/// Downloads `file` to `dest` through `dest.part`, resuming what an earlier run left there,
/// retrying a broken transfer, and checking size and sha256 before the file takes its name.
fn download(
    agent: &ureq::Agent,
    opts: &HubOptions,
    repo: &str,
    file: &RemoteFile,
    dest: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| file_err(parent, format!("cannot create: {e}")))?;
    }
    let part = PathBuf::from(format!("{}.part", dest.display()));
    let url = format!("{}/{repo}/resolve/main/{}", opts.endpoint, file.path);
    let mut attempt = 1;
    loop {
        match download_once(agent, opts, repo, file, &part, &url, progress) {
            Ok(Transfer::Complete) => break,
            Ok(Transfer::Interrupted(why)) if attempt < ATTEMPTS => {
                progress(Progress::Retry { error: why });
                std::thread::sleep(Duration::from_millis(500 * attempt as u64));
                attempt += 1;
            }
            Ok(Transfer::Interrupted(why)) => {
                let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
                return Err(KilnError::Download {
                    what: file.path.clone(),
                    message: format!(
                        "the download broke off {ATTEMPTS} times ({why}); {have} of {} bytes are kept in {}: \
                         run the command again to resume",
                        file.size,
                        part.display()
                    ),
                });
            }
            Err(e) => return Err(e),
        }
    }
    progress(Progress::Finish);
    verify(file, &part)?;
    std::fs::rename(&part, dest).map_err(|e| file_err(dest, format!("cannot move the download into place: {e}")))
}

enum Transfer {
    Complete,
    /// The connection broke off; what arrived is in the `.part` file.
    Interrupted(String),
}

fn download_once(
    agent: &ureq::Agent,
    opts: &HubOptions,
    repo: &str,
    file: &RemoteFile,
    part: &Path,
    url: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<Transfer> {
    let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    if have > file.size {
        have = 0;
    }
    let resp = if have == file.size && have > 0 {
        None
    } else {
        match get(agent, opts, url, have) {
            Ok(r) => Some(r),
            // No answer at all: worth another try only if something was already downloaded.
            Err(e) if have > 0 => return Ok(Transfer::Interrupted(e.to_string())),
            Err(e) => return Err(e),
        }
    };
    let Some(resp) = resp else { return Ok(Transfer::Complete) };
    let status = resp.status().as_u16();
    // 206: the rest from `have`; 200: the server ignored the range, so start over.
    let start = match status {
        206 => have,
        200 => 0,
        416 => {
            // The part does not fit the file the hub has now: start over next time.
            let _ = std::fs::remove_file(part);
            return Ok(Transfer::Interrupted("the partial download did not match the server's file".into()));
        }
        _ => return Err(status_error(repo, status, &format!("file {}", file.path))),
    };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(part)
        .map_err(|e| file_err(part, format!("cannot write: {e}")))?;
    out.set_len(start).map_err(|e| file_err(part, format!("cannot write: {e}")))?;
    out.seek(std::io::SeekFrom::End(0)).map_err(|e| file_err(part, format!("cannot write: {e}")))?;
    progress(Progress::Start { file: &file.path, total: file.size, done: start });
    let mut body = resp.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = start;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Ok(Transfer::Interrupted(e.to_string())),
        };
        out.write_all(&buf[..n]).map_err(|e| file_err(part, format!("cannot write: {e}")))?;
        done += n as u64;
        progress(Progress::Bytes(done));
    }
    out.flush().map_err(|e| file_err(part, format!("cannot write: {e}")))?;
    if done < file.size {
        return Ok(Transfer::Interrupted(format!("the connection closed after {done} of {} bytes", file.size)));
    }
    Ok(Transfer::Complete)
}

/// Checks the finished `.part` against the hub's size and sha256; removes it if it differs.
fn verify(file: &RemoteFile, part: &Path) -> Result<()> {
    let fail = |message: String| {
        let _ = std::fs::remove_file(part);
        Err(KilnError::Download { what: file.path.clone(), message })
    };
    let size = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    if size != file.size {
        return fail(format!(
            "downloaded {size} bytes, the hub lists {}; the download was removed, run the command again",
            file.size
        ));
    }
    let Some(want) = &file.sha256 else { return Ok(()) };
    let got = sha256_file(part)?;
    if &got != want {
        return fail(format!(
            "checksum mismatch: sha256 {got}, the hub lists {want}; the download was removed, run the command again"
        ));
    }
    Ok(())
}

/// The file's sha256, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| file_err(path, format!("cannot read: {e}")))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| file_err(path, format!("cannot read: {e}")))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<RemoteFile> {
        names.iter().map(|n| RemoteFile { path: n.to_string(), size: 1, sha256: None }).collect()
    }

    fn pick(names: &[&str], quant: Option<&str>) -> Result<(String, bool)> {
        select_file("o/r", &files(names), quant).map(|(f, fb)| (f.path, fb))
    }

    #[test]
    fn parses_references() {
        assert_eq!(
            ModelRef::parse("Qwen/Qwen2.5-0.5B-Instruct-GGUF:q8_0").unwrap(),
            ModelRef { repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF".into(), quant: Some("q8_0".into()) }
        );
        assert_eq!(ModelRef::parse("a/b").unwrap().quant, None);
        for bad in ["a", "a/b/c", "../b", "a/..", "a/b:", "a/b:Q4 K", "/b", "a b/c"] {
            assert!(ModelRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn picks_the_quant_asked_for() {
        let repo = ["README.md", "m.Q4_K_M.gguf", "m.Q4_K_S.gguf", "m-q8_0.gguf", "m.BF16.gguf", "mmproj-m-f16.gguf"];
        assert_eq!(pick(&repo, None).unwrap(), ("m.Q4_K_M.gguf".into(), false));
        assert_eq!(pick(&repo, Some("Q8_0")).unwrap().0, "m-q8_0.gguf");
        assert_eq!(pick(&repo, Some("q4_k_s")).unwrap().0, "m.Q4_K_S.gguf");
        // Q4_K does not match Q4_K_M, F16 does not match BF16 (nor the projector).
        let e = pick(&repo, Some("F16")).unwrap_err().to_string();
        assert!(e.contains("no F16 file") && e.contains("BF16, Q4_K_M, Q4_K_S, Q8_0"), "{e}");
        assert!(pick(&repo, Some("Q4_K")).is_err());
    }

    #[test]
    fn falls_back_sensibly() {
        assert_eq!(pick(&["only-f16.gguf"], None).unwrap(), ("only-f16.gguf".into(), false));
        assert_eq!(pick(&["x.gguf"], None).unwrap(), ("x.gguf".into(), false));
        assert_eq!(pick(&["a.Q8_0.gguf", "a.F16.gguf"], None).unwrap(), ("a.Q8_0.gguf".into(), true));
        assert!(pick(&["a.IQ2_XS.gguf", "a.Q3_K_M.gguf"], None).unwrap_err().to_string().contains("IQ2_XS, Q3_K_M"));
        assert!(pick(&["README.md"], None).unwrap_err().to_string().contains("no GGUF file"));
        let split = ["Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", "m-Q8_0.gguf"];
        assert!(pick(&split, None).unwrap_err().to_string().contains("split into 2 files"));
        assert!(pick(&["a.Q8_0.gguf", "b/a.Q8_0.gguf"], Some("Q8_0")).unwrap_err().to_string().contains("--hf-file"));
    }

    #[test]
    fn names_from_the_network_stay_in_the_cache() {
        let d = Path::new("/cache/hf/o/r");
        assert_eq!(local_path(d, "sub/m.gguf").unwrap(), d.join("sub/m.gguf"));
        for bad in ["../x.gguf", "/etc/x", "a/../../x", "", ".hidden", "a\\b"] {
            assert!(local_path(d, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn follows_the_next_page() {
        let link = r#"<https://hf.co/api/models/o/r/tree/main?cursor=abc>; rel="next", <https://x>; rel="prev""#;
        assert_eq!(next_page(link).as_deref(), Some("https://hf.co/api/models/o/r/tree/main?cursor=abc"));
        assert_eq!(next_page(r#"<https://x>; rel="prev""#), None);
    }

    #[test]
    fn quant_tags() {
        assert_eq!(quant_tag("Meta-Llama-3-8B-Instruct.Q4_K_M.gguf").as_deref(), Some("Q4_K_M"));
        assert_eq!(quant_tag("qwen2.5-0.5b-instruct-iq4_xs.gguf").as_deref(), Some("IQ4_XS"));
        assert_eq!(quant_tag("model.gguf"), None);
    }
}
