//! A simple quantizer producing valid GGUF-layout blocks, for tests and
//! synthetic models. Q8_0, F16 and BF16 follow ggml's reference rounding; the
//! K-quants use plain min/max scales (no search), so they are slightly less
//! accurate than llama.cpp's but decode with the same dequantizers.

use super::{checked_blocks, QuantError, WeightFormat};
use half::{bf16, f16};

/// Quantizes `values` into GGUF-layout blocks of `format`.
pub fn quantize(format: WeightFormat, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    let n_blocks = checked_blocks(format, values.len())?;
    let n_bytes = n_blocks.checked_mul(format.block_bytes()).ok_or(QuantError::Overflow)?;
    let mut bytes = Vec::with_capacity(n_bytes);
    let block_elems = format.block_elems();
    for block in values.chunks_exact(block_elems) {
        match format {
            WeightFormat::F32 => bytes.extend_from_slice(&block[0].to_le_bytes()),
            WeightFormat::F16 => bytes.extend_from_slice(&f16::from_f32(block[0]).to_le_bytes()),
            // half's conversion rounds to nearest even and keeps NaN quiet, like ggml.
            WeightFormat::BF16 => bytes.extend_from_slice(&bf16::from_f32(block[0]).to_le_bytes()),
            WeightFormat::Q8_0 => quantize_block_q8_0(block, &mut bytes),
            WeightFormat::Q4K => quantize_block_q4_k(block, &mut bytes),
            WeightFormat::Q5K => quantize_block_q5_k(block, &mut bytes),
            WeightFormat::Q6K => quantize_block_q6_k(block, &mut bytes),
        }
    }
    Ok(bytes)
}

/// Random but valid blocks: `n_elems` values drawn from N(0, 0.02), roughly
/// the spread of trained LLM weights, then quantized. Deterministic per seed.
pub fn random_blocks(format: WeightFormat, n_elems: usize, seed: u64) -> Result<Vec<u8>, QuantError> {
    checked_blocks(format, n_elems)?;
    let mut rng = SplitMix64(seed);
    let values: Vec<f32> = (0..n_elems).map(|_| 0.02 * rng.next_normal()).collect();
    quantize(format, &values)
}

/// `n` values drawn from N(0, scale²), deterministic in `seed` (synthetic biases and norms).
pub fn random_values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| scale * rng.next_normal()).collect()
}

/// splitmix64: tiny, well-mixed, good enough for synthetic weights and test data.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]; never 0 so the logarithm below stays finite.
    pub fn next_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal via Box-Muller (one of the pair is discarded for simplicity).
    pub fn next_normal(&mut self) -> f32 {
        let radius = (-2.0 * self.next_unit().ln()).sqrt();
        let angle = std::f64::consts::TAU * self.next_unit();
        (radius * angle.cos()) as f32
    }
}

/// ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d) (ties away from zero).
fn quantize_block_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
    let d = amax / 127.0;
    let inv_d = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|v| (v * inv_d).round() as i8 as u8));
}

/// Inverse of `get_scale_min_k4`: packs eight 6-bit scales and mins into 12 bytes.
pub(super) fn pack_scale_min_k4(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = scales[j] & 63;
        packed[j + 4] = mins[j] & 63;
    }
    for j in 4..8 {
        packed[j + 4] = (scales[j] & 0xF) | ((mins[j] & 0xF) << 4);
        packed[j - 4] |= ((scales[j] >> 4) & 3) << 6;
        packed[j] |= ((mins[j] >> 4) & 3) << 6;
    }
    packed
}

