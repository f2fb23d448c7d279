// Embedding lookup: out[t, :] = dequantized row ids[t] of the table, for the rows held by
// this chunk of the table (a table larger than one binding is gathered chunk by chunk).
// One invocation per 8-weight chunk. Header constants: WG. Weights binding:
// common/weights_words.wgsl.

struct Params {
    n_tokens: u32,
    k: u32,          // row length
    row_start: u32,  // first table row in this chunk
    n_rows: u32,     // rows in this chunk
    out_stride: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    let n_chunks = (p.k + 7u) / 8u;
    let t = i / n_chunks;
    let c = i % n_chunks;
    if (t >= p.n_tokens) { return; }
    let id = ids[t];
    if (id < p.row_start || id >= p.row_start + p.n_rows) { return; }
    let ch = decode8(id - p.row_start, c, p.k);
    let lo = chunk_lo(ch);
    let hi = chunk_hi(ch);
    let base = t * p.out_stride + c * 8u;
    for (var j = 0u; j < 4u; j++) {
        if (c * 8u + j < p.k) { out[base + j] = lo[j]; }
        if (c * 8u + 4u + j < p.k) { out[base + 4u + j] = hi[j]; }
    }
}
