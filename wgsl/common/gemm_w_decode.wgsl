// A GEMM's W read through its format file (fetch8, unpack8): the register GEMM's tiles, and
// the cooperative GEMM's where W is a block format (common/coop_w_decode.wgsl).

// Weights 8c .. 8c + 7 of W's row as loaded (the format file's fetch8), and whether the
// chunk lies inside W: outside, it is read from a chunk that does (row and chunk clamped) and
// unpack_w8 gives zeros. Split so that a GEMM can issue a K step's loads together and decode
// after them.
struct RawW8 {
    raw: Raw8,
    inside: bool,
}

fn fetch_w8(row: u32, c: u32) -> RawW8 {
    let inside = row < p.n_rows && c * 8u < p.k;
    return RawW8(fetch8(min(row, p.n_rows - 1u), select(0u, c, inside), p.k), inside);
}

// The eight weights fetched, decoded (the format file's unpack8); zero outside W.
fn unpack_w8(w: RawW8) -> array<vec4<f32>, 2> {
    if (!w.inside) { return array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0)); }
    let ch = unpack8(w.raw);
    return array<vec4<f32>, 2>(chunk_lo(ch), chunk_hi(ch));
}
