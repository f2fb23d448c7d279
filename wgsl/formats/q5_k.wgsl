// Q5_K: 176 bytes per 256 weights = d, dmin (f16) | scales[12] | qh[32] (fifth bits) |
// qs[128] (low 4 bits, laid out as Q4_K's). A GEMV unit is one 64-weight group.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 44u;
const UNIT_CHUNKS: u32 = 8u;

struct UnitHeader {
    qw: u32,       // first low-bits word of the group
    qhw: u32,      // first fifth-bit word (shared by all groups of the block)
    hbit: u32,     // bit of qh[l] for the group's low nibbles (+1 for the high nibbles)
    scale0: f32,
    offset0: f32,
    scale1: f32,
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
    return UnitHeader(b + 12u + grp * 8u, b + 4u, 2u * grp, d * sm0.x, -(dmin * sm0.y), d * sm1.x, -(dmin * sm1.y));
}

fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    let l = j % 4u;
    let w0 = wq[h.qw + 2u * l];
    let w1 = wq[h.qw + 2u * l + 1u];
    let hb = h.hbit + j / 4u;
    let hs = vec4<u32>(hb, hb + 8u, hb + 16u, hb + 24u);
    let h0 = (vec4<u32>(wq[h.qhw + 2u * l]) >> hs) & vec4<u32>(1u);
    let h1 = (vec4<u32>(wq[h.qhw + 2u * l + 1u]) >> hs) & vec4<u32>(1u);
    if (j < 4u) {
        return Chunk8(vec4<f32>(lo_nibbles(w0) + h0 * 16u), vec4<f32>(lo_nibbles(w1) + h1 * 16u), h.scale0, h.offset0);
    }
    return Chunk8(vec4<f32>(hi_nibbles(w0) + h0 * 16u), vec4<f32>(hi_nibbles(w1) + h1 * 16u), h.scale1, h.offset1);
}

fn unit_chunk(u: u32, j: u32) -> u32 { return u * 8u + j; }

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    return unit_decode(unit_header(row, c / 8u, k), c % 8u);
}
