// common/q8_in_local.wgsl's prepare_x with subgroups (of 8 invocations or more,
// `Caps::subgroups`): each invocation loads one vector of 4 values, so that a subgroup's loads
// are consecutive, and 8 neighbours of a subgroup quantize a block of 32, its largest magnitude
// and its halves' sums taken through subgroup shuffles: every invocation busy, where one
// invocation a block left 7 in 8 idle and read x 128 bytes apart (H200, run 231: TinyLlama
// Q4_K_M tg128 1,100-1,102 -> 1,120-1,122 tok/s). The same blocks as q8_block. Uniform
// control flow: it has a barrier.
fn prepare_x(lane: Lane) {
    let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
    let sg_size = WG / lane.n_sg;
    var ss = 0.0;
    for (var base = 0u; base < p.k / 4u; base += WG) {
        let i = base + lane.sg_id * sg_size + lane.sg_lane;
        let inside = i < p.k / 4u;
        var v = vec4<f32>(0.0);
        if (inside) { v = load_x(xr, i / 2u, i % 2u); }
        ss += dot(v, v);
        let w = input_of(v, xr, i / 2u, i % 2u, 1.0);
        var m = max(max(abs(w.x), abs(w.y)), max(abs(w.z), abs(w.w)));
        m = max(m, subgroupShuffleXor(m, 1u));
        m = max(m, subgroupShuffleXor(m, 2u));
        m = max(m, subgroupShuffleXor(m, 4u));
        let d = m / 127.0;
        let id = select(0.0, 1.0 / d, d > 0.0);
        let q = pack_q8(w, id);
        var s = dot4I8Packed(q, 0x01010101u);
        s += subgroupShuffleXor(s, 1u);
        s += subgroupShuffleXor(s, 2u);
        let s_hi = subgroupShuffleXor(s, 4u);
        let blk = i / 8u;
        let j = i % 8u;
        if (inside) {
            xq[3u * blk + j / 4u][j % 4u] = q;
            if (j == 0u) { xq[3u * blk + 2u] = bitcast<vec4<u32>>(vec4<f32>(d, d * f32(s), d * f32(s_hi), 0.0)); }
        }
    }
    x_ss = ss;
    workgroupBarrier();
}
