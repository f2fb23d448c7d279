// rms_norm.wgsl's output as halves, the cooperative GEMM's f16 input (rows of y_stride halves,
// a multiple of 8; what lies past n stays as to_half.wgsl leaves it, zero), four values an
// invocation (n and x_stride multiples of 4). The same values, in the same order of
// operations, as the float output rounded by to_half.wgsl.
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f16>>;

fn store_row(row: u32, xb: u32, inv: f32, lane: Lane) {
    let yb = row * p.y_stride / 4u;
    for (var i = lane.lid; i < p.n / 4u; i += WG) {
        let j = 4u * i;
        let v = vec4<f32>(x[xb + j], x[xb + j + 1u], x[xb + j + 2u], x[xb + j + 3u]) * inv;
        y[yb + i] = vec4<f16>(v * vec4<f32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]));
    }
}
