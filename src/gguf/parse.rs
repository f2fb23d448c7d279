//! kiln's own reader of the GGUF header (key/value pairs and tensor table), over a byte slice.
//!
//! A GGUF file is untrusted input. Every count and length is checked against the bytes that
//! remain before anything is allocated, so no allocation grows with a number the file claims,
//! only with bytes the file has; strings must be UTF-8; type ids must be known. Errors are one
//! line naming the offending entry.

use std::collections::BTreeMap;

use serde_json::Value;

/// The GGUF value types.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// ggml allows at most 4 dimensions.
pub const MAX_DIMS: u32 = 4;
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// (elements per block, bytes per block) of every ggml type id that ggml defines, or `None`
/// for ids it does not (including ids it has retired).
pub fn ggml_block(id: u32) -> Option<(u64, u64)> {
    Some(match id {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),  // IQ2_XS
        18 => (256, 98),  // IQ3_XXS
        19 => (256, 50),  // IQ1_S
        20 => (32, 18),   // IQ4_NL
        21 => (256, 110), // IQ3_S
        22 => (256, 82),  // IQ2_S
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        29 => (256, 56),  // IQ1_M
        30 => (1, 2),     // BF16
        34 => (256, 54),  // TQ1_0
        35 => (256, 66),  // TQ2_0
        39 => (32, 17),   // MXFP4
        _ => return None,
    })
}

/// One tensor-table entry as stored (offset relative to the start of the data section).
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
    /// Bytes of data, from the type's block size and the shape (checked for overflow).
    pub bytes: u64,
}

/// What the header says.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<RawTensor>,
    pub alignment: u64,
    /// Absolute offset of the data section (end of the header, rounded up to the alignment).
    pub data_offset: u64,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "{} at offset {} runs past the end of the file ({} bytes): the file is truncated",
                what(),
                self.pos,
                self.bytes.len()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], String> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, String> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, String> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, String> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > self.remaining() {
            return Err(format!(
                "{} claims a string of {len} bytes at offset {}, but only {} bytes remain",
                what(),
                self.pos,
                self.remaining()
            ));
        }
        let s = self.take(len, what)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(format!("{} is not valid UTF-8 ({e})", what())),
        }
    }

    /// The smallest number of bytes a value of type `t` takes.
    fn min_size(t: u32) -> u64 {
        match t {
            T_U8 | T_I8 | T_BOOL => 1,
            T_U16 | T_I16 => 2,
            T_U32 | T_I32 | T_F32 => 4,
            T_U64 | T_I64 | T_F64 | T_STRING => 8,
            _ => 12, // an array: item type and count
        }
    }

    fn value(&mut self, t: u32, what: &dyn Fn() -> String) -> Result<Value, String> {
        Ok(match t {
            T_U8 => Value::from(self.array::<1>(what)?[0]),
            T_I8 => Value::from(self.array::<1>(what)?[0] as i8),
            T_U16 => Value::from(u16::from_le_bytes(self.array(what)?)),
            T_I16 => Value::from(i16::from_le_bytes(self.array(what)?)),
            T_U32 => Value::from(u32::from_le_bytes(self.array(what)?)),
            T_I32 => Value::from(i32::from_le_bytes(self.array(what)?)),
            // Non-finite floats become null, as serde_json has no number for them.
            T_F32 => Value::from(f32::from_le_bytes(self.array(what)?)),
            T_BOOL => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("{} is a boolean stored as {b} (must be 0 or 1)", what())),
            },
            T_STRING => Value::String(self.string(what)?),
            T_U64 => Value::from(u64::from_le_bytes(self.array(what)?)),
            T_I64 => Value::from(i64::from_le_bytes(self.array(what)?)),
            T_F64 => Value::from(f64::from_le_bytes(self.array(what)?)),
            T_ARRAY => {
                let item = self.u32(&|| format!("the item type of {}", what()))?;
                if item == T_ARRAY {
                    return Err(format!("{} is an array of arrays, which GGUF readers do not support", what()));
                }
                if item > T_F64 {
                    return Err(format!("{} has unknown item type {item}", what()));
                }
                let n = self.u64(&|| format!("the length of {}", what()))?;
                if n > self.remaining() / Self::min_size(item) {
                    return Err(format!(
                        "{} claims {n} items at offset {}, more than the {} bytes that remain can hold",
                        what(),
                        self.pos,
                        self.remaining()
                    ));
                }
                let mut items = Vec::with_capacity(n as usize);
                for i in 0..n {
                    items.push(self.value(item, &|| format!("item {i} of {}", what()))?);
                }
                Value::Array(items)
            }
            other => return Err(format!("{} has unknown value type {other}", what())),
        })
    }
}

