// Q5_K: 176 bytes per 256 weights = d, dmin (f16) | scales[12] | qh[32] (fifth bits) |
// qs[128] (low 4 bits, laid out as Q4_K's).
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 44u;

fn kquant_scale_min(b: u32, j: u32) -> vec2<f32> {
    let s0 = wq[b + 1u];
    let s1 = wq[b + 2u];
    let s2 = wq[b + 3u];
    var sc: u32;
    var mn: u32;
    if (j < 4u) {
        sc = byte_at(s0, j) & 63u;
        mn = byte_at(s1, j) & 63u;
    } else {
        let q_j4 = byte_at(s2, j - 4u);
        sc = (q_j4 & 0xfu) | ((byte_at(s0, j - 4u) >> 6u) << 4u);
        mn = (q_j4 >> 4u) | ((byte_at(s1, j - 4u) >> 6u) << 4u);
    }
    return vec2<f32>(f32(sc), f32(mn));
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 32u) * BLOCK_WORDS;
    let cb = c % 32u;
    let grp = cb / 8u;
    let high = (cb / 4u) & 1u;
    let l0 = (cb % 4u) * 8u;
    let dm = wq[b];
    let d = f16_bits_to_f32(dm & 0xffffu);
    let dmin = f16_bits_to_f32(dm >> 16u);
    let sm = kquant_scale_min(b, grp * 2u + high);
    let qw = b + 12u + (grp * 32u + l0) / 4u;
    let w0 = wq[qw];
    let w1 = wq[qw + 1u];
    // Fifth bits: bit (2*grp + high) of qh[l] for l = l0 .. l0+7.
    let hb = 2u * grp + high;
    let h0 = (vec4<u32>(wq[b + 4u + l0 / 4u]) >> vec4<u32>(hb, hb + 8u, hb + 16u, hb + 24u)) & vec4<u32>(1u);
    let h1 = (vec4<u32>(wq[b + 5u + l0 / 4u]) >> vec4<u32>(hb, hb + 8u, hb + 16u, hb + 24u)) & vec4<u32>(1u);
    var q0: vec4<u32>;
    var q1: vec4<u32>;
    if (high == 0u) {
        q0 = lo_nibbles(w0);
        q1 = lo_nibbles(w1);
    } else {
        q0 = hi_nibbles(w0);
        q1 = hi_nibbles(w1);
    }
    q0 = q0 + h0 * 16u;
    q1 = q1 + h1 * 16u;
    return Chunk8(vec4<f32>(q0), vec4<f32>(q1), d * sm.x, -(dmin * sm.y));
}
