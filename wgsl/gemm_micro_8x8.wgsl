// 8x8 register tile for gemm.wgsl: rows i of the tile in acc_l[i] (columns 0-3) and
// acc_h[i] (columns 4-7). Indices are constants so the tile stays in registers.
var<private> acc_l: array<vec4<f32>, 8>;
var<private> acc_h: array<vec4<f32>, 8>;

fn micro_step(xa: u32, wa: u32) {
    let a0 = xs[xa];
    let a1 = xs[xa + 1u];
    let b0 = ws[wa];
    let b1 = ws[wa + 1u];
    acc_l[0] = fma(vec4<f32>(a0.x), b0, acc_l[0]); acc_h[0] = fma(vec4<f32>(a0.x), b1, acc_h[0]);
    acc_l[1] = fma(vec4<f32>(a0.y), b0, acc_l[1]); acc_h[1] = fma(vec4<f32>(a0.y), b1, acc_h[1]);
    acc_l[2] = fma(vec4<f32>(a0.z), b0, acc_l[2]); acc_h[2] = fma(vec4<f32>(a0.z), b1, acc_h[2]);
    acc_l[3] = fma(vec4<f32>(a0.w), b0, acc_l[3]); acc_h[3] = fma(vec4<f32>(a0.w), b1, acc_h[3]);
    acc_l[4] = fma(vec4<f32>(a1.x), b0, acc_l[4]); acc_h[4] = fma(vec4<f32>(a1.x), b1, acc_h[4]);
    acc_l[5] = fma(vec4<f32>(a1.y), b0, acc_l[5]); acc_h[5] = fma(vec4<f32>(a1.y), b1, acc_h[5]);
    acc_l[6] = fma(vec4<f32>(a1.z), b0, acc_l[6]); acc_h[6] = fma(vec4<f32>(a1.z), b1, acc_h[6]);
    acc_l[7] = fma(vec4<f32>(a1.w), b0, acc_l[7]); acc_h[7] = fma(vec4<f32>(a1.w), b1, acc_h[7]);
}

fn micro_get(i: u32, j: u32) -> f32 {
    if (j < 4u) { return acc_l[i][j]; }
    return acc_h[i][j - 4u];
}