/// Parses the header of a GGUF file held in `bytes` (the whole file: the data section is not
/// read, only checked to be in range by the caller).
pub fn parse(bytes: &[u8]) -> Result<Header, String> {
    if bytes.len() < 4 || &bytes[..4] != b"GGUF" {
        return Err("not a GGUF file (bad magic); kiln reads GGUF v2/v3 model files".into());
    }
    let mut c = Cursor { bytes, pos: 4 };
    let version = c.u32(&|| "the version".into())?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version} is not supported (kiln reads versions 2 and 3)"));
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    // A key/value pair takes at least 13 bytes (key length, type, one byte of value), a tensor
    // entry at least 32 (name length, dimension count, one dimension, type, offset).
    if n_kv > c.remaining() / 13 {
        return Err(format!(
            "the header claims {n_kv} metadata entries, more than the file's {} bytes can hold (truncated or corrupt)",
            bytes.len()
        ));
    }
    if n_tensors > c.remaining() / 32 {
        return Err(format!(
            "the header claims {n_tensors} tensors, more than the file's {} bytes can hold",
            bytes.len()
        ));
    }
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("the key of metadata entry {i}"))?;
        let t = c.u32(&|| format!("the type of metadata {key}"))?;
        let value = c.value(t, &|| format!("metadata {key}"))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("metadata key {key} appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 30 => a,
            _ => return Err(format!("metadata general.alignment = {v} must be a power of two")),
        },
    };
    if n_tensors > c.remaining() / 32 {
        return Err(format!(
            "the header claims {n_tensors} tensors, more than the file's {} bytes can hold",
            bytes.len()
        ));
    }
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(&|| format!("the name of tensor {i}"))?;
        let n_dims = c.u32(&|| format!("the dimension count of tensor {name}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!("tensor {name} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&|| format!("dimension {d} of tensor {name}"))?);
        }
        let ggml_type = c.u32(&|| format!("the type of tensor {name}"))?;
        let offset = c.u64(&|| format!("the offset of tensor {name}"))?;
        if !names.insert(name.clone()) {
            return Err(format!("tensor {name} appears twice"));
        }
        if dims.contains(&0) {
            return Err(format!("tensor {name} has an empty shape {dims:?}"));
        }
        // ggml keeps element counts in int64.
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("tensor {name}: shape {dims:?} overflows (its element count exceeds 2^63)"))?;
        let (block, block_bytes) =
            ggml_block(ggml_type).ok_or_else(|| format!("tensor {name} has unknown ggml type id {ggml_type}"))?;
        if dims[0] % block != 0 {
            return Err(format!(
                "tensor {name}: row length {} is not a whole number of {}-element blocks of {}",
                dims[0],
                block,
                super::ggml_type_name(ggml_type)
            ));
        }
        let bytes = (n / block)
            .checked_mul(block_bytes)
            .ok_or_else(|| format!("tensor {name}: shape {dims:?} overflows its size in bytes"))?;
        if offset % alignment != 0 {
            return Err(format!("tensor {name} data offset {offset} is not aligned to {alignment}"));
        }
        tensors.push(RawTensor { name, dims, ggml_type, offset, bytes });
    }
    let end = c.pos as u64;
    let data_offset = end.div_ceil(alignment) * alignment;
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}
