//! Hostile GGUF files, built here byte by byte: every one must be refused with one line that
//! names the problem, exit code 2, no panic, no allocation larger than the file, and quickly
//! (by the library, by `kiln run` before it opens a GPU, and by `kiln inspect`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kiln::gguf::GgufFile;
use kiln::model::ModelConfig;
use kiln::tokenizer::Tokenizer;

/// Records the largest single allocation made by a thread while it is watching.
struct Counting;

thread_local! {
    static WATCH: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = WATCH.try_with(|w| {
        if w.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---- building GGUF files ----

fn s(x: &[u8]) -> Vec<u8> {
    [(x.len() as u64).to_le_bytes().as_slice(), x].concat()
}
fn u32b(x: u32) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}
fn u64b(x: u64) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}

/// A key/value pair: key bytes, type id, value bytes.
#[derive(Clone)]
struct Kv(Vec<u8>, u32, Vec<u8>);

fn kv_u32(k: &str, v: u32) -> Kv {
    Kv(k.into(), 4, u32b(v))
}
fn kv_str(k: &str, v: &str) -> Kv {
    Kv(k.into(), 8, s(v.as_bytes()))
}

#[derive(Clone)]
struct Tensor {
    name: Vec<u8>,
    dims: Vec<u64>,
    ggml_type: u32,
    /// None: placed after the previous tensor.
    offset: Option<u64>,
}

/// A GGUF file; `build` lays it out (data aligned to 32), with counts and version as given.
#[derive(Clone)]
struct File {
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    kvs: Vec<Kv>,
    tensors: Vec<Tensor>,
}

const N_EMBD: u64 = 8;
const N_VOCAB: u64 = 7;

fn type_bytes(t: u32, n: u64) -> u64 {
    match t {
        1 | 30 => n.saturating_mul(2),
        _ => n.saturating_mul(4),
    }
}

impl File {
    /// A valid one-layer llama (8-wide, 2 heads, 1 KV head) with a 7-token vocabulary.
    fn base() -> File {
        let toks = ["<unk>", "<s>", "</s>", "\u{2581}a", "b", "<0x0A>", "\u{2581}"];
        let tok_arr = [u32b(8), u64b(toks.len() as u64), toks.iter().flat_map(|t| s(t.as_bytes())).collect()].concat();
        let scores = [u32b(6), u64b(7), (0..7).flat_map(|i| (-(i as f32)).to_le_bytes()).collect()].concat();
        let types =
            [u32b(5), u64b(7), [2i32, 3, 3, 1, 1, 6, 1].iter().flat_map(|t| t.to_le_bytes()).collect()].concat();
        let kvs = vec![
            kv_str("general.architecture", "llama"),
            kv_u32("llama.embedding_length", N_EMBD as u32),
            kv_u32("llama.block_count", 1),
            kv_u32("llama.feed_forward_length", 8),
            kv_u32("llama.attention.head_count", 2),
            kv_u32("llama.attention.head_count_kv", 1),
            kv_u32("llama.context_length", 16),
            kv_str("tokenizer.ggml.model", "llama"),
            Kv(b"tokenizer.ggml.tokens".to_vec(), 9, tok_arr),
            Kv(b"tokenizer.ggml.scores".to_vec(), 9, scores),
            Kv(b"tokenizer.ggml.token_type".to_vec(), 9, types),
        ];
        let t =
            |name: &str, dims: &[u64]| Tensor { name: name.into(), dims: dims.to_vec(), ggml_type: 0, offset: None };
        let tensors = vec![
            t("token_embd.weight", &[N_EMBD, N_VOCAB]),
            t("output_norm.weight", &[N_EMBD]),
            t("output.weight", &[N_EMBD, N_VOCAB]),
            t("blk.0.attn_norm.weight", &[N_EMBD]),
            t("blk.0.attn_q.weight", &[N_EMBD, 8]),
            t("blk.0.attn_k.weight", &[N_EMBD, 4]),
            t("blk.0.attn_v.weight", &[N_EMBD, 4]),
            t("blk.0.attn_output.weight", &[8, N_EMBD]),
            t("blk.0.ffn_norm.weight", &[N_EMBD]),
            t("blk.0.ffn_gate.weight", &[N_EMBD, 8]),
            t("blk.0.ffn_up.weight", &[N_EMBD, 8]),
            t("blk.0.ffn_down.weight", &[8, N_EMBD]),
        ];
        File { version: 3, n_tensors: None, n_kv: None, kvs, tensors }
    }

    fn set_kv(mut self, kv: Kv) -> File {
        match self.kvs.iter_mut().find(|k| k.0 == kv.0) {
            Some(k) => *k = kv,
            None => self.kvs.push(kv),
        }
        self
    }

    fn tensor(mut self, i: usize, f: impl FnOnce(&mut Tensor)) -> File {
        f(&mut self.tensors[i]);
        self
    }

    /// The bytes, and the offsets where sections end (for truncation).
    fn build_with_marks(&self) -> (Vec<u8>, Vec<usize>) {
        let mut b = b"GGUF".to_vec();
        let mut marks = vec![b.len()];
        b.extend(u32b(self.version));
        marks.push(b.len());
        b.extend(u64b(self.n_tensors.unwrap_or(self.tensors.len() as u64)));
        marks.push(b.len());
        b.extend(u64b(self.n_kv.unwrap_or(self.kvs.len() as u64)));
        marks.push(b.len());
        for Kv(k, t, v) in &self.kvs {
            b.extend(s(k));
            marks.push(b.len());
            b.extend(u32b(*t));
            marks.push(b.len());
            b.extend(v);
            marks.push(b.len());
        }
        let mut next = 0u64;
        let mut data_len = 0u64;
        for t in &self.tensors {
            b.extend(s(&t.name));
            b.extend(u32b(t.dims.len() as u32));
            t.dims.iter().for_each(|d| b.extend(u64b(*d)));
            b.extend(u32b(t.ggml_type));
            let off = t.offset.unwrap_or(next);
            b.extend(u64b(off));
            marks.push(b.len());
            let n = t.dims.iter().fold(1u64, |a, d| a.saturating_mul(*d));
            let bytes = type_bytes(t.ggml_type, n).min(1 << 12);
            if t.offset.is_none() {
                next = (off + bytes).div_ceil(32) * 32;
                data_len = data_len.max(off + bytes);
            }
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        let data_start = b.len();
        marks.push(data_start);
        // Deterministic small weights.
        b.extend(
            (0..data_len).map(|i| [0x00, 0x3c, 0x00, 0xbc][(i % 4) as usize] & if i % 8 < 4 { 0xff } else { 0x3f }),
        );
        (b, marks)
    }

    fn build(&self) -> Vec<u8> {
        self.build_with_marks().0
    }
}

/// Every malformed case: name, bytes, a word the message must contain, and whether the file
/// is well-formed GGUF (so `inspect` shows it and says what kiln cannot run).
fn cases() -> Vec<(String, Vec<u8>, &'static str, bool)> {
    let base = File::base();
    let (good, marks) = base.build_with_marks();
    let mut v: Vec<(String, Vec<u8>, &'static str, bool)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>, want: &'static str, well_formed: bool| {
        v.push((name.to_string(), bytes, want, well_formed));
    };
    // Truncation at every section boundary, and inside every tensor's data.
    let data_start = *marks.last().unwrap();
    for &m in &marks[..marks.len() - 1] {
        add(&format!("truncated-at-{m}"), good[..m].to_vec(), "truncated", false);
    }
    for (i, t) in base.tensors.iter().enumerate() {
        let f = GgufFile::from_bytes("base", good.clone()).unwrap();
        let info = f.tensor(std::str::from_utf8(&t.name).unwrap()).unwrap();
        let cut = (info.offset + info.bytes / 2) as usize;
        assert!(cut > data_start);
        add(&format!("truncated-in-tensor-{i}"), good[..cut].to_vec(), "truncated", false);
    }
    add("empty", Vec::new(), "bad magic", false);
    add("bad-magic", [b"GGML".as_slice(), &good[4..]].concat(), "bad magic", false);
    for version in [0u32, 1, 99] {
        add(&format!("version-{version}"), File { version, ..base.clone() }.build(), "version", false);
    }
    for n in [u64::MAX, u64::MAX - 1, 1 << 63, 1 << 40] {
        add(&format!("tensor-count-{n}"), File { n_tensors: Some(n), ..base.clone() }.build(), "tensors", false);
        add(&format!("kv-count-{n}"), File { n_kv: Some(n), ..base.clone() }.build(), "metadata entries", false);
    }
    // Strings and arrays far longer than the file.
    let mut key_len = good.clone();
    key_len[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    add("key-length-2^64", key_len, "string of", false);
    for n in [u64::MAX, 1 << 40, good.len() as u64] {
        let f = base.clone().set_kv(Kv(b"general.name".to_vec(), 8, u64b(n)));
        add(&format!("string-length-{n}"), f.build(), "string of", false);
        let f = base.clone().set_kv(Kv(b"general.tags".to_vec(), 9, [u32b(4), u64b(n)].concat()));
        add(&format!("array-length-{n}"), f.build(), "items", false);
        let f = base.clone().set_kv(Kv(b"general.tags".to_vec(), 9, [u32b(8), u64b(2), s(b"ok"), u64b(n)].concat()));
        add(&format!("array-string-length-{n}"), f.build(), "string of", false);
        let mut b = base.clone().tensor(3, |t| t.name = b"QQQQ".to_vec()).build();
        let marker = s(b"QQQQ");
        let at = b.windows(marker.len()).position(|w| w == marker.as_slice()).unwrap();
        b[at..at + 8].copy_from_slice(&n.to_le_bytes());
        add(&format!("tensor-name-length-{n}"), b, "string of", false);
    }
    // Shapes.
    add(
        "dims-overflow-u64",
        base.clone().tensor(4, |t| t.dims = vec![1 << 32, 1 << 32, 2]).build(),
        "overflows",
        false,
    );
    add("dims-overflow-max", base.clone().tensor(4, |t| t.dims = vec![u64::MAX, 2]).build(), "overflows", false);
    add("dims-overflow-i64", base.clone().tensor(4, |t| t.dims = vec![1 << 62, 4]).build(), "overflows", false);
    add("dims-bytes-overflow", base.clone().tensor(4, |t| t.dims = vec![1 << 62]).build(), "overflows", false);
    add("zero-dimension", base.clone().tensor(4, |t| t.dims = vec![8, 0]).build(), "empty shape", false);
    add("five-dimensions", base.clone().tensor(4, |t| t.dims = vec![8, 1, 1, 1, 8]).build(), "5 dimensions", false);
    add("no-dimensions", base.clone().tensor(4, |t| t.dims = vec![]).build(), "0 dimensions", false);
    let mut many_dims = base.clone().tensor(4, |t| t.dims = vec![8, 8]).build();
    let at = many_dims.windows(19).position(|w| w.starts_with(b"blk.0.attn_q.weight")).unwrap() + 19;
    many_dims[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    add("dimension-count-2^32", many_dims, "dimensions", false);
    // Offsets.
    add("offset-past-eof", base.clone().tensor(11, |t| t.offset = Some(1 << 20)).build(), "truncated", false);
    add("offset-near-2^64", base.clone().tensor(11, |t| t.offset = Some(u64::MAX - 31)).build(), "overflows", false);
    add("offset-misaligned", base.clone().tensor(5, |t| t.offset = Some(3)).build(), "not aligned", false);
    add("offsets-overlap", base.clone().tensor(2, |t| t.offset = Some(0)).build(), "overlap", false);
    // Types.
    for id in [4u32, 31, 40, 99, u32::MAX] {
        add(
            &format!("ggml-type-{id}"),
            base.clone().tensor(1, |t| t.ggml_type = id).build(),
            "unknown ggml type",
            false,
        );
    }
    add("kv-type-13", base.clone().set_kv(Kv(b"general.x".to_vec(), 13, u32b(0))).build(), "unknown value type", false);
    add(
        "kv-type-2^32",
        base.clone().set_kv(Kv(b"general.x".to_vec(), u32::MAX, u32b(0))).build(),
        "unknown value type",
        false,
    );
    add(
        "nested-array",
        base.clone()
            .set_kv(Kv(b"general.x".to_vec(), 9, [u32b(9), u64b(1), u32b(4), u64b(1), u32b(0)].concat()))
            .build(),
        "array of arrays",
        false,
    );
    add("bool-2", base.clone().set_kv(Kv(b"general.x".to_vec(), 7, vec![2])).build(), "boolean", false);
    add("alignment-0", base.clone().set_kv(kv_u32("general.alignment", 0)).build(), "alignment", false);
    add("alignment-3", base.clone().set_kv(kv_u32("general.alignment", 3)).build(), "alignment", false);
    // Names.
    add(
        "duplicate-tensor",
        base.clone().tensor(5, |t| t.name = b"blk.0.attn_q.weight".to_vec()).build(),
        "appears twice",
        false,
    );
    let mut dup_kv = base.clone();
    dup_kv.kvs.push(kv_u32("llama.block_count", 1));
    add("duplicate-key", dup_kv.build(), "appears twice", false);
    add("non-utf8-key", base.clone().set_kv(Kv(b"general.\xff\xfe".to_vec(), 4, u32b(1))).build(), "UTF-8", false);
    add("non-utf8-value", base.clone().set_kv(Kv(b"general.name".to_vec(), 8, s(b"caf\xe9"))).build(), "UTF-8", false);
    add("non-utf8-tensor-name", base.clone().tensor(1, |t| t.name = b"out\xc0put".to_vec()).build(), "UTF-8", false);
    add(
        "non-utf8-token",
        base.clone()
            .set_kv(Kv(b"tokenizer.ggml.tokens".to_vec(), 9, [u32b(8), u64b(1), s(b"\xed\xa0\x80")].concat()))
            .build(),
        "UTF-8",
        false,
    );
    // Well-formed files of a model kiln cannot run.
    add(
        "block-count-string",
        base.clone().set_kv(kv_str("llama.block_count", "one")).build(),
        "llama.block_count should be an unsigned integer",
        true,
    );
    add(
        "architecture-u32",
        base.clone().set_kv(kv_u32("general.architecture", 7)).build(),
        "general.architecture should be a string",
        true,
    );
    add("head-count-zero", base.clone().set_kv(kv_u32("llama.attention.head_count", 0)).build(), "zero-sized", true);
    add(
        "kv-head-count-zero",
        base.clone().set_kv(kv_u32("llama.attention.head_count_kv", 0)).build(),
        "zero-sized",
        true,
    );
    add(
        "heads-do-not-divide",
        base.clone()
            .set_kv(kv_u32("llama.attention.head_count", 3))
            .set_kv(kv_u32("llama.attention.head_count_kv", 2))
            .build(),
        "do not divide",
        true,
    );
    add(
        "embedding-not-multiple-of-heads",
        base.clone()
            .set_kv(kv_u32("llama.attention.head_count", 3))
            .set_kv(kv_u32("llama.attention.head_count_kv", 3))
            .build(),
        "not a multiple",
        true,
    );
    add(
        "head-dim-overflow",
        base.clone()
            .set_kv(kv_u32("llama.attention.head_count", 1 << 16))
            .set_kv(kv_u32("llama.attention.head_count_kv", 1 << 16))
            .set_kv(kv_u32("llama.attention.key_length", 1 << 16))
            .build(),
        "too large",
        true,
    );
    add(
        "missing-tensor",
        {
            let mut f = base.clone();
            f.tensors.pop();
            f.build()
        },
        "missing",
        true,
    );
    add(
        "unsupported-type",
        base.clone()
            .tensor(4, |t| {
                t.ggml_type = 2;
                t.dims = vec![32, 2];
            })
            .build(),
        "Q4_0",
        true,
    );
    add("wrong-shape", base.clone().tensor(4, |t| t.dims = vec![8, 4]).build(), "shape", true);
    add(
        "unsupported-architecture",
        base.clone().set_kv(kv_str("general.architecture", "gpt2")).build(),
        "not supported",
        true,
    );
    add(
        "tokenizer-unknown",
        base.clone().set_kv(kv_str("tokenizer.ggml.model", "rwkv")).build(),
        "not supported",
        true,
    );
    v
}

/// Parse, configure and build the tokenizer as `kiln run` does before it opens a GPU.
fn check(path: &str, bytes: Vec<u8>) -> kiln::Result<()> {
    let f = GgufFile::from_bytes(path, bytes)?;
    let cfg = ModelConfig::from_gguf(&f)?;
    cfg.validate_tensors(&f)?;
    Tokenizer::from_gguf(&f)?;
    Ok(())
}

#[test]
fn the_base_file_is_valid() {
    check("base.gguf", File::base().build()).unwrap();
}

#[test]
fn every_malformed_file_is_refused_in_the_library_without_large_allocations() {
    let (mut slowest, mut n) = (Duration::ZERO, 0);
    let mut biggest = (0usize, 0usize, String::new());
    for (name, bytes, want, _) in cases() {
        let len = bytes.len();
        let copy = bytes.clone();
        LARGEST.with(|l| l.set(0));
        WATCH.with(|w| w.set(true));
        let t = Instant::now();
        let r = check(&name, bytes);
        WATCH.with(|w| w.set(false));
        let took = t.elapsed();
        let err = match r {
            Ok(()) => panic!("{name}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{name}: message {err:?} does not say {want:?}");
        assert!(!err.contains('\n'), "{name}: more than one line: {err}");
        assert_eq!(kiln::KilnError::File { path: PathBuf::new(), message: String::new() }.exit_code(), 2);
        // The file's own bytes (the copy the caller handed over) are the largest allocation
        // the file may cause; anything else is bounded by it.
        let largest = LARGEST.with(|l| l.get());
        assert!(largest > 0, "{name}: the allocation counter saw nothing");
        assert!(largest <= len.max(4096), "{name}: an allocation of {largest} bytes for a file of {len}");
        assert!(took < Duration::from_millis(500), "{name}: took {took:?}");
        drop(copy);
        slowest = slowest.max(took);
        if largest > biggest.0 {
            biggest = (largest, len, name.clone());
        }
        n += 1;
    }
    eprintln!(
        "{n} malformed files refused in the library; slowest {:.3} ms; largest single allocation {} bytes ({}, a file of {} bytes)",
        slowest.as_secs_f64() * 1e3,
        biggest.0,
        biggest.2,
        biggest.1
    );
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs the binary, killing it after `limit`.
fn kiln(args: &[&std::ffi::OsStr], limit: Duration) -> (Option<i32>, String, String, Duration) {
    let t = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = t.elapsed();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

#[test]
fn kiln_run_and_inspect_refuse_every_malformed_file_on_one_line() {
    let mut slowest = (Duration::ZERO, String::new());
    let mut total = Duration::ZERO;
    let cases = cases();
    for (name, bytes, want, well_formed) in &cases {
        let p = temp_file(name, bytes);
        let (code, _, err, took) = kiln(
            &["run".as_ref(), "-m".as_ref(), p.as_os_str(), "-p".as_ref(), "hi".as_ref()],
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(2), "kiln run {name}: exit {code:?}, stderr {err}");
        assert_eq!(err.trim().lines().count(), 1, "kiln run {name}: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "kiln run {name}: {err}");
        // A hang guard: parse-level failures take milliseconds.
        assert!(took < Duration::from_secs(3), "kiln run {name}: took {took:?}");
        total += took;
        if took > slowest.0 {
            slowest = (took, name.clone());
        }
        let (code, out, err, _) = kiln(&["inspect".as_ref(), p.as_os_str()], Duration::from_secs(10));
        if *well_formed {
            assert_eq!(code, Some(0), "kiln inspect {name}: {err}");
            assert!(out.contains("kiln cannot run this model") && out.contains(want), "kiln inspect {name}: {out}");
        } else {
            assert_eq!(code, Some(2), "kiln inspect {name}: exit {code:?}, stderr {err}");
            assert_eq!(err.trim().lines().count(), 1, "kiln inspect {name}: {err}");
            assert!(err.contains(want) && !err.contains("panicked"), "kiln inspect {name}: {err}");
        }
        let _ = std::fs::remove_file(&p);
    }
    eprintln!(
        "kiln run on {} malformed files: mean {:.1} ms, slowest {:.1} ms ({})",
        cases.len(),
        total.as_secs_f64() * 1e3 / cases.len() as f64,
        slowest.0.as_secs_f64() * 1e3,
        slowest.1
    );
}

/// The committed fuzzing seeds stay what they claim to be: a runnable model and a
/// vocabulary-only file.
#[test]
fn fuzz_seeds_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/gguf");
    check("tiny-llama.gguf", std::fs::read(dir.join("tiny-llama.gguf")).unwrap()).unwrap();
    let vocab = GgufFile::from_bytes("vocab-only.gguf", std::fs::read(dir.join("vocab-only.gguf")).unwrap()).unwrap();
    assert!(vocab.tensors.is_empty());
    Tokenizer::from_gguf(&vocab).unwrap();
}
