// Decode attention over a long context on cooperative matrices (16x16x16 f16 multiply-adds
// into f32): one query token, its GQA group of query heads (at most 16: the rows of one 16-row
// tile, the rest zero) against an f16 cache read as f16, for heads of 64 or 128 dimensions.
// A workgroup takes one KV head and one split of NSG x BK positions, a tile of BK keys (16, 32
// or 64) for each of its NSG subgroups. A subgroup issues every load of its tile at once
// (`tile_load`: common/decode_coop_staged.wgsl for 64-dimension heads in tiles of up to 32
// keys, through its own slice of workgroup memory; else common/decode_coop_direct.wgsl,
// straight from the cache into fragments), takes its 16 x BK scores on the matrix cores
// (`tile_scores`), the probabilities against the tile's max (its lanes through its own slice of
// workgroup memory, behind subgroup barriers), and P·V into D / 16 accumulators
// (`tile_weigh`). The workgroup then merges its subgroups' outputs and writes the split's
// unnormalized rows with their max and sum (as attention_decode.wgsl's partials) for
// attention_combine.wgsl.
// Why: the plain decode kernel takes a position's dot products on the f32 FMA units with
// barriers between its phases; at thousands of positions that, not the cache's bytes, bounds
// it. Here the products are on the matrix cores and each subgroup's work is one round trip to
// memory (a first version that looped over tiles, loading fragments as its products needed
// them, took 5.8 µs for a split on an H200, run 195).
// A tile reaching past the context is moved back to end at its last position, the keys it
// shares with the tile before masked (every key read is a written one, so V's rows are finite
// and weigh 0 when masked); contexts are at least 64 positions (`attention::decode_coop_takes`).
// Subgroups of 32 in index order (as gemm_coop.wgsl), so lane = lid % 32.
// Header constants: D (64 or 128), BK (16, 32 or 64), NSG (subgroups), WG (32 NSG), MERGE,
// Q8_OUT (with MERGE). Needs common/step_one.wgsl, common/coop_out.wgsl, common/half8.wgsl,
// one of the tile files above and common/decode_merge.wgsl (or common/decode_merge_none.wgsl).

struct Params {
    head_dim: u32,
    n_head: u32,
    group: u32,      // query heads per KV head: at most 16
    kv_len: u32,     // unused: the step state's
    kv_stride: u32,  // elements between cache rows (n_kv_head * head_dim)
    n_splits: u32,   // splits the partials buffer has room for, per head
    q_stride: u32,   // elements between heads' queries
    scale: f32,      // 1 / sqrt(head_dim)
    chunk: u32,      // positions per split: NSG x BK
    _pad2: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
// Bindings 2 and 3, the K and V caches: declared by the tile file, as it reads them.
// The partials [n_head, n_splits, head_dim + 2]: each split's unnormalized output, then its
// max (natural log) and sum; with MERGE the output [n_head * head_dim] (the partials in
// common/decode_merge.wgsl's), not written with Q8_OUT.
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read> step: Step;
// With MERGE and Q8_OUT: the output as int8 blocks [n_head * head_dim / 32] (only so).
@group(0) @binding(6) var<storage, read_write> xq_out: array<vec4<u32>>;

const LDQ: u32 = D + 8u;                 // f16 row stride of the Q tile (bank padding)
// Row strides, in vec4s, of a subgroup's scores (f32, 16 x BK) or output (16 x D), and of its
// probabilities (f16, 16 x BK): 2 mod 8 vec4s, as flash_attention_coop.wgsl's.
const SS4: u32 = (max(BK, D) + 8u) / 4u;
const PS4: u32 = (BK + 8u) / 4u;

var<workgroup> qs: array<f16, 16u * LDQ>;
var<workgroup> ss: array<vec4<f32>, NSG * 16u * SS4>;
var<workgroup> ps: array<vec4<f16>, NSG * 16u * PS4>;
// Each subgroup's row maxima and sums: [subgroup][row] as (max, sum).
var<workgroup> ms: array<vec2<f32>, NSG * 16u>;

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let split = wid.x;
    let kvh = wid.y;
    let g = p.group;
    let kv_len = step.kv_len;
    let sg = lid / 32u;
    let lane = lid % 32u;
    // This subgroup's keys j0 .. j0 + BK - 1 (none past the context: `live` false), read as the
    // BK ending at the context's last where they reach past it.
    let j0 = split * p.chunk + sg * BK;
    let live = j0 < kv_len;
    let t0 = min(j0, kv_len - BK);
    let row = (step.kv_base + t0) * p.kv_stride + kvh * D;
    if (live) { tile_load(lane, sg, row); }

