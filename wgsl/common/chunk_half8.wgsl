// A decoded chunk (the format file's unpack8) rounded to f16: how the cooperative GEMM's
// loaders store block-format weights (common/coop_w_decode.wgsl) and how the f16 weight copy
// is written (dequant_f16.wgsl), so a GEMM over the copy multiplies the same halves.
fn chunk_halves(ch: Chunk8) -> Half8 {
    return Half8(vec4<f16>(chunk_lo(ch)), vec4<f16>(chunk_hi(ch)));
}
