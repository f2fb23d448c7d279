//! Weight formats of GGUF / ggml tensors: sizes, exact CPU dequantization,
//! GPU repacking and a simple quantizer for tests and synthetic models.

mod dequant;
mod quantize;
#[cfg(test)]
mod tests;

pub use dequant::{dequantize, dequantize_row};
pub use quantize::{quantize, random_blocks, random_values, SplitMix64};

use std::fmt;

/// Storage format of one weight tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 7] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q8_0,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
    ];

    /// Maps a `ggml_type` id from a GGUF tensor header; None for types kiln cannot run.
    pub fn from_ggml_type(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|format| format.ggml_type() == id)
    }

    pub fn ggml_type(self) -> u32 {
        match self {
            WeightFormat::F32 => 0,
            WeightFormat::F16 => 1,
            WeightFormat::Q8_0 => 8,
            WeightFormat::Q4K => 12,
            WeightFormat::Q5K => 13,
            WeightFormat::Q6K => 14,
            WeightFormat::BF16 => 30,
        }
    }

    /// ggml's spelling of the type name.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "F32",
            WeightFormat::F16 => "F16",
            WeightFormat::BF16 => "BF16",
            WeightFormat::Q8_0 => "Q8_0",
            WeightFormat::Q4K => "Q4_K",
            WeightFormat::Q5K => "Q5_K",
            WeightFormat::Q6K => "Q6_K",
        }
    }

    /// Case-insensitive; underscores are optional so "q4_k", "Q4K" and "q8_0" all parse.
    pub fn parse(s: &str) -> Option<Self> {
        let wanted: String = s.trim().chars().filter(|c| *c != '_').map(|c| c.to_ascii_uppercase()).collect();
        Self::ALL.into_iter().find(|format| format.name().replace('_', "") == wanted)
    }

    /// Block-quantized (integer quants with scales), as opposed to plain floats.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Elements per block (1 for plain float formats).
    pub fn block_elems(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => 1,
            WeightFormat::Q8_0 => 32,
            WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K => 256,
        }
    }

    /// Bytes per block as stored in GGUF.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
            WeightFormat::Q8_0 => 34,
            WeightFormat::Q4K => 144,
            WeightFormat::Q5K => 176,
            WeightFormat::Q6K => 210,
        }
    }

    /// Bytes per block after `repack_for_gpu`: Q8_0 is padded so that every block
    /// starts 4-byte aligned and the GPU can use 32-bit loads; Q6_K so that every block
    /// starts 16-byte aligned and the int8 GEMV can load its quants as 16-byte vectors.
    pub fn gpu_block_bytes(self) -> usize {
        match self {
            WeightFormat::Q8_0 => 36,
            WeightFormat::Q6K => 224,
            other => other.block_bytes(),
        }
    }

    /// Bytes of one row of `k` elements in GGUF layout; None if `k` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        self.blocks_in(k)?.checked_mul(self.block_bytes())
    }

    /// Bytes of a `[rows, k]` tensor in GGUF layout.
    pub fn tensor_bytes(self, rows: usize, k: usize) -> Option<usize> {
        self.row_bytes(k)?.checked_mul(rows)
    }

    /// Bytes of one row of `k` elements in the GPU layout.
    pub fn gpu_row_bytes(self, k: usize) -> Option<usize> {
        self.blocks_in(k)?.checked_mul(self.gpu_block_bytes())
    }

    /// Bytes of a `[rows, k]` tensor in the GPU layout.
    pub fn gpu_tensor_bytes(self, rows: usize, k: usize) -> Option<usize> {
        self.gpu_row_bytes(k)?.checked_mul(rows)
    }

    fn blocks_in(self, n_elems: usize) -> Option<usize> {
        let block_elems = self.block_elems();
        (n_elems % block_elems == 0).then_some(n_elems / block_elems)
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a buffer could not be decoded, encoded or repacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    PartialBlock { format: WeightFormat, n_elems: usize },
    /// The byte length is not a whole number of blocks.
    PartialBlockBytes { format: WeightFormat, n_bytes: usize },
    /// The quantized data holds fewer bytes than the element count needs.
    DataTooShort { format: WeightFormat, needed: usize, got: usize },
    /// The output slice holds fewer elements than asked for.
    OutputTooShort { needed: usize, got: usize },
    /// The size does not fit in usize.
    Overflow,
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::PartialBlock { format, n_elems } => {
                write!(f, "{n_elems} elements is not a multiple of the {format} block size {}", format.block_elems())
            }
            QuantError::PartialBlockBytes { format, n_bytes } => write!(
                f,
                "{n_bytes} bytes is not a multiple of the {format} block size of {} bytes",
                format.block_bytes()
            ),
            QuantError::DataTooShort { format, needed, got } => {
                write!(f, "{format} data too short: need {needed} bytes, got {got}")
            }
            QuantError::OutputTooShort { needed, got } => {
                write!(f, "output too short: need {needed} elements, got {got}")
            }
            QuantError::Overflow => f.write_str("tensor size overflows usize"),
        }
    }
}