    // Q of the group's heads, scaled into base 2, as f16 (rows past the group: zeros).
    let qscale = p.scale * 1.4426950408889634;
    for (var i = lid; i < 16u * D; i += WG) {
        let r = i / D;
        let d = i % D;
        var v = 0.0;
        if (r < g) { v = q[(kvh * g + r) * p.q_stride + d] * qscale; }
        qs[r * LDQ + d] = f16(v);
    }
    workgroupBarrier();

    // Lanes 2r and 2r + 1 take row r of the scores, probabilities and output, the 4-value
    // chunks h, h + 2, ... (h = lane % 2), and hold the row's max and sum.
    let orow = lane / 2u;
    let h = lane % 2u;
    let slice4 = sg * 16u * SS4;
    let pslice4 = sg * 16u * PS4;
    let srow = slice4 + orow * SS4 + h;
    let prow = pslice4 + orow * PS4 + h;
    var mx = -3.0e38;
    var sum = 0.0;
    if (live) {
        tile_scores(lane, sg, slice4);
        // Softmax of row orow against the tile's max, half a tile per lane (16-byte reads);
        // keys before j0 (a moved tile's) get probability 0.
        var sc: array<vec4<f32>, BK / 8u>;
        for (var c = 0u; c < BK / 8u; c++) {
            let key = t0 + (2u * c + h) * 4u;
            let vis = vec4<u32>(key, key + 1u, key + 2u, key + 3u) >= vec4<u32>(j0);
            sc[c] = select(vec4<f32>(-3.0e38), ss[srow + 2u * c], vis);
            mx = max(mx, max(max(sc[c].x, sc[c].y), max(sc[c].z, sc[c].w)));
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        for (var c = 0u; c < BK / 8u; c++) {
            let e = exp2(sc[c] - mx);
            ps[prow + 2u * c] = vec4<f16>(e);
            sum += (e.x + e.y) + (e.z + e.w);
        }
        sum += subgroupShuffleXor(sum, 1u);
        tile_weigh(lane, sg, row, pslice4);
    }

    // The subgroups' outputs merged: each row's largest max, the others' rows scaled to it.
    store_o(slice4);
    if (h == 0u) { ms[sg * 16u + orow] = vec2<f32>(mx, sum); }
    workgroupBarrier();
    if (MERGE) {
        // The split's rows as vec4s; the KV head's last split to finish merges them.
        for (var i = lid; i < g * (D / 4u); i += WG) {
            let r = i / (D / 4u);
            let c = i % (D / 4u);
            var mm = -3.0e38;
            for (var s = 0u; s < NSG; s++) { mm = max(mm, ms[s * 16u + r].x); }
            var acc = vec4<f32>(0.0);
            var tot = 0.0;
            for (var s = 0u; s < NSG; s++) {
                let w = exp2(ms[s * 16u + r].x - mm);
                acc += ss[s * 16u * SS4 + r * SS4 + c] * w;
                tot += ms[s * 16u + r].y * w;
            }
            let row = merge_row(kvh * g + r, split, p.n_splits, D);
            merge_put(row + c, acc);
            if (c == 0u) { merge_put(row + D / 4u, vec4<f32>(mm * 0.6931471805599453, tot, 0.0, 0.0)); }
        }
        // Only the splits the context reaches count (the grid never holds more).
        let n_used = (kv_len + p.chunk - 1u) / p.chunk;
        if (split >= n_used) { return; }
        let ticket = merge_ticket(lid, kvh, n_used);
        if (ticket + 1u == n_used) {
            // Subgroups of 32 (`attention::decode_coop_takes`): their size as a constant.
            merge_splits_in(lid, kvh * g, g, D, n_used, p.n_splits, 32u);
        } else {
            // The output projection's weights into L2, a share for each of every KV head's
            // n_used - 1 workgroups that do not merge, by the order they finished in.
            merge_wo_ahead(lid, kvh * (n_used - 1u) + ticket, (p.n_head / g) * (n_used - 1u));
        }
        return;
    }
    let stride = p.head_dim + 2u;
    for (var i = lid; i < g * D; i += WG) {
        let r = i / D;
        let d = i % D;
        var mm = -3.0e38;
        for (var s = 0u; s < NSG; s++) { mm = max(mm, ms[s * 16u + r].x); }
        var acc = 0.0;
        var tot = 0.0;
        for (var s = 0u; s < NSG; s++) {
            let w = exp2(ms[s * 16u + r].x - mm);
            acc += ss[s * 16u * SS4 + r * SS4 + d / 4u][d % 4u] * w;
            tot += ms[s * 16u + r].y * w;
        }
        let at = ((kvh * g + r) * p.n_splits + split) * stride;
        dst[at + d] = acc;
        if (d == 0u) {
            // attention_combine.wgsl weighs splits by exp(max - largest): natural log.
            dst[at + p.head_dim] = mm * 0.6931471805599453;
            dst[at + p.head_dim + 1u] = tot;
        }
    }
}
