// The int8 GEMV's input (gemv_q8.wgsl) as quantize_q8.wgsl or quantize_q8_lanes.wgsl wrote
// it, per 32 values of x: quants 0-15, quants 16-31, then (d, sum of x~ 0-15, sum of x~ 16-31,
// the block's sum of squares of x) as f32 bits. NORM (one column): the blocks are x times the
// RMSNorm's weights without its 1 / rms (quantize_q8_lanes.wgsl), which the sums take at the
// end from the blocks' sums of squares.
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;
const_assert !NORM || (NCOLS == 1u && (GROUPED == 0u || K_LANES * (GROUP_OUTS + 1u) >= LANE_GROUPS_MAX));

// NORM: this invocation's share of the column's sum of squares, loaded before the products so
// that its latency hides behind theirs.
var<private> x_ss: f32;

fn prepare_x(lane: Lane) {
    if (!NORM) { return; }
    let n_blocks = p.k / 32u;
    let first = min(col0, p.n_cols - 1u) * n_blocks;
    var ss = 0.0;
    for (var b = lane.lid; b < n_blocks; b += WG) { ss += bitcast<f32>(xq[(first + b) * 3u + 2u].w); }
    x_ss = ss;
}

// The factor the sums take: NORM's 1 / rms, else none. Uniform control flow (barriers).
fn x_scale(lane: Lane) -> f32 {
    if (!NORM) { return 1.0; }
    return inv_rms_from(x_ss, f32(p.k), lane);
}

// Values 16 half .. 16 half + 15 of quantized x row m.
fn x_half(m: u32, half: u32) -> XHalf {
    let i = (m * (p.k / 32u) + half / 2u) * 3u;
    let s = bitcast<vec4<f32>>(xq[i + 2u]);
    return XHalf(xq[i + half % 2u], s.x, select(s.y, s.z, half % 2u == 1u));
}
