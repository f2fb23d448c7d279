// Eight halves, one 16-byte load or store: the cooperative GEMM's f16 activations and F16
// weights (common/gemm_x_f16.wgsl, coop_w_*.wgsl) and what to_half.wgsl writes for them.
struct Half8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}
