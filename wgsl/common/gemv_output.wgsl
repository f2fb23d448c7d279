// The output side of both GEMV bodies (gemv.wgsl, gemv_q8.wgsl): Y, the bias, and the
// reduction of every lane's partial sums (columns col0 + 0 .. NCOLS - 1); the values go out
// through common/matmul_epilogue.wgsl (write_one, or store_pair for the other epilogues).
// Header constants: WG, ROWS, NCOLS, EPI; the including body declares `partial` (workgroup
// f32s, at least ROWS * NCOLS * LANE_GROUPS_MAX).

@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// Adds up every lane's ROWS x NCOLS partial sums with a single barrier and writes the
// workgroup's rows of Y (+ bias, + the value already there). Uniform control flow.
fn write_rows(acc: array<f32, ROWS * NCOLS>, row0: u32, lane: Lane) {
    for (var i = 0u; i < ROWS * NCOLS; i++) {
        let s = group_sum(acc[i], lane);
        if (lane_is_leader(lane)) { partial[i * LANE_GROUPS_MAX + lane_group(lane)] = s; }
    }
    workgroupBarrier();
    if (EPI != EPI_PLAIN) {
        // Pairs of rows (ROWS is even, row0 too) through the epilogue.
        for (var i = lane.lid; i < ROWS / 2u * NCOLS; i += WG) {
            let r = 2u * (i / NCOLS);
            let m = i % NCOLS;
            var t0 = 0.0;
            var t1 = 0.0;
            for (var g = 0u; g < lane_groups(lane); g++) {
                t0 += partial[(r * NCOLS + m) * LANE_GROUPS_MAX + g];
                t1 += partial[((r + 1u) * NCOLS + m) * LANE_GROUPS_MAX + g];
            }
            if (col0 + m < p.n_cols) { store_pair(col0 + m, row0 + r, t0, t1); }
        }
        return;
    }
    for (var i = lane.lid; i < ROWS * NCOLS; i += WG) {
        var total = 0.0;
        for (var g = 0u; g < lane_groups(lane); g++) { total += partial[i * LANE_GROUPS_MAX + g]; }
        write_one(col0 + i % NCOLS, row0 + i / NCOLS, total);
    }
}