impl std::error::Error for QuantError {}

/// Number of blocks in `n_elems`, or why it is not a whole number.
fn checked_blocks(format: WeightFormat, n_elems: usize) -> Result<usize, QuantError> {
    format.blocks_in(n_elems).ok_or(QuantError::PartialBlock { format, n_elems })
}

/// Converts GGUF-layout blocks to the GPU layout (see `gpu_block_bytes`).
pub fn repack_for_gpu(format: WeightFormat, gguf_bytes: &[u8]) -> Result<Vec<u8>, QuantError> {
    let mut gpu_bytes = Vec::new();
    repack_for_gpu_into(format, gguf_bytes, &mut gpu_bytes)?;
    Ok(gpu_bytes)
}

/// Like `repack_for_gpu`, appending to `gpu_bytes` so a caller can reuse one
/// staging buffer for many tensors.
///
/// Q8_0 `[d: f16][qs: 32 x i8]` (34 B) becomes `[qs][d][0, 0]` (36 B) so qs is
/// 4-byte aligned; Q6_K (210 B) gets 14 zero bytes appended (224 B). Other
/// formats are copied unchanged.
pub fn repack_for_gpu_into(format: WeightFormat, gguf_bytes: &[u8], gpu_bytes: &mut Vec<u8>) -> Result<(), QuantError> {
    let block_bytes = format.block_bytes();
    if gguf_bytes.len() % block_bytes != 0 {
        return Err(QuantError::PartialBlockBytes { format, n_bytes: gguf_bytes.len() });
    }
    let n_blocks = gguf_bytes.len() / block_bytes;
    let out_len = n_blocks.checked_mul(format.gpu_block_bytes()).ok_or(QuantError::Overflow)?;
    if format.gpu_block_bytes() == block_bytes {
        gpu_bytes.extend_from_slice(gguf_bytes);
        return Ok(());
    }
    let start = gpu_bytes.len();
    gpu_bytes.resize(start + out_len, 0);
    let gpu_block = format.gpu_block_bytes();
    for (block, out) in gguf_bytes.chunks_exact(block_bytes).zip(gpu_bytes[start..].chunks_exact_mut(gpu_block)) {
        repack_block_for_gpu(format, block, out);
    }
    Ok(())
}

/// One block in the GPU layout: `src` is `block_bytes()` GGUF bytes, `dst` is
/// `gpu_block_bytes()` bytes (see `repack_for_gpu_into`).
pub fn repack_block_for_gpu(format: WeightFormat, src: &[u8], dst: &mut [u8]) {
    match format {
        WeightFormat::Q8_0 => {
            dst[..32].copy_from_slice(&src[2..34]);
            dst[32..34].copy_from_slice(&src[0..2]);
            dst[34..36].fill(0);
        }
        WeightFormat::Q6K => {
            dst[..210].copy_from_slice(src);
            dst[210..224].fill(0);
        }
        _ => dst.copy_from_slice(src),
    }
}
