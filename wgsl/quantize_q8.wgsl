// Quantizes a GEMV's input to int8 for gemv_q8.wgsl, as llama.cpp's q8_1: per 32 values,
// d = max |x| / 127 and q = round(x / d). The input goes through the fused RMSNorm or SwiGLU
// (common/gemv_input.wgsl), so the GEMV after it reads only the quantized blocks. One
// invocation per block and column group (NCOLS rows each). Header constants: WG, NCOLS, NORM, GLU.
// Output, per block: quants 0-15, quants 16-31, then (d, sum of x~ 0-15, sum of x~ 16-31, 0)
// as f32 bits, where x~ = d * q: the GEMV applies the formats' offsets to these sums.

@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;

var<workgroup> partial: array<f32, NCOLS * LANE_GROUPS_MAX>;

// Four values times id, rounded to int8 and packed. Adding 1.5 * 2^23 rounds to an integer
// held in the mantissa's low bits, whose low byte is its two's complement (|v * id| <= 127):
// no float-to-int conversion.
fn pack_q8(v: vec4<f32>, id: f32) -> u32 {
    let t = bitcast<vec4<u32>>(fma(v, vec4<f32>(id), vec4<f32>(12582912.0))) & vec4<u32>(0xffu);
    return t.x | (t.y << 8u) | (t.z << 16u) | (t.w << 24u);
}

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
        let a = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))), max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
        let d = max(max(a.x, a.y), max(a.z, a.w)) / 127.0;
        let id = select(0.0, 1.0 / d, d > 0.0);
        let lo = vec4<u32>(pack_q8(v0, id), pack_q8(v1, id), pack_q8(v2, id), pack_q8(v3, id));
        let hi = vec4<u32>(pack_q8(v4, id), pack_q8(v5, id), pack_q8(v6, id), pack_q8(v7, id));
        let ones = vec4<u32>(0x01010101u);
        let o = (m * n_blocks + blk) * 3u;
        xq[o] = lo;
        xq[o + 1u] = hi;
        xq[o + 2u] = bitcast<vec4<u32>>(vec4<f32>(d, d * f32(dot4x4(lo, ones)), d * f32(dot4x4(hi, ones)), 0.0));
    }
}
