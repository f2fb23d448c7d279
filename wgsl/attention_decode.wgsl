// Decode attention: one query token against the cached context (flash-decoding). A workgroup
// takes a block of NB query heads that share one KV head (GQA), so each K and V row it reads
// serves the whole block, and C positions of the context (a split). With one split the
// workgroup writes the normalized output itself: a short context needs a single dispatch.
// Longer contexts are split over workgroups that write their partial max, sum and weighted
// V, which attention_combine.wgsl merges, or with MERGE the last of them to finish
// (common/decode_merge.wgsl: one dispatch; one sequence). A batched decode step (common/step_columns.wgsl)
// adds the grid's z: column z's query against its own sequence's cache region up to its own
// position; the splits past a column's context exit at once, and where the longest context
// (the step header's kv_len) is split, every column writes partials for the combine pass.
// With common/step_one.wgsl the grid's z is 1 and the column is 0.
//
// Bound by latency, not bandwidth: every K and V value the workgroup needs is loaded into
// registers at the start, PER of each per invocation, so the loads are in flight together
// instead of one round trip per pass; then the scores, one softmax and the weighted V take
// a handful of barriers.
//
// With Q8_OUT, a step of one split also writes its output as the output projection's int8
// input, blocks of 32 values of one head (common/q8_block.wgsl, the layout quantize_q8.wgsl
// writes; heads of a multiple of 32 dimensions), so that GEMV needs no quantize dispatch; a
// split step's combine pass writes them instead, or with MERGE its last split, which then
// writes no f32 output (common/decode_merge.wgsl's `merge_write`).
//
// K rows come through common/kv_rows_vec.wgsl (heads of a multiple of 8 dimensions: whole
// vectors) or common/kv_rows_scalar.wgsl (one value at a time).
// Header constants: WG (256; 512 to measure), D (the head-dim class: 32, 64, 128 or 256;
// heads of up to D dimensions), PER (K dimensions and V positions an invocation holds: 8, 16
// or 32, at most D), C (positions per split: WG * PER / D), NB (query heads per workgroup, at
// most min(8, 512 / D, 1024 / C): the scratch below stays within 16 KiB), Q8_OUT, OB (NB * D
// / 4 with Q8_OUT, else 1), MERGE (with common/decode_merge.wgsl, else
// common/decode_merge_none.wgsl; heads of a multiple of 4 dimensions).

// Scoring: TPP invocations per position, PER dimensions each (K values in registers).
const TPP: u32 = D / PER;
// Weighting V: invocation (position group, dimension), VG groups of PER positions each.
const VG: u32 = WG / D;
// The block's heads in vectors of four.
const NBV: u32 = (NB + 3u) / 4u;
const_assert !(MERGE && BATCHED);

struct Params {
    head_dim: u32,
    n_head: u32,
    group: u32,      // query heads per KV head
    kv_len: u32,     // unused: the step state's kv_len (written per step, advanced on the GPU)
    kv_stride: u32,  // elements between cache rows (n_kv_head * head_dim)
    n_splits: u32,   // splits the partials buffer has room for, per head
    q_stride: u32,   // elements between heads' queries (head_dim for a packed Q row)
    scale: f32,
    chunk: u32,      // positions per split (C)
    _pad2: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
// k_cache: binding 2, read by k_row (common/kv_rows_vec.wgsl or common/kv_rows_scalar.wgsl).
@group(0) @binding(3) var<storage, read> v_cache: array<KvWord>;
// The output [columns, n_head * head_dim] with one split or MERGE, else the partials
// [columns, n_head, n_splits, head_dim + 2].
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
// The step: each column sees positions 0 .. kv_len - 1 of its region (common/step_*.wgsl).
@group(0) @binding(5) var<storage, read> step: Step;
// With Q8_OUT and one split: the output as int8 blocks [columns, n_head * head_dim / 32].
@group(0) @binding(6) var<storage, read_write> xq_out: array<vec4<u32>>;

// The block's queries [head][D / 4], pre-scaled; after the scores, the sums of
// exp(score - max) per position group and head.
var<workgroup> qs: array<vec4<f32>, NB * D / 4u>;
// exp(score - max) [position][heads in fours].
var<workgroup> sc: array<vec4<f32>, C * NBV>;
// Partial dot products [invocation][head]; then each subgroup's maximum [head][group]; then
// partial outputs [position group][head][D].
var<workgroup> red: array<f32, WG * NB>;
// With Q8_OUT: the block's normalized output [head][D], to be quantized.
var<workgroup> ob: array<vec4<f32>, OB>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    // Loop bounds from the uniform alone would let lavapipe (Mesa 22/23) inline them and
    // compile a new shader variant per dispatch; a bound that also depends on the workgroup
    // id (never 0xffffffff) is not inlinable.
    let opaque = wid.z == 0xffffffffu;
    let hd = select(p.head_dim, 0u, opaque);
    let blocks_per_kv = p.group / NB;
    // The grid: (head blocks, splits, columns); with MERGE (splits, head blocks), so that a
    // block's splits run together and its merge overlaps the later blocks' splits instead of
    // every merge waiting for the last wave.
    let blk = select(wid.x, wid.y, MERGE);
    let split = select(wid.y, wid.x, MERGE);
    let kvh = blk / blocks_per_kv;
    let h0 = kvh * p.group + (blk % blocks_per_kv) * NB;   // first query head of the block
    let j0 = split * C;
    // The column: 0 for one sequence (a constant, so its terms fold away).
    let col = select(0u, wid.z, BATCHED);
    let kv_len = col_len(col);
    if (BATCHED && j0 >= kv_len) {
        // A split past this column's context (the grid covers the longest in the step).
        return;
    }
    let row0 = col_base(col) + j0;   // the split's first cache row
    let qh0 = col * p.n_head;        // the column's first head in Q and the output
    let len = min(j0 + C, kv_len) - j0;
    let lid = lane.lid;
    let last = hd - 1u;
    // One split for the whole step: the output is written here, else partials.
    let one_split = step.kv_len <= C;

