// The cooperative GEMM's W decoded in the tile from its block format (common/gemm_w_decode.wgsl):
// the loading invocations load the words (stage_w, the format file's fetch8), then decode them
// (unpack8) and round them to f16 (halves_w; common/chunk_half8.wgsl) as they store them.

alias WStage = RawW8;

fn stage_w(row: u32, c: u32) -> WStage { return fetch_w8(row, c); }

// Rows inside W: the row itself is the base (the format file finds its blocks).
fn w_base(row: u32) -> u32 { return row; }

fn stage_w_at(base: u32, c: u32) -> WStage { return RawW8(fetch8(base, c, p.k), true); }

fn halves_w_full(s: WStage) -> Half8 {
    return chunk_halves(unpack8(s.raw));
}

fn halves_w(s: WStage) -> Half8 {
    let h = halves_w_full(s);
    return Half8(select(vec4<f16>(0.0), h.lo, s.inside), select(vec4<f16>(0.0), h.hi, s.inside));
}
