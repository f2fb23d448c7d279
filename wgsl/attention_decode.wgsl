// Decode attention: one query per head against the cached context, split over the context
// (flash-decoding). Workgroup (h, split) scores its CHUNK positions, and writes its partial
// max, sum and weighted V; `combine` merges the splits. Header constants: WG, CHUNK, MAX_HD.

struct Params {
    head_dim: u32,
    n_head: u32,
    group: u32,      // query heads per KV head
    kv_len: u32,     // positions 0 .. kv_len-1 are visible
    kv_stride: u32,  // elements between cache rows (n_kv_head * head_dim)
    n_splits: u32,
    q_stride: u32,   // elements between heads' queries (head_dim for a packed Q row)
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<KvWord>;
@group(0) @binding(3) var<storage, read> v_cache: array<KvWord>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;   // [n_head, n_splits, head_dim + 2]

var<workgroup> qv: array<f32, MAX_HD>;
var<workgroup> sc: array<f32, CHUNK>;

fn k_at(i: u32) -> f32 { return kv_get(k_cache[i / KV_PER_WORD], i); }
fn v_at(i: u32) -> f32 { return kv_get(v_cache[i / KV_PER_WORD], i); }

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let split = wid.y;
    // Loop bounds from the uniform would let lavapipe (Mesa 22/23) inline them and compile
    // a new shader variant per dispatch, growing host memory by ~1 MB per decode step; a
    // bound that also depends on the workgroup id (never 0xffffffff) is not inlinable.
    let hd = select(p.head_dim, 0u, wid.z == 0xffffffffu);
    let kvh = h / p.group;
    let j0 = split * CHUNK;
    let j1 = min(j0 + CHUNK, p.kv_len);
    for (var d = lane.lid; d < hd; d += WG) { qv[d] = q[h * p.q_stride + d]; }
    workgroupBarrier();

    var mx = -3.4028235e38;
    for (var j = j0 + lane.lid; j < j1; j += WG) {
        let kb = j * p.kv_stride + kvh * hd;
        var dot_ = 0.0;
        for (var d = 0u; d < hd; d++) { dot_ = fma(qv[d], k_at(kb + d), dot_); }
        let s = dot_ * p.scale;
        sc[j - j0] = s;
        mx = max(mx, s);
    }
    mx = wg_max(mx, lane);
    var sum = 0.0;
    for (var j = j0 + lane.lid; j < j1; j += WG) {
        let e = exp(sc[j - j0] - mx);
        sc[j - j0] = e;
        sum += e;
    }
    sum = wg_sum(sum, lane);
    workgroupBarrier();

    let out = (h * p.n_splits + split) * (hd + 2u);
    for (var d = lane.lid; d < hd; d += WG) {
        var acc = 0.0;
        for (var j = j0; j < j1; j++) { acc = fma(sc[j - j0], v_at(j * p.kv_stride + kvh * hd + d), acc); }
        part[out + d] = acc;
    }
    if (lane.lid == 0u) {
        part[out + hd] = mx;
        part[out + hd + 1u] = sum;
    }
}
