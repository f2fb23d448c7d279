// Flash attention for prefill: Q·Kᵀ, the causal online softmax and P·V in one pass over
// tiles of the KV cache, read in place; no score matrix in memory.
//
// A workgroup takes BM rows of one KV head's GQA group, flattened as row r = token * group +
// head-in-group (heads of a group sit side by side in a Q row, so the Q loads stay
// contiguous): every K and V tile it stages in workgroup memory serves all the group's query
// heads, which divides the cache traffic by the group size (8 for TinyLlama). The key loop
// stops after the last key the tile's last token sees, so fully masked tiles are never
// loaded. Each invocation keeps a TR x TK block of scores and a TR x TD block of the output
// in registers; invocation `lid < BM` keeps row lid's running max and sum.
//
// Per key tile (BK keys): scores over DK-dimension chunks of Q and K (Q pre-scaled by
// log2(e) / sqrt(head_dim), so exp2 gives the softmax), the scores to workgroup memory, one
// invocation per row updates its max and sum and turns its scores into probabilities, the
// output is rescaled by exp2(old max - new max), then O += P·V over KC-key chunks of V.
//
// Header constants: WG (RT * CT invocations), BM (rows), BK (keys per tile), DK (head
// dimensions per Q/K chunk), D (the head-dim class: head_dim rounded up, sizes the output
// registers), KC (keys per V chunk), A_LEN, B_LEN (workgroup array sizes). Workgroup memory:
// (A_LEN + B_LEN + BM) floats, 12.5 KiB, under WebGPU's 16 KiB minimum.
//
// The chunk's queries, positions and cache region come from `segment(wid.z, lid)`:
// common/flash_one.wgsl (one sequence: the uniform's m, pos0, kv_off, n_tiles) or
// common/flash_segments.wgsl (several sequences' chunks side by side, a table).

struct Params {
    m: u32,          // query tokens of the step
    pos0: u32,       // position of token 0: token i sees keys 0 ..= pos0 + i
    head_dim: u32,
    group: u32,      // query heads per KV head
    q_stride: u32,   // elements between tokens in Q and in the output (n_head * head_dim)
    kv_stride: u32,  // elements between cache rows (n_kv_head * head_dim)
    scale: f32,      // log2(e) / sqrt(head_dim)
    n_tiles: u32,    // row tiles per KV head (the grid's x)
    kv_off: u32,     // cache element of the sequence's row 0 (its region of a shared cache)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<KvWord>;
@group(0) @binding(3) var<storage, read> v_cache: array<KvWord>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const RT: u32 = 16u;        // invocation rows
const CT: u32 = WG / RT;    // invocation columns
const TR: u32 = BM / RT;    // rows per invocation
const TK: u32 = BK / CT;    // keys per invocation (scores)
const TD: u32 = D / CT;     // output dimensions per invocation
const AS: u32 = BM + 1u;    // row stride of tile_a, padded against bank conflicts
const KS: u32 = BK + 1u;    // row stride of the K chunk in tile_b

var<workgroup> tile_a: array<f32, A_LEN>;    // Q chunk [DK][AS], then P [BK][AS]
var<workgroup> tile_b: array<f32, B_LEN>;    // K chunk [DK][KS], then V chunk [KC][D]
var<workgroup> row_scale: array<f32, BM>;    // per row: this tile's rescale, at the end 1 / sum

fn k_at(i: u32) -> f32 { return kv_get(k_cache[i / KV_PER_WORD], i); }
fn v_at(i: u32) -> f32 { return kv_get(v_cache[i / KV_PER_WORD], i); }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    // A bound from the uniform alone would let lavapipe inline it and compile a variant per
    // dispatch; one that also depends on the workgroup id (never 0xffffffff) is opaque.
    let hd = select(p.head_dim, 0u, wid.z == 0xffffffffu);
    let g = p.group;
    let kvh = wid.y;
    // The chunk of one sequence this workgroup's rows belong to (`segment`, wid.z); grids
    // span the longest chunk, so a shorter one's surplus workgroups leave at once.
    let seg = segment(wid.z, lid);
    if (wid.x >= seg.n_tiles) { return; }
    let tile = row_tile(seg, wid.x, BM, g);
    let r0 = tile.r0;
    let rows = tile.rows;
    let n_keys = tile.n_keys;
    let kv_base = seg.kv_off + kvh * hd;
    let tr = lid / CT;
    let tc = lid % CT;

