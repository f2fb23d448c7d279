// Greedy sampling: ids[r] = index of the largest value of row r (the lowest index on ties,
// as numpy and llama.cpp pick). One workgroup per row. Header constants: WG.

struct Params {
    n: u32,
    stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x;
    let base = row * p.stride;
    var best = -3.4028235e38;
    var best_i = 0xffffffffu;
    for (var i = lane.lid; i < p.n; i += WG) {
        let v = logits[base + i];
        if (v > best || best_i == 0xffffffffu) {
            best = v;
            best_i = i;
        }
    }
    let m = wg_max(best, lane);
    let cand = select(0xffffffffu, best_i, best == m);
    let idx = wg_min_u32(cand, lane);
    if (lane.lid == 0u) { ids[row] = idx; }
}
