// The int8 SwiGLU epilogue's output (EPI_SWIGLU_Q8, gemv_q8.wgsl): the gate/up GEMV's SwiGLU
// values also quantized in blocks of 32 (common/q8_block.wgsl) for the down projection's
// int8 GEMV, in the layout quantize_q8.wgsl writes (block i = m * blocks a row + b).
@group(0) @binding(6) var<storage, read_write> xq_out: array<vec4<u32>>;

fn store_q8_block(i: u32, q: Q8Block) {
    xq_out[3u * i] = q.lo;
    xq_out[3u * i + 1u] = q.hi;
    xq_out[3u * i + 2u] = q.sums;
}
