// The SwiGLU epilogue writing halves (common/matmul_epilogue.wgsl, EPI_SWIGLU_F16): Y as the
// f16 input of the cooperative GEMM after it (binding 6, rows of y_stride halves), in place of
// the float Y and the to_half dispatch that would round it. store_qkv unused here.
@group(0) @binding(6) var<storage, read_write> yh: array<f16>;

fn store_half(i: u32, v: f32) { yh[i] = f16(v); }

fn store_qkv(gm: u32, n: u32, a: f32, b: f32) {}
