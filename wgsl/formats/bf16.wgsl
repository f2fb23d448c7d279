// BF16 weights: row-major, two per word; a bf16 is the top half of an f32.
const BLOCK_ELEMS: u32 = 1u;
const UNIT_CHUNKS: u32 = 1u;

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 {
    let k0 = c * 8u;
    let e = row * k + k0;
    var h: vec4<u32>;
    var g: vec4<u32>;
    if ((e & 1u) == 0u && k0 + 8u <= k) {
        let w = chunk_words(e);
        h = vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u);
        g = vec4<u32>(w.z << 16u, w.z & 0xffff0000u, w.w << 16u, w.w & 0xffff0000u);
    } else {
        for (var i = 0u; i < 4u; i++) {
            h[i] = select(0u, half_at(e + i) << 16u, k0 + i < k);
            g[i] = select(0u, half_at(e + 4u + i) << 16u, k0 + 4u + i < k);
        }
    }
    return Chunk8(bitcast<vec4<f32>>(h), bitcast<vec4<f32>>(g), 1.0, 0.0);
}

struct UnitHeader { row: u32, u: u32, k: u32 }
fn unit_count(k: u32) -> u32 { return (k + 7u) / 8u; }
fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader { return UnitHeader(row, u, k); }
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 { return decode8(h.row, h.u, h.k); }
fn unit_chunk(u: u32, j: u32) -> u32 { return u; }
