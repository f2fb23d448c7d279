// Split-K's second pass and the RMSNorm after it in one dispatch (prefill, where a split GEMM
// adds its output to the residual stream and the next matmul's cooperative GEMM reads the
// norm's output as halves). One workgroup a row (token): each lane adds up its values' partial
// sums over the K ranges in range order and adds them to the residual Y, as gemm_reduce.wgsl's
// plain epilogue does, writes Y and keeps the values; then the row's 1 / rms and the halves as
// rms_norm.wgsl with common/norm_out_f16.wgsl computes them from Y. The same bits as those two
// dispatches, one dispatch and one read of Y fewer.
// A lane holds values lid, lid + WG, ... (the norm's order for its sum of squares), at most
// HELD of them (n <= WG * HELD). Each K range's loads are issued together (ranges outer).
// Header constants: WG, HELD.

struct Params {
    // Values a row (the GEMM's output rows), rows (tokens), K ranges.
    n: u32,
    n_cols: u32,
    splits: u32,
    // Floats between Y's rows, halves between the output's rows.
    y_stride: u32,
    h_stride: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// The split GEMM's partials, [splits][n_cols][n].
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f16>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    // The same for the whole workgroup: the barriers of wg_sum stay in uniform control flow.
    if (row >= p.n_cols) { return; }
    // Zeros (WGSL initializes it): the reduce's sums start from 0.0 too.
    var held: array<f32, HELD>;
    for (var s = 0u; s < p.splits; s++) {
        let b = (s * p.n_cols + row) * p.n;
        for (var j = 0u; j < HELD; j++) {
            let i = lane.lid + j * WG;
            if (i < p.n) { held[j] += part[b + i]; }
        }
    }
    let yb = row * p.y_stride;
    for (var j = 0u; j < HELD; j++) {
        let i = lane.lid + j * WG;
        if (i < p.n) { held[j] += y[yb + i]; }
    }
    var ss = 0.0;
    for (var j = 0u; j < HELD; j++) {
        let i = lane.lid + j * WG;
        if (i < p.n) {
            y[yb + i] = held[j];
            ss = fma(held[j], held[j], ss);
        }
    }
    ss = wg_sum(ss, lane);
    let inv = 1.0 / sqrt(ss / f32(p.n) + p.eps);
    let hb = row * p.h_stride;
    for (var j = 0u; j < HELD; j++) {
        let i = lane.lid + j * WG;
        if (i < p.n) { h[hb + i] = f16(held[j] * inv * w[i]); }
    }
}
