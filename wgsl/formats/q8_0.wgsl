// Q8_0, GPU layout (repacked at upload so the quants are word-aligned):
// 36 bytes per 32 weights = qs[32] (int8) | d (f16) | 2 bytes padding.
// A GEMV unit is one chunk: neighbouring invocations read neighbouring 8-byte pieces.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_WORDS: u32 = 9u;
const UNIT_CHUNKS: u32 = 1u;

struct UnitHeader { qw: u32, d: f32 }

fn unit_count(k: u32) -> u32 { return k / 8u; }

fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 4u) * BLOCK_WORDS;
    return UnitHeader(b + 2u * (u % 4u), unpack2x16float(w32(b + 8u)).x);
}

fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    return Chunk8(i8x4(w32(h.qw)), i8x4(w32(h.qw + 1u)), h.d, 0.0);
}

fn unit_chunk(u: u32, j: u32) -> u32 { return u; }

// The chunk's two words of quants and the word holding the block's scale.
struct Raw8 { q0: u32, q1: u32, d: u32 }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 4u) * BLOCK_WORDS;
    let qw = b + 2u * (c % 4u);
    return Raw8(w32(qw), w32(qw + 1u), w32(b + 8u));
}

// Whole blocks never straddle a row's end: fetch8 itself (the float GEMV's aligned loop
// calls it by this name for every format).
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 { return fetch8(row, c, k); }

fn unpack8(r: Raw8) -> Chunk8 { return Chunk8(i8x4(r.q0), i8x4(r.q1), unpack2x16float(r.d).x, 0.0); }

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

// Int8-activation GEMV (gemv_q8.wgsl): a unit is one block; part j is its half j. (Blocks
// are 36 bytes, not 16-byte aligned, so its words are loaded one by one; the planner keeps
// Q8_0 on the float GEMV, which is faster for it.)
struct DotHeader { b: u32, d: f32 }

fn dot_unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS; }

fn dot_unit_half(u: u32, j: u32) -> u32 { return 2u * u + j; }

fn dot_header(row: u32, u: u32, k: u32) -> DotHeader {
    let b = (row * (k / BLOCK_ELEMS) + u) * BLOCK_WORDS;
    return DotHeader(b, unpack2x16float(w32(b + 8u)).x);
}

fn dot_part(h: DotHeader, j: u32, xh: XHalf) -> f32 {
    let w = h.b + 4u * j;
    let q = vec4<u32>(w32(w), w32(w + 1u), w32(w + 2u), w32(w + 3u));
    return h.d * xh.d * f32(dot4x4(q, xh.q));
}
