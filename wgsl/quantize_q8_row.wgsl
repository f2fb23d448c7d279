// A GEMV's input (through the fused RMSNorm or SwiGLU, common/gemv_input.wgsl) quantized to
// int8 blocks for gemv_q8.wgsl, as quantize_q8.wgsl does (the same blocks and layout), by one
// workgroup a column (grid z), every invocation busy: each loads its ROW_VECS vectors of 4
// values at once (consecutive across a subgroup), the RMSNorm's 1 / rms comes from one
// reduction of their squares, then 8 neighbours of a subgroup quantize a block through
// subgroup shuffles (common/q8_lanes8.wgsl). quantize_q8.wgsl instead takes a block an
// invocation, after a pass of its own over the whole row in every workgroup for the RMSNorm.
// Inputs of at most 4 WG ROW_VECS values; subgroups of 8 or more. Header constants: WG,
// ROW_VECS, NCOLS (1), NORM, GLU.

@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;

var<workgroup> partial: array<f32, LANE_GROUPS_MAX>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    col0 = wid.z;
    let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
    let n4 = p.k / 4u;
    let n_blocks = p.k / 32u;
    // The invocation's place within the workgroup, counted along subgroups, so that the 8
    // neighbours of a block are one subgroup's.
    let me = lane.sg_id * (WG / lane.n_sg) + lane.sg_lane;
    var v: array<vec4<f32>, ROW_VECS>;
    var ss = 0.0;
    for (var r = 0u; r < ROW_VECS; r++) {
        let i = r * WG + me;
        v[r] = vec4<f32>(0.0);
        if (i < n4) { v[r] = load_x(xr, i / 2u, i % 2u); }
    }
    for (var r = 0u; r < ROW_VECS; r++) { ss += dot(v[r], v[r]); }
    var inv = 1.0;
    if (NORM) { inv = inv_rms_from(ss, f32(p.k), lane); }
    for (var r = 0u; r < ROW_VECS; r++) {
        let i = r * WG + me;
        let blk = i / 8u;
        let j = i % 8u;
        let b = q8_lanes8(input_of(v[r], xr, i / 2u, i % 2u, inv), j);
        if (i < n4) {
            let o = (col0 * n_blocks + blk) * 3u;
            xq[o + j / 4u][j % 4u] = b.q;
            if (j == 0u) { xq[o + 2u] = bitcast<vec4<u32>>(b.sums); }
        }
    }
}
