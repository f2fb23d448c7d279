// The cooperative GEMM's X in f16 (rows of x_stride halves, x_stride % 8 == 0): eight halves
// in one 16-byte load, stored to workgroup memory as they are. (Rounding f32 X to f16 inside
// the GEMM costs a conversion per value per tile of N, and conversions run at a fraction of
// the rate of everything else.) Half8: common/half8.wgsl.

@group(0) @binding(2) var<storage, read> x: array<Half8>;

// X[gm, gk .. gk + 7] (gk % 8 == 0) as loaded, and how many of the eight lie inside X.
struct XStage {
    h: Half8,
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

fn x_halves(s: XStage) -> Half8 {
    let i = vec4<u32>(0u, 1u, 2u, 3u);
    let n = vec4<u32>(s.n);
    return Half8(select(vec4<f16>(0.0), s.h.lo, i < n), select(vec4<f16>(0.0), s.h.hi, i + vec4<u32>(4u) < n));
}
