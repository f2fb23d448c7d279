// GEMV over int8 activations, for the quantized weight formats: Y[m, n] = sum_k W[n, k] X[m, k].
// x comes quantized to int8 by quantize_q8.wgsl (its own small dispatch, once per input
// rather than once per workgroup), so that quantized weights multiply with packed 4x8-bit
// integer dot products (dot4I8Packed: one DP4A instruction where the driver offers integer
// dot products, as Vulkan 1.3 drivers do) instead of being converted to floats one by one.
// The result is exactly sum(w * x~) for the rounded activations x~, which differ from x by at
// most d / 2.
// Each invocation streams units of one aligned 16-byte vector of quants (weights bound as
// vec4s: common/weights_vec4.wgsl), so that one load instruction of a subgroup reads whole
// cache lines. The format file supplies dot_unit_count, dot_unit_half (which 16 x values
// part j of a unit multiplies), dot_header and dot_part; parameters:
// common/matmul_params.wgsl; output and the final reduction: common/gemv_output.wgsl.

// Per 32 values of x: quants 0-15, quants 16-31, then (d, sum of x~ 0-15, sum of x~ 16-31, 0).
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;

var<workgroup> partial: array<f32, ROWS * NCOLS * LANE_GROUPS_MAX>;

// Values 16 half .. 16 half + 15 of quantized x row m.
fn x_half(m: u32, half: u32) -> XHalf {
    let i = (m * (p.k / 32u) + half / 2u) * 3u;
    let s = bitcast<vec4<f32>>(xq[i + 2u]);
    return XHalf(xq[i + half % 2u], s.x, select(s.y, s.z, half % 2u == 1u));
}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    col0 = wid.z * NCOLS;
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }

    // Consecutive invocations take consecutive units of the row, so weight reads coalesce;
    // a unit's x values are loaded once for all ROWS rows.
    let n_units = dot_unit_count(p.k);
    for (var u = lane.lid; u < n_units; u += WG) {
        var xa: array<XHalf, NCOLS>;
        var xb: array<XHalf, NCOLS>;
        for (var m = 0u; m < NCOLS; m++) {
            let xm = min(col0 + m, p.n_cols - 1u);
            xa[m] = x_half(xm, dot_unit_half(u, 0u));
            xb[m] = x_half(xm, dot_unit_half(u, 1u));
        }
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < p.n_rows) {
                let h = dot_header(row, u, p.k);
                for (var m = 0u; m < NCOLS; m++) {
                    acc[r * NCOLS + m] += dot_part(h, 0u, xa[m]) + dot_part(h, 1u, xb[m]);
                }
            }
        }
    }
    write_rows(acc, row0, lane);
}
