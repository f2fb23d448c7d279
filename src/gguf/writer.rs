//! A small GGUF v3 writer: metadata and tensors, for synthetic models and test files.

use std::io::Write;

use crate::quant::WeightFormat;

/// A metadata value.
#[derive(Debug, Clone)]
pub enum MetaValue {
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    ArrStr(Vec<String>),
    ArrF32(Vec<f32>),
    ArrI32(Vec<i32>),
}

const ALIGN: u64 = 32;

/// A tensor's data: bytes, or zeros of a size (left as a hole in an image built in memory,
/// which costs no memory until read).
pub enum TensorData {
    Bytes(Vec<u8>),
    Zeros(u64),
}

impl TensorData {
    fn len(&self) -> u64 {
        match self {
            TensorData::Bytes(b) => b.len() as u64,
            TensorData::Zeros(n) => *n,
        }
    }
}

/// Collects metadata and tensors, then writes them in GGUF v3 layout.
#[derive(Default)]
pub struct GgufWriter {
    meta: Vec<(String, MetaValue)>,
    tensors: Vec<(String, WeightFormat, Vec<u64>, TensorData)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufWriter {
    pub fn meta(&mut self, key: &str, v: MetaValue) {
        self.meta.push((key.to_string(), v));
    }

    /// `dims` innermost first (row length first), `data` in the GGUF block layout.
    pub fn tensor(&mut self, name: &str, format: WeightFormat, dims: Vec<u64>, data: Vec<u8>) {
        self.tensors.push((name.to_string(), format, dims, TensorData::Bytes(data)));
    }

    /// Replaces the data of the tensor `name` (already added) by `data` of the same length
    /// (tests that need other values than a synthetic model's, e.g. norms' weights other than
    /// 1); whether it did.
    pub fn replace_tensor(&mut self, name: &str, data: Vec<u8>) -> bool {
        match self.tensors.iter_mut().find(|t| t.0 == name) {
            Some(t) if matches!(&t.3, TensorData::Bytes(b) if b.len() == data.len()) => {
                t.3 = TensorData::Bytes(data);
                true
            }
            _ => false,
        }
    }

    /// A tensor of `bytes` zero bytes (valid blocks of every format: all weights 0).
    pub fn tensor_zeros(&mut self, name: &str, format: WeightFormat, dims: Vec<u64>, bytes: u64) {
        self.tensors.push((name.to_string(), format, dims, TensorData::Zeros(bytes)));
    }

    /// The header and tensor table (everything before the tensor data).
    fn header(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for (k, v) in &self.meta {
            put_str(&mut h, k);
            match v {
                MetaValue::U32(x) => {
                    h.extend_from_slice(&4u32.to_le_bytes());
                    h.extend_from_slice(&x.to_le_bytes());
                }
                MetaValue::I32(x) => {
                    h.extend_from_slice(&5u32.to_le_bytes());
                    h.extend_from_slice(&x.to_le_bytes());
                }
                MetaValue::F32(x) => {
                    h.extend_from_slice(&6u32.to_le_bytes());
                    h.extend_from_slice(&x.to_le_bytes());
                }
                MetaValue::Bool(x) => {
                    h.extend_from_slice(&7u32.to_le_bytes());
                    h.push(*x as u8);
                }
                MetaValue::Str(s) => {
                    h.extend_from_slice(&8u32.to_le_bytes());
                    put_str(&mut h, s);
                }
                MetaValue::ArrStr(a) => {
                    h.extend_from_slice(&9u32.to_le_bytes());
                    h.extend_from_slice(&8u32.to_le_bytes());
                    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
                    a.iter().for_each(|s| put_str(&mut h, s));
                }
                MetaValue::ArrF32(a) => {
                    h.extend_from_slice(&9u32.to_le_bytes());
                    h.extend_from_slice(&6u32.to_le_bytes());
                    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes()));
                }
                MetaValue::ArrI32(a) => {
                    h.extend_from_slice(&9u32.to_le_bytes());
                    h.extend_from_slice(&5u32.to_le_bytes());
                    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| h.extend_from_slice(&x.to_le_bytes()));
                }
            }
        }
        let mut offset = 0u64;
        for (name, format, dims, data) in &self.tensors {
            put_str(&mut h, name);
            h.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| h.extend_from_slice(&d.to_le_bytes()));
            h.extend_from_slice(&format.ggml_type().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset += data.len().div_ceil(ALIGN) * ALIGN;
        }
        h
    }

    /// The size of the file `write` produces.
    pub fn len(&self) -> u64 {
        struct Count(u64);
        impl Write for Count {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0 += b.len() as u64;
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut c = Count(0);
        let _ = self.write(&mut c);
        c.0
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty() && self.meta.is_empty()
    }

    /// Parses the written image in memory, as if it had been written to a file and opened.
    /// Each tensor's buffer is freed once copied, so building takes about the image's size
    /// plus one tensor, not twice the image.
    pub fn into_gguf(mut self, label: &str) -> crate::Result<crate::gguf::GgufFile> {
        let len = self.len();
        let header = self.header();
        let tensors = std::mem::take(&mut self.tensors);
        let pad = |n: u64| vec![0u8; ((ALIGN - n % ALIGN) % ALIGN) as usize];
        crate::gguf::GgufFile::from_memory(label, len, move |mut buf: &mut [u8]| {
            buf.write_all(&header)?;
            buf.write_all(&pad(header.len() as u64))?;
            for (_, _, _, data) in tensors {
                let n = data.len();
                match data {
                    TensorData::Bytes(b) => buf.write_all(&b)?,
                    // The anonymous mapping is zero already: skip over the hole.
                    TensorData::Zeros(z) => buf = &mut std::mem::take(&mut buf)[z as usize..],
                }
                buf.write_all(&pad(n))?;
            }
            Ok(())
        })
    }

    /// The tensor data bytes (sum over tensors) and the largest tensor's bytes.
    pub fn data_bytes(&self) -> (u64, u64) {
        let sizes = self.tensors.iter().map(|t| t.3.len());
        (sizes.clone().sum(), sizes.max().unwrap_or(0))
    }

    pub fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let h = self.header();
        out.write_all(&h)?;
        let pad = |n: u64| vec![0u8; ((ALIGN - n % ALIGN) % ALIGN) as usize];
        out.write_all(&pad(h.len() as u64))?;
        for (_, _, _, data) in &self.tensors {
            match data {
                TensorData::Bytes(b) => out.write_all(b)?,
                TensorData::Zeros(n) => {
                    let zeros = vec![0u8; 1 << 20];
                    let mut left = *n;
                    while left > 0 {
                        let k = left.min(zeros.len() as u64);
                        out.write_all(&zeros[..k as usize])?;
                        left -= k;
                    }
                }
            }
            out.write_all(&pad(data.len()))?;
        }
        Ok(())
    }
}
