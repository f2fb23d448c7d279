// 1 / rms of one column's n values from each invocation's sum of squares over its share of
// them, for the GEMV bodies that take the RMSNorm's factor at the end: the float GEMV over one
// column (common/gemv_rows.wgsl) and the int8 GEMV over blocks quantized without it
// (common/q8_in_local.wgsl, q8_in_global.wgsl). The including body declares `partial`
// (workgroup f32s, at least LANE_GROUPS_MAX). Uniform control flow: it has barriers.
fn inv_rms_from(ss: f32, n: f32, lane: Lane) -> f32 {
    let s = group_sum(ss, lane);
    if (lane_is_leader(lane)) { partial[lane_group(lane)] = s; }
    workgroupBarrier();
    var total = 0.0;
    for (var g = 0u; g < lane_groups(lane); g++) { total += partial[g]; }
    workgroupBarrier();
    return 1.0 / sqrt(total / n + p.eps);
}
