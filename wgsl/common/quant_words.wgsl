// The pieces of block decoding that read the weights (through w32 and w128, bound by
// common/weights_words.wgsl or weights_vec4.wgsl), apart from common/quant.wgsl's pure ones
// so that a GEMV over two formats can compose them a second time over its second weights
// binding (`Composer::include_renamed`).

// The half stored at half-index i of the weights.
fn half_at(i: u32) -> u32 {
    return (w32(i >> 1u) >> ((i & 1u) * 16u)) & 0xffffu;
}

// F16 and BF16: the four words holding halves e .. e + 7 (e even): one vector load when they
// start at a 16-byte boundary.
fn chunk_words(e: u32) -> vec4<u32> {
    let i = e >> 1u;
    if ((i & 3u) == 0u) { return w128(i >> 2u); }
    return vec4<u32>(w32(i), w32(i + 1u), w32(i + 2u), w32(i + 3u));
}

// F16 and BF16: halves 8c .. 8c + 7 of a row of k, two to a word (zeros past k).
fn halves8(row: u32, c: u32, k: u32) -> vec4<u32> {
    let k0 = c * 8u;
    let e = row * k + k0;
    if ((e & 1u) == 0u && k0 + 8u <= k) { return chunk_words(e); }
    var h: vec4<u32>;
    for (var i = 0u; i < 4u; i++) {
        let lo = select(0u, half_at(e + 2u * i), k0 + 2u * i < k);
        let hi = select(0u, half_at(e + 2u * i + 1u), k0 + 2u * i + 1u < k);
        h[i] = lo | (hi << 16u);
    }
    return h;
}

// Q4_K and Q5_K: (scale, offset) of sub-blocks 2g and 2g+1 of the block at word b, as
// (scale0, offset0, scale1, offset1): weight = scale * q + offset. Their bytes taken out of
// kquant_scale_min_words' at 16 g % 32 and 8 bits on (no branch: H200 run 413, TinyLlama
// Q4_K_M tg128 +3.3%, Llama-7B +5.6%).
fn kquant_group_scales(b: u32, grp: u32) -> vec4<f32> {
    // The block's first four words, one load where the weights are bound as vectors.
    let hd = w128(b / 4u);
    let w = kquant_scale_min_words(hd.y, hd.z, hd.w, grp >= 2u);
    let sh = (grp % 2u) * 16u;
    let sm = uint_to_f32x4((vec4<u32>(w.x, w.y, w.x, w.y) >> vec4<u32>(sh, sh, sh + 8u, sh + 8u)) & vec4<u32>(0xffu));
    let d_dmin = unpack2x16float(hd.x);
    return vec4<f32>(d_dmin.x * sm.x, -(d_dmin.y * sm.y), d_dmin.x * sm.z, -(d_dmin.y * sm.w));
}

// Unit u of a row of k weights in blocks of block_words words, whose quants start at vector
// qs_vec of the block; FIFTH: Q5_K, whose qh bytes start at vector 1.
fn kquant_dot_header(row: u32, u: u32, k: u32, block_words: u32, qs_vec: u32, FIFTH: bool) -> KquantDotHeader {
    let b = (row * (k / 256u) + u / 8u) * block_words;
    let v = u % 8u;
    let grp = v / 2u;
    let sc = kquant_group_scales(b, grp);
    var qh = vec4<u32>(0u);
    if (FIFTH) { qh = w128(b / 4u + 1u + v % 2u); }
    return KquantDotHeader(w128(b / 4u + qs_vec + v), qh, 2u * grp, sc.x, sc.y, sc.z, sc.w);
}
