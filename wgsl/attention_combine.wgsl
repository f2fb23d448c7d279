// Merges the per-split partial results of attention_decode into out[h * head_dim + d], one
// workgroup per query head (and per column of a batched step, the grid's z: every column,
// its short context one split). Needs common/step_one.wgsl or common/step_columns.wgsl.
// The splits are spread over the workgroup: invocation (split group, dimension) adds up every
// groups-th split of its dimension, so the partials' loads are in flight together rather
// than one split after another. Header constants: WG (a power of two, at least the largest
// head dim).

struct Params {
    head_dim: u32,
    n_head: u32,
    group: u32,
    kv_len: u32,     // unused: the step state's
    kv_stride: u32,
    n_splits: u32,
    q_stride: u32,
    scale: f32,
    chunk: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> step: Step;

// (maximum, sum) pairs, then the split groups' partial outputs.
var<workgroup> red_m: array<f32, WG>;
var<workgroup> red_s: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let col = select(0u, wid.z, BATCHED);
    let kv_len = col_len(col);
    let h = col * p.n_head + wid.x;
    // Not inlinable by lavapipe: see attention_decode.wgsl.
    let opaque = wid.z == 0xffffffffu;
    let hd = select(p.head_dim, 0u, opaque);
    let n_used = select((kv_len + p.chunk - 1u) / p.chunk, 0u, opaque);
    let stride = hd + 2u;
    let base = h * p.n_splits * stride;

    // The global maximum and the sum of exp(split max - global max) * split sum, as
    // (max, sum) pairs merged over the workgroup.
    var m = -3.4028235e38;
    var s = 0.0;
    for (var i = lid; i < n_used; i += WG) {
        let mi = part[base + i * stride + hd];
        let si = part[base + i * stride + hd + 1u];
        let mn = max(m, mi);
        s = s * exp(m - mn) + si * exp(mi - mn);
        m = mn;
    }
    red_m[lid] = m;
    red_s[lid] = s;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w >>= 1u) {
        if (lid < w) {
            let m2 = red_m[lid + w];
            let mn = max(m, m2);
            s = s * exp(m - mn) + red_s[lid + w] * exp(m2 - mn);
            m = mn;
            red_m[lid] = m;
            red_s[lid] = s;
        }
        workgroupBarrier();
    }
    let gmax = red_m[0];
    let total = red_s[0];
    workgroupBarrier();

    // Invocation (split group sg, dimension d) over splits sg, sg + groups, ...
    let groups = WG / max(hd, 1u);
    let sg = lid / max(hd, 1u);
    let d = lid % max(hd, 1u);
    var acc = 0.0;
    if (sg < groups) {
        for (var i = sg; i < n_used; i += groups) {
            let b = base + i * stride;
            acc += part[b + d] * exp(part[b + hd] - gmax);
        }
    }
    red_m[lid] = acc;
    workgroupBarrier();
    if (lid < hd) {
        var o = 0.0;
        for (var g = 0u; g < groups; g++) { o += red_m[g * hd + lid]; }
        out[h * hd + lid] = o / total;
    }
}
