// A chunk as halves for the cooperative GEMM (gemm_coop.wgsl): decoded (the format file's
// unpack8), then rounded to f16.
fn unpack8h(r: Raw8) -> array<vec4<f16>, 2> {
    let ch = unpack8(r);
    return array<vec4<f16>, 2>(vec4<f16>(chunk_lo(ch)), vec4<f16>(chunk_hi(ch)));
}