    // Every load first. K: invocation (position pk, part t) holds dimensions PER t .. PER t + PER - 1
    // of its position (as whole vectors where the heads allow); V: invocation (group pg,
    // dimension dv) holds dimension dv of positions pg, pg + VG, ... Positions past the
    // context read the last one (their weights are zero), dimensions past the head its last
    // (their queries are zero). Both stay as loaded (halves) until used: fewer registers, so
    // more workgroups fit an SM at once.
    let pk = lid / TPP;
    let t = lid % TPP;
    let kr = k_row((row0 + min(pk, len - 1u)) * p.kv_stride + kvh * hd, t, hd);
    let pg = lid / D;
    let dv = lid % D;
    let vc = kvh * hd + min(dv, last);
    // Rows of an even number of values keep dimension vc's half of a packed word the same in
    // every row.
    var vr: array<KvWord, PER>;
    for (var i = 0u; i < PER; i++) { vr[i] = v_cache[((row0 + min(pg + VG * i, len - 1u)) * p.kv_stride + vc) / KV_PER_WORD]; }
    for (var i = lid; i < NB * D; i += WG) {
        let d = i % D;
        let qv = q[(qh0 + h0 + i / D) * p.q_stride + min(d, last)] * p.scale;
        qs[i / 4u][i % 4u] = select(0.0, qv, d < hd);
    }
    workgroupBarrier();

    // Scores: each invocation's PER dimensions for every head of the block, then the TPP
    // parts of each position added up by the position's own invocation (lid < C).
    var dots: array<f32, NB>;
    for (var g = 0u; g < NB; g++) {
        var s = 0.0;
        for (var r = 0u; r < PER / 4u; r++) { s += dot(qs[(g * D + t * PER) / 4u + r], k_row4(kr, r)); }
        dots[g] = s;
    }
    var s: array<f32, NB>;
    if (TPP > 1u) {
        for (var g = 0u; g < NB; g++) { red[lid * NB + g] = dots[g]; }
        workgroupBarrier();
        for (var g = 0u; g < NB; g++) {
            var tot = 0.0;
            if (lid < C) {
                for (var u = 0u; u < TPP; u++) { tot += red[(lid * TPP + u) * NB + g]; }
            }
            s[g] = tot;
        }
        workgroupBarrier();
    } else {
        s = dots;
    }
    for (var g = 0u; g < NB; g++) { s[g] = select(-3.4028235e38, s[g], lid < len); }

    // The maximum of each head's scores: per lane group (a subgroup), then across them.
    for (var g = 0u; g < NB; g++) {
        let m = group_max(s[g], lane);
        if (lane_is_leader(lane)) { red[g * LANE_GROUPS_MAX + lane_group(lane)] = m; }
    }
    workgroupBarrier();
    var mx: array<f32, NB>;
    var e: array<f32, NBV * 4u>;
    for (var g = 0u; g < NBV * 4u; g++) { e[g] = 0.0; }
    for (var g = 0u; g < NB; g++) {
        var m = red[g * LANE_GROUPS_MAX];
        for (var u = 1u; u < lane_groups(lane); u++) { m = max(m, red[g * LANE_GROUPS_MAX + u]); }
        mx[g] = m;
        e[g] = select(0.0, exp(s[g] - m), lid < len);
    }
    if (lid < C) {
        for (var v = 0u; v < NBV; v++) {
            sc[lid * NBV + v] = vec4<f32>(e[4u * v], e[4u * v + 1u], e[4u * v + 2u], e[4u * v + 3u]);
        }
    }
    workgroupBarrier();

