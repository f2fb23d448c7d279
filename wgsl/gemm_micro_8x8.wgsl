// 8x8 register tile for gemm.wgsl: rows ty + NTY i (i < 8) by columns 2 (tx + NTX jj) + h
// (jj < 4, h < 2), as named vec4s (row i's columns 0-3 in ril, 4-7 in rih, in that order)
// passed by value: constant field names keep it in registers on every driver.
struct Acc {
    r0l: vec4<f32>, r0h: vec4<f32>,
    r1l: vec4<f32>, r1h: vec4<f32>,
    r2l: vec4<f32>, r2h: vec4<f32>,
    r3l: vec4<f32>, r3h: vec4<f32>,
    r4l: vec4<f32>, r4h: vec4<f32>,
    r5l: vec4<f32>, r5h: vec4<f32>,
    r6l: vec4<f32>, r6h: vec4<f32>,
    r7l: vec4<f32>, r7h: vec4<f32>,
}

// The products over k-quad q of the step (`quad`: gemm.wgsl). The weights' 4x4 transpositions
// are written out: as a transposed mat4x4 built by one helper, NVIDIA's compiler made the
// kernel up to 5% slower (H200, run 492).
fn micro_step(c: Acc, q: u32, tx: u32, ty: u32) -> Acc {
    let b0 = w_at(q, 2u * tx);
    let b1 = w_at(q, 2u * tx + 1u);
    let b2 = w_at(q, 2u * (tx + NTX));
    let b3 = w_at(q, 2u * (tx + NTX) + 1u);
    let b4 = w_at(q, 2u * (tx + 2u * NTX));
    let b5 = w_at(q, 2u * (tx + 2u * NTX) + 1u);
    let b6 = w_at(q, 2u * (tx + 3u * NTX));
    let b7 = w_at(q, 2u * (tx + 3u * NTX) + 1u);
    let l0 = vec4<f32>(b0.x, b1.x, b2.x, b3.x);
    let l1 = vec4<f32>(b0.y, b1.y, b2.y, b3.y);
    let l2 = vec4<f32>(b0.z, b1.z, b2.z, b3.z);
    let l3 = vec4<f32>(b0.w, b1.w, b2.w, b3.w);
    let h0 = vec4<f32>(b4.x, b5.x, b6.x, b7.x);
    let h1 = vec4<f32>(b4.y, b5.y, b6.y, b7.y);
    let h2 = vec4<f32>(b4.z, b5.z, b6.z, b7.z);
    let h3 = vec4<f32>(b4.w, b5.w, b6.w, b7.w);
    var o: Acc;
    let a0 = x_at(q, ty);
    o.r0l = quad(c.r0l, a0, l0, l1, l2, l3); o.r0h = quad(c.r0h, a0, h0, h1, h2, h3);
    let a1 = x_at(q, ty + NTY);
    o.r1l = quad(c.r1l, a1, l0, l1, l2, l3); o.r1h = quad(c.r1h, a1, h0, h1, h2, h3);
    let a2 = x_at(q, ty + 2u * NTY);
    o.r2l = quad(c.r2l, a2, l0, l1, l2, l3); o.r2h = quad(c.r2h, a2, h0, h1, h2, h3);
    let a3 = x_at(q, ty + 3u * NTY);
    o.r3l = quad(c.r3l, a3, l0, l1, l2, l3); o.r3h = quad(c.r3h, a3, h0, h1, h2, h3);
    let a4 = x_at(q, ty + 4u * NTY);
    o.r4l = quad(c.r4l, a4, l0, l1, l2, l3); o.r4h = quad(c.r4h, a4, h0, h1, h2, h3);
    let a5 = x_at(q, ty + 5u * NTY);
    o.r5l = quad(c.r5l, a5, l0, l1, l2, l3); o.r5h = quad(c.r5h, a5, h0, h1, h2, h3);
    let a6 = x_at(q, ty + 6u * NTY);
    o.r6l = quad(c.r6l, a6, l0, l1, l2, l3); o.r6h = quad(c.r6h, a6, h0, h1, h2, h3);
    let a7 = x_at(q, ty + 7u * NTY);
    o.r7l = quad(c.r7l, a7, l0, l1, l2, l3); o.r7h = quad(c.r7h, a7, h0, h1, h2, h3);
    return o;
}

// Row i's column j (0-7, in the order above).
fn micro_get(c: Acc, i: u32, j: u32) -> f32 {
    var r: vec4<f32>;
    switch i {
        case 0u: { r = select(c.r0l, c.r0h, j >= 4u); }
        case 1u: { r = select(c.r1l, c.r1h, j >= 4u); }
        case 2u: { r = select(c.r2l, c.r2h, j >= 4u); }
        case 3u: { r = select(c.r3l, c.r3h, j >= 4u); }
        case 4u: { r = select(c.r4l, c.r4h, j >= 4u); }
        case 5u: { r = select(c.r5l, c.r5h, j >= 4u); }
        case 6u: { r = select(c.r6l, c.r6h, j >= 4u); }
        case 7u: { r = select(c.r7l, c.r7h, j >= 4u); }
        default: { r = vec4<f32>(0.0); }
    }
    return r[j % 4u];
}
