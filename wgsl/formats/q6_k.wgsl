// Q6_K, GPU layout (padded to whole words at upload): 212 bytes per 256 weights =
// ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] (int8) | d (f16) | 2 bytes padding.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 53u;

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 32u) * BLOCK_WORDS;
    let e0 = (c % 32u) * 8u;     // first weight of the chunk within the block
    let half = e0 / 128u;        // 128-weight half
    let quarter = (e0 % 128u) / 32u;
    let l0 = e0 % 32u;
    // ql byte: 64*half + 32*(quarter & 1) + l; nibble: high for quarters 2 and 3.
    let qlw = b + (64u * half + 32u * (quarter & 1u) + l0) / 4u;
    let nib = (quarter >> 1u) * 4u;
    let sh = vec4<u32>(nib, nib + 8u, nib + 16u, nib + 24u);
    let lo0 = (vec4<u32>(wq[qlw]) >> sh) & vec4<u32>(0xfu);
    let lo1 = (vec4<u32>(wq[qlw + 1u]) >> sh) & vec4<u32>(0xfu);
    // qh byte: 32*half + l; bits 2*quarter .. 2*quarter+1.
    let qhw = b + 32u + (32u * half + l0) / 4u;
    let hs = 2u * quarter;
    let hsh = vec4<u32>(hs, hs + 8u, hs + 16u, hs + 24u);
    let hi0 = (vec4<u32>(wq[qhw]) >> hsh) & vec4<u32>(3u);
    let hi1 = (vec4<u32>(wq[qhw + 1u]) >> hsh) & vec4<u32>(3u);
    let q0 = vec4<f32>(lo0 | (hi0 << vec4<u32>(4u))) - vec4<f32>(32.0);
    let q1 = vec4<f32>(lo1 | (hi1 << vec4<u32>(4u))) - vec4<f32>(32.0);
    // scale index: 8*half + l/16 + 2*quarter
    let si = 8u * half + l0 / 16u + 2u * quarter;
    let sw = wq[b + 48u + si / 4u];
    let sc = f32((bitcast<i32>(sw << (24u - 8u * (si % 4u)))) >> 24u);
    let d = f16_bits_to_f32(wq[b + 52u] & 0xffffu);
    return Chunk8(q0, q1, d * sc, 0.0);
}
