//! CPU reference dequantizers for the GGUF block layouts. Each one follows
//! ggml's `dequantize_row_*` (ggml-quants.c) operation by operation, so the
//! f32 results are bit-identical to ggml's.

use super::{checked_blocks, QuantError, WeightFormat};
use half::f16;

/// Decodes the first `n_elems` elements of GGUF-layout `data` into `out[..n_elems]`.
pub fn dequantize(format: WeightFormat, data: &[u8], n_elems: usize, out: &mut [f32]) -> Result<(), QuantError> {
    let n_blocks = checked_blocks(format, n_elems)?;
    let block_bytes = format.block_bytes();
    let needed = n_blocks.checked_mul(block_bytes).ok_or(QuantError::Overflow)?;
    if data.len() < needed {
        return Err(QuantError::DataTooShort { format, needed, got: data.len() });
    }
    if out.len() < n_elems {
        return Err(QuantError::OutputTooShort { needed: n_elems, got: out.len() });
    }
    let block_elems = format.block_elems();
    let blocks = data[..needed].chunks_exact(block_bytes);
    let outs = out[..n_elems].chunks_exact_mut(block_elems);
    // Lengths were checked above, so every block and output chunk has full size.
    let decode_block: fn(&[u8], &mut [f32]) = match format {
        WeightFormat::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        WeightFormat::F16 => |b, y| y[0] = read_f16(b, 0),
        WeightFormat::BF16 => |b, y| y[0] = f32::from_bits(u32::from(read_u16(b, 0)) << 16),
        WeightFormat::Q8_0 => dequant_block_q8_0,
        WeightFormat::Q4K => dequant_block_q4_k,
        WeightFormat::Q5K => dequant_block_q5_k,
        WeightFormat::Q6K => dequant_block_q6_k,
    };
    for (block, y) in blocks.zip(outs) {
        decode_block(block, y);
    }
    Ok(())
}

/// Decodes one row: as many elements as `out` holds.
pub fn dequantize_row(format: WeightFormat, row_bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let n_elems = out.len();
    dequantize(format, row_bytes, n_elems, out)
}

fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn read_f16(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(read_u16(bytes, at)).to_f32()
}

/// block_q8_0: d f16 @0, qs [i8; 32] @2 (34 bytes).
fn dequant_block_q8_0(block: &[u8], y: &mut [f32]) {
    let d = read_f16(block, 0);
    for (yj, &q) in y.iter_mut().zip(&block[2..34]) {
        *yj = (q as i8) as f32 * d;
    }
}

/// ggml's get_scale_min_k4: 8 pairs of 6-bit (scale, min) packed into 12 bytes.
/// Pairs 0..4 use the low 6 bits of bytes 0..8; pairs 4..8 take their low
/// nibbles from bytes 8..12 and their top 2 bits from bytes 0..8.
pub(super) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (scale, min)
    }
}

/// block_q4_K: d f16 @0, dmin f16 @2, scales [u8; 12] @4, qs [u8; 128] @16 (144 bytes).
fn dequant_block_q4_k(block: &[u8], y: &mut [f32]) {
    let d = read_f16(block, 0);
    let min = read_f16(block, 2);
    let scales = &block[4..16];
    let qs = &block[16..144];
    // Each 64-element chunk uses 32 bytes of qs: low nibbles, then high nibbles.
    for (chunk, (q, y64)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * chunk, scales);
        let d1 = d * sc as f32;
        let m1 = min * m as f32;
        let (sc, m) = get_scale_min_k4(2 * chunk + 1, scales);
        let d2 = d * sc as f32;
        let m2 = min * m as f32;
        let (y_lo, y_hi) = y64.split_at_mut(32);
        for l in 0..32 {
            y_lo[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y_hi[l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// block_q5_K: d f16 @0, dmin f16 @2, scales [u8; 12] @4, qh [u8; 32] @16,
/// qs [u8; 128] @48 (176 bytes). Bit 2c / 2c+1 of qh[l] is the fifth bit of
/// the low / high nibble element of chunk c.
fn dequant_block_q5_k(block: &[u8], y: &mut [f32]) {
    let d = read_f16(block, 0);
    let min = read_f16(block, 2);
    let scales = &block[4..16];
    let qh = &block[16..48];
    let ql = &block[48..176];
    for (chunk, (q, y64)) in ql.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let u1 = 1u8 << (2 * chunk);
        let u2 = 2u8 << (2 * chunk);
        let (sc, m) = get_scale_min_k4(2 * chunk, scales);
        let d1 = d * sc as f32;
        let m1 = min * m as f32;
        let (sc, m) = get_scale_min_k4(2 * chunk + 1, scales);
        let d2 = d * sc as f32;
        let m2 = min * m as f32;
        let (y_lo, y_hi) = y64.split_at_mut(32);
        for l in 0..32 {
            let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y_lo[l] = d1 * ((q[l] & 0xF) + hi1) as f32 - m1;
            y_hi[l] = d2 * ((q[l] >> 4) + hi2) as f32 - m2;
        }
    }
}

/// block_q6_K: ql [u8; 128] @0, qh [u8; 64] @128, scales [i8; 16] @192,
/// d f16 @208 (210 bytes).
fn dequant_block_q6_k(block: &[u8], y: &mut [f32]) {
    let d = read_f16(block, 208);
    // Each 128-element half uses 64 bytes of ql, 32 of qh and 8 scales.
    for half in 0..2 {
        let ql = &block[half * 64..half * 64 + 64];
        let qh = &block[128 + half * 32..128 + half * 32 + 32];
        let sc = &block[192 + half * 8..192 + half * 8 + 8];
        let y128 = &mut y[half * 128..half * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            // ggml evaluates d * sc * q left to right in float.
            y128[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y128[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y128[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y128[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
