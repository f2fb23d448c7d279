// The cooperative GEMM's X in f16 (rows of x_stride halves, x_stride % 8 == 0): eight halves
// in one 16-byte load. (Rounding f32 X to f16 inside the GEMM costs a conversion per value per
// tile of N, and conversions run at a fraction of the rate of everything else.)
// X is bound as 16-byte vectors of words, not as Half8 (common/half8.wgsl): NVIDIA's compiler
// loads a Half8, two 8-byte-aligned vec4<f16>, in two 8-byte loads, and the loads set the GEMM's
// pace; the words become halves as they are stored (halves_of_words). H200, run 281, TFLOP/s Half8 -> words:
// 4096^3 F16 124.2 -> 137.6, Q4_K 104.3 -> 106.8; 512x4096x11008 F16 105.3 -> 116.2. F16 W as
// words too (common/coop_w_half.wgsl) cost more in conversions than it saved alone (4096^3
// 135.0 -> 132.6, run 280) and pays with the loads held a step ahead (run 310).

@group(0) @binding(2) var<storage, read> x: array<vec4<u32>>;

// X[gm, gk .. gk + 7] (gk % 8 == 0) as loaded, and how many of the eight lie inside X.
struct XStage {
    v: vec4<u32>,
    n: u32,
}

// Every load is made, from a clamped position inside X, and what lies outside is zeroed when
// it is stored (x_halves): loads behind branches, or a select right after the load, kept the
// kernel at half its rate on an H200 (75 against 139 TFLOP/s at 4096^3).
fn load_x8(gm: u32, gk: u32) -> XStage {
    let inside = gm < p.n_cols && gk < p.k;
    let n = select(0u, min(8u, p.k - gk), inside);
    let r = min(gm, p.n_cols - 1u);
    let c = min(gk, (p.k - 1u) & ~7u);
    return XStage(x[(r * p.x_stride + c) / 8u], n);
}

// Chunks of tiles that lie inside X in rows and K (the GEMM checks that once per workgroup):
// row gm's first chunk, computed once, and the load of chunk c of it alone.
fn x_base(gm: u32) -> u32 {
    return gm * (p.x_stride / 8u);
}

fn load_x8_at(base: u32, c: u32) -> XStage {
    return XStage(x[base + c], 8u);
}

// The eight halves of a chunk inside X.
fn x_halves_full(s: XStage) -> Half8 { return halves_of_words(s.v); }

// Those of any chunk, what lies outside X zeroed.
fn x_halves(s: XStage) -> Half8 {
    let h = x_halves_full(s);
    let i = vec4<u32>(0u, 1u, 2u, 3u);
    let n = vec4<u32>(s.n);
    return Half8(select(vec4<f16>(0.0), h.lo, i < n), select(vec4<f16>(0.0), h.hi, i + vec4<u32>(4u) < n));
}