    // Weighted V and the sums of the weights, per position group; then the groups added.
    var acc: array<vec4<f32>, NBV>;
    var es: array<vec4<f32>, NBV>;
    for (var v = 0u; v < NBV; v++) {
        var a = vec4<f32>(0.0);
        var e = vec4<f32>(0.0);
        for (var i = 0u; i < PER; i++) {
            let w = sc[(pg + VG * i) * NBV + v];
            a = fma(w, vec4<f32>(kv_get(vr[i], vc)), a);
            e += w;
        }
        acc[v] = a;
        es[v] = e;
    }
    for (var g = 0u; g < NB; g++) { red[(pg * NB + g) * D + dv] = acc[g / 4u][g % 4u]; }
    if (dv == 0u) {
        for (var g = 0u; g < NB; g++) { qs[(pg * NB + g) / 4u][(pg * NB + g) % 4u] = es[g / 4u][g % 4u]; }
    }
    workgroupBarrier();
    if (MERGE && !one_split) {
        // The split's partials as rows of vec4s (common/decode_merge.wgsl); the block's last
        // split to finish merges them.
        for (var i = lid; i < NB * (D / 4u); i += WG) {
            let g = i / (D / 4u);
            let c = i % (D / 4u);
            if (4u * c < hd) {
                var o = vec4<f32>(0.0);
                for (var u = 0u; u < VG; u++) {
                    let r = (u * NB + g) * D + 4u * c;
                    o += vec4<f32>(red[r], red[r + 1u], red[r + 2u], red[r + 3u]);
                }
                merge_put(merge_row(qh0 + h0 + g, split, p.n_splits, hd) + c, o);
            }
        }
        if (lid < NB) {
            var tot = 0.0;
            for (var u = 0u; u < VG; u++) { tot += qs[(u * NB + lid) / 4u][(u * NB + lid) % 4u]; }
            merge_put(merge_row(qh0 + h0 + lid, split, p.n_splits, hd) + hd / 4u, vec4<f32>(mx[lid], tot, 0.0, 0.0));
        }
        // Only the splits the context reaches count (the grid never holds more).
        let n_used = (kv_len + C - 1u) / C;
        if (split >= n_used) { return; }
        if (merge_is_last(lid, blk, n_used)) {
            merge_splits(lid, qh0 + h0, NB, hd, n_used, p.n_splits);
        }
        return;
    }
    for (var i = lid; i < NB * D; i += WG) {
        let g = i / D;
        let d = i % D;
        if (d < hd) {
            var o = 0.0;
            for (var u = 0u; u < VG; u++) { o += red[(u * NB + g) * D + d]; }
            let h = qh0 + h0 + g;
            if (one_split) {
                var tot = 0.0;
                for (var u = 0u; u < VG; u++) { tot += qs[(u * NB + g) / 4u][(u * NB + g) % 4u]; }
                dst[h * hd + d] = o / tot;
                if (Q8_OUT) { ob[i / 4u][i % 4u] = o / tot; }
            } else {
                dst[(h * p.n_splits + split) * (hd + 2u) + d] = o;
            }
        }
    }
    if (Q8_OUT) {
        // One invocation per block of 32 dimensions of a head.
        workgroupBarrier();
        let bph = hd / 32u;
        if (one_split && lid < NB * bph) {
            let g = lid / bph;
            let v = (g * D + (lid % bph) * 32u) / 4u;
            let qb = q8_block(ob[v], ob[v + 1u], ob[v + 2u], ob[v + 3u], ob[v + 4u], ob[v + 5u], ob[v + 6u], ob[v + 7u]);
            let blk = (qh0 + h0 + g) * bph + lid % bph;
            xq_out[3u * blk] = qb.lo;
            xq_out[3u * blk + 1u] = qb.hi;
            xq_out[3u * blk + 2u] = qb.sums;
        }
    }
    if (!one_split && lid < NB) {
        var tot = 0.0;
        for (var u = 0u; u < VG; u++) { tot += qs[(u * NB + lid) / 4u][(u * NB + lid) % 4u]; }
        let b = ((qh0 + h0 + lid) * p.n_splits + split) * (hd + 2u);
        dst[b + hd] = mx[lid];
        dst[b + hd + 1u] = tot;
    }
}
