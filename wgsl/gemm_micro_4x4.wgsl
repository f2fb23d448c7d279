// 4x4 register tile for gemm.wgsl: rows ty + NTY i (i < 4) by columns 2 (tx + NTX jj) + h
// (jj < 2, h < 2), as named vec4s passed by value (registers on every driver).
struct Acc { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }

// The products over k-quad q of the step (`quad`: gemm.wgsl); the transposition written out
// (gemm_micro_8x8.wgsl says why).
fn micro_step(c: Acc, q: u32, tx: u32, ty: u32) -> Acc {
    let b0 = w_at(q, 2u * tx);
    let b1 = w_at(q, 2u * tx + 1u);
    let b2 = w_at(q, 2u * (tx + NTX));
    let b3 = w_at(q, 2u * (tx + NTX) + 1u);
    let t0 = vec4<f32>(b0.x, b1.x, b2.x, b3.x);
    let t1 = vec4<f32>(b0.y, b1.y, b2.y, b3.y);
    let t2 = vec4<f32>(b0.z, b1.z, b2.z, b3.z);
    let t3 = vec4<f32>(b0.w, b1.w, b2.w, b3.w);
    var o: Acc;
    o.r0 = quad(c.r0, x_at(q, ty), t0, t1, t2, t3);
    o.r1 = quad(c.r1, x_at(q, ty + NTY), t0, t1, t2, t3);
    o.r2 = quad(c.r2, x_at(q, ty + 2u * NTY), t0, t1, t2, t3);
    o.r3 = quad(c.r3, x_at(q, ty + 3u * NTY), t0, t1, t2, t3);
    return o;
}

// Row i's column j (0-3, in the order above).
fn micro_get(c: Acc, i: u32, j: u32) -> f32 {
    var r: vec4<f32>;
    switch i {
        case 0u: { r = c.r0; }
        case 1u: { r = c.r1; }
        case 2u: { r = c.r2; }
        case 3u: { r = c.r3; }
        default: { r = vec4<f32>(0.0); }
    }
    return r[j];
}
