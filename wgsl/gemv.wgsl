// GEMV for decode and few-token batches: Y[m, n] = sum_k W[n, k] * X[m, k] for m < n_cols,
// one body for every weight format (the format file supplies decode8). Each workgroup owns
// ROWS rows of one weight chunk; its invocations stride over the row's 8-weight chunks.
// Header constants: WG, ROWS, NCOLS.

struct Params {
    k: u32,          // weights per row
    n_rows: u32,     // rows in this weight chunk
    row_offset: u32, // output column of the chunk's first row
    y_stride: u32,   // elements between output rows (m)
    x_stride: u32,   // elements between input rows (m)
    n_cols: u32,     // active columns, <= NCOLS
    has_bias: u32,   // add bias[row_offset + r]
    accumulate: u32, // add the value already in Y (fused residual)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let n_chunks = (p.k + 7u) / 8u;
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }

    for (var c = lane.lid; c < n_chunks; c += WG) {
        let k0 = c * 8u;
        var xl: array<vec4<f32>, NCOLS>;
        var xh: array<vec4<f32>, NCOLS>;
        for (var m = 0u; m < NCOLS; m++) {
            let b = min(m, p.n_cols - 1u) * p.x_stride + k0;
            if (k0 + 8u <= p.k) {
                xl[m] = vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]);
                xh[m] = vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]);
            } else {
                for (var i = 0u; i < 4u; i++) {
                    xl[m][i] = select(0.0, x[b + i], k0 + i < p.k);
                    xh[m][i] = select(0.0, x[b + 4u + i], k0 + 4u + i < p.k);
                }
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < p.n_rows) {
                let ch = decode8(row, c, p.k);
                for (var m = 0u; m < NCOLS; m++) {
                    let qx = dot(ch.lo, xl[m]) + dot(ch.hi, xh[m]);
                    let xs = dot(xl[m] + xh[m], vec4<f32>(1.0));
                    acc[r * NCOLS + m] += ch.scale * qx + ch.offset * xs;
                }
            }
        }
    }

    for (var r = 0u; r < ROWS; r++) {
        for (var m = 0u; m < NCOLS; m++) {
            let total = wg_sum(acc[r * NCOLS + m], lane);
            let row = row0 + r;
            if (lane.lid == 0u && row < p.n_rows && m < p.n_cols) {
                let n = p.row_offset + row;
                let o = m * p.y_stride + n;
                var v = total;
                if (p.has_bias != 0u) { v += bias[n]; }
                if (p.accumulate != 0u) { v += y[o]; }
                y[o] = v;
            }
        }
    }
}
