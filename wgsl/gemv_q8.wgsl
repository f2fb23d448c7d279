// GEMV over int8 activations, for the quantized weight formats: Y[m, n] = sum_k W[n, k] X[m, k].
// Each 32-value block of x is quantized to int8 (d = max |x| / 127, as llama.cpp's q8_1), so
// that quantized weights multiply with packed 4x8-bit integer dot products (dot4I8Packed: one
// DP4A instruction where the driver offers integer dot products, as Vulkan 1.3 drivers do)
// instead of being converted to floats one by one, which is what bounds the float GEMV of
// K-quants. The result is exactly sum(w * x~) for the rounded activations x~, which differ
// from x by at most d / 2. No extra dispatch: each invocation quantizes the x blocks it
// multiplies, once for all ROWS rows.
// The format file supplies DOT_BLOCKS (x blocks per unit, 1 or 2), dot_unit_count,
// dot_unit_block (units cover the blocks in order, DOT_BLOCKS at a time), dot_header and
// dot_block; bindings, fused inputs (RMSNorm, SwiGLU) and the final reduction are
// common/gemv_io.wgsl's, as in gemv.wgsl.

// Four values times id, rounded to int8 and packed. Adding 1.5 * 2^23 rounds to an integer
// held in the mantissa's low bits, whose low byte is its two's complement (|v * id| <= 127):
// no float-to-int conversion, which runs at a quarter of the FMA rate.
fn pack_q8(v: vec4<f32>, id: f32) -> u32 {
    let t = bitcast<vec4<u32>>(fma(v, vec4<f32>(id), vec4<f32>(12582912.0))) & vec4<u32>(0xffu);
    return t.x | (t.y << 8u) | (t.z << 16u) | (t.w << 24u);
}

// x values 32 blk .. 32 blk + 31 of the row at xr (in vec4s), through the fused inputs, quantized.
// Its sum is d * sum(q), so that the GEMV computes exactly sum(w * x~) for the rounded x~.
fn quantize_block(xr: u32, blk: u32, inv_rms: f32) -> Q8Block {
    let c = 4u * blk;
    let v0 = load_in(xr, c, 0u, inv_rms);
    let v1 = load_in(xr, c, 1u, inv_rms);
    let v2 = load_in(xr, c + 1u, 0u, inv_rms);
    let v3 = load_in(xr, c + 1u, 1u, inv_rms);
    let v4 = load_in(xr, c + 2u, 0u, inv_rms);
    let v5 = load_in(xr, c + 2u, 1u, inv_rms);
    let v6 = load_in(xr, c + 3u, 0u, inv_rms);
    let v7 = load_in(xr, c + 3u, 1u, inv_rms);
    let a = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))), max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
    let d = max(max(a.x, a.y), max(a.z, a.w)) / 127.0;
    let id = select(0.0, 1.0 / d, d > 0.0);
    let lo = vec4<u32>(pack_q8(v0, id), pack_q8(v1, id), pack_q8(v2, id), pack_q8(v3, id));
    let hi = vec4<u32>(pack_q8(v4, id), pack_q8(v5, id), pack_q8(v6, id), pack_q8(v7, id));
    let ones = 0x01010101u;
    let q_sum = dot4I8Packed(lo.x, ones) + dot4I8Packed(lo.y, ones) + dot4I8Packed(lo.z, ones) + dot4I8Packed(lo.w, ones)
        + dot4I8Packed(hi.x, ones) + dot4I8Packed(hi.y, ones) + dot4I8Packed(hi.z, ones) + dot4I8Packed(hi.w, ones);
    return Q8Block(lo, hi, d, d * f32(q_sum));
}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }
    let inv = row_inv_rms(lane);

    // Consecutive invocations take consecutive units of the row, so weight reads coalesce;
    // a unit's x blocks are quantized once for all ROWS rows. (Staging x in workgroup memory
    // instead, loaded in whole cache lines, was half as fast on an H200: its barriers and
    // lower occupancy cost more than the strided x reads it saves.)
    let n_units = dot_unit_count(p.k);
    for (var u = lane.lid; u < n_units; u += WG) {
        var xa: array<Q8Block, NCOLS>;
        var xb: array<Q8Block, NCOLS>;
        for (var m = 0u; m < NCOLS; m++) {
            let xr = min(m, p.n_cols - 1u) * (p.x_stride / 4u);
            xa[m] = quantize_block(xr, dot_unit_block(u, 0u), inv[m]);
            if (DOT_BLOCKS == 2u) {
                xb[m] = quantize_block(xr, dot_unit_block(u, 1u), inv[m]);
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < p.n_rows) {
                let h = dot_header(row, u, p.k);
                for (var m = 0u; m < NCOLS; m++) {
                    var s = dot_block(h, 0u, xa[m]);
                    if (DOT_BLOCKS == 2u) { s += dot_block(h, 1u, xb[m]); }
                    acc[r * NCOLS + m] += s;
                }
            }
        }
    }
    write_rows(acc, row0, lane);
}
