// Flash attention for prefill on cooperative matrices (16x16x16 f16 multiply-adds into f32),
// for heads of 64 or 128 dimensions over an f16 cache: the same rows, causal mask and online
// softmax as flash_attention.wgsl, with Q·Kᵀ and P·V on the matrix cores.
//
// A workgroup takes BM = 16 NSG rows of one KV head's GQA group (row r = token * group +
// head-in-group, as flash_attention.wgsl), 16 per subgroup (NSG subgroups: 4 for 64
// dimensions, 2 for 128, within 48 KiB of workgroup memory). Q (pre-scaled by log2(e) /
// sqrt(D), as f16) stays in workgroup memory; per tile of 64 keys:
// - K is staged as f16 and each subgroup computes its 16 x 64 scores (4 accumulators over 4
//   K steps of 16 dimensions), stored to its slice of workgroup memory;
// - lanes 2r and 2r + 1 of each subgroup take row r's 64 scores, 32 each, and update its
//   running max and sum (combined across the pair with a subgroup shuffle), writing the
//   row's probabilities as f16;
// - V is staged as f16 in K's place and each subgroup computes P·V (4 accumulators of 16
//   dimensions over 4 K steps of 16 keys, twice for 128), stored to its slice; every lane
//   then updates its 8 outputs per 16 dimensions in registers: O = alpha O + P·V (an
//   accumulator cannot be scaled per row, so O lives in plain registers).
// For 64 dimensions the next tile's K and V are loaded into registers while this tile
// computes (PREFETCH), so the loads' latency hides behind the multiply-adds.
// Subgroups of 32 in index order (as gemm_coop.wgsl), so lane = lid % 32.
// Header constants: NSG, WG (32 NSG), BM (16 NSG), BK (64 keys), D (64 or 128), SS (the larger
// of BK and D, plus 4 against bank conflicts). The chunk of rows comes from
// `segment(wid.z, lid)` as in flash_attention.wgsl.

