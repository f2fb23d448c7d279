// Workgroup reductions through workgroup memory alone (adapters without subgroups).
// WG must be a power of two. Callers must be in uniform control flow.
struct Lane {
    @builtin(local_invocation_index) lid: u32,
}

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;

fn wg_sum(v: f32, lane: Lane) -> f32 {
    workgroupBarrier();
    red_f[lane.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lane.lid < s) { red_f[lane.lid] += red_f[lane.lid + s]; }
        workgroupBarrier();
    }
    return red_f[0];
}

fn wg_max(v: f32, lane: Lane) -> f32 {
    workgroupBarrier();
    red_f[lane.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lane.lid < s) { red_f[lane.lid] = max(red_f[lane.lid], red_f[lane.lid + s]); }
        workgroupBarrier();
    }
    return red_f[0];
}

fn wg_min_u32(v: u32, lane: Lane) -> u32 {
    workgroupBarrier();
    red_u[lane.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lane.lid < s) { red_u[lane.lid] = min(red_u[lane.lid], red_u[lane.lid + s]); }
        workgroupBarrier();
    }
    return red_u[0];
}

// Batched reductions (many sums or maxima, one barrier): without subgroups every lane is its own
// group; after one barrier any lane adds the groups up.
const LANE_GROUPS_MAX: u32 = WG;
fn lane_group(lane: Lane) -> u32 { return lane.lid; }
fn lane_groups(lane: Lane) -> u32 { return WG; }
fn lane_is_leader(lane: Lane) -> bool { return true; }
fn group_sum(v: f32, lane: Lane) -> f32 { return v; }
fn group_max(v: f32, lane: Lane) -> f32 { return v; }
