// F32 weights: row-major floats, one per word.
const BLOCK_ELEMS: u32 = 1u;
const UNIT_CHUNKS: u32 = 1u;

// The chunk's eight floats as words.
struct Raw8 { lo: vec4<u32>, hi: vec4<u32> }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 {
    let k0 = c * 8u;
    let e = row * k + k0;
    if ((e & 3u) == 0u && k0 + 8u <= k) {
        // A whole chunk at a 16-byte boundary: two vector loads.
        return Raw8(w128(e >> 2u), w128((e >> 2u) + 1u));
    }
    var v: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = select(0u, w32(e + i), k0 + i < k);
    }
    return Raw8(vec4<u32>(v[0], v[1], v[2], v[3]), vec4<u32>(v[4], v[5], v[6], v[7]));
}

// fetch8 of a chunk inside a row of k % 8 == 0 weights (the float GEMV's aligned loop): two
// vector loads, without the alignment and bounds branches in front of them.
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 {
    let i = (row * k + c * 8u) >> 2u;
    return Raw8(w128(i), w128(i + 1u));
}

fn unpack8(r: Raw8) -> Chunk8 { return Chunk8(bitcast<vec4<f32>>(r.lo), bitcast<vec4<f32>>(r.hi), 1.0, 0.0); }

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

struct UnitHeader { row: u32, u: u32, k: u32 }
fn unit_count(k: u32) -> u32 { return (k + 7u) / 8u; }
fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader { return UnitHeader(row, u, k); }
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 { return decode8(h.row, h.u, h.k); }
fn unit_chunk(u: u32, j: u32) -> u32 { return u; }
