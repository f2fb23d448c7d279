// Q8_0, GPU layout (repacked at upload so the quants are word-aligned):
// 36 bytes per 32 weights = qs[32] (int8) | d (f16) | 2 bytes padding.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_WORDS: u32 = 9u;

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    let b = (row * (k / BLOCK_ELEMS) + c / 4u) * BLOCK_WORDS;
    let sub = c % 4u;
    let d = f16_bits_to_f32(wq[b + 8u] & 0xffffu);
    return Chunk8(i8x4(wq[b + sub * 2u]), i8x4(wq[b + sub * 2u + 1u]), d, 0.0);
}
