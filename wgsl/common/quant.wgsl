// Shared pieces of block decoding. Weights are read as 32-bit words through w32(i) and as
// 16-byte vectors through w128(i) (common/weights_words.wgsl or weights_vec4.wgsl: WGSL has
// no portable 8- or 16-bit storage); the shared pieces that read them are in
// common/quant_words.wgsl. Each format file provides these views of a row of k
// weights (and dot_* functions for the int8 GEMV, gemv_q8.wgsl):
//
// Random access (GEMM tiles, embedding rows), in two halves so that a kernel can issue a
// tile's loads, do other work while they are in flight, and decode only then (the
// cooperative GEMM's double buffering):
//   struct Raw8                                           the words a chunk needs, as loaded
//   fn fetch8(row: u32, c: u32, k: u32) -> Raw8           chunk c = weights 8c .. 8c+7: loads only
//   fn unpack8(r: Raw8) -> Chunk8                         the decode: arithmetic only
//   fn decode8(row: u32, c: u32, k: u32) -> Chunk8        unpack8(fetch8(row, c, k))
// Streaming (GEMV): a row is read as units of UNIT_CHUNKS chunks that share one header
// (scales, base address), so the header is loaded and unpacked once per unit; consecutive
// invocations take consecutive units, so their reads coalesce.
//   const UNIT_CHUNKS: u32                                1 or 2 (the GEMV holds chunks in named variables)
//   fn unit_count(k: u32) -> u32
//   fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader
//   fn unit_decode(h: UnitHeader, j: u32) -> Chunk8       j < UNIT_CHUNKS
//   fn unit_chunk(u: u32, j: u32) -> u32                   which chunk of the row that is

// Eight consecutive weights in factored form: weight = scale * q + offset. Every format's
// chunk shares one scale and offset, so a GEMV can take the dot product of the raw q values
// and apply the scale once per chunk.
struct Chunk8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
    scale: f32,
    offset: f32,
}

// The eight weights themselves, computed in ggml's order so they match its dequantizer
// bit for bit (d*sc*q is exact in f32 for all formats, so only the offset rounds).
fn chunk_lo(ch: Chunk8) -> vec4<f32> {
    var v = ch.scale * ch.lo;
    if (ch.offset != 0.0) { v = v + vec4<f32>(ch.offset); }
    return v;
}
fn chunk_hi(ch: Chunk8) -> vec4<f32> {
    var v = ch.scale * ch.hi;
    if (ch.offset != 0.0) { v = v + vec4<f32>(ch.offset); }
    return v;
}

// 16 activations quantized to int8 for the integer GEMV (gemv_q8.wgsl, which reads them from
// the blocks quantize_q8.wgsl writes): x~ = d * q, four values to a word; sum = sum of the x~
// (for the formats' offsets). The formats' dot_part functions multiply them with their quants.
struct XHalf {
    q: vec4<u32>,
    d: f32,
    sum: f32,
}

// Sum over four words of the products of their signed bytes.
fn dot4x4(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}

// Small unsigned integers to float without the (quarter-rate) int-to-float conversion:
// 2^23 + q has q in its mantissa, so one OR and one subtraction give q exactly (q < 2^23).
fn uint_to_f32x4(q: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(q | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

fn u8x4(w: u32) -> vec4<f32> {
    return uint_to_f32x4((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu));
}

// Signed bytes: flipping the sign bit maps -128..127 to 0..255, so subtract 2^23 + 128.
fn i8x4(w: u32) -> vec4<f32> {
    let b = ((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu)) ^ vec4<u32>(0x80u);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4b000000u)) - vec4<f32>(8388736.0);
}

fn lo_nibbles(w: u32) -> vec4<u32> {
    return vec4<u32>(w & 0xfu, (w >> 8u) & 0xfu, (w >> 16u) & 0xfu, (w >> 24u) & 0xfu);
}

fn hi_nibbles(w: u32) -> vec4<u32> {
    return vec4<u32>((w >> 4u) & 0xfu, (w >> 12u) & 0xfu, (w >> 20u) & 0xfu, (w >> 28u) & 0xfu);
}

// IEEE half to float in integer arithmetic, exact for subnormals too. The weight decoders
// use the hardware's unpack2x16float instead (a third faster for F16 GEMV on an H200); the
// tests hold both to ggml's bits on every adapter they run on, subnormal scales included.
fn f16_bits_to_f32x4(h: vec4<u32>) -> vec4<f32> {
    let em = h & vec4<u32>(0x7fffu);
    // Rebias the exponent (15 -> 127) with one add. A subnormal half m * 2^-24 is built as
    // 2^-14 * (1 + m / 1024) and 2^-14 subtracted, which is exact (same binade).
    let base = (em << vec4<u32>(13u)) + vec4<u32>(0x38000000u);
    let sub = bitcast<vec4<f32>>(base + vec4<u32>(0x00800000u)) - vec4<f32>(6.103515625e-05);
    var v = select(bitcast<vec4<f32>>(base), sub, em < vec4<u32>(0x400u));
    // Inf and NaN keep an all-ones exponent.
    v = select(v, bitcast<vec4<f32>>((em << vec4<u32>(13u)) | vec4<u32>(0x7f800000u)), em >= vec4<u32>(0x7c00u));
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) | ((h & vec4<u32>(0x8000u)) << vec4<u32>(16u)));
}

