// common/q8_in_local.wgsl's prepare_x with subgroups (of 8 invocations or more,
// `Caps::subgroups`): each invocation loads one vector of 4 values, so that a subgroup's loads
// are consecutive, and 8 neighbours of a subgroup quantize a block of 32 (common/
// q8_lanes8.wgsl): every invocation busy, where one invocation a block left 7 in 8 idle and
// read x 128 bytes apart (H200, run 231: TinyLlama Q4_K_M tg128 1,100-1,102 -> 1,120-1,122
// tok/s). The same blocks as q8_block. Uniform control flow: it has a barrier.
fn prepare_x(lane: Lane) {
    let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
    let sg_size = WG / lane.n_sg;
    var ss = 0.0;
    for (var base = 0u; base < p.k / 4u; base += WG) {
        let i = base + lane.sg_id * sg_size + lane.sg_lane;
        let inside = i < p.k / 4u;
        // The loads from a clamped index (k % 4 == 0 here), what lies past x zeroed after:
        // no load behind a branch.
        let ic = min(i, p.k / 4u - 1u);
        let raw = load_x_inside(xr, ic / 2u, ic % 2u);
        let v = select(vec4<f32>(0.0), raw, inside);
        ss += dot(v, v);
        let blk = i / 8u;
        let j = i % 8u;
        let b = q8_lanes8(select(vec4<f32>(0.0), input_inside(raw, xr, ic / 2u, ic % 2u), inside), j);
        if (inside) {
            xq[3u * blk + j / 4u][j % 4u] = b.q;
            if (j == 0u) { xq[3u * blk + 2u] = bitcast<vec4<u32>>(b.sums); }
        }
    }
    x_ss = ss;
    workgroupBarrier();
}
