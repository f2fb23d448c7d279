// F16 weights: row-major halves, two per word.
const BLOCK_ELEMS: u32 = 1u;
const UNIT_CHUNKS: u32 = 1u;

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    let k0 = c * 8u;
    let e = row * k + k0;
    var h: vec4<u32>;
    var g: vec4<u32>;
    if ((e & 1u) == 0u && k0 + 8u <= k) {
        // Aligned whole chunk: four words (one vector load at a 16-byte boundary), converted
        // by the hardware (exact: every half, subnormals included, is an f32; the tests hold
        // it to ggml's bits).
        let w = chunk_words(e);
        return Chunk8(
            vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
            vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
            1.0,
            0.0,
        );
    } else {
        for (var i = 0u; i < 4u; i++) {
            h[i] = select(0u, half_at(e + i), k0 + i < k);
            g[i] = select(0u, half_at(e + 4u + i), k0 + 4u + i < k);
        }
    }
    return Chunk8(f16_bits_to_f32x4(h), f16_bits_to_f32x4(g), 1.0, 0.0);
}

struct UnitHeader { row: u32, u: u32, k: u32 }
fn unit_count(k: u32) -> u32 { return (k + 7u) / 8u; }
fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader { return UnitHeader(row, u, k); }
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 { return decode8(h.row, h.u, h.k); }
fn unit_chunk(u: u32, j: u32) -> u32 { return u; }
