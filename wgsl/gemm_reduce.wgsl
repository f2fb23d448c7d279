// Split-K's second pass: adds up the partial sums a split-K GEMM (EPI_PARTIAL) wrote for each
// K range, [splits][m][n_rows], and applies the matmul's real epilogue (bias, residual add,
// SwiGLU, RoPE into the KV cache) to each pair of adjacent outputs, as the GEMM would have.
// Same bindings as the GEMM (the weights at 1 and the fused-input weights at 5 unused), the
// partials where the GEMM reads X. Header constant WG.
// Parameters: common/matmul_params.wgsl; the epilogue: common/matmul_epilogue.wgsl.

@group(0) @binding(2) var<storage, read> part: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let pairs = (p.n_rows + 1u) / 2u;
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let gm = i / max(pairs, 1u);
    if (gm >= p.n_cols) { return; }
    let row = (i % pairs) * 2u;
    let second = row + 1u < p.n_rows;
    var v0 = 0.0;
    var v1 = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let o = (s * p.n_cols + gm) * p.n_rows + row;
        v0 += part[o];
        if (second) { v1 += part[o + 1u]; }
    }
    store_pair(gm, row, v0, v1);
}
