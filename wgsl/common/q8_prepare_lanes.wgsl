// common/q8_in_local.wgsl's prepare_x on adapters without subgroups: one invocation a block
// of 32 values. Uniform control flow: it has a barrier.
fn prepare_x(lane: Lane) {
    let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
    var ss = 0.0;
    for (var blk = lane.lid; blk < p.k / 32u; blk += WG) {
        let c = 4u * blk;
        let v0 = load_x(xr, c, 0u);
        let v1 = load_x(xr, c, 1u);
        let v2 = load_x(xr, c + 1u, 0u);
        let v3 = load_x(xr, c + 1u, 1u);
        let v4 = load_x(xr, c + 2u, 0u);
        let v5 = load_x(xr, c + 2u, 1u);
        let v6 = load_x(xr, c + 3u, 0u);
        let v7 = load_x(xr, c + 3u, 1u);
        ss += dot(v0, v0) + dot(v1, v1) + dot(v2, v2) + dot(v3, v3) + dot(v4, v4) + dot(v5, v5) + dot(v6, v6) + dot(v7, v7);
        let q = q8_block(input_of(v0, xr, c, 0u, 1.0), input_of(v1, xr, c, 1u, 1.0), input_of(v2, xr, c + 1u, 0u, 1.0),
                         input_of(v3, xr, c + 1u, 1u, 1.0), input_of(v4, xr, c + 2u, 0u, 1.0), input_of(v5, xr, c + 2u, 1u, 1.0),
                         input_of(v6, xr, c + 3u, 0u, 1.0), input_of(v7, xr, c + 3u, 1u, 1.0));
        xq[3u * blk] = q.lo;
        xq[3u * blk + 1u] = q.hi;
        xq[3u * blk + 2u] = q.sums;
    }
    x_ss = ss;
    workgroupBarrier();
}

