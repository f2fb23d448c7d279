// The int8 GEMV's input (gemv_q8.wgsl) quantized by each workgroup itself from the float x
// (binding 2, common/gemv_input.wgsl), through the fused RMSNorm (NORM), into workgroup
// memory in quantize_q8.wgsl's layout: the GEMV needs no quantize dispatch before it. For
// one column (NCOLS 1) of at most XQ_MAX_BLOCKS blocks (k up to 8192), and for shapes of few
// workgroups (the int8 SwiGLU epilogue's: each reads x, a few KiB, from cache).
const XQ_MAX_BLOCKS: u32 = 256u;
var<workgroup> xq: array<vec4<u32>, 3u * XQ_MAX_BLOCKS>;
// row_inv_rms's reduction goes through gemv_q8.wgsl's `partial`.
const_assert NCOLS == 1u && (GROUPED == 0u || K_LANES * (GROUP_OUTS + 1u) >= LANE_GROUPS_MAX);

// Quantizes x's column col0 into xq. Uniform control flow: it has barriers.
fn prepare_x(lane: Lane) {
    let inv = row_inv_rms(lane)[0];
    let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
    for (var blk = lane.lid; blk < p.k / 32u; blk += WG) {
        let c = 4u * blk;
        let q = q8_block(load_in(xr, c, 0u, inv), load_in(xr, c, 1u, inv), load_in(xr, c + 1u, 0u, inv),
                         load_in(xr, c + 1u, 1u, inv), load_in(xr, c + 2u, 0u, inv), load_in(xr, c + 2u, 1u, inv),
                         load_in(xr, c + 3u, 0u, inv), load_in(xr, c + 3u, 1u, inv));
        xq[3u * blk] = q.lo;
        xq[3u * blk + 1u] = q.hi;
        xq[3u * blk + 2u] = q.sums;
    }
    workgroupBarrier();
}

// Values 16 half .. 16 half + 15 of the quantized column (m is 0: one column).
fn x_half(m: u32, half: u32) -> XHalf {
    let i = (half / 2u) * 3u;
    let s = bitcast<vec4<f32>>(xq[i + 2u]);
    return XHalf(xq[i + half % 2u], s.x, select(s.y, s.z, half % 2u == 1u));
}
