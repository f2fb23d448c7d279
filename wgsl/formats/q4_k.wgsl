// Q4_K: 144 bytes per 256 weights = d, dmin (f16) | scales[12] (6-bit scale/min pairs for
// eight 32-weight sub-blocks) | qs[128] (4-bit quants; 64-weight groups, low nibbles first).
// A GEMV unit is one pair of quant words: its low nibbles are chunk c of sub-block 2g and its
// high nibbles chunk c + 4 of sub-block 2g + 1; neighbouring units read neighbouring words.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 36u;
const UNIT_CHUNKS: u32 = 2u;

struct UnitHeader {
    qw: u32,       // the unit's pair of quant words
    scale0: f32,   // sub-block 2g: weight = scale0 * q + offset0 (low nibbles)
    offset0: f32,
    scale1: f32,   // sub-block 2g+1 (high nibbles)
    offset1: f32,
}

fn unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS * 16u; }

fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 16u) * BLOCK_WORDS;
    let grp = (u % 16u) / 4u;
    let pair = u % 4u;
    let sc = kquant_group_scales(b, grp);
    return UnitHeader(b + 4u + grp * 8u + 2u * pair, sc.x, sc.y, sc.z, sc.w);
}

// Chunk 0: low nibbles of the unit's 8 bytes; chunk 1: high nibbles of the same bytes.
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    let w0 = w32(h.qw);
    let w1 = w32(h.qw + 1u);
    if (j == 0u) {
        return Chunk8(uint_to_f32x4(lo_nibbles(w0)), uint_to_f32x4(lo_nibbles(w1)), h.scale0, h.offset0);
    }
    return Chunk8(uint_to_f32x4(hi_nibbles(w0)), uint_to_f32x4(hi_nibbles(w1)), h.scale1, h.offset1);
}

fn unit_chunk(u: u32, j: u32) -> u32 { return (u / 4u) * 8u + u % 4u + 4u * j; }

// The chunk's pair of quant words (low nibbles for an even sub-block, high for an odd one),
// the block's d/dmin word and its three scale words; sub: the sub-block (0-7).
struct Raw8 { q0: u32, q1: u32, dm: u32, s0: u32, s1: u32, s2: u32, sub: u32 }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 32u) * BLOCK_WORDS;
    let cb = c % 32u;
    let grp = cb / 8u;
    let qw = b + 4u + grp * 8u + 2u * (cb % 4u);
    // Whole vectors where the weights are bound as vec4s (blocks are 16-byte aligned): the
    // header in one load, the quant pair in one.
    let q = w64(qw);
    let hd = w128(b / 4u);
    return Raw8(q.x, q.y, hd.x, hd.y, hd.z, hd.w, 2u * grp + (cb / 4u) % 2u);
}

// Whole blocks never straddle a row's end: fetch8 itself (the float GEMV's aligned loop
// calls it by this name for every format).
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 { return fetch8(row, c, k); }

fn unpack8(r: Raw8) -> Chunk8 {
    let so = kquant_sub_scale(r.dm, r.s0, r.s1, r.s2, r.sub);
    if ((r.sub & 1u) == 0u) {
        return Chunk8(uint_to_f32x4(lo_nibbles(r.q0)), uint_to_f32x4(lo_nibbles(r.q1)), so.x, so.y);
    }
    return Chunk8(uint_to_f32x4(hi_nibbles(r.q0)), uint_to_f32x4(hi_nibbles(r.q1)), so.x, so.y);
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

// Int8-activation GEMV (gemv_q8.wgsl): see kquant_dot_header in common/quant.wgsl. Unit v of
// a block reads its quant vector 1 + v (the block is 9 aligned vectors).
alias DotHeader = KquantDotHeader;

fn dot_unit_count(k: u32) -> u32 { return kquant_dot_unit_count(k); }

fn dot_unit_half(u: u32, j: u32) -> u32 { return kquant_dot_unit_half(u, j); }

fn dot_header(row: u32, u: u32, k: u32) -> DotHeader { return kquant_dot_header(row, u, k, BLOCK_WORDS, 1u, false); }

fn dot_part(h: DotHeader, j: u32, xh: XHalf) -> f32 { return kquant_dot_part(h, j, xh, false); }
