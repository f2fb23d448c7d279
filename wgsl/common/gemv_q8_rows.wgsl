// The int8 GEMV's (gemv_q8.wgsl) products of one workgroup's rows with the int8 x, apart
// from its reduction and output so that a GEMV over two weight formats
// (common/gemv_two_formats.wgsl) composes it a second time over its second weights
// (`Composer::include_renamed`). The rows are the weights' own (from row0, none past
// last_row); the format file supplies the dot_* functions.

// The workgroup's ROWS x NCOLS sums from row row0 of its weights, before x's scale.
// ROW_GROUPS 1: every invocation along K of the same rows. Consecutive invocations take
// consecutive units of the row, so weight reads coalesce; a unit's x values are loaded once
// for all ROWS rows.
// ROW_GROUPS > 1: group g = lid / K_LANES takes rows row0 + g ROWS ..; its lanes stride over
// the rows' units. Per unit the ROWS rows' headers are unpacked once and held, and each
// column's x slice is loaded in turn (NCOLS slices held at once would not fit in registers
// at 8 or 16 columns). Rows past the weights' end read the last row; their sums are not
// stored.
fn gemv_sums(row0: u32, last_row: u32, lane: Lane) -> GemvSums {
    var s: GemvSums;
    for (var i = 0u; i < ROWS * NCOLS; i++) { s.acc[i] = 0.0; }
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
                    s.acc[r * NCOLS + m] += dot_part(h[r], 0u, xa) + dot_part(h[r], 1u, xb);
                }
            }
        }
        return s;
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
                    s.acc[r * NCOLS + m] += dot_part(h, 0u, xa[m]) + dot_part(h, 1u, xb[m]);
                }
            }
        }
    }
    return s;
}
