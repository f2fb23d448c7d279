// Merges the per-split partial results of attention_decode into out[h * head_dim + d], one
// workgroup per query head (and per column of a batched step, the grid's z: every column,
// its short context one split). Needs common/step_one.wgsl or common/step_columns.wgsl and a
// reduce file (common/reduce_*.wgsl). The splits' maxima meet in one batched reduction; then
// invocation (split group, dimension) adds up every groups-th split of its dimension, four
// splits' loads in flight at a time. With Q8_OUT, the output is also written as the output
// projection's int8 input (blocks of 32 dimensions, common/q8_block.wgsl; heads of a multiple
// of 32). Header constants: WG (a power of two, at least the largest head dim), Q8_OUT.

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
// With Q8_OUT: the output as int8 blocks [columns, n_head * head_dim / 32].
@group(0) @binding(4) var<storage, read_write> xq_out: array<vec4<u32>>;

// Each lane group's maximum; then the split groups' weighted values [group][dimension].
var<workgroup> red_v: array<f32, WG>;
// The split groups' weighted sums.
var<workgroup> red_s: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lane.lid;
    let col = select(0u, wid.z, BATCHED);
    let kv_len = col_len(col);
    let h = col * p.n_head + wid.x;
    // Not inlinable by lavapipe: see attention_decode.wgsl.
    let opaque = wid.z == 0xffffffffu;
    let hd = select(p.head_dim, 0u, opaque);
    let n_used = select((kv_len + p.chunk - 1u) / p.chunk, 0u, opaque);
    let stride = hd + 2u;
    let base = h * p.n_splits * stride;

    // The largest of the splits' maxima.
    var m = -3.4028235e38;
    for (var i = lid; i < n_used; i += WG) { m = max(m, part[base + i * stride + hd]); }
    let gm = group_max(m, lane);
    if (lane_is_leader(lane)) { red_v[lane_group(lane)] = gm; }
    workgroupBarrier();
    var gmax = red_v[0];
    for (var u = 1u; u < lane_groups(lane); u++) { gmax = max(gmax, red_v[u]); }
    workgroupBarrier();

    // Invocation (split group sg, dimension d) over splits sg, sg + groups, ...
    let groups = WG / max(hd, 1u);
    let sg = lid / max(hd, 1u);
    let d = lid % max(hd, 1u);
    var acc = 0.0;
    var tot = 0.0;
    if (sg < groups) {
        var i = sg;
        for (; i + 3u * groups < n_used; i += 4u * groups) {
            let b0 = base + i * stride;
            let b1 = b0 + groups * stride;
            let b2 = b1 + groups * stride;
            let b3 = b2 + groups * stride;
            let v = vec4<f32>(part[b0 + d], part[b1 + d], part[b2 + d], part[b3 + d]);
            let mx = vec4<f32>(part[b0 + hd], part[b1 + hd], part[b2 + hd], part[b3 + hd]);
            let s = vec4<f32>(part[b0 + hd + 1u], part[b1 + hd + 1u], part[b2 + hd + 1u], part[b3 + hd + 1u]);
            let w = exp(mx - vec4<f32>(gmax));
            acc += dot(v, w);
            tot += dot(s, w);
        }
        for (; i < n_used; i += groups) {
            let b = base + i * stride;
            let w = exp(part[b + hd] - gmax);
            acc += part[b + d] * w;
            tot += part[b + hd + 1u] * w;
        }
    }
    red_v[lid] = acc;
    red_s[lid] = tot;
    workgroupBarrier();
    var val = 0.0;
    if (lid < hd) {
        var o = 0.0;
        var t = 0.0;
        for (var g = 0u; g < groups; g++) {
            o += red_v[g * hd + lid];
            t += red_s[g * hd];
        }
        val = o / t;
        out[h * hd + lid] = val;
    }
    if (Q8_OUT) {
        // The head's values in red_v, then one invocation per block of 32.
        workgroupBarrier();
        red_v[lid] = val;
        workgroupBarrier();
        if (lid < hd / 32u) {
            let b = 32u * lid;
            var v: array<vec4<f32>, 8>;
            for (var j = 0u; j < 8u; j++) {
                v[j] = vec4<f32>(red_v[b + 4u * j], red_v[b + 4u * j + 1u], red_v[b + 4u * j + 2u], red_v[b + 4u * j + 3u]);
            }
            let qb = q8_block(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            let blk = h * (hd / 32u) + lid;
            xq_out[3u * blk] = qb.lo;
            xq_out[3u * blk + 1u] = qb.hi;
            xq_out[3u * blk + 2u] = qb.sums;
        }
    }
}
