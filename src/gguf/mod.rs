//! GGUF files: memory-mapped, parsed by kiln's own bounds-checked reader ([`parse`]), and
//! validated before anything is trusted: every tensor's type, shape and byte range is checked
//! against the file.

pub mod parse;
pub mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{KilnError, Result};
use crate::quant::WeightFormat;

/// One tensor's entry in the GGUF table.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// The ggml type id as stored.
    pub ggml_type: u32,
    /// The format kiln decodes it as, if kiln supports that type.
    pub format: Option<WeightFormat>,
    /// Dimensions, innermost first (ne[0] is the row length).
    pub dims: Vec<u64>,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// (rows, row length) of a matrix; a vector is one row.
    pub fn rows_k(&self) -> (usize, usize) {
        let k = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (rows, k)
    }
    pub fn type_name(&self) -> String {
        match self.format {
            Some(f) => f.name().to_string(),
            None => ggml_type_name(self.ggml_type),
        }
    }
}

/// ggml's names of its types, for messages.
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    };
    format!("{name} (ggml type {id})")
}

/// The bytes of the file: a mapped file, memory-mapped anonymous memory (synthetic models
/// built in memory), or owned (fuzzing).
enum Storage {
    File(memmap2::Mmap),
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::File(m) | Storage::Map(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    map: Storage,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let err = |m: String| KilnError::File { path: path.clone(), message: m };
        let file = std::fs::File::open(&path).map_err(|e| err(format!("cannot open: {e}")))?;
        let meta = file.metadata().map_err(|e| err(format!("cannot open: {e}")))?;
        if meta.is_dir() {
            return Err(err("is a directory, not a GGUF file".into()));
        }
        let storage = if meta.len() == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the file is mapped read-only; kiln does not modify it, and a change made by
            // another process while kiln runs can corrupt results but not memory safety of the
            // slices we hand out (they stay within the mapping).
            Storage::File(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?)
        };
        Self::validate(path, storage)
    }

    /// Parses and validates a file held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::validate(path.as_ref().to_path_buf(), Storage::Owned(bytes))
    }

    /// A GGUF image built in memory (synthetic models): `write` fills exactly `len` bytes.
    pub fn from_memory(
        label: &str,
        len: u64,
        write: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<GgufFile> {
        let path = PathBuf::from(label);
        let err = |m: String| KilnError::File { path: path.clone(), message: m };
        let mut map = memmap2::MmapMut::map_anon(len as usize).map_err(|e| err(format!("cannot allocate: {e}")))?;
        write(&mut map[..]).map_err(|e| err(format!("cannot build: {e}")))?;
        let map = map.make_read_only().map_err(|e| err(format!("cannot seal: {e}")))?;
        Self::from_map(path, map)
    }

    /// Parses and validates a mapped GGUF image.
    pub fn from_map(path: PathBuf, map: memmap2::Mmap) -> Result<GgufFile> {
        Self::validate(path, Storage::Map(map))
    }

    fn validate(path: PathBuf, map: Storage) -> Result<GgufFile> {
        let err = |m: String| KilnError::File { path: path.clone(), message: m };
        let header = parse::parse(&map).map_err(|m| {
            if m.starts_with("not a GGUF") || m.starts_with("GGUF version") {
                err(m)
            } else {
                err(format!("malformed GGUF header: {m}"))
            }
        })?;
        let data_offset = header.data_offset;
        let alignment = header.alignment;
        let file_len = map.len() as u64;
        // A vocabulary-only file has no tensor data, and need not pad up to where it would start.
        if data_offset > file_len && !header.tensors.is_empty() {
            return Err(err(format!(
                "truncated: the tensor data would start at byte {data_offset}, past the end ({file_len} bytes)"
            )));
        }
        let mut tensors = Vec::with_capacity(header.tensors.len());
        for t in header.tensors {
            let start =
                data_offset.checked_add(t.offset).ok_or_else(|| err(format!("tensor {} offset overflows", t.name)))?;
            let end = start.checked_add(t.bytes).ok_or_else(|| err(format!("tensor {} size overflows", t.name)))?;
            if end > file_len {
                return Err(err(format!(
                    "truncated: tensor {} needs bytes {start}..{end} but the file has {file_len}; re-download or re-convert the model",
                    t.name
                )));
            }
            let format = WeightFormat::from_ggml_type(t.ggml_type);
            tensors.push(TensorInfo {
                name: t.name,
                ggml_type: t.ggml_type,
                format,
                dims: t.dims,
                offset: start,
                bytes: t.bytes,
            });
        }
        // Overlapping tensor data means a corrupt table.
        let mut ranges: Vec<(u64, u64, &str)> =
            tensors.iter().map(|t| (t.offset, t.offset + t.bytes, t.name.as_str())).collect();
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(err(format!("tensors {} and {} overlap in the file", w[0].2, w[1].2)));
            }
        }
        Ok(GgufFile { path, map, version: header.version, metadata: header.metadata, tensors, alignment })
    }

    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor (validated to lie inside the file at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.offset as usize..(t.offset + t.bytes) as usize]
    }

    /// Tells the OS that the tensor data will be read once, front to back (read-ahead).
    pub fn will_read_tensors(&self) {
        if let Storage::File(m) = &self.map {
            let _ = m.advise(memmap2::Advice::Sequential);
        }
    }

    /// Drops this process's mapping of `t`'s pages once they are uploaded, as llama.cpp
    /// unmaps what it has offloaded: the file stays in the page cache, so a later read faults
    /// the pages back in, but the process no longer holds the model twice (its copy on the
    /// GPU and the file's pages). Only for mapped files: anonymous memory would be lost.
    pub fn release_tensor_data(&self, t: &TensorInfo) {
        if let Storage::File(m) = &self.map {
            let page = 4096usize;
            let start = t.offset as usize / page * page;
            let end = ((t.offset + t.bytes) as usize).min(m.len());
            if end > start {
                // SAFETY: the mapping is a read-only private mapping of a file; MADV_DONTNEED
                // discards only this process's page table entries, and any later access reads
                // the same bytes from the file again. No reference into these pages is held
                // across this call by the loader.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
            }
        }
    }

    fn bad_key(&self, key: &str, want: &str) -> KilnError {
        KilnError::File { path: self.path.clone(), message: format!("metadata {key} should be {want}") }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.bad_key(key, "an unsigned integer")),
        }
    }

    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|f| Some(f as f32)).ok_or_else(|| self.bad_key(key, "a number")),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.bad_key(key, "a string")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.bad_key(key, "a boolean")),
        }
    }

    /// A required unsigned integer.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| KilnError::File {
            path: self.path.clone(),
            message: format!("metadata key {key} is missing"),
        })
    }
}
