// Q4_K: 144 bytes per 256 weights = d, dmin (f16) | scales[12] (6-bit scale/min pairs for
// eight 32-weight sub-blocks) | qs[128] (4-bit quants; 64-weight groups, low nibbles first).
// A GEMV unit is one 64-weight group: 32 bytes of quants and two sub-block scales.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 36u;
const UNIT_CHUNKS: u32 = 8u;

struct UnitHeader {
    qw: u32,       // first quant word of the group
    scale0: f32,   // sub-block 2g: weight = scale0 * q + offset0 (low nibbles)
    offset0: f32,
    scale1: f32,   // sub-block 2g+1 (high nibbles)
    offset1: f32,
}

fn unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS * 4u; }

fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 4u) * BLOCK_WORDS;
    let grp = u % 4u;
    let dm = wq[b];
    let d = f16_bits_to_f32(dm & 0xffffu);
    let dmin = f16_bits_to_f32(dm >> 16u);
    let sm0 = kquant_scale_min(b, 2u * grp);
    let sm1 = kquant_scale_min(b, 2u * grp + 1u);
    return UnitHeader(b + 4u + grp * 8u, d * sm0.x, -(dmin * sm0.y), d * sm1.x, -(dmin * sm1.y));
}

// Chunks 0-3: low nibbles of the group's 32 bytes; chunks 4-7: high nibbles of the same bytes.
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    let w0 = wq[h.qw + 2u * (j % 4u)];
    let w1 = wq[h.qw + 2u * (j % 4u) + 1u];
    if (j < 4u) {
        return Chunk8(vec4<f32>(lo_nibbles(w0)), vec4<f32>(lo_nibbles(w1)), h.scale0, h.offset0);
    }
    return Chunk8(vec4<f32>(hi_nibbles(w0)), vec4<f32>(hi_nibbles(w1)), h.scale1, h.offset1);
}

fn unit_chunk(u: u32, j: u32) -> u32 { return u * 8u + j; }

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    return unit_decode(unit_header(row, c / 8u, k), c % 8u);
}
