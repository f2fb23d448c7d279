// Merges the per-split partial results of attention_decode into out[h * head_dim + d], one
// workgroup per query head. Header constants: WG.

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
@group(0) @binding(3) var<storage, read> step: StepState;

struct StepState {
    n_tokens: u32,
    pos0: u32,
    kv_len: u32,
    _pad: u32,
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    // Not inlinable by lavapipe: see attention_decode.wgsl.
    let opaque = wid.z == 0xffffffffu;
    let hd = select(p.head_dim, 0u, opaque);
    let n_used = select((step.kv_len + p.chunk - 1u) / p.chunk, 0u, opaque);
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
