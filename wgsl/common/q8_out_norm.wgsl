// EPI_ADD_Q8_NORM (gemv_q8.wgsl): the weights of the RMSNorm that the GEMV after this one
// applies to Y, by which Y's int8 blocks are scaled (its 1 / rms left to that GEMV, which takes
// it from the blocks' sums of squares: common/q8_in_global.wgsl, NORM).
@group(0) @binding(7) var<storage, read> q8_norm_w: array<f32>;

fn q8_out_weight(n: u32) -> f32 { return q8_norm_w[n]; }
