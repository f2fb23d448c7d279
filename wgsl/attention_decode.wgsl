// Decode attention: one query token against the cached context (flash-decoding). A workgroup
// takes a block of query heads that share one KV head (GQA), so each K and V row it reads
// serves the whole block, and CHUNK positions of the context (`p.chunk`). With one split the
// workgroup writes the normalized output itself: a short context needs a single dispatch.
// Longer contexts are split over workgroups that write their partial max, sum and weighted
// V, which attention_combine.wgsl merges. A batched decode step (common/step_columns.wgsl)
// adds the grid's z: column z's query against its own sequence's cache region up to its own
// position; the splits past a column's context exit at once, and where the longest context
// (the step header's kv_len) is split, every column writes partials for the combine pass.
// With common/step_one.wgsl the grid's z is 1 and the column is 0. Header constants: WG (256), TPP (invocations per
// position while scoring), NB (query heads per workgroup, at most 8), MAX_QB (query values
// of a block: NB x head_dim), MAX_SC (scores of a block: NB x chunk).

struct Params {
    head_dim: u32,
    n_head: u32,
    group: u32,      // query heads per KV head
    kv_len: u32,     // unused: the step state's kv_len (written per step, advanced on the GPU)
    kv_stride: u32,  // elements between cache rows (n_kv_head * head_dim)
    n_splits: u32,   // splits the partials buffer has room for, per head
    q_stride: u32,   // elements between heads' queries (head_dim for a packed Q row)
    scale: f32,
    chunk: u32,      // positions per split (a multiple of WG / TPP)
    _pad2: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<KvWord>;
@group(0) @binding(3) var<storage, read> v_cache: array<KvWord>;
// The output [columns, n_head * head_dim] with one split, else the partials
// [columns, n_head, n_splits, head_dim + 2].
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
// The step: each column sees positions 0 .. kv_len - 1 of its region (common/step_*.wgsl).
@group(0) @binding(5) var<storage, read> step: Step;

var<workgroup> qs: array<f32, MAX_QB>;       // [block][head_dim], pre-scaled
var<workgroup> sc: array<f32, MAX_SC>;       // [block][chunk] scores, then exp(score - max)
var<workgroup> red: array<f32, 2048>;        // partial dot products, then partial outputs
var<workgroup> stat: array<f32, 32>;         // per head of the block: max, sum

fn k_at(i: u32) -> f32 { return kv_get(k_cache[i / KV_PER_WORD], i); }
fn v_at(i: u32) -> f32 { return kv_get(v_cache[i / KV_PER_WORD], i); }

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    // Loop bounds from the uniform alone would let lavapipe (Mesa 22/23) inline them and
    // compile a new shader variant per dispatch; a bound that also depends on the workgroup
    // id (never 0xffffffff) is not inlinable.
    let opaque = wid.z == 0xffffffffu;
    let hd = select(p.head_dim, 0u, opaque);
    let blocks_per_kv = p.group / NB;
    let kvh = wid.x / blocks_per_kv;
    let h0 = kvh * p.group + (wid.x % blocks_per_kv) * NB;   // first query head of the block
    let split = wid.y;
    let j0 = split * p.chunk;
    // The column: 0 for one sequence (a constant, so its terms fold away).
    let col = select(0u, wid.z, BATCHED);
    let kv_len = col_len(col);
    if (BATCHED && j0 >= kv_len) {
        // A split past this column's context (the grid covers the longest in the step).
        return;
    }
    let row0 = col_base(col);   // the column's first cache row
    let qh0 = col * p.n_head;   // the column's first head in Q and the output
    let j1 = min(j0 + p.chunk, kv_len);
    let len = j1 - j0;
    let lid = lane.lid;
    // One split for the whole step: the output is written here, else partials.
    let one_split = step.kv_len <= p.chunk;

    for (var i = lid; i < NB * hd; i += WG) {
        let g = i / hd;
        qs[i] = q[(qh0 + h0 + g) * p.q_stride + i % hd] * p.scale;
    }
    workgroupBarrier();

