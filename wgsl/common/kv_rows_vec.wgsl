// The K cache read as whole vectors (heads of a multiple of 8 dimensions, so every head's row
// starts on one): attention_decode.wgsl's k_row32.
@group(0) @binding(2) var<storage, read> k_cache: array<KvVec>;

// Values e0 + 32t .. e0 + 32t + 31 of the cache, those past e0 + hd - 1 read as that one.
fn k_row32(e0: u32, t: u32, hd: u32) -> array<f32, 32> {
    let vb = e0 / KV_PER_VEC;
    let last = hd / KV_PER_VEC - 1u;
    var w: array<KvVec, 32u / KV_PER_VEC>;
    for (var r = 0u; r < 32u / KV_PER_VEC; r++) { w[r] = k_cache[vb + min(t * (32u / KV_PER_VEC) + r, last)]; }
    var out: array<f32, 32>;
    for (var i = 0u; i < 32u; i++) { out[i] = kv_vec_get(w[i / KV_PER_VEC], i % KV_PER_VEC); }
    return out;
}
