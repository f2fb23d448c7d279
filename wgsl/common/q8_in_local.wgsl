// The int8 GEMV's input (gemv_q8.wgsl) quantized by each workgroup itself from the float x
// (binding 2, common/gemv_input.wgsl), through the fused RMSNorm (NORM), into workgroup
// memory in quantize_q8.wgsl's layout: the GEMV needs no quantize dispatch before it. For
// one column (NCOLS 1) of at most XQ_MAX_BLOCKS blocks (k up to 8192), and for shapes of few
// workgroups (the int8 SwiGLU epilogue's: each reads x, a few KiB, from cache).
const XQ_MAX_BLOCKS: u32 = 256u;
var<workgroup> xq: array<vec4<u32>, 3u * XQ_MAX_BLOCKS>;
const_assert NCOLS == 1u && (GROUPED == 0u || K_LANES * (GROUP_OUTS + 1u) >= LANE_GROUPS_MAX);

// x's column col0 is quantized into xq by prepare_x (common/q8_prepare_subgroups.wgsl, or
// without subgroups common/q8_prepare_lanes.wgsl): x times the fused RMSNorm's weights, not
// yet its 1 / rms (quantizing by blocks is free of scale: the products take it at the end,
// x_scale), so that no pass over x waits for the row's sum of squares; each invocation adds
// up its values' squares on the way (x_ss).
var<private> x_ss: f32;

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
