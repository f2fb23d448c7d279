// Q4_K: 144 bytes per 256 weights = d, dmin (f16) | scales[12] (6-bit scale/min pairs for
// eight 32-weight sub-blocks) | qs[128] (4-bit quants; 64-weight groups, low nibbles first).
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 36u;

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 packed bytes.
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
    let cb = c % 32u;          // chunk within the block
    let grp = cb / 8u;         // 64-weight group
    let high = (cb / 4u) & 1u; // 0: low nibbles (first 32 of the group), 1: high nibbles
    let l0 = (cb % 4u) * 8u;   // byte offset within the group's 32 quant bytes
    let dm = wq[b];
    let d = f16_bits_to_f32(dm & 0xffffu);
    let dmin = f16_bits_to_f32(dm >> 16u);
    let sm = kquant_scale_min(b, grp * 2u + high);
    let qw = b + 4u + (grp * 32u + l0) / 4u;
    let w0 = wq[qw];
    let w1 = wq[qw + 1u];
    var q0: vec4<u32>;
    var q1: vec4<u32>;
    if (high == 0u) {
        q0 = lo_nibbles(w0);
        q1 = lo_nibbles(w1);
    } else {
        q0 = hi_nibbles(w0);
        q1 = hi_nibbles(w1);
    }
    return Chunk8(vec4<f32>(q0), vec4<f32>(q1), d * sm.x, -(dmin * sm.y));
}
