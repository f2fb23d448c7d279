// A GEMV over a matrix stacked from two weight formats in one dispatch (the Q/K/V projection
// of Q4_K_M files, whose V rows are Q6_K): rows [0, p.first_rows) from binding 1, the rest
// from binding 10 through the `_b` copies of the second format's file and of the body's work
// (`Composer::include_renamed`). A workgroup's rows lie in one part (the planner takes this
// kernel where first_rows is a multiple of a workgroup's rows), so the branch is uniform.
fn gemv_workgroup(row0: u32, lane: Lane) {
    if (row0 < p.first_rows) {
        gemv_rows(row0, p.first_rows - 1u, row0, lane);
        return;
    }
    gemv_rows_b(row0 - p.first_rows, p.n_rows - p.first_rows - 1u, row0, lane);
}
