// store_q8_block for int8 GEMVs without the int8 SwiGLU epilogue (never called: EPI is a constant).
fn store_q8_block(i: u32, q: Q8Block) {}
// The next RMSNorm's weight at row n for EPI_ADD_Q8_NORM (never called either).
fn q8_out_weight(n: u32) -> f32 { return 1.0; }
