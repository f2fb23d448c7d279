//! GGUF files: memory-mapped, parsed with gguf-rs, and validated before anything is trusted:
//! every tensor's type, shape and byte range is checked against the file.

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
    /// Size of the data in bytes (0 when the type is unsupported).
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

/// Names of the ggml types kiln does not decode, for messages.
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16..=23 => "IQ (importance-matrix quant)",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        _ => "unknown",
    };
    format!("{name} (ggml type {id})")
}

/// A reader over the mapped file that gguf-rs can own.
struct MapReader {
    map: std::sync::Arc<memmap2::Mmap>,
    pos: usize,
}

impl std::io::Read for MapReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest = &self.map[self.pos.min(self.map.len())..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    map: std::sync::Arc<memmap2::Mmap>,
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
        // SAFETY: the file is mapped read-only; kiln does not modify it, and a change made by
        // another process while kiln runs can corrupt results but not memory safety of the
        // slices we hand out (they stay within the mapping).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?;
        Self::from_map(path, map)
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
        let err = |m: String| KilnError::File { path: path.clone(), message: m };
        if map.len() < 8 || &map[..4] != b"GGUF" {
            return Err(err("not a GGUF file (bad magic); kiln reads GGUF v2/v3 model files".into()));
        }
        let version = u32::from_le_bytes([map[4], map[5], map[6], map[7]]);
        if !(2..=3).contains(&version) {
            return Err(err(format!("GGUF version {version} is not supported (kiln reads versions 2 and 3)")));
        }
        let map = std::sync::Arc::new(map);
        // gguf-rs reads the header from after the magic; it never reads the tensor data.
        let reader = MapReader { map: map.clone(), pos: 4 };
        let mut container = gguf_rs::GGUFContainer::new(gguf_rs::ByteOrder::LE, Box::new(reader), u64::MAX);
        let model = container.decode().map_err(|e| err(format!("malformed GGUF header: {e}")))?;
        let data_offset = model.data_offset();
        let alignment = model.alignment();
        let file_len = map.len() as u64;
        // A vocabulary-only file has no tensor data, and need not pad up to where it would start.
        if data_offset > file_len && !model.tensors().is_empty() {
            return Err(err(format!(
                "truncated: the tensor data would start at byte {data_offset}, past the end ({file_len} bytes)"
            )));
        }
        let mut tensors = Vec::with_capacity(model.tensors().len());
        let mut seen = std::collections::HashSet::new();
        for t in model.tensors() {
            if !seen.insert(t.name.clone()) {
                return Err(err(format!("tensor {} appears twice", t.name)));
            }
            let dims: Vec<u64> = t.shape.clone();
            if dims.is_empty() || dims.iter().any(|&d| d == 0) {
                return Err(err(format!("tensor {} has an empty shape {dims:?}", t.name)));
            }
            let n = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| err(format!("tensor {} shape {dims:?} overflows", t.name)))?;
            let format = WeightFormat::from_ggml_type(t.kind);
            let bytes = match format {
                Some(f) => {
                    let k = dims[0] as usize;
                    let rows = (n / dims[0]) as usize;
                    f.tensor_bytes(rows, k).ok_or_else(|| {
                        err(format!("tensor {}: row length {k} is not a whole number of {} blocks", t.name, f.name()))
                    })? as u64
                }
                None => 0,
            };
            if t.offset % alignment != 0 {
                return Err(err(format!("tensor {} data offset {} is not aligned to {alignment}", t.name, t.offset)));
            }
            let start =
                data_offset.checked_add(t.offset).ok_or_else(|| err(format!("tensor {} offset overflows", t.name)))?;
            let end = start.checked_add(bytes).ok_or_else(|| err(format!("tensor {} size overflows", t.name)))?;
            if end > file_len {
                return Err(err(format!(
                    "truncated: tensor {} needs bytes {start}..{end} but the file has {file_len}; re-download or re-convert the model",
                    t.name
                )));
            }
            tensors.push(TensorInfo { name: t.name.clone(), ggml_type: t.kind, format, dims, offset: start, bytes });
        }
        // Overlapping tensor data means a corrupt table.
        let mut ranges: Vec<(u64, u64, &str)> =
            tensors.iter().filter(|t| t.bytes > 0).map(|t| (t.offset, t.offset + t.bytes, t.name.as_str())).collect();
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(err(format!("tensors {} and {} overlap in the file", w[0].2, w[1].2)));
            }
        }
        let metadata = model.metadata().clone();
        Ok(GgufFile { path, map, version, metadata, tensors, alignment })
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
