// Row softmax of attention scores in place, with the causal mask: in row i (query at
// position pos0 + i) only columns j <= pos0 + i are visible. One workgroup per row.
// Header constants: WG.

struct Params {
    n_cols: u32,     // visible context length (kv_len)
    row_stride: u32,
    m: u32,          // query rows per head
    pos0: u32,       // position of query row 0
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> s: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let base = row * p.row_stride;
    let last = min(p.pos0 + row % p.m + 1u, p.n_cols);
    var mx = -3.4028235e38;
    for (var j = lane.lid; j < last; j += WG) { mx = max(mx, s[base + j]); }
    mx = wg_max(mx, lane);
    var sum = 0.0;
    for (var j = lane.lid; j < last; j += WG) {
        let e = exp(s[base + j] - mx);
        s[base + j] = e;
        sum += e;
    }
    sum = wg_sum(sum, lane);
    let inv = 1.0 / sum;
    for (var j = lane.lid; j < p.n_cols; j += WG) {
        s[base + j] = select(0.0, s[base + j] * inv, j < last);
    }
}
