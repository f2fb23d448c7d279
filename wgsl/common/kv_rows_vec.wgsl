// The K cache read as whole vectors (heads of a multiple of 8 dimensions, so every head's row
// starts on one): attention_decode.wgsl's k_row and k_row4. The values stay as loaded
// (halves, two to a register) until they are used.
@group(0) @binding(2) var<storage, read> k_cache: array<KvVec>;

alias KRow = array<KvVec, PER / KV_PER_VEC>;

// Values e0 + PER t .. e0 + PER t + PER - 1 of the cache, those past e0 + hd - 1 read as that one.
fn k_row(e0: u32, t: u32, hd: u32) -> KRow {
    let vb = e0 / KV_PER_VEC;
    let last = hd / KV_PER_VEC - 1u;
    var w: KRow;
    for (var r = 0u; r < PER / KV_PER_VEC; r++) { w[r] = k_cache[vb + min(t * (PER / KV_PER_VEC) + r, last)]; }
    return w;
}

// Values 4j .. 4j + 3 of a row.
fn k_row4(w: KRow, j: u32) -> vec4<f32> {
    let v = w[(4u * j) / KV_PER_VEC];
    let e = (4u * j) % KV_PER_VEC;
    return vec4<f32>(kv_vec_get(v, e), kv_vec_get(v, e + 1u), kv_vec_get(v, e + 2u), kv_vec_get(v, e + 3u));
}
