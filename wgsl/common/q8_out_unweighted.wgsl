// q8_out_weight for the int8 SwiGLU epilogue (EPI_SWIGLU_Q8), whose blocks are not scaled by
// a norm's weights (never called: EPI is a constant).
fn q8_out_weight(n: u32) -> f32 { return 1.0; }
