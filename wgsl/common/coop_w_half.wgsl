// The cooperative GEMM's W as halves (F16 weights): rows of k halves, k % 8 == 0, loaded as
// 16-byte vectors of words (one load a chunk: an array of Half8 loads in two) and kept as
// words until stored, so that a chunk loaded a step ahead is not unpacked before the barrier.

@group(0) @binding(1) var<storage, read> wh: array<vec4<u32>>;

struct WStage {
    v: vec4<u32>,
    inside: bool,
}

// Weights 8c .. 8c + 7 of W's row; outside W, a chunk inside it (zeroed by halves_w: no load
// behind a branch, see load_x8).
fn stage_w(row: u32, c: u32) -> WStage {
    let inside = row < p.n_rows && c * 8u < p.k;
    let r = min(row, p.n_rows - 1u);
    return WStage(wh[(r * p.k) / 8u + select(0u, c, inside)], inside);
}

// Rows inside W: row's first chunk (computed once per workgroup), and chunk c of it.
fn w_base(row: u32) -> u32 {
    return row * (p.k / 8u);
}

fn stage_w_at(base: u32, c: u32) -> WStage {
    return WStage(wh[base + c], true);
}

fn halves_w(s: WStage) -> Half8 {
    let h = halves_of_words(s.v);
    return Half8(select(vec4<f16>(0.0), h.lo, s.inside), select(vec4<f16>(0.0), h.hi, s.inside));
}

fn halves_w_full(s: WStage) -> Half8 {
    return halves_of_words(s.v);
}
