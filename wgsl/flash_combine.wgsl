// Merges the partial outputs of flash attention whose keys were split among workgroups
// (flash_attention_coop.wgsl with n_split > 1): for each output row, the splits' unnormalized
// outputs weighted by 2^(their max - the largest), over the same weighted sum of their sums.
// One invocation per 4 dimensions of a row.

struct Params {
    rows: u32,     // output rows (tokens x heads)
    d4: u32,       // head dimensions / 4
    n_split: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// [split][row][d4] outputs, then [split][row] (max, sum, 0, 0).
@group(0) @binding(1) var<storage, read> partial: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * WG + gid.x;
    if (i >= p.rows * p.d4) { return; }
    let row = i / p.d4;
    let ml0 = p.n_split * p.rows * p.d4;
    var mx = -3.0e38;
    for (var s = 0u; s < p.n_split; s++) { mx = max(mx, partial[ml0 + s * p.rows + row].x); }
    var sum = 0.0;
    var o = vec4<f32>(0.0);
    for (var s = 0u; s < p.n_split; s++) {
        let ml = partial[ml0 + s * p.rows + row];
        let w = exp2(ml.x - mx);
        sum += w * ml.y;
        o += w * partial[s * p.rows * p.d4 + i];
    }
    out[i] = o / sum;
}
