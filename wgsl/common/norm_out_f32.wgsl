// rms_norm.wgsl's output as floats: rows y_stride apart.
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn store_row(row: u32, xb: u32, inv: f32, lane: Lane) {
    let yb = row * p.y_stride;
    for (var i = lane.lid; i < p.n; i += WG) {
        y[yb + i] = x[xb + i] * inv * w[i];
    }
}
