// The weights bound as 16-byte vectors, for kernels that stream whole aligned quant vectors
// (gemv_q8.wgsl: one load instruction per 16 bytes instead of four). Same functions as
// weights_words.wgsl; buffers carry a 64-byte tail, so a word's vector is always in range.
@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;

fn w32(i: u32) -> u32 { return wq[i >> 2u][i & 3u]; }

// Words i and i + 1 (i even): one load of their vector, not two.
fn w64(i: u32) -> vec2<u32> {
    let v = wq[i >> 2u];
    return select(v.xy, v.zw, (i & 2u) != 0u);
}

// Words 4i .. 4i + 3.
fn w128(i: u32) -> vec4<u32> { return wq[i]; }
