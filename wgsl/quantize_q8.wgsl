// Quantizes a GEMV's input to int8 for gemv_q8.wgsl, as llama.cpp's q8_1, 32 values a block
// (common/q8_block.wgsl). The input goes through the fused RMSNorm or SwiGLU
// (common/gemv_input.wgsl), so the GEMV after it reads only the quantized blocks. One
// invocation per block and column group (NCOLS rows each). Header constants: WG, NCOLS, NORM, GLU.

@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;

var<workgroup> partial: array<f32, NCOLS * LANE_GROUPS_MAX>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    col0 = wid.z * NCOLS;
    let inv = row_inv_rms(lane);
    let n_blocks = p.k / 32u;
    let blk = (wid.x + wid.y * nwg.x) * WG + lane.lid;
    if (blk >= n_blocks) { return; }
    for (var i = 0u; i < NCOLS; i++) {
        let m = col0 + i;
        if (m >= p.n_cols) { break; }
        let xr = m * (p.x_stride / 4u);
        let c = 4u * blk;
        let v0 = load_in(xr, c, 0u, inv[i]);
        let v1 = load_in(xr, c, 1u, inv[i]);
        let v2 = load_in(xr, c + 1u, 0u, inv[i]);
        let v3 = load_in(xr, c + 1u, 1u, inv[i]);
        let v4 = load_in(xr, c + 2u, 0u, inv[i]);
        let v5 = load_in(xr, c + 2u, 1u, inv[i]);
        let v6 = load_in(xr, c + 3u, 0u, inv[i]);
        let v7 = load_in(xr, c + 3u, 1u, inv[i]);
        let q = q8_block(v0, v1, v2, v3, v4, v5, v6, v7);
        let o = (m * n_blocks + blk) * 3u;
        xq[o] = q.lo;
        xq[o + 1u] = q.hi;
        xq[o + 2u] = q.sums;
    }
}
