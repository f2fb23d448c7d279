// X rounded to f16 for the cooperative GEMM (common/gemm_x_f16.wgsl), once per matmul input
// rather than once per tile of N inside the GEMM: rows of p.k floats (p.x_stride apart) to
// rows of p.y_stride halves (a multiple of 8), eight halves per invocation, zeros past k.
// Parameters: common/matmul_params.wgsl (n_cols rows); Half8: common/half8.wgsl. Header
// constant: WG.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> xh: array<Half8>;

// X[r, gk .. gk + 3], zero past k.
fn four(r: u32, gk: u32) -> vec4<f32> {
    if (gk >= p.k) { return vec4<f32>(0.0); }
    let v = x[(r * p.x_stride + gk) / 4u];
    return select(vec4<f32>(0.0), v, vec4<u32>(gk) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.k));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    let per_row = p.y_stride / 8u;
    if (i >= p.n_cols * per_row) { return; }
    let r = i / per_row;
    let gk = (i % per_row) * 8u;
    xh[i] = Half8(vec4<f16>(four(r, gk)), vec4<f16>(four(r, gk + 4u)));
}
