// 8x8 register tile for gemm.wgsl, as named vec4s (columns 0-3 in l, 4-7 in h of each
// row) passed by value: constant field names keep it in registers on every driver.
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

fn micro_step(c: Acc, xa: u32, wa: u32) -> Acc {
    let a0 = xs[xa];
    let a1 = xs[xa + 1u];
    let b0 = ws[wa];
    let b1 = ws[wa + 1u];
    var o = c;
    o.r0l = fma(vec4<f32>(a0.x), b0, c.r0l); o.r0h = fma(vec4<f32>(a0.x), b1, c.r0h);
    o.r1l = fma(vec4<f32>(a0.y), b0, c.r1l); o.r1h = fma(vec4<f32>(a0.y), b1, c.r1h);
    o.r2l = fma(vec4<f32>(a0.z), b0, c.r2l); o.r2h = fma(vec4<f32>(a0.z), b1, c.r2h);
    o.r3l = fma(vec4<f32>(a0.w), b0, c.r3l); o.r3h = fma(vec4<f32>(a0.w), b1, c.r3h);
    o.r4l = fma(vec4<f32>(a1.x), b0, c.r4l); o.r4h = fma(vec4<f32>(a1.x), b1, c.r4h);
    o.r5l = fma(vec4<f32>(a1.y), b0, c.r5l); o.r5h = fma(vec4<f32>(a1.y), b1, c.r5h);
    o.r6l = fma(vec4<f32>(a1.z), b0, c.r6l); o.r6h = fma(vec4<f32>(a1.z), b1, c.r6h);
    o.r7l = fma(vec4<f32>(a1.w), b0, c.r7l); o.r7h = fma(vec4<f32>(a1.w), b1, c.r7h);
    return o;
}

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