/// Shared Q4_K / Q5_K quantization: `x = d*sc*q - dmin*m` per 32-element
/// sub-block with q in 0..=q_max. Returns the 4-byte (d, dmin) header, the
/// packed 12-byte scales and the 256 levels.
fn quantize_affine_k(x: &[f32], q_max: u8) -> ([u8; 4], [u8; 12], [u8; 256]) {
    let mut sub_scales = [0.0f32; 8];
    let mut sub_mins = [0.0f32; 8];
    for (sub, values) in x.chunks_exact(32).enumerate() {
        // The min is kept <= 0 (stored negated) as ggml does, so 0 stays representable.
        let lo = values.iter().fold(0.0f32, |acc, v| acc.min(*v));
        let hi = values.iter().fold(lo, |acc, v| acc.max(*v));
        sub_scales[sub] = (hi - lo) / q_max as f32;
        sub_mins[sub] = -lo;
    }
    let max_scale = sub_scales.iter().fold(0.0f32, |acc, v| acc.max(*v));
    let max_min = sub_mins.iter().fold(0.0f32, |acc, v| acc.max(*v));
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    // Quantize 6-bit scales against the f16-rounded super-block values the decoder will see.
    let to_6bit = |value: f32, unit: f32| {
        if unit > 0.0 {
            (value / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let scales: [u8; 8] = std::array::from_fn(|i| to_6bit(sub_scales[i], d.to_f32()));
    let mins: [u8; 8] = std::array::from_fn(|i| to_6bit(sub_mins[i], dmin.to_f32()));

    let mut levels = [0u8; 256];
    for (sub, (values, level)) in x.chunks_exact(32).zip(levels.chunks_exact_mut(32)).enumerate() {
        // Levels are fitted to the effective (already quantized) scale and min.
        let step = d.to_f32() * scales[sub] as f32;
        let offset = dmin.to_f32() * mins[sub] as f32;
        if step <= 0.0 {
            continue;
        }
        for (l, v) in level.iter_mut().zip(values) {
            *l = ((v + offset) / step).round().clamp(0.0, q_max as f32) as u8;
        }
    }
    let mut header = [0u8; 4];
    header[..2].copy_from_slice(&d.to_le_bytes());
    header[2..].copy_from_slice(&dmin.to_le_bytes());
    (header, pack_scale_min_k4(&scales, &mins), levels)
}

fn quantize_block_q4_k(x: &[f32], out: &mut Vec<u8>) {
    let (header, scales, levels) = quantize_affine_k(x, 15);
    out.extend_from_slice(&header);
    out.extend_from_slice(&scales);
    // Each 64-element chunk: first 32 in the low nibbles, next 32 in the high nibbles.
    for chunk in levels.chunks_exact(64) {
        out.extend((0..32).map(|l| chunk[l] | (chunk[l + 32] << 4)));
    }
}

fn quantize_block_q5_k(x: &[f32], out: &mut Vec<u8>) {
    let (header, scales, levels) = quantize_affine_k(x, 31);
    out.extend_from_slice(&header);
    out.extend_from_slice(&scales);
    // Fifth bits: chunk c puts its low-half bit at 2c and its high-half bit at 2c+1.
    let mut qh = [0u8; 32];
    for (chunk, values) in levels.chunks_exact(64).enumerate() {
        for l in 0..32 {
            qh[l] |= ((values[l] >> 4) & 1) << (2 * chunk);
            qh[l] |= ((values[l + 32] >> 4) & 1) << (2 * chunk + 1);
        }
    }
    out.extend_from_slice(&qh);
    for chunk in levels.chunks_exact(64) {
        out.extend((0..32).map(|l| (chunk[l] & 0xF) | ((chunk[l + 32] & 0xF) << 4)));
    }
}

/// Q6_K: x = d * sc * (q - 32) with an int8 scale per 16 elements.
fn quantize_block_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut sub_scales = [0.0f32; 16];
    for (sub, values) in x.chunks_exact(16).enumerate() {
        let amax = values.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
        sub_scales[sub] = amax / 31.0;
    }
    let max_scale = sub_scales.iter().fold(0.0f32, |acc, v| acc.max(*v));
    let d = f16::from_f32(max_scale / 127.0);
    let unit = d.to_f32();
    let scales: [i8; 16] =
        std::array::from_fn(|i| if unit > 0.0 { (sub_scales[i] / unit).round().clamp(0.0, 127.0) as i8 } else { 0 });
    let mut levels = [32u8; 256];
    for (sub, (values, level)) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).enumerate() {
        let step = unit * scales[sub] as f32;
        if step <= 0.0 {
            continue;
        }
        for (l, v) in level.iter_mut().zip(values) {
            *l = ((v / step).round().clamp(-32.0, 31.0) + 32.0) as u8;
        }
    }
    // Layout mirrors dequant_block_q6_k: per 128-half, 64 ql bytes then 32 qh bytes.
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let lv = &levels[half * 128..half * 128 + 128];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (lv[l], lv[l + 32], lv[l + 64], lv[l + 96]);
            ql[half * 64 + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[half * 64 + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[half * 32 + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(scales.iter().map(|s| *s as u8));
    out.extend_from_slice(&d.to_le_bytes());
}
