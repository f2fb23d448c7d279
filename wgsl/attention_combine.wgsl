// Merges the per-split partial results of attention_decode into out[h * head_dim + d], one
// workgroup per query head (and per column of a batched step, the grid's z: every column,
// its short context one split). Needs common/step_one.wgsl or common/step_columns.wgsl and a
// reduce file (common/reduce_*.wgsl). Invocation (split group, dimension) adds up every
// groups-th split of its dimension, eight splits' values, maxima and sums loaded at once and
// weighed against their own largest maximum; the groups then meet through workgroup memory.
// (A first pass that reduced the splits' maxima before any value was loaded cost a round trip:
// H200 run 420, TinyLlama tg128 at depth 4,096 with the combine pass, KILN_DECODE_MERGE=0,
// 1,036.2 -> 1,048.3 tok/s.) With Q8_OUT, the output is also written as the output
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
// The split groups' maxima.
var<workgroup> red_m: array<f32, WG>;

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

    // Invocation (split group sg, dimension d) over splits sg, sg + groups, ...: eight splits'
    // values, maxima and sums loaded at once, weighed against their own largest maximum (a
    // running one across batches); the groups then meet, rescaled to the largest of theirs.
    let groups = WG / max(hd, 1u);
    let sg = lid / max(hd, 1u);
    let d = lid % max(hd, 1u);
    var m = -3.4028235e38;
    var acc = 0.0;
    var tot = 0.0;
    if (sg < groups) {
        for (var i = sg; i < n_used; i += 8u * groups) {
            var v: array<f32, 8>;
            var mx: array<f32, 8>;
            var s: array<f32, 8>;
            for (var j = 0u; j < 8u; j++) {
                let ij = i + j * groups;
                let b = base + min(ij, n_used - 1u) * stride;
                v[j] = part[b + d];
                mx[j] = select(-3.4028235e38, part[b + hd], ij < n_used);
                s[j] = part[b + hd + 1u];
            }
            var bm = m;
            for (var j = 0u; j < 8u; j++) { bm = max(bm, mx[j]); }
            let r = exp(m - bm);
            acc *= r;
            tot *= r;
            for (var j = 0u; j < 8u; j++) {
                let w = exp(mx[j] - bm);
                acc += v[j] * w;
                tot += s[j] * w;
            }
            m = bm;
        }
    }
    red_m[lid] = m;
    red_v[lid] = acc;
    red_s[lid] = tot;
    workgroupBarrier();
    var val = 0.0;
    if (lid < hd) {
        var gm = -3.4028235e38;
        for (var g = 0u; g < groups; g++) { gm = max(gm, red_m[g * hd + lid]); }
        var o = 0.0;
        var t = 0.0;
        for (var g = 0u; g < groups; g++) {
            let w = exp(red_m[g * hd + lid] - gm);
            o += red_v[g * hd + lid] * w;
            t += red_s[g * hd + lid] * w;
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
