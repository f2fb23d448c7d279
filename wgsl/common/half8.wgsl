// Eight halves, one 16-byte load or store: the cooperative GEMM's f16 activations and F16
// weights (common/gemm_x_f16.wgsl, coop_w_*.wgsl) and what to_half.wgsl writes for them.
struct Half8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}

// The eight halves packed in four words, as loaded from f16 data bound as vec4<u32> (one
// 16-byte load: NVIDIA loads a Half8 in two 8-byte loads, a vec4<f16> of four f16 reads in
// four). naga rejects bitcasts from u32 to f16 vectors (gfx-rs/wgpu#4403), so each word's two
// halves go through f32 (exact).
fn halves_of_words(w: vec4<u32>) -> Half8 {
    let lo = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    let hi = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
    return Half8(vec4<f16>(lo), vec4<f16>(hi));
}
