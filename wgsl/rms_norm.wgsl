// RMSNorm over rows: y = x / sqrt(mean(x^2) + eps) * w. One workgroup per row. Also the
// per-head Q/K norm of Qwen3 (rows = tokens x heads, n = head_dim, one weight row). The
// output file stores the row: floats (common/norm_out_f32.wgsl), or halves for the
// cooperative GEMM's input (common/norm_out_f16.wgsl: no to_half dispatch after the norm).
// Header constants: WG.

struct Params {
    n: u32,
    x_stride: u32,
    y_stride: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let xb = row * p.x_stride;
    var ss = 0.0;
    for (var i = lane.lid; i < p.n; i += WG) {
        let v = x[xb + i];
        ss = fma(v, v, ss);
    }
    ss = wg_sum(ss, lane);
    let inv = 1.0 / sqrt(ss / f32(p.n) + p.eps);
    store_row(row, xb, inv, lane);
}
