// A block-format weight matrix decoded to f16 once per prefill step (`Caps::dequant_f16_from`):
// the GEMMs after it read the copy as F16 weights (gemm_coop.wgsl with common/coop_w_half.wgsl),
// whose loaders then only move 16-byte chunks, where decoding every chunk in each tile's loaders
// ran the K-quant GEMMs at 0.7-0.8 of the F16 one's rate. Rows of p.k weights (k % 8 == 0) in
// p.n_rows rows, eight at a time (chunk i of the matrix, row-major) through the format file's
// fetch8 and unpack8, rounded to f16 as the cooperative GEMM's loaders round them
// (common/chunk_half8.wgsl): the same halves either way.
// PER chunks an invocation, WG apart, so that each load and store of a subgroup is contiguous;
// workgroups whose chunks all lie inside the matrix load them all before decoding any (no
// load behind a bounds check). Parameters: common/matmul_params.wgsl; Half8:
// common/half8.wgsl; chunk_halves: common/chunk_half8.wgsl. Header constants: WG, PER (1 or 4).

@group(0) @binding(3) var<storage, read_write> wh: array<Half8>;

// Chunk i's weights as loaded.
fn fetch_chunk(i: u32) -> Raw8 {
    let per_row = p.k / 8u;
    return fetch8(i / per_row, i % per_row, p.k);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let total = p.n_rows * (p.k / 8u);
    let first = (wid.x + wid.y * nwg.x) * (WG * PER);
    let i0 = first + lid;
    if (PER == 4u && first + WG * 4u <= total) {
        let r0 = fetch_chunk(i0);
        let r1 = fetch_chunk(i0 + WG);
        let r2 = fetch_chunk(i0 + 2u * WG);
        let r3 = fetch_chunk(i0 + 3u * WG);
        wh[i0] = chunk_halves(unpack8(r0));
        wh[i0 + WG] = chunk_halves(unpack8(r1));
        wh[i0 + 2u * WG] = chunk_halves(unpack8(r2));
        wh[i0 + 3u * WG] = chunk_halves(unpack8(r3));
        return;
    }
    for (var j = 0u; j < PER; j++) {
        let i = i0 + j * WG;
        if (i < total) { wh[i] = chunk_halves(unpack8(fetch_chunk(i))); }
    }
}
