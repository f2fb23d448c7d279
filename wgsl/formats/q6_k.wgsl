// Q6_K, GPU layout (padded at upload so that blocks are 16-byte aligned): 224 bytes per 256
// weights = ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] (int8) | d (f16) |
// 14 bytes padding.
// Weight 128n + 32q + l (half n, quarter q, l < 32) takes the low (q < 2) or high (q >= 2)
// nibble of ql[64n + 32(q & 1) + l] and bits 2q..2q+1 of qh[32n + l]; its scale is
// scales[8n + 2q + l / 16]. A GEMV unit is the chunk at l of quarters q and q + 2 of one
// half: they share their ql and qh words; neighbouring units read neighbouring words.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 56u;
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
    return UnitHeader(b, v / 8u, (v / 4u) % 2u, (v % 4u) * 8u, unpack2x16float(w32(b + 52u)).x);
}

fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 {
    let q = h.q0 + 2u * j;
    let l0 = h.l0;
    let qlw = h.b + (64u * h.n + 32u * h.q0 + l0) / 4u;
    let nib = j * 4u;
    let sh = vec4<u32>(nib, nib + 8u, nib + 16u, nib + 24u);
    let lo0 = (vec4<u32>(w32(qlw)) >> sh) & vec4<u32>(0xfu);
    let lo1 = (vec4<u32>(w32(qlw + 1u)) >> sh) & vec4<u32>(0xfu);
    let qhw = h.b + 32u + (32u * h.n + l0) / 4u;
    let hs = 2u * q;
    let hsh = vec4<u32>(hs, hs + 8u, hs + 16u, hs + 24u);
    let hi0 = (vec4<u32>(w32(qhw)) >> hsh) & vec4<u32>(3u);
    let hi1 = (vec4<u32>(w32(qhw + 1u)) >> hsh) & vec4<u32>(3u);
    let x0 = uint_to_f32x4(lo0 | (hi0 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let x1 = uint_to_f32x4(lo1 | (hi1 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let si = 8u * h.n + 2u * q + l0 / 16u;
    let sw = w32(h.b + 48u + si / 4u);
    let sc = f32((bitcast<i32>(sw << (24u - 8u * (si % 4u)))) >> 24u);
    return Chunk8(x0, x1, h.d * sc, 0.0);
}

fn unit_chunk(u: u32, j: u32) -> u32 {
    let v = u % 16u;
    let q = (v / 4u) % 2u + 2u * j;
    return (u / 16u) * 32u + (v / 8u) * 16u + q * 4u + v % 4u;
}

// The chunk's two ql words, two qh words, the word holding its scale byte and the block's
// d word; nib: its quants' nibble (0 or 4), hs: their high bits' shift, sb: the scale byte.
struct Raw8 { l0: u32, l1: u32, h0: u32, h1: u32, sw: u32, dw: u32, nib: u32, hs: u32, sb: u32 }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 32u) * BLOCK_WORDS;
    let cb = c % 32u;
    // Half n of the block, quarter q of the half (quarters 2 and 3 are the high nibbles of
    // quarters 0 and 1's bytes), first weight l0 of the quarter.
    let n = cb / 16u;
    let q = (cb % 16u) / 4u;
    let l0 = (cb % 4u) * 8u;
    let qlw = b + (64u * n + 32u * (q % 2u) + l0) / 4u;
    let qhw = b + 32u + (32u * n + l0) / 4u;
    let si = 8u * n + 2u * q + l0 / 16u;
    let l = w64(qlw);
    let h = w64(qhw);
    return Raw8(l.x, l.y, h.x, h.y, w32(b + 48u + si / 4u), w32(b + 52u), 4u * (q / 2u), 2u * q, si % 4u);
}

// Whole blocks never straddle a row's end: fetch8 itself (the float GEMV's aligned loop
// calls it by this name for every format).
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 { return fetch8(row, c, k); }

fn unpack8(r: Raw8) -> Chunk8 {
    let sh = vec4<u32>(r.nib, r.nib + 8u, r.nib + 16u, r.nib + 24u);
    let hsh = vec4<u32>(r.hs, r.hs + 8u, r.hs + 16u, r.hs + 24u);
    let lo0 = (vec4<u32>(r.l0) >> sh) & vec4<u32>(0xfu);
    let lo1 = (vec4<u32>(r.l1) >> sh) & vec4<u32>(0xfu);
    let hi0 = (vec4<u32>(r.h0) >> hsh) & vec4<u32>(3u);
    let hi1 = (vec4<u32>(r.h1) >> hsh) & vec4<u32>(3u);
    let x0 = uint_to_f32x4(lo0 | (hi0 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let x1 = uint_to_f32x4(lo1 | (hi1 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let sc = f32((bitcast<i32>(r.sw << (24u - 8u * r.sb))) >> 24u);
    return Chunk8(x0, x1, unpack2x16float(r.dw).x * sc, 0.0);
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

// Int8-activation GEMV (gemv_q8.wgsl): a unit is one aligned 16-byte vector of ql, v = 4n +
// 2 q0 + hf within the block: values 16 hf .. 16 hf + 15 of quarters q0 (low nibbles, part
// j = 0) and q0 + 2 (high nibbles, part 1) of half n. Their high bits share qh vector
// 8 + 2n + hf; each part's 16 values have one scale.
struct DotHeader {
    ql: vec4<u32>,
    qh: vec4<u32>,
    hs: u32,       // 2 q0: part j's high bits are bits hs + 4j of each qh byte
    scale0: f32,   // d * scale of each part
    scale1: f32,
}

fn dot_unit_count(k: u32) -> u32 { return k / BLOCK_ELEMS * 8u; }

// Quarter q of half n is x block 4n + q of the 256 weights.
fn dot_unit_half(u: u32, j: u32) -> u32 {
    let v = u % 8u;
    return (u / 8u) * 16u + 2u * (4u * (v / 4u) + (v / 2u) % 2u + 2u * j) + v % 2u;
}

fn dot_header(row: u32, u: u32, k: u32) -> DotHeader {
    let b = (row * (k / BLOCK_ELEMS) + u / 8u) * BLOCK_WORDS;
    let v = u % 8u;
    let n = v / 4u;
    // Scales 8n + 2q + hf for q = q0 (word 48 + 2n) and q0 + 2 (word 49 + 2n), byte 2 q0 + hf.
    let sh = 24u - 8u * (v % 4u);
    // Words 48 .. 51 in one load where the weights are bound as vectors.
    let sw = w128(b / 4u + 12u);
    let sc0 = bitcast<i32>(select(sw.x, sw.z, n == 1u) << sh) >> 24u;
    let sc1 = bitcast<i32>(select(sw.y, sw.w, n == 1u) << sh) >> 24u;
    let d = unpack2x16float(w32(b + 52u)).x;
    return DotHeader(w128(b / 4u + v), w128(b / 4u + 8u + 2u * n + v % 2u), 2u * ((v / 2u) % 2u), d * f32(sc0), d * f32(sc1));
}

// Part j's sum of w * x~: the 6-bit values q as signed bytes q - 32 (with its top bit set,
// a byte loses 32 without borrowing; flipping the top bit back gives q - 32).
fn dot_part(h: DotHeader, j: u32, xh: XHalf) -> f32 {
    let lo = (h.ql >> vec4<u32>(4u * j)) & vec4<u32>(0x0f0f0f0fu);
    let hi = (h.qh >> vec4<u32>(h.hs + 4u * j)) & vec4<u32>(0x03030303u);
    let q = (((lo | (hi << vec4<u32>(4u))) | vec4<u32>(0x80808080u)) - vec4<u32>(0x20202020u)) ^ vec4<u32>(0x80808080u);
    return select(h.scale0, h.scale1, j == 1u) * xh.d * f32(dot4x4(q, xh.q));
}
