// The int8 GEMV's input (gemv_q8.wgsl) as quantize_q8.wgsl wrote it, per 32 values of x:
// quants 0-15, quants 16-31, then (d, sum of x~ 0-15, sum of x~ 16-31, 0).
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;

// Nothing to prepare: the quantize dispatch before the GEMV did.
fn prepare_x(lane: Lane) {}

// The factor the sums take (common/q8_in_local.wgsl's may be the fused RMSNorm's): none here.
fn x_scale(lane: Lane) -> f32 { return 1.0; }

// Values 16 half .. 16 half + 15 of quantized x row m.
fn x_half(m: u32, half: u32) -> XHalf {
    let i = (m * (p.k / 32u) + half / 2u) * 3u;
    let s = bitcast<vec4<f32>>(xq[i + 2u]);
    return XHalf(xq[i + half % 2u], s.x, select(s.y, s.z, half % 2u == 1u));
}