fn f16_bits_to_f32(h: u32) -> f32 {
    return f16_bits_to_f32x4(vec4<u32>(h)).x;
}

// Q4_K and Q5_K: the 6-bit scales (x) and mins (y) of sub-blocks 0-3 (hi false: the low 6
// bits of s0 and s1) or 4-7 (hi true: s2's nibbles with s0's and s1's top two bits moved in),
// a byte a sub-block: ggml's get_scale_min_k4 for four sub-blocks on whole words, without its
// branch (a subgroup's invocations take both halves; branched, each ran both).
fn kquant_scale_min_words(s0: u32, s1: u32, s2: u32, hi: bool) -> vec2<u32> {
    let scales = select(s0 & 0x3f3f3f3fu, (s2 & 0x0f0f0f0fu) | ((s0 >> 2u) & 0x30303030u), hi);
    let mins = select(s1 & 0x3f3f3f3fu, ((s2 >> 4u) & 0x0f0f0f0fu) | ((s1 >> 2u) & 0x30303030u), hi);
    return vec2<u32>(scales, mins);
}

// Q4_K and Q5_K: ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12
// packed bytes (the words s0, s1, s2 after d and dmin): byte j % 4 of kquant_scale_min_words'.
// (The same speed as a branched copy of its own, H200 run 415; one body for both.)
fn kquant_scale_min_of(s0: u32, s1: u32, s2: u32, j: u32) -> vec2<f32> {
    let w = kquant_scale_min_words(s0, s1, s2, j >= 4u);
    let q = (w >> vec2<u32>((j % 4u) * 8u)) & vec2<u32>(0xffu);
    return uint_to_f32x4(vec4<u32>(q, 0u, 0u)).xy;
}

// Q4_K and Q5_K: (scale, offset) of sub-block j of a block whose d/dmin word is dm:
// weight = scale * q + offset.
fn kquant_sub_scale(dm: u32, s0: u32, s1: u32, s2: u32, j: u32) -> vec2<f32> {
    let d_dmin = unpack2x16float(dm);
    let sm = kquant_scale_min_of(s0, s1, s2, j);
    return vec2<f32>(d_dmin.x * sm.x, -(d_dmin.y * sm.y));
}

// Q4_K and Q5_K in the int8-activation GEMV: a unit is one aligned 16-byte vector of quants,
// half hf of the 64-weight group g = v / 2 (v = unit within the block, hf = v % 2): its low
// nibbles are values 16 hf .. 16 hf + 15 of sub-block 2g (part j = 0), its high nibbles the
// same values of sub-block 2g + 1 (part 1). Q5_K adds their fifth bits from qh.
fn kquant_dot_unit_count(k: u32) -> u32 { return k / 256u * 8u; }

// Sub-block 2g + j, half hf, as the 16-value half index of the row.
fn kquant_dot_unit_half(u: u32, j: u32) -> u32 {
    let v = u % 8u;
    return (u / 8u) * 16u + (v / 2u) * 4u + 2u * j + v % 2u;
}

struct KquantDotHeader {
    q: vec4<u32>,   // the unit's 32 nibbles
    qh: vec4<u32>,  // Q5_K: qh bytes 16 hf .. 16 hf + 15 (bit 2g + j is part j's fifth bit)
    hbit: u32,      // 2g
    scale0: f32,    // weight = scale * q + offset, sub-blocks 2g and 2g + 1
    offset0: f32,
    scale1: f32,
    offset1: f32,
}

// Part j's sum of w * x~ over its 16 values; FIFTH: add the qh bits (Q5_K).
fn kquant_dot_part(h: KquantDotHeader, j: u32, xh: XHalf, FIFTH: bool) -> f32 {
    var q = (h.q >> vec4<u32>(4u * j)) & vec4<u32>(0x0f0f0f0fu);
    if (FIFTH) {
        q |= ((h.qh >> vec4<u32>(h.hbit + j)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u);
    }
    let s = xh.d * f32(dot4x4(q, xh.q));
    if (j == 0u) { return h.scale0 * s + h.offset0 * xh.sum; }
    return h.scale1 * s + h.offset1 * xh.sum;
}
