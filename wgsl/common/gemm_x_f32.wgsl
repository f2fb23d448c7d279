// A GEMM's X in f32 (the register GEMM, gemm.wgsl).

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // rows of x_stride floats, x_stride % 4 == 0

// X[gm, gk .. gk + 3], zero outside X (past its rows, or past k in a ragged last vector).
fn load_x4(gm: u32, gk: u32) -> vec4<f32> {
    if (gm >= p.n_cols || gk >= p.k) { return vec4<f32>(0.0); }
    return select(vec4<f32>(0.0), x[(gm * p.x_stride + gk) / 4u], vec4<u32>(gk) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.k));
}
