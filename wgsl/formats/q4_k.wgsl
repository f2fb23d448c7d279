// Q4_K: 144 bytes per 256 weights = d, dmin (f16) | scales[12] (6-bit scale/min pairs for
// eight 32-weight sub-blocks) | qs[128] (4-bit quants; 64-weight groups, low nibbles first).
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_WORDS: u32 = 36u;

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
