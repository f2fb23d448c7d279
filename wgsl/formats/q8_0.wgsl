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
    return UnitHeader(b + 2u * (u % 4u), unpack2x16float(wq[b + 8u]).x);
}

fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    return Chunk8(i8x4(wq[h.qw]), i8x4(wq[h.qw + 1u]), h.d, 0.0);
}

fn unit_chunk(u: u32, j: u32) -> u32 { return u; }

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    return unit_decode(unit_header(row, c, k), 0u);
}

// Int8-activation GEMV (gemv_q8.wgsl): a unit is one block, against one x block.
const DOT_BLOCKS: u32 = 1u;

struct DotHeader { qw: u32, d: f32 }

fn dot_unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS; }

fn dot_unit_block(u: u32, j: u32) -> u32 { return u; }

fn dot_header(row: u32, u: u32, k: u32) -> DotHeader {
    let b = (row * (k / BLOCK_ELEMS) + u) * BLOCK_WORDS;
    return DotHeader(b, unpack2x16float(wq[b + 8u]).x);
}

fn dot_block(h: DotHeader, j: u32, xq: Q8Block) -> f32 {
    let s = dot4I8Packed(wq[h.qw], xq.lo.x) + dot4I8Packed(wq[h.qw + 1u], xq.lo.y)
        + dot4I8Packed(wq[h.qw + 2u], xq.lo.z) + dot4I8Packed(wq[h.qw + 3u], xq.lo.w)
        + dot4I8Packed(wq[h.qw + 4u], xq.hi.x) + dot4I8Packed(wq[h.qw + 5u], xq.hi.y)
        + dot4I8Packed(wq[h.qw + 6u], xq.hi.z) + dot4I8Packed(wq[h.qw + 7u], xq.hi.w);
    return h.d * xq.d * f32(s);
}
