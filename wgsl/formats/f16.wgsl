// F16 weights: row-major halves, two per word.
const BLOCK_ELEMS: u32 = 1u;
const UNIT_CHUNKS: u32 = 1u;

// The chunk's eight halves, two to a word (one vector load for an aligned whole chunk).
struct Raw8 { w: vec4<u32> }

fn fetch8(row: u32, c: u32, k: u32) -> Raw8 { return Raw8(halves8(row, c, k)); }

// fetch8 of a chunk inside a row of k % 8 == 0 weights (the float GEMV's aligned loop): one
// vector load, without the alignment and bounds branches in front of it.
fn fetch8_inside(row: u32, c: u32, k: u32) -> Raw8 { return Raw8(w128((row * k) / 8u + c)); }

// Converted by the hardware (exact: every half, subnormals included, is an f32; the tests
// hold it to ggml's bits).
fn unpack8(r: Raw8) -> Chunk8 {
    return Chunk8(
        vec4<f32>(unpack2x16float(r.w.x), unpack2x16float(r.w.y)),
        vec4<f32>(unpack2x16float(r.w.z), unpack2x16float(r.w.w)),
        1.0,
        0.0,
    );
}

fn decode8(row: u32, c: u32, k: u32) -> Chunk8 { return unpack8(fetch8(row, c, k)); }

struct UnitHeader { row: u32, u: u32, k: u32 }
fn unit_count(k: u32) -> u32 { return (k + 7u) / 8u; }
fn unit_header(row: u32, u: u32, k: u32) -> UnitHeader { return UnitHeader(row, u, k); }
fn unit_decode(h: UnitHeader, j: u32) -> Chunk8 { return decode8(h.row, h.u, h.k); }
fn unit_chunk(u: u32, j: u32) -> u32 { return u; }
