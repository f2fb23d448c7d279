// Workgroup reductions with subgroup operations: one subgroup op, then one value per
// subgroup through workgroup memory. Callers must be in uniform control flow.
struct Lane {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
}

// One slot per subgroup: enough for 512 invocations at the smallest subgroup size (8).
var<workgroup> red_f: array<f32, 64>;
var<workgroup> red_u: array<u32, 64>;

fn wg_sum(v: f32, lane: Lane) -> f32 {
    let s = subgroupAdd(v);
    workgroupBarrier();
    if (lane.sg_lane == 0u) { red_f[lane.sg_id] = s; }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < lane.n_sg; i++) { t += red_f[i]; }
    return t;
}

fn wg_max(v: f32, lane: Lane) -> f32 {
    let s = subgroupMax(v);
    workgroupBarrier();
    if (lane.sg_lane == 0u) { red_f[lane.sg_id] = s; }
    workgroupBarrier();
    var t = red_f[0];
    for (var i = 1u; i < lane.n_sg; i++) { t = max(t, red_f[i]); }
    return t;
}

fn wg_min_u32(v: u32, lane: Lane) -> u32 {
    let s = subgroupMin(v);
    workgroupBarrier();
    if (lane.sg_lane == 0u) { red_u[lane.sg_id] = s; }
    workgroupBarrier();
    var t = red_u[0];
    for (var i = 1u; i < lane.n_sg; i++) { t = min(t, red_u[i]); }
    return t;
}

// Batched reductions (many sums or maxima, one barrier): each group of lanes (a subgroup) sums its
// values, its leader stores the result, and after one barrier any lane adds the groups up.
const LANE_GROUPS_MAX: u32 = 64u;
fn lane_group(lane: Lane) -> u32 { return lane.sg_id; }
fn lane_groups(lane: Lane) -> u32 { return lane.n_sg; }
fn lane_is_leader(lane: Lane) -> bool { return lane.sg_lane == 0u; }
fn group_sum(v: f32, lane: Lane) -> f32 { return subgroupAdd(v); }
fn group_max(v: f32, lane: Lane) -> f32 { return subgroupMax(v); }
