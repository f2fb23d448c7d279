//! Seeded inputs for kernel checks: Gaussian activations, quantized weights with their exact
//! dequantized values, activations the int8 GEMV rounds without error, logits shaped like a
//! model's, and KV-cache values in the cache's storage type.

use crate::error::{KilnError, Result};
use crate::kernels::KvKind;
use crate::quant::{dequantize, quantize, SplitMix64, WeightFormat};

/// A seeded random source (the same seed gives the same data on every machine).
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64(seed))
    }
    /// `n` values from N(0, scale²).
    pub fn normal(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * self.0.next_normal()).collect()
    }
    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f32 {
        self.0.next_unit() as f32
    }
    /// Uniform in lo..hi (hi > lo).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.0.next_u64() % (hi - lo).max(1) as u64) as i64
    }
    pub fn coin(&mut self) -> bool {
        self.0.next_u64() & 1 == 1
    }
}

/// Row length for a weight format: `ragged` values for the float formats (not a multiple of
/// any tile), `blocks` whole blocks for the block formats (a row is whole blocks).
pub fn k_for(format: WeightFormat, blocks: usize, ragged: usize) -> usize {
    if format.block_elems() == 1 {
        ragged
    } else {
        format.block_elems() * blocks
    }
}

/// k for a cooperative-matrix GEMM check: `blocks` blocks, or for float formats a k ragged
/// against its K steps (32) but in whole 8-value chunks, as the planner gives it F16 rows
/// (`plan::coop_gemm_takes`).
pub fn k_for_coop(format: WeightFormat, blocks: usize) -> usize {
    k_for(format, blocks, 104 + 32 * blocks)
}

/// A matmul's inputs: W [n, k] in `format` and its exact dequantized values, X [m, k], a bias
/// [n] and a Y [m, n] to accumulate into.
pub struct MatmulCase {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    pub m: usize,
    /// W in its GGUF layout.
    pub weights: Vec<u8>,
    /// W as the GPU decodes it (the CPU dequantizer reproduces ggml's bit for bit).
    pub w_ref: Vec<f32>,
    pub x: Vec<f32>,
    pub bias: Vec<f32>,
    pub y0: Vec<f32>,
}

impl MatmulCase {
    pub fn new(format: WeightFormat, n: usize, k: usize, m: usize, seed: u64) -> Result<MatmulCase> {
        let mut r = Rng::new(seed);
        let w = r.normal(n * k, 0.5);
        let bad = |e: crate::quant::QuantError| KilnError::invalid("check data", format!("{format} n={n} k={k}: {e}"));
        let weights = quantize(format, &w).map_err(bad)?;
        let mut w_ref = vec![0f32; n * k];
        dequantize(format, &weights, n * k, &mut w_ref).map_err(bad)?;
        let (x, bias, y0) = (r.normal(m * k, 1.0), r.normal(n, 1.0), r.normal(m * n, 1.0));
        Ok(MatmulCase { format, n, k, m, weights, w_ref, x, bias, y0 })
    }

    /// X's rows padded to a multiple of 4 floats, as the engine lays activations out.
    pub fn x_padded(&self) -> (Vec<f32>, usize) {
        pad_rows(&self.x, self.m, self.k)
    }
}

/// Rows of k values padded to a multiple of 4 floats: the values and the row stride.
pub fn pad_rows(v: &[f32], m: usize, k: usize) -> (Vec<f32>, usize) {
    let stride = k.div_ceil(4) * 4;
    let mut out = vec![0f32; m * stride];
    for (dst, src) in out.chunks_mut(stride).zip(v.chunks(k)) {
        dst[..src.len()].copy_from_slice(src);
    }
    (out, stride)
}

/// Activations the int8 GEMV quantizes without error: each 32-value block is integers in
/// -127..=127 (one of them ±127) times a power of two, so the only error left is f32
/// accumulation and the kernel is held to the float reference's tolerance.
pub fn q8_exact_x(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut x = vec![0f32; m * k];
    for block in x.chunks_mut(32) {
        let scale = 2f32.powi(-(r.range(4, 10) as i32));
        for v in block.iter_mut() {
            *v = r.range(-127, 128) as f32 * scale;
        }
        let i = r.range(0, block.len() as i64) as usize;
        block[i] = if r.coin() { 127.0 } else { -127.0 } * scale;
    }
    x
}

/// Logits like a model's: a few likely tokens over a long tail `spread` nats wide; flat
/// (spread 0.5: hundreds within a nat of the top); or, for spread 0, a shuffled ramp 1e-5
/// apart (thousands within 0.25 of the top: the sampler's threshold search narrows over
/// several rounds).
pub fn model_logits(r: &mut Rng, n: usize, spread: f32) -> Vec<f32> {
    if spread <= 0.0 {
        return (0..n).map(|i| -((i * 7919 % n) as f32) * 1e-5).collect();
    }
    (0..n).map(|_| spread * r.unit().powi(8) - spread).collect()
}

/// Values as a KV cache of `kv` stores them: the bytes, and the values read back from them.
pub fn cache_bytes(vals: &[f32], kv: KvKind) -> (Vec<u8>, Vec<f32>) {
    match kv {
        KvKind::F32 => (bytemuck::cast_slice(vals).to_vec(), vals.to_vec()),
        _ => {
            let h: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            (bytemuck::cast_slice(&h).to_vec(), h.iter().map(|v| v.to_f32()).collect())
        }
    }
}

/// A KV cache's bytes as values.
pub fn cache_values(bytes: &[u8], kv: KvKind) -> Vec<f32> {
    match kv {
        KvKind::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => bytes.chunks_exact(2).map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_data_repeats_and_stays_in_range() {
        assert_eq!(Rng::new(7).normal(5, 1.0), Rng::new(7).normal(5, 1.0));
        assert_ne!(Rng::new(7).normal(5, 1.0), Rng::new(8).normal(5, 1.0));
        let mut r = Rng::new(1);
        assert!((0..1000).map(|_| r.range(-127, 128)).all(|v| (-127..128).contains(&v)));
        let x = q8_exact_x(2, 64, 3);
        for b in x.chunks(32) {
            let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
            let step = amax / 127.0;
            assert!(b.iter().all(|v| (v / step).fract() == 0.0), "{b:?}");
        }
        let (bytes, vals) = cache_bytes(&[1.0, 0.1], KvKind::F16Packed);
        assert_eq!(cache_values(&bytes, KvKind::F16Packed), vals);
        assert_eq!(cache_values(&cache_bytes(&[0.1], KvKind::F32).0, KvKind::F32), vec![0.1]);
    }
}
