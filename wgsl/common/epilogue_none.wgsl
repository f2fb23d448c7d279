// store_qkv and store_half for matmuls without the QKV or the f16 SwiGLU epilogue (never
// called: EPI is a constant).
fn store_qkv(gm: u32, n: u32, a: f32, b: f32) {}
fn store_half(i: u32, v: f32) {}
