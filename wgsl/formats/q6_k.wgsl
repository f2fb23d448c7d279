// Q6_K, GPU layout (padded to whole words at upload): 212 bytes per 256 weights =
// ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] (int8) | d (f16) | 2 bytes padding.
// Weight 128n + 32q + l (half n, quarter q, l < 32) takes the low (q < 2) or high (q >= 2)
// nibble of ql[64n + 32(q & 1) + l] and bits 2q..2q+1 of qh[32n + l]; its scale is
// scales[8n + 2q + l / 16]. A GEMV unit is the chunk at l of quarters q and q + 2 of one
// half: they share their ql and qh words; neighbouring units read neighbouring words.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 53u;
const UNIT_CHUNKS: u32 = 2u;

struct UnitHeader {
    b: u32,     // block's first word
    n: u32,     // half
    q0: u32,    // quarter of chunk 0 (quarter q0 + 2 for chunk 1)
    l0: u32,    // first weight within the quarter
    d: f32,
}

// 16 units per block: (half n, quarter pair q0, chunk l0 / 8) with l0 fastest.
fn unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS * 16u; }

fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 16u) * BLOCK_WORDS;
    let v = u % 16u;
    return UnitHeader(b, v / 8u, (v / 4u) % 2u, (v % 4u) * 8u, unpack2x16float(wq[b + 52u]).x);
}

fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    let q = h.q0 + 2u * j;
    let l0 = h.l0;
    let qlw = h.b + (64u * h.n + 32u * h.q0 + l0) / 4u;
    let nib = j * 4u;
    let sh = vec4<u32>(nib, nib + 8u, nib + 16u, nib + 24u);
    let lo0 = (vec4<u32>(wq[qlw]) >> sh) & vec4<u32>(0xfu);
    let lo1 = (vec4<u32>(wq[qlw + 1u]) >> sh) & vec4<u32>(0xfu);
    let qhw = h.b + 32u + (32u * h.n + l0) / 4u;
    let hs = 2u * q;
    let hsh = vec4<u32>(hs, hs + 8u, hs + 16u, hs + 24u);
    let hi0 = (vec4<u32>(wq[qhw]) >> hsh) & vec4<u32>(3u);
    let hi1 = (vec4<u32>(wq[qhw + 1u]) >> hsh) & vec4<u32>(3u);
    let x0 = uint_to_f32x4(lo0 | (hi0 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let x1 = uint_to_f32x4(lo1 | (hi1 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let si = 8u * h.n + 2u * q + l0 / 16u;
    let sw = wq[h.b + 48u + si / 4u];
    let sc = f32((bitcast<i32>(sw << (24u - 8u * (si % 4u)))) >> 24u);
    return Chunk8(x0, x1, h.d * sc, 0.0);
}

fn unit_chunk(u: u32, j: u32) -> u32 {
    let v = u % 16u;
    let q = (v / 4u) % 2u + 2u * j;
    return (u / 16u) * 32u + (v / 8u) * 16u + q * 4u + v % 4u;
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    let cb = c % 32u;
    let n = cb / 16u;
    let q = (cb % 16u) / 4u;
    let u = (c / 32u) * 16u + 8u * n + 4u * (q % 2u) + cb % 4u;
    return unit_decode(unit_header(row, u, k), q / 2u);
}

// Int8-activation GEMV (gemv_q8.wgsl): a unit is quarters q0 and q0 + 2 (x blocks j = 0, 1)
// of half n, which share their ql words (low and high nibbles) and qh words.
const DOT_BLOCKS: u32 = 2u;

struct DotHeader {
    b: u32,
    n: u32,
    q0: u32,
    d: f32,
}

fn dot_unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS * 4u; }

// Quarter q of half n is block 4n + q of the 256 weights.
fn dot_unit_block(u: u32, j: u32) -> u32 {
    let v = u % 4u;
    return (u / 4u) * 8u + (v / 2u) * 4u + v % 2u + 2u * j;
}

fn dot_header(row: u32, u: u32, k: u32) -> DotHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 4u) * BLOCK_WORDS;
    let v = u % 4u;
    return DotHeader(b, v / 2u, v % 2u, unpack2x16float(wq[b + 52u]).x);
}

// Weights 4i .. 4i + 3 of quarter q0 + 2j as signed bytes q - 32: the 6-bit value with its
// top bit set loses 32 without borrowing, and flipping the top bit back gives q - 32.
fn q6_word(h: DotHeader, j: u32, i: u32) -> u32 {
    let lo = (wq[h.b + 16u * h.n + 8u * h.q0 + i] >> (4u * j)) & 0x0f0f0f0fu;
    let hi = (wq[h.b + 32u + 8u * h.n + i] >> (2u * (h.q0 + 2u * j))) & 0x03030303u;
    return (((lo | (hi << 4u)) | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

fn dot_block(h: DotHeader, j: u32, xq: Q8Block) -> f32 {
    // Scales 8n + 2q and 8n + 2q + 1 (weights 0-15 and 16-31) share a word (2q is even).
    let si = 8u * h.n + 2u * (h.q0 + 2u * j);
    let sw = wq[h.b + 48u + si / 4u] >> (8u * (si % 4u));
    let sc_lo = bitcast<i32>(sw << 24u) >> 24u;
    let sc_hi = bitcast<i32>(sw << 16u) >> 24u;
    let s_lo = dot4I8Packed(q6_word(h, j, 0u), xq.lo.x) + dot4I8Packed(q6_word(h, j, 1u), xq.lo.y)
        + dot4I8Packed(q6_word(h, j, 2u), xq.lo.z) + dot4I8Packed(q6_word(h, j, 3u), xq.lo.w);
    let s_hi = dot4I8Packed(q6_word(h, j, 4u), xq.hi.x) + dot4I8Packed(q6_word(h, j, 5u), xq.hi.y)
        + dot4I8Packed(q6_word(h, j, 6u), xq.hi.z) + dot4I8Packed(q6_word(h, j, 7u), xq.hi.w);
    return h.d * xq.d * f32(sc_lo * s_lo + sc_hi * s_hi);
}