    // Row lid's state (lid < BM): the last key it sees (rows past the step's end see what
    // its last token sees, and are never written), its running max (base 2) and sum.
    let my_last = seg.pos0 + min((r0 + lid) / g, seg.m - 1u);
    var run_max = -3.0e38;
    var run_sum = 0.0;
    var o: array<f32, TR * TD>;

    for (var j0 = 0u; j0 < n_keys; j0 += BK) {
        var s: array<f32, TR * TK>;
        for (var d0 = 0u; d0 < hd; d0 += DK) {
            for (var i = lid; i < BM * DK; i += WG) {
                let r = i / DK;
                let d = i % DK;
                let rr = r0 + r;
                var v = 0.0;
                if (rr < rows && d0 + d < hd) {
                    v = q[(seg.row0 + rr / g) * p.q_stride + (kvh * g + rr % g) * hd + d0 + d] * p.scale;
                }
                tile_a[d * AS + r] = v;
            }
            for (var i = lid; i < BK * DK; i += WG) {
                let c = i / DK;
                let d = i % DK;
                var v = 0.0;
                if (j0 + c < n_keys && d0 + d < hd) { v = k_at((j0 + c) * p.kv_stride + kv_base + d0 + d); }
                tile_b[d * KS + c] = v;
            }
            workgroupBarrier();
            for (var d = 0u; d < DK; d++) {
                var qv: array<f32, TR>;
                for (var a = 0u; a < TR; a++) { qv[a] = tile_a[d * AS + tr + a * RT]; }
                for (var b = 0u; b < TK; b++) {
                    let kv = tile_b[d * KS + tc + b * CT];
                    for (var a = 0u; a < TR; a++) { s[a * TK + b] = fma(qv[a], kv, s[a * TK + b]); }
                }
            }
            workgroupBarrier();
        }
        for (var a = 0u; a < TR; a++) {
            for (var b = 0u; b < TK; b++) { tile_a[(tc + b * CT) * AS + tr + a * RT] = s[a * TK + b]; }
        }
        workgroupBarrier();

        // Online softmax of row lid over this tile; masked keys get probability 0.
        if (lid < BM) {
            var mx = run_max;
            for (var c = 0u; c < BK; c++) {
                if (j0 + c <= my_last) { mx = max(mx, tile_a[c * AS + lid]); }
            }
            let alpha = exp2(run_max - mx);
            var sum = 0.0;
            for (var c = 0u; c < BK; c++) {
                let e = select(0.0, exp2(tile_a[c * AS + lid] - mx), j0 + c <= my_last);
                tile_a[c * AS + lid] = e;
                sum += e;
            }
            run_max = mx;
            run_sum = run_sum * alpha + sum;
            row_scale[lid] = alpha;
        }
        workgroupBarrier();
        for (var a = 0u; a < TR; a++) {
            let alpha = row_scale[tr + a * RT];
            for (var t = 0u; t < TD; t++) { o[a * TD + t] *= alpha; }
        }

        // O += P·V, KC keys of V at a time.
        for (var c0 = 0u; c0 < BK; c0 += KC) {
            for (var i = lid; i < KC * D; i += WG) {
                let c = i / D;
                let d = i % D;
                let j = j0 + c0 + c;
                var v = 0.0;
                if (j < n_keys && d < hd) { v = v_at(j * p.kv_stride + kv_base + d); }
                tile_b[c * D + d] = v;
            }
            workgroupBarrier();
            for (var c = 0u; c < KC; c++) {
                var pv: array<f32, TR>;
                for (var a = 0u; a < TR; a++) { pv[a] = tile_a[(c0 + c) * AS + tr + a * RT]; }
                for (var t = 0u; t < TD; t++) {
                    let vv = tile_b[c * D + tc + t * CT];
                    for (var a = 0u; a < TR; a++) { o[a * TD + t] = fma(pv[a], vv, o[a * TD + t]); }
                }
            }
            workgroupBarrier();
        }
    }

    if (lid < BM) { row_scale[lid] = 1.0 / run_sum; }
    workgroupBarrier();
    for (var a = 0u; a < TR; a++) {
        let r = tr + a * RT;
        let rr = r0 + r;
        if (rr < rows) {
            let base = (seg.row0 + rr / g) * p.q_stride + (kvh * g + rr % g) * hd;
            let inv = row_scale[r];
            for (var t = 0u; t < TD; t++) {
                let d = tc + t * CT;
                if (d < hd) { out[base + d] = o[a * TD + t] * inv; }
            }
        }
    }
}
