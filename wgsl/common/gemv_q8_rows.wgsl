// The int8 GEMV's (gemv_q8.wgsl) work over one workgroup's rows of one weights binding: the
// products with the int8 x, x's scale, the reduction and the output. Apart from
// gemv_q8.wgsl's entry point so that a GEMV over two weight formats
// (common/gemv_two_formats.wgsl) composes it a second time over its second weights
// (`Composer::include_renamed`). The format file supplies the dot_* functions.

// The workgroup's rows from row row0 of its weights, none past last_row, written as Y's
// rows from out0 on.
// ROW_GROUPS 1: every invocation along K of the same rows. Consecutive invocations take
// consecutive units of the row, so weight reads coalesce; a unit's x values are loaded once
// for all ROWS rows.
// ROW_GROUPS > 1: group g = lid / K_LANES takes rows row0 + g ROWS ..; its lanes stride over
// the rows' units. Per unit the ROWS rows' headers are unpacked once and held, and each
// column's x slice is loaded in turn (NCOLS slices held at once would not fit in registers
// at 8 or 16 columns). Rows past the weights' end read the last row; their sums are not
// stored.
fn gemv_rows(row0: u32, last_row: u32, out0: u32, lane: Lane) {
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }
    let n_units = dot_unit_count(p.k);
    if (ROW_GROUPS > 1u) {
        let rows0 = row0 + (lane.lid / K_LANES) * ROWS;
        for (var u = lane.lid % K_LANES; u < n_units; u += K_LANES) {
            var h: array<DotHeader, ROWS>;
            for (var r = 0u; r < ROWS; r++) { h[r] = dot_header(min(rows0 + r, last_row), u, p.k); }
            let ha = dot_unit_half(u, 0u);
            let hb = dot_unit_half(u, 1u);
            for (var m = 0u; m < NCOLS; m++) {
                let xm = min(col0 + m, p.n_cols - 1u);
                let xa = x_half(xm, ha);
                let xb = x_half(xm, hb);
                for (var r = 0u; r < ROWS; r++) {
                    acc[r * NCOLS + m] += dot_part(h[r], 0u, xa) + dot_part(h[r], 1u, xb);
                }
            }
        }
        let xs = x_scale(lane);
        for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] *= xs; }
        write_group_rows(acc, out0, lane);
        return;
    }
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
            if (row <= last_row) {
                let h = dot_header(row, u, p.k);
                for (var m = 0u; m < NCOLS; m++) {
                    acc[r * NCOLS + m] += dot_part(h, 0u, xa[m]) + dot_part(h, 1u, xb[m]);
                }
            }
        }
    }
    let xs = x_scale(lane);
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] *= xs; }
    write_rows(acc, out0, lane);
}
