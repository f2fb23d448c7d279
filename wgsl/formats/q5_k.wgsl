// Q5_K: 176 bytes per 256 weights = d, dmin (f16) | scales[12] | qh[32] (fifth bits) |
// qs[128] (low 4 bits, laid out as Q4_K's).
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 44u;

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
