// Merges the per-split partial results of attention_decode into out[h * head_dim + d], one
// workgroup per query head (and per column of a batched step, the grid's z: every column,
// its short context one split). Needs common/step_one.wgsl or common/step_columns.wgsl.
// Header constants: WG.

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

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let col = select(0u, wid.z, BATCHED);
    let kv_len = col_len(col);
    let h = col * p.n_head + wid.x;
    // Not inlinable by lavapipe: see attention_decode.wgsl.
    let opaque = wid.z == 0xffffffffu;
    let hd = select(p.head_dim, 0u, opaque);
    let n_used = select((kv_len + p.chunk - 1u) / p.chunk, 0u, opaque);
    var gmax = -3.4028235e38;
    for (var s = 0u; s < n_used; s++) { gmax = max(gmax, part[(h * p.n_splits + s) * (hd + 2u) + hd]); }
    var total = 0.0;
    for (var s = 0u; s < n_used; s++) {
        let b = (h * p.n_splits + s) * (hd + 2u);
        total += part[b + hd + 1u] * exp(part[b + hd] - gmax);
    }
    for (var d = lid; d < hd; d += WG) {
        var acc = 0.0;
        for (var s = 0u; s < n_used; s++) {
            let b = (h * p.n_splits + s) * (hd + 2u);
            acc += part[b + d] * exp(part[b + hd] - gmax);
        }
        out[h * hd + d] = acc / total;
    }
}