    // Scores: TPP invocations per position, each over every TPP-th dimension, for every
    // head of the block; then the TPP partial sums of each (position, head) are added.
    let per_pass = WG / TPP;
    let pl = lid / TPP;
    let t = lid % TPP;
    for (var jj = 0u; jj < len; jj += per_pass) {
        let j = jj + pl;
        var dots: array<f32, NB>;
        for (var g = 0u; g < NB; g++) { dots[g] = 0.0; }
        if (j < len) {
            let kb = (row0 + j0 + j) * p.kv_stride + kvh * hd;
            for (var d = t; d < hd; d += TPP) {
                let kv = k_at(kb + d);
                for (var g = 0u; g < NB; g++) { dots[g] = fma(qs[g * hd + d], kv, dots[g]); }
            }
        }
        for (var g = 0u; g < NB; g++) { red[(pl * NB + g) * TPP + t] = dots[g]; }
        workgroupBarrier();
        for (var i = lid; i < per_pass * NB; i += WG) {
            let jp = i / NB;
            let g = i % NB;
            if (jj + jp < len) {
                var s = 0.0;
                for (var u = 0u; u < TPP; u++) { s += red[i * TPP + u]; }
                sc[g * p.chunk + jj + jp] = s;
            }
        }
        workgroupBarrier();
    }

    // Softmax pieces per head: the maximum, then exp(score - max) and their sum.
    for (var g = 0u; g < NB; g++) {
        var mx = -3.4028235e38;
        for (var j = lid; j < len; j += WG) { mx = max(mx, sc[g * p.chunk + j]); }
        mx = wg_max(mx, lane);
        var sum = 0.0;
        for (var j = lid; j < len; j += WG) {
            let e = exp(sc[g * p.chunk + j] - mx);
            sc[g * p.chunk + j] = e;
            sum += e;
        }
        sum = wg_sum(sum, lane);
        if (lid == 0u) {
            stat[2u * g] = mx;
            stat[2u * g + 1u] = sum;
        }
    }
    workgroupBarrier();

    // Weighted V: invocation (position group pg, dimension d) walks every groups-th position,
    // four at a time so their loads are in flight together; the groups are added after.
    let groups = max(WG / max(hd, 1u), 1u);
    let pg = lid / max(hd, 1u);
    for (var d0 = 0u; d0 < hd; d0 += WG) {
        let d = d0 + lid % hd;
        var acc: array<f32, NB>;
        for (var g = 0u; g < NB; g++) { acc[g] = 0.0; }
        let vb = (row0 + j0) * p.kv_stride + kvh * hd + d;
        if (pg < groups && d < hd) {
            var j = pg;
            for (; j + 3u * groups < len; j += 4u * groups) {
                let v0 = v_at(vb + j * p.kv_stride);
                let v1 = v_at(vb + (j + groups) * p.kv_stride);
                let v2 = v_at(vb + (j + 2u * groups) * p.kv_stride);
                let v3 = v_at(vb + (j + 3u * groups) * p.kv_stride);
                for (var g = 0u; g < NB; g++) {
                    let s = g * p.chunk + j;
                    acc[g] += sc[s] * v0 + sc[s + groups] * v1 + sc[s + 2u * groups] * v2 + sc[s + 3u * groups] * v3;
                }
            }
            for (; j < len; j += groups) {
                let v = v_at(vb + j * p.kv_stride);
                for (var g = 0u; g < NB; g++) { acc[g] = fma(sc[g * p.chunk + j], v, acc[g]); }
            }
        }
        workgroupBarrier();
        if (pg < groups && d < hd) {
            for (var g = 0u; g < NB; g++) { red[(pg * NB + g) * hd + (d - d0)] = acc[g]; }
        }
        workgroupBarrier();
        let width = min(WG, hd - d0);
        for (var i = lid; i < NB * width; i += WG) {
            let g = i / width;
            let dd = i % width;
            var o = 0.0;
            for (var u = 0u; u < groups; u++) { o += red[(u * NB + g) * hd + dd]; }
            let h = qh0 + h0 + g;
            if (one_split) {
                part[h * hd + d0 + dd] = o / stat[2u * g + 1u];
            } else {
                part[(h * p.n_splits + split) * (hd + 2u) + d0 + dd] = o;
            }
        }
        workgroupBarrier();
    }
    if (!one_split && lid < NB) {
        let b = ((qh0 + h0 + lid) * p.n_splits + split) * (hd + 2u);
        part[b + hd] = stat[2u * lid];
        part[b + hd + 1u] = stat[2u * lid + 1u];
    }
}
