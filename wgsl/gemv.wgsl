// GEMV for decode and few-token batches: Y[m, n] = sum_k W[n, k] * X[m, k] for m < n_cols,
// NCOLS columns per workgroup (common/matmul_params.wgsl's col0),
// one body for every weight format (the format file supplies the unit functions). Each
// workgroup owns ROWS rows of one weight chunk; its invocations stride over the row's units.
// One column (decode) may also take ROW_GROUPS > 1 groups of K_LANES invocations
// (common/gemv_output.wgsl), each group its own ROWS rows: more rows a workgroup, so that its
// x slices and fused RMSNorm are loaded and reduced once for many rows, not for two.
// The work: common/gemv_rows.wgsl, through common/gemv_one_format.wgsl or gemv_two_formats.wgsl;
// parameters: common/matmul_params.wgsl; input (fused RMSNorm, SwiGLU): common/gemv_input.wgsl;
// output and the final reduction: common/gemv_output.wgsl.

var<workgroup> partial: array<f32, PARTIALS>;
const_assert ((GROUPED == 0u || NCOLS == 1u) && PARTIALS >= NCOLS * LANE_GROUPS_MAX);

// write_group_rows' hooks: nothing more to do with the row pairs here.
fn keep_pair(i: u32, row: u32, inside: bool, t0: f32, t1: f32) {}
fn pairs_kept(row0: u32, lane: Lane) {}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    col0 = wid.z * NCOLS;
    let row0 = (wid.x + wid.y * nwg.x) * ROWS * ROW_GROUPS;
    gemv_workgroup(row0, lane);
}
