// The int8 GEMV's input (gemv_q8.wgsl) quantized by each workgroup itself from the float x
// (binding 2, common/gemv_input.wgsl), through the fused RMSNorm (NORM), into workgroup
// memory in quantize_q8.wgsl's layout: the GEMV needs no quantize dispatch before it. For
// one column (NCOLS 1) of at most XQ_MAX_BLOCKS blocks (k up to 8192), and for shapes of few
// workgroups (the int8 SwiGLU epilogue's: each reads x, a few KiB, from cache).
const XQ_MAX_BLOCKS: u32 = 256u;
var<workgroup> xq: array<vec4<u32>, 3u * XQ_MAX_BLOCKS>;
const_assert NCOLS == 1u && (GROUPED == 0u || K_LANES * (GROUP_OUTS + 1u) >= LANE_GROUPS_MAX);

// Quantizes x's column col0 into xq: x times the fused RMSNorm's weights, not yet its 1 / rms
// (quantizing by blocks is free of scale: the products take it at the end, x_scale), so that
// no pass over x waits for the row's sum of squares; each invocation adds up its values'
// squares on the way (x_ss). Uniform control flow: it has a barrier.
var<private> x_ss: f32;

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

// The factor the sums over the quantized column take: the fused RMSNorm's 1 / rms. Uniform
// control flow: it has barriers (its reduction goes through gemv_q8.wgsl's `partial`).
fn x_scale(lane: Lane) -> f32 {
    if (!NORM) { return 1.0; }
    return inv_rms_from(x_ss, f32(p.k), lane);
}

// Values 16 half .. 16 half + 15 of the quantized column (m is 0: one column).
fn x_half(m: u32, half: u32) -> XHalf {
    let i = (half / 2u) * 3u;
    let s = bitcast<vec4<f32>>(xq[i + 2u]);
    return XHalf(xq[i + half % 2u], s.x, select(s.y, s.z, half % 2u == 1u));
}
