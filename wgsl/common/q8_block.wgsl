// One block of 32 activations quantized as llama.cpp's q8_1, for gemv_q8.wgsl: d = max |x| /
// 127 and q = round(x / d). Shared by quantize_q8.wgsl (a GEMV's input quantized by its own
// dispatch) and the int8 SwiGLU epilogue of gemv_q8.wgsl (EPI_SWIGLU_Q8: the gate/up GEMV
// writes the down projection's input so). A block is three vec4<u32>: quants 0-15, quants
// 16-31, then (d, sum of x~ 0-15, sum of x~ 16-31, 0) as f32 bits, where x~ = d * q: the GEMV
// applies the formats' offsets to these sums (quantize_q8_lanes.wgsl's blocks through the
// RMSNorm hold the block's sum of squares of x in the last slot). Also written by decode attention
// (attention_decode.wgsl, attention_combine.wgsl: Q8_OUT) for the output projection.

struct Q8Block {
    lo: vec4<u32>,
    hi: vec4<u32>,
    sums: vec4<u32>,
}

// Four values times id, rounded to int8 and packed. Adding 1.5 * 2^23 rounds to an integer
// held in the mantissa's low bits, whose low byte is its two's complement (|v * id| <= 127):
// no float-to-int conversion.
fn pack_q8(v: vec4<f32>, id: f32) -> u32 {
    let t = bitcast<vec4<u32>>(fma(v, vec4<f32>(id), vec4<f32>(12582912.0))) & vec4<u32>(0xffu);
    return t.x | (t.y << 8u) | (t.z << 16u) | (t.w << 24u);
}

// The sum of sixteen packed int8 quants.
fn q8_sum(q: vec4<u32>) -> i32 {
    let ones = 0x01010101u;
    return dot4I8Packed(q.x, ones) + dot4I8Packed(q.y, ones) + dot4I8Packed(q.z, ones) + dot4I8Packed(q.w, ones);
}

// The block of values v0 (0-3) .. v7 (28-31).
fn q8_block(v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
            v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>) -> Q8Block {
    let a = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))), max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
    let d = max(max(a.x, a.y), max(a.z, a.w)) / 127.0;
    let id = select(0.0, 1.0 / d, d > 0.0);
    let lo = vec4<u32>(pack_q8(v0, id), pack_q8(v1, id), pack_q8(v2, id), pack_q8(v3, id));
    let hi = vec4<u32>(pack_q8(v4, id), pack_q8(v5, id), pack_q8(v6, id), pack_q8(v7, id));
    let sums = bitcast<vec4<u32>>(vec4<f32>(d, d * f32(q8_sum(lo)), d * f32(q8_sum(hi)), 0.0));
    return Q8Block(lo, hi, sums);
}
