// KV cache of halves packed two per u32 (the same bytes as kv_f16_native, for adapters
// without SHADER_F16). Conversions are done with integer ops: the pack/unpack intrinsics
// need a capability not every backend offers.
alias KvWord = u32;
const KV_PER_WORD: u32 = 2u;

fn kv_half_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) { return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604644775390625e-8)); }
    if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 to IEEE half bits, rounding to nearest even.
fn kv_f32_to_half(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) { return sign | 0x7e00u; }
    let e = i32(ax >> 23u) - 112;
    if (e >= 31) { return sign | 0x7c00u; }
    if (e <= 0) {
        if (e < -10) { return sign; }
        let m = (ax & 0x7fffffu) | 0x800000u;
        let shift = u32(14 - e);
        var h = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u) == 1u)) { h += 1u; }
        return sign | h;
    }
    var h = (u32(e) << 10u) | ((ax >> 13u) & 0x3ffu);
    let rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) { h += 1u; }
    return sign | h;
}

fn kv_get(w: KvWord, i: u32) -> f32 { return kv_half_to_f32((w >> ((i & 1u) * 16u)) & 0xffffu); }
fn kv_pair_words(a: f32, b: f32) -> array<KvWord, 2> {
    return array<KvWord, 2>(kv_f32_to_half(a) | (kv_f32_to_half(b) << 16u), 0u);
}
// Eight halves at once, for kernels that read whole rows (attention_decode.wgsl binds the
// cache as KvVec; rows of a multiple of 8 values start on one).
alias KvVec = vec4<u32>;
const KV_PER_VEC: u32 = 8u;
fn kv_vec_get(v: KvVec, e: u32) -> f32 { return kv_half_to_f32((v[e / 2u] >> ((e % 2u) * 16u)) & 0xffffu); }
