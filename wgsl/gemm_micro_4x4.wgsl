// 4x4 register tile for gemm.wgsl: row i of the tile in acc_l[i]. Constant indices keep it
// in registers.
var<private> acc_l: array<vec4<f32>, 4>;

fn micro_step(xa: u32, wa: u32) {
    let a0 = xs[xa];
    let b0 = ws[wa];
    acc_l[0] = fma(vec4<f32>(a0.x), b0, acc_l[0]);
    acc_l[1] = fma(vec4<f32>(a0.y), b0, acc_l[1]);
    acc_l[2] = fma(vec4<f32>(a0.z), b0, acc_l[2]);
    acc_l[3] = fma(vec4<f32>(a0.w), b0, acc_l[3]);
}

fn micro_get(i: u32, j: u32) -> f32 {
    return acc_l[i][j];
}
