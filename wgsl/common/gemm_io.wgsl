// What both GEMM bodies (gemm.wgsl on registers, gemm_coop.wgsl on cooperative matrices)
// share: X, Y and the bias, and the bounded reads of X and of W's decoded chunks (the
// epilogue that writes Y is common/matmul_epilogue.wgsl).

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // rows of x_stride floats, x_stride % 4 == 0
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// X[gm, gk .. gk + 3], zero outside X (past its rows, or past k in a ragged last vector).
fn load_x4(gm: u32, gk: u32) -> vec4<f32> {
    if (gm >= p.n_cols || gk >= p.k) { return vec4<f32>(0.0); }
    return select(vec4<f32>(0.0), x[(gm * p.x_stride + gk) / 4u], vec4<u32>(gk) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.k));
}

// Weights 8c .. 8c + 7 of W's row, decoded (the format file's decode8); zero outside W.
fn load_w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    if (row >= p.n_rows || c * 8u >= p.k) { return array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0)); }
    let ch = decode8(row, c, p.k);
    return array<vec4<f32>, 2>(chunk_lo(ch), chunk_hi(ch));
}

// The weights this workgroup sums, [x, y): all of K, or with EPI_PARTIAL (split-K) range z of
// p.split_k weights (a whole number of BK steps), which the epilogue writes as split z.
fn k_range(z: u32) -> vec2<u32> {
    split_z = z;
    if (EPI != EPI_PARTIAL) { return vec2<u32>(0u, p.k); }
    let begin = z * p.split_k;
    return vec2<u32>(begin, min(p.k, begin + p.split_k));
}
