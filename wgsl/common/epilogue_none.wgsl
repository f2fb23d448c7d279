// store_qkv for matmuls without the QKV epilogue (never called: EPI is a constant).
fn store_qkv(gm: u32, n: u32, a: f32, b: f32) {}