struct Params {
    m: u32,
    pos0: u32,
    head_dim: u32,
    group: u32,
    q_stride: u32,
    kv_stride: u32,
    scale: f32,
    n_tiles: u32,
    kv_off: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

const LDS: u32 = D + 8u;       // f16 row stride of Q and K/V tiles (bank padding)
const PS: u32 = BK + 8u;       // f16 row stride of a subgroup's probabilities
// SS: f32 row stride of a subgroup's scores (16 x BK) and then its P·V (16 x D).

var<workgroup> qs: array<f16, BM * LDS>;
var<workgroup> kv: array<f16, BK * LDS>;
var<workgroup> ss: array<f32, NSG * 16u * SS>;
var<workgroup> ps: array<f16, NSG * 16u * PS>;

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

// Four halves at t of qs (which == 0) or kv.
fn put4(t: u32, h: vec4<f16>, which: u32) {
    if (which == 0u) {
        qs[t] = h.x;
        qs[t + 1u] = h.y;
        qs[t + 2u] = h.z;
        qs[t + 3u] = h.w;
    } else {
        kv[t] = h.x;
        kv[t + 1u] = h.y;
        kv[t + 2u] = h.z;
        kv[t + 3u] = h.w;
    }
}

// vec4s of a K or V tile each invocation stages (BK x D halves: 8 for 64 dimensions and 4
// subgroups, 32 for 128 and 2).
const KV_PER: u32 = BK * D / 4u / WG;
// Where that is a few registers, the next tile's K and V are loaded while this tile computes
// (held in registers, written to workgroup memory at the next tile); else each is loaded
// when it is staged.
const PREFETCH: bool = KV_PER <= 8u;
// The registers that hold them (one, unused, without PREFETCH).
const PF_LEN: u32 = select(1u, KV_PER, PREFETCH);

// The i-th vec4 of keys j0 .. j0 + BK of K (which_v false) or V, zeros past n_keys.
fn load_kv(i: u32, j0: u32, n_keys: u32, kv_base: u32, which_v: bool) -> vec4<f16> {
    let key = j0 + i / (D / 4u);
    let src = (min(key, n_keys - 1u) * p.kv_stride + kv_base) / 4u + i % (D / 4u);
    var h: vec4<f16>;
    if (which_v) { h = v_cache[src]; } else { h = k_cache[src]; }
    return select(vec4<f16>(0.0), h, key < n_keys);
}

// Where the i-th vec4 of a tile goes in kv.
fn tile_at(i: u32) -> u32 { return (i / (D / 4u)) * LDS + (i % (D / 4u)) * 4u; }

// This invocation's share of a tile (PREFETCH), held in registers ...
fn fetch_kv(lid: u32, j0: u32, n_keys: u32, kv_base: u32, which_v: bool) -> array<vec4<f16>, PF_LEN> {
    var r: array<vec4<f16>, PF_LEN>;
    for (var u = 0u; u < PF_LEN; u++) { r[u] = load_kv(lid + u * WG, j0, n_keys, kv_base, which_v); }
    return r;
}

// ... and written into the tile in kv.
fn put_kv(lid: u32, r: array<vec4<f16>, PF_LEN>) {
    for (var u = 0u; u < PF_LEN; u++) { put4(tile_at(lid + u * WG), r[u], 1u); }
}

// Without PREFETCH, the tile loaded and stored value by value (holding a whole tile's share
// in registers cost Llama-7B's 128-dimension heads 14% of pp512 on an H200, run 118).
fn stage_kv(lid: u32, j0: u32, n_keys: u32, kv_base: u32, which_v: bool) {
    for (var i = lid; i < BK * D / 4u; i += WG) { put4(tile_at(i), load_kv(i, j0, n_keys, kv_base, which_v), 1u); }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
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
    let kv_base = seg.kv_off + kvh * D;
    let sg = lid / 32u;
    let lane = lid % 32u;

    // Q, scaled, as f16 (rows past the step: zeros).
    for (var i = lid; i < BM * D / 4u; i += WG) {
        let r = i / (D / 4u);
        let d4 = i % (D / 4u);
        let rr = r0 + r;
        var v = vec4<f32>(0.0);
        if (rr < rows) {
            v = q[((seg.row0 + rr / g) * p.q_stride + (kvh * g + rr % g) * D) / 4u + d4] * p.scale;
        }
        put4(r * LDS + d4 * 4u, vec4<f16>(v), 0u);
    }

    // Lanes 2r and 2r + 1: row r of the subgroup's 16, its last visible key, running max and
    // sum (both lanes hold them), keys (l % 2) * 32 .. + 32 of each tile for the softmax, and
    // dimensions (l % 2) * 8 .. + 8 of each 16-dimension chunk of the output (4 chunks).
    let orow = lane / 2u;
    let my_last = seg.pos0 + min((r0 + sg * 16u + orow) / g, seg.m - 1u);
    let khalf = (lane % 2u) * 32u;
    var run_max = -3.0e38;
    var run_sum = 0.0;
    var o0 = vec4<f32>(0.0); var o1 = vec4<f32>(0.0);
    var o2 = vec4<f32>(0.0); var o3 = vec4<f32>(0.0);
    var o4 = vec4<f32>(0.0); var o5 = vec4<f32>(0.0);
    var o6 = vec4<f32>(0.0); var o7 = vec4<f32>(0.0);
    // Dimensions 64 .. 127 (D = 128).
    var o8 = vec4<f32>(0.0); var o9 = vec4<f32>(0.0);
    var o10 = vec4<f32>(0.0); var o11 = vec4<f32>(0.0);
    var o12 = vec4<f32>(0.0); var o13 = vec4<f32>(0.0);
    var o14 = vec4<f32>(0.0); var o15 = vec4<f32>(0.0);
    let ocol = (lane % 2u) * 8u;
    let slice = sg * 16u * SS;
    let pslice = sg * 16u * PS;
    let qa = sg * 16u * LDS;

    // The next tile's share of K and V (PREFETCH).
    var k_next: array<vec4<f16>, PF_LEN>;
    var v_next: array<vec4<f16>, PF_LEN>;
    if (PREFETCH) {
        k_next = fetch_kv(lid, 0u, n_keys, kv_base, false);
        v_next = fetch_kv(lid, 0u, n_keys, kv_base, true);
    }
    for (var j0 = 0u; j0 < n_keys; j0 += BK) {
        workgroupBarrier();
        if (PREFETCH) { put_kv(lid, k_next); } else { stage_kv(lid, j0, n_keys, kv_base, false); }
        workgroupBarrier();
        // The next tile's K, in flight while this one's scores are taken.
        if (PREFETCH) { k_next = fetch_kv(lid, j0 + BK, n_keys, kv_base, false); }
        // Scores: 16 rows x 64 keys, over 4 steps of 16 dimensions.
        var s0 = TileC();
        var s1 = TileC();
        var s2 = TileC();
        var s3 = TileC();
        for (var d0 = 0u; d0 < D; d0 += 16u) {
            let a = coopLoadT<TileA>(&qs[qa + d0], LDS);
            let b0 = coopLoad<TileB>(&kv[d0], LDS);
            let b1 = coopLoad<TileB>(&kv[16u * LDS + d0], LDS);
            let b2 = coopLoad<TileB>(&kv[32u * LDS + d0], LDS);
            let b3 = coopLoad<TileB>(&kv[48u * LDS + d0], LDS);
            s0 = coopMultiplyAdd(a, b0, s0);
            s1 = coopMultiplyAdd(a, b1, s1);
            s2 = coopMultiplyAdd(a, b2, s2);
            s3 = coopMultiplyAdd(a, b3, s3);
        }
        coopStoreT(s0, &ss[slice], SS);
        coopStoreT(s1, &ss[slice + 16u], SS);
        coopStoreT(s2, &ss[slice + 32u], SS);
        coopStoreT(s3, &ss[slice + 48u], SS);
        workgroupBarrier();

        // Online softmax of row orow, half a tile per lane; masked keys get probability 0.
        // The lane's 32 scores are read from workgroup memory once, into registers.
        let srow = slice + orow * SS + khalf;
        var sc: array<f32, 32>;
        var mx = run_max;
        for (var c = 0u; c < 32u; c++) {
            sc[c] = ss[srow + c];
            if (j0 + khalf + c <= my_last) { mx = max(mx, sc[c]); }
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        let alpha = exp2(run_max - mx);
        var sum = 0.0;
        for (var c = 0u; c < 32u; c++) {
            let e = select(0.0, exp2(sc[c] - mx), j0 + khalf + c <= my_last);
            ps[pslice + orow * PS + khalf + c] = f16(e);
            sum += e;
        }
        sum += subgroupShuffleXor(sum, 1u);
        run_max = mx;
        run_sum = run_sum * alpha + sum;
        workgroupBarrier();
        if (PREFETCH) { put_kv(lid, v_next); } else { stage_kv(lid, j0, n_keys, kv_base, true); }
        workgroupBarrier();
        if (PREFETCH) { v_next = fetch_kv(lid, j0 + BK, n_keys, kv_base, true); }
        // P·V: 16 rows x D dimensions, over 4 steps of 16 keys.
        var v0 = TileC();
        var v1 = TileC();
        var v2 = TileC();
        var v3 = TileC();
        var v4 = TileC();
        var v5 = TileC();
        var v6 = TileC();
        var v7 = TileC();
        for (var c0 = 0u; c0 < BK; c0 += 16u) {
            let a = coopLoadT<TileA>(&ps[pslice + c0], PS);
            let b0 = coopLoadT<TileB>(&kv[c0 * LDS], LDS);
            let b1 = coopLoadT<TileB>(&kv[c0 * LDS + 16u], LDS);
            let b2 = coopLoadT<TileB>(&kv[c0 * LDS + 32u], LDS);
            let b3 = coopLoadT<TileB>(&kv[c0 * LDS + 48u], LDS);
            v0 = coopMultiplyAdd(a, b0, v0);
            v1 = coopMultiplyAdd(a, b1, v1);
            v2 = coopMultiplyAdd(a, b2, v2);
            v3 = coopMultiplyAdd(a, b3, v3);
            if (D == 128u) {
                let b4 = coopLoadT<TileB>(&kv[c0 * LDS + 64u], LDS);
                let b5 = coopLoadT<TileB>(&kv[c0 * LDS + 80u], LDS);
                let b6 = coopLoadT<TileB>(&kv[c0 * LDS + 96u], LDS);
                let b7 = coopLoadT<TileB>(&kv[c0 * LDS + 112u], LDS);
                v4 = coopMultiplyAdd(a, b4, v4);
                v5 = coopMultiplyAdd(a, b5, v5);
                v6 = coopMultiplyAdd(a, b6, v6);
                v7 = coopMultiplyAdd(a, b7, v7);
            }
        }
        coopStoreT(v0, &ss[slice], SS);
        coopStoreT(v1, &ss[slice + 16u], SS);
        coopStoreT(v2, &ss[slice + 32u], SS);
        coopStoreT(v3, &ss[slice + 48u], SS);
        if (D == 128u) {
            coopStoreT(v4, &ss[slice + 64u], SS);
            coopStoreT(v5, &ss[slice + 80u], SS);
            coopStoreT(v6, &ss[slice + 96u], SS);
            coopStoreT(v7, &ss[slice + 112u], SS);
        }
        workgroupBarrier();
        let t = slice + orow * SS + ocol;
        o0 = alpha * o0 + vec4<f32>(ss[t], ss[t + 1u], ss[t + 2u], ss[t + 3u]);
        o1 = alpha * o1 + vec4<f32>(ss[t + 4u], ss[t + 5u], ss[t + 6u], ss[t + 7u]);
        o2 = alpha * o2 + vec4<f32>(ss[t + 16u], ss[t + 17u], ss[t + 18u], ss[t + 19u]);
        o3 = alpha * o3 + vec4<f32>(ss[t + 20u], ss[t + 21u], ss[t + 22u], ss[t + 23u]);
        o4 = alpha * o4 + vec4<f32>(ss[t + 32u], ss[t + 33u], ss[t + 34u], ss[t + 35u]);
        o5 = alpha * o5 + vec4<f32>(ss[t + 36u], ss[t + 37u], ss[t + 38u], ss[t + 39u]);
        o6 = alpha * o6 + vec4<f32>(ss[t + 48u], ss[t + 49u], ss[t + 50u], ss[t + 51u]);
        o7 = alpha * o7 + vec4<f32>(ss[t + 52u], ss[t + 53u], ss[t + 54u], ss[t + 55u]);
        if (D == 128u) {
            o8 = alpha * o8 + vec4<f32>(ss[t + 64u], ss[t + 65u], ss[t + 66u], ss[t + 67u]);
            o9 = alpha * o9 + vec4<f32>(ss[t + 68u], ss[t + 69u], ss[t + 70u], ss[t + 71u]);
            o10 = alpha * o10 + vec4<f32>(ss[t + 80u], ss[t + 81u], ss[t + 82u], ss[t + 83u]);
            o11 = alpha * o11 + vec4<f32>(ss[t + 84u], ss[t + 85u], ss[t + 86u], ss[t + 87u]);
            o12 = alpha * o12 + vec4<f32>(ss[t + 96u], ss[t + 97u], ss[t + 98u], ss[t + 99u]);
            o13 = alpha * o13 + vec4<f32>(ss[t + 100u], ss[t + 101u], ss[t + 102u], ss[t + 103u]);
            o14 = alpha * o14 + vec4<f32>(ss[t + 112u], ss[t + 113u], ss[t + 114u], ss[t + 115u]);
            o15 = alpha * o15 + vec4<f32>(ss[t + 116u], ss[t + 117u], ss[t + 118u], ss[t + 119u]);
        }
    }

    let rr = r0 + sg * 16u + orow;
    if (rr < rows) {
        let inv = 1.0 / run_sum;
        let base = ((seg.row0 + rr / g) * p.q_stride + (kvh * g + rr % g) * D + ocol) / 4u;
        out[base] = o0 * inv;
        out[base + 1u] = o1 * inv;
        out[base + 4u] = o2 * inv;
        out[base + 5u] = o3 * inv;
        out[base + 8u] = o4 * inv;
        out[base + 9u] = o5 * inv;
        out[base + 12u] = o6 * inv;
        out[base + 13u] = o7 * inv;
        if (D == 128u) {
            out[base + 16u] = o8 * inv;
            out[base + 17u] = o9 * inv;
            out[base + 20u] = o10 * inv;
            out[base + 21u] = o11 * inv;
            out[base + 24u] = o12 * inv;
            out[base + 25u] = o13 * inv;
            out[base + 28u] = o14 * inv;
            out[base + 29u] = o15 * inv;
        }
    }
}
