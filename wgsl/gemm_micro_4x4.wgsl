// 4x4 register tile for gemm.wgsl, as named vec4s passed by value (registers on every driver).
struct Acc { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }

fn micro_step(c: Acc, xa: u32, wa: u32) -> Acc {
    let a0 = xs[xa];
    let b0 = ws[wa];
    var o = c;
    o.r0 = fma(vec4<f32>(a0.x), b0, c.r0);
    o.r1 = fma(vec4<f32>(a0.y), b0, c.r1);
    o.r2 = fma(vec4<f32>(a0.z), b0, c.r2);
    o.r3 = fma(vec4<f32>(a0.w), b0, c.r3);
    return o;
}

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
