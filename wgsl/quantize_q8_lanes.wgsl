// A one-token step's GEMV input (through the fused RMSNorm or SwiGLU, common/gemv_input.wgsl)
// quantized to int8 blocks for gemv_q8.wgsl in quantize_q8.wgsl's layout, each invocation one
// vector of 4 values and 8 neighbours of a subgroup a block (common/q8_lanes8.wgsl): one round
// of loads, coalesced, and no pass over the row. Through the RMSNorm the blocks hold x times
// the norm's weights, not yet its 1 / rms (quantizing by blocks is free of scale), and each
// block's sum of squares of x in its sums' last slot, from which the GEMV takes the 1 / rms
// (common/q8_in_global.wgsl, NORM): no workgroup waits for the whole row's sum. quantize_q8.wgsl
// (1 / rms applied, one invocation a block) stays for steps of several columns. Subgroups of 8
// or more; k % 32 == 0. Header constants: WG, NCOLS (1), NORM, GLU.

@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;

// gemv_input.wgsl's reductions (unused here) name it.
var<workgroup> partial: array<f32, LANE_GROUPS_MAX>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    col0 = wid.z;
    let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
    let n4 = p.k / 4u;
    // The invocation's vector, counted along subgroups so that a block's 8 neighbours are one
    // subgroup's. Past the row's end (the last workgroup) it loads zeros and stores nothing,
    // but takes part in the shuffles.
    let i = (wid.x + wid.y * nwg.x) * WG + lane.sg_id * (WG / lane.n_sg) + lane.sg_lane;
    let j = i % 8u;
    let v = load_x(xr, i / 2u, i % 2u);
    var ss = dot(v, v);
    ss += subgroupShuffleXor(ss, 1u);
    ss += subgroupShuffleXor(ss, 2u);
    ss += subgroupShuffleXor(ss, 4u);
    let b = q8_lanes8(input_of(v, xr, i / 2u, i % 2u, 1.0), j);
    if (i < n4) {
        let o = (col0 * (p.k / 32u) + i / 8u) * 3u;
        xq[o + j / 4u][j % 4u] = b.q;
        if (j == 0u) {
            var s = b.sums;
            if (NORM) { s.w = ss; }
            xq[o + 2u] = bitcast<vec4<u32>>(s);
        }
    }
}
