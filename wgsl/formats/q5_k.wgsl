// Q5_K: 176 bytes per 256 weights = d, dmin (f16) | scales[12] | qh[32] (fifth bits) |
// qs[128] (low 4 bits, laid out as Q4_K's). A GEMV unit is one pair of quant words (low nibbles: sub-block 2g, high: 2g + 1), as in Q4_K.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 44u;
const UNIT_CHUNKS: u32 = 2u;

struct UnitHeader {
    qw: u32,       // first low-bits word of the group
    qhw: u32,      // the unit's fifth-bit words (shared with the other groups of the block)
    hbit: u32,     // bit of qh[l] for the group's low nibbles (+1 for the high nibbles)
    scale0: f32,
    offset0: f32,
    scale1: f32,
    offset1: f32,
}

fn unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS * 16u; }

fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 16u) * BLOCK_WORDS;
    let grp = (u % 16u) / 4u;
    let pair = u % 4u;
    let sc = kquant_group_scales(b, grp);
    return UnitHeader(b + 12u + grp * 8u + 2u * pair, b + 4u + 2u * pair, 2u * grp, sc.x, sc.y, sc.z, sc.w);
}

fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    let w0 = w32(h.qw);
    let w1 = w32(h.qw + 1u);
    let hb = h.hbit + j;
    let hs = vec4<u32>(hb, hb + 8u, hb + 16u, hb + 24u);
    let h0 = (vec4<u32>(w32(h.qhw)) >> hs) & vec4<u32>(1u);
    let h1 = (vec4<u32>(w32(h.qhw + 1u)) >> hs) & vec4<u32>(1u);
    if (j == 0u) {
        return Chunk8(uint_to_f32x4(lo_nibbles(w0) + h0 * 16u), uint_to_f32x4(lo_nibbles(w1) + h1 * 16u), h.scale0, h.offset0);
    }
    return Chunk8(uint_to_f32x4(hi_nibbles(w0) + h0 * 16u), uint_to_f32x4(hi_nibbles(w1) + h1 * 16u), h.scale1, h.offset1);
}

fn unit_chunk(u: u32, j: u32) -> u32 { return (u / 4u) * 8u + u % 4u + 4u * j; }

// As Q4_K's, with the two qh words holding the chunk's fifth bits (bit `sub` of each byte).
struct Raw8 { q0: u32, q1: u32, h0: u32, h1: u32, dm: u32, s0: u32, s1: u32, s2: u32, sub: u32 }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 32u) * BLOCK_WORDS;
    let cb = c % 32u;
    let grp = cb / 8u;
    let pair = cb % 4u;
    let qw = b + 12u + grp * 8u + 2u * pair;
    let qhw = b + 4u + 2u * pair;
    // Whole vectors where the weights are bound as vec4s (as Q4_K's).
    let q = w64(qw);
    let qh = w64(qhw);
    let hd = w128(b / 4u);
    return Raw8(q.x, q.y, qh.x, qh.y, hd.x, hd.y, hd.z, hd.w, 2u * grp + (cb / 4u) % 2u);
}

// Whole blocks never straddle a row's end: fetch8 itself (the float GEMV's aligned loop
// calls it by this name for every format).
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 { return fetch8(row, c, k); }

fn unpack8(r: Raw8) -> Chunk8 {
    let so = kquant_sub_scale(r.dm, r.s0, r.s1, r.s2, r.sub);
    let hs = vec4<u32>(r.sub, r.sub + 8u, r.sub + 16u, r.sub + 24u);
    let h0 = (vec4<u32>(r.h0) >> hs) & vec4<u32>(1u);
    let h1 = (vec4<u32>(r.h1) >> hs) & vec4<u32>(1u);
    if ((r.sub & 1u) == 0u) {
        return Chunk8(uint_to_f32x4(lo_nibbles(r.q0) + h0 * 16u), uint_to_f32x4(lo_nibbles(r.q1) + h1 * 16u), so.x, so.y);
    }
    return Chunk8(uint_to_f32x4(hi_nibbles(r.q0) + h0 * 16u), uint_to_f32x4(hi_nibbles(r.q1) + h1 * 16u), so.x, so.y);
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

// Int8-activation GEMV (gemv_q8.wgsl): see kquant_dot_header in common/quant.wgsl. Unit v of
// a block reads its quant vector 3 + v and qh vector 1 + hf (the block is 11 aligned vectors).
alias DotHeader = KquantDotHeader;

fn dot_unit_count(k: u32) -> u32 { return kquant_dot_unit_count(k); }

fn dot_unit_half(u: u32, j: u32) -> u32 { return kquant_dot_unit_half(u, j); }

fn dot_header(row: u32, u: u32, k: u32) -> DotHeader { return kquant_dot_header(row, u, k, BLOCK_WORDS, 3u, true); }

fn dot_part(h: DotHeader, j: u32, xh: XHalf) -> f32 { return kquant_dot_part(h, j, xh, true); }
