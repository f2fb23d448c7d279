// What both GEMM bodies (gemm.wgsl on registers, gemm_coop.wgsl on cooperative matrices)
// share: Y, the bias and the K range (the epilogue that writes Y is
// common/matmul_epilogue.wgsl). X is read through common/gemm_x_f32.wgsl or gemm_x_f16.wgsl,
// W through common/gemm_w_decode.wgsl (and for the cooperative GEMM coop_w_*.wgsl).

@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// The weights this workgroup sums, [x, y): all of K, or with EPI_PARTIAL (split-K) range z of
// p.split_k weights (a whole number of BK steps), which the epilogue writes as split z.
fn k_range(z: u32) -> vec2<u32> {
    split_z = z;
    if (EPI != EPI_PARTIAL) { return vec2<u32>(0u, p.k); }
    let begin = z * p.split_k;
    return vec2<u32>(begin, min(p.k, begin + p.split_k));
}
