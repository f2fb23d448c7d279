// The K cache read one value at a time (heads whose rows do not start on a whole vector):
// attention_decode.wgsl's k_row and k_row4.
@group(0) @binding(2) var<storage, read> k_cache: array<KvWord>;

alias KRow = array<f32, PER>;

// Values e0 + PER t .. e0 + PER t + PER - 1 of the cache, those past e0 + hd - 1 read as that one.
fn k_row(e0: u32, t: u32, hd: u32) -> KRow {
    var out: KRow;
    for (var i = 0u; i < PER; i++) {
        let e = e0 + min(t * PER + i, hd - 1u);
        out[i] = kv_get(k_cache[e / KV_PER_WORD], e);
    }
    return out;
}

// Values 4j .. 4j + 3 of a row.
fn k_row4(w: KRow, j: u32) -> vec4<f32> { return vec4<f32>(w[4u * j], w[4u * j + 1u], w[4u * j + 2u], w[4u * j + 3u]); }
