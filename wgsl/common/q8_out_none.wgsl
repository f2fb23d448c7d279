// store_q8_block for int8 GEMVs without the int8 SwiGLU epilogue (never called: EPI is a constant).
fn store_q8_block(i: u32, q: Q8Block) {}
