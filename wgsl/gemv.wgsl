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
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // rows of x_stride floats, x_stride % 4 == 0
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

var<workgroup> partial: array<f32, ROWS * NCOLS * LANE_GROUPS_MAX>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let n_units = unit_count(p.k);
    let n_chunks = (p.k + 7u) / 8u;
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }

    // Consecutive invocations take consecutive units of the row, so reads coalesce; each
    // unit's header (scales) is unpacked once for its UNIT_CHUNKS chunks, and its slice of x
    // is loaded once for all ROWS rows.
    for (var u = lane.lid; u < n_units; u += WG) {
        var xv: array<vec4<f32>, UNIT_CHUNKS * NCOLS * 2u>;
        var xsum: array<f32, UNIT_CHUNKS * NCOLS>;   // for the per-chunk offset (K-quant mins)
        for (var j = 0u; j < UNIT_CHUNKS; j++) {
            let c = unit_chunk(u, j);
            let kk = vec4<u32>(c * 8u) + vec4<u32>(0u, 1u, 2u, 3u);
            for (var m = 0u; m < NCOLS; m++) {
                let xb = min(m, p.n_cols - 1u) * (p.x_stride / 4u) + 2u * c;
                // Past the end of a ragged row, x counts as zero.
                xv[(j * NCOLS + m) * 2u] = select(vec4<f32>(0.0), x[xb], kk < vec4<u32>(p.k));
                xv[(j * NCOLS + m) * 2u + 1u] = select(vec4<f32>(0.0), x[xb + 1u], kk + vec4<u32>(4u) < vec4<u32>(p.k));
                xsum[j * NCOLS + m] = dot(xv[(j * NCOLS + m) * 2u] + xv[(j * NCOLS + m) * 2u + 1u], vec4<f32>(1.0));
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < p.n_rows) {
                let h = unit_header(row, u, p.k);
                for (var j = 0u; j < UNIT_CHUNKS; j++) {
                    if (unit_chunk(u, j) < n_chunks) {
                        let ch = unit_decode(h, j);
                        for (var m = 0u; m < NCOLS; m++) {
                            let xl = xv[(j * NCOLS + m) * 2u];
                            let xh = xv[(j * NCOLS + m) * 2u + 1u];
                            let qx = dot(ch.lo, xl) + dot(ch.hi, xh);
                            acc[r * NCOLS + m] += ch.scale * qx + ch.offset * xsum[j * NCOLS + m];
                        }
                    }
                }
            }
        }
    }

    // All ROWS x NCOLS sums with a single barrier.
    for (var i = 0u; i < ROWS * NCOLS; i++) {
        let s = group_sum(acc[i], lane);
        if (lane_is_leader(lane)) { partial[i * LANE_GROUPS_MAX + lane_group(lane)] = s; }
    }
    workgroupBarrier();
    for (var i = lane.lid; i < ROWS * NCOLS; i += WG) {
        let r = i / NCOLS;
        let m = i % NCOLS;
        let row = row0 + r;
        if (row < p.n_rows && m < p.n_cols) {
            var total = 0.0;
            for (var g = 0u; g < lane_groups(lane); g++) { total += partial[i * LANE_GROUPS_MAX + g]; }
            let n = p.row_offset + row;
            let o = m * p.y_stride + n;
            var v = total;
            if (p.has_bias != 0u) { v += bias[n]; }
            if (p.accumulate != 0u) { v += y[o]; }
            y[o] = v;
        }
    }
}
