// The output side of both GEMV bodies (gemv.wgsl, gemv_q8.wgsl): Y, the bias, and the
// reduction of every lane's partial sums (columns col0 + 0 .. NCOLS - 1); the values go out
// through common/matmul_epilogue.wgsl (write_one, or store_pair for the other epilogues).
// Header constants: WG, ROWS, NCOLS, ROW_GROUPS, EPI; the including body declares `partial`
// (workgroup f32s, at least PARTIALS) and, for write_group_rows, keep_pair and pairs_kept.

@group(0) @binding(3) var<storage, read_write> y: array<f32>;

// ROW_GROUPS > 1: the invocations split into ROW_GROUPS groups of K_LANES, each group its own
// ROWS rows, each invocation a K_LANES-th of their units (write_group_rows adds them up).
const K_LANES: u32 = WG / ROW_GROUPS;
const GROUP_OUTS: u32 = ROW_GROUPS * ROWS * NCOLS;
const GROUPED: u32 = min(ROW_GROUPS, 2u) - 1u;   // 1 where ROW_GROUPS > 1, else 0
// One column, grouped: where every lane group (a subgroup: LANE_GROUP_SIZE lanes, a header
// constant from the adapter's fixed subgroup size; 1 without subgroups, every lane its own
// group; 0 where subgroups vary in size, and for the float GEMV, which was slower so) lies
// inside one group of K_LANES, each lane group adds its sums up itself (group_sum) and
// write_group_rows' readers add SPG of them, not K_LANES.
const SG_SUMS: bool = NCOLS == 1u && LANE_GROUP_SIZE > 0u && LANE_GROUP_SIZE <= K_LANES
    && K_LANES % max(LANE_GROUP_SIZE, 1u) == 0u;
// (At least 1: groups of fewer lanes than a subgroup, e.g. 8 on a GPU of 32-lane subgroups,
// do not take SG_SUMS, and `lg / SPG` must still compile.)
const SPG: u32 = max(1u, K_LANES / max(LANE_GROUP_SIZE, 1u));
// The reduction's workgroup memory: one slot per lane group and output (write_rows), or, grouped,
// one per lane of a group and output, padded by one per lane so the lanes' stores spread
// over banks (write_group_rows).
const PARTIALS: u32 = (1u - GROUPED) * ROWS * NCOLS * LANE_GROUPS_MAX + GROUPED * K_LANES * (GROUP_OUTS + 1u);
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

// Adds up the K_LANES lanes' sums of each of the workgroup's ROW_GROUPS x ROWS rows and NCOLS
// columns through workgroup memory (one barrier) and writes them as write_rows does.
// Output o = row * NCOLS + m (row within the workgroup); lane j of a group stores its sums at
// j (GROUP_OUTS + 1) + o, so the readers (one output each) read consecutive words. With
// SG_SUMS each lane group's leader stores its group_sum at o SPG + (its place in the group):
// a reader adds SPG words (1 for 32 lanes in subgroups of 32) instead of K_LANES. Each row
// pair through the epilogue is also handed to the body's keep_pair, and pairs_kept follows.
fn write_group_rows(acc: array<f32, ROWS * NCOLS>, row0: u32, lane: Lane) {
    if (SG_SUMS) {
        let lg = lane_group(lane);
        for (var i = 0u; i < ROWS; i++) {
            let s = group_sum(acc[i], lane);
            if (lane_is_leader(lane)) { partial[((lg / SPG) * ROWS + i) * SPG + lg % SPG] = s; }
        }
    } else {
        let g = lane.lid / K_LANES;
        let base = (lane.lid % K_LANES) * (GROUP_OUTS + 1u) + g * ROWS * NCOLS;
        for (var i = 0u; i < ROWS * NCOLS; i++) { partial[base + i] = acc[i]; }
    }
    workgroupBarrier();
    if (EPI != EPI_PLAIN) {
        // Pairs of rows (ROWS is even, row0 too) through the epilogue.
        for (var i = lane.lid; i < GROUP_OUTS / 2u; i += WG) {
            let r = 2u * (i / NCOLS);
            let m = i % NCOLS;
            let t0 = group_total(r * NCOLS + m);
            let t1 = group_total((r + 1u) * NCOLS + m);
            let inside = col0 + m < p.n_cols && row0 + r < p.n_rows;
            if (inside) { store_pair(col0 + m, row0 + r, t0, t1); }
            keep_pair(i, row0 + r, inside, t0, t1);
        }
        pairs_kept(row0, lane);
        return;
    }
    for (var o = lane.lid; o < GROUP_OUTS; o += WG) {
        write_one(col0 + o % NCOLS, row0 + o / NCOLS, group_total(o));
    }
}

// Output o's total from what write_group_rows stored.
fn group_total(o: u32) -> f32 {
    var t = 0.0;
    if (SG_SUMS) {
        for (var j = 0u; j < SPG; j++) { t += partial[o * SPG + j]; }
    } else {
        for (var j = 0u; j < K_LANES; j++) { t += partial[j * (GROUP_OUTS + 1u) + o]; }
    }
    return t;
}
