// Scoring: the negative log-likelihood of each row's target token under the softmax of the
// row's logits, nll = log(sum_j exp(x_j)) - x_target, computed as max + log(sum_j
// exp(x_j - max)) - x_target so that no exp overflows. Rows row0 .. row0 + n_rows of the
// logits are scored; row row0 + i writes nll[out0 + i]. One workgroup per row.
// Header constants: WG.

struct Params {
    n: u32,       // vocabulary size: values per row
    stride: u32,  // floats from one row of logits to the next
    row0: u32,    // first row scored (also indexes targets)
    n_rows: u32,
    out0: u32,    // where row0's result goes in nll
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> nll: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = wid.x + wid.y * nwg.x;
    // The grid can overshoot when it is folded into two dimensions (same for the whole
    // workgroup, so the barriers below stay in uniform control flow).
    if (i >= p.n_rows) { return; }
    let row = p.row0 + i;
    let base = row * p.stride;
    var mx = -3.4028235e38;
    for (var j = lane.lid; j < p.n; j += WG) { mx = max(mx, logits[base + j]); }
    mx = wg_max(mx, lane);
    var sum = 0.0;
    for (var j = lane.lid; j < p.n; j += WG) { sum += exp(logits[base + j] - mx); }
    sum = wg_sum(sum, lane);
    if (lane.lid == 0u) {
        // The host checks targets against the vocabulary; min() only keeps the read in the row.
        let t = min(targets[row], p.n - 1u);
        nll[p.out0 + i] = mx + log(sum) - logits[base + t];
    }
}
