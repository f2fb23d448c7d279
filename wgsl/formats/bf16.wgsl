// BF16 weights: row-major, two per word; a bf16 is the top half of an f32.
const BLOCK_ELEMS: u32 = 1u;
const UNIT_CHUNKS: u32 = 1u;

// The chunk's eight bf16 values, two to a word.
struct Raw8 { w: vec4<u32> }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 { return Raw8(halves8(row, c, k)); }

// fetch8 of a chunk inside a row of k % 8 == 0 weights (the float GEMV's aligned loop): one
// vector load, without the alignment and bounds branches in front of it.
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 { return Raw8(w128((row * k) / 8u + c)); }

// A bf16 is the high half of an f32.
fn unpack8(r: Raw8) -> Chunk8 {
    let w = r.w;
    let h = vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u);
    let g = vec4<u32>(w.z << 16u, w.z & 0xffff0000u, w.w << 16u, w.w & 0xffff0000u);
    return Chunk8(bitcast<vec4<f32>>(h), bitcast<vec4<f32>>(g), 1.0, 0.0);
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

struct UnitHeader { row: u32, u: u32, k: u32 }
fn unit_count(k: u32) -> u32 { return (k + 7u) / 8u; }
fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader { return UnitHeader(row, u, k); }
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 { return decode8(h.row, h.u, h.k); }
fn unit_chunk(u: u32, j: u32) -> u32 { return u; }
