// Flash attention for prefill on cooperative matrices (16x16x16 f16 multiply-adds into f32),
// for heads of 64 or 128 dimensions over an f16 cache: the same rows, causal mask and online
// softmax as flash_attention.wgsl, with Q·Kᵀ and P·V on the matrix cores.
//
// A workgroup takes BM = 16 NSG rows of one KV head's GQA group (row r = token * group +
// head-in-group, as flash_attention.wgsl), 16 per subgroup (NSG subgroups: 4 for 64
// dimensions, 2 for 128, within 48 KiB of workgroup memory). Q (pre-scaled by log2(e) /
// sqrt(D), as f16) is staged in K's tile, each subgroup loading its fragments once;
// per tile of 64 keys:
// - K is staged as f16 and each subgroup computes its 16 x 64 scores (4 accumulators over 4
//   K steps of 16 dimensions), stored to its slice of workgroup memory;
// - lanes 2r and 2r + 1 of each subgroup take row r's 64 scores, 32 each (16-byte reads of
//   chunks h, h + 2, ..., h = lane % 2), and write the row's probabilities as f16;
// - V is staged as f16 (in a tile of its own, or in K's place) and each subgroup adds P·V to
//   its output, which stays in D / 16 accumulators for the whole loop.
// An accumulator cannot be scaled row by row, so the online softmax raises a row's max (the
// one its probabilities are taken against) only when a tile's max exceeds it by more than
// TH: probabilities stay below 2^TH (f16 holds them as precisely at any size), and only then
// does the subgroup take its output through workgroup memory to rescale it. Past the first
// tile that is rare (a new row max of 2^8 times the last). Before, the output was kept in
// plain registers and P·V went through workgroup memory every tile (run 169 on an H200: the
// kernel at TinyLlama's heads over 4,096 tokens 953 -> 858 µs, Llama-7B's 8,605 -> 8,348).
// For 64 dimensions the next tile's K and V are loaded into registers while this tile
// computes (PREFETCH), so the loads' latency hides behind the multiply-adds, and K and V have
// tiles of their own (SEP), Q staged through K's before the loop: the subgroups meet at two
// workgroup barriers a tile instead of four, each subgroup's scores and probabilities passing
// through its own slices behind subgroup barriers (run 195 on an H200: TinyLlama's heads over
// 4,096 tokens 835 -> 801 µs, pp4096 34,105 / 34,151 -> 34,496 / 34,399 tok/s).
// Subgroups of 32 in index order (as gemm_coop.wgsl), so lane = lid % 32.
// Header constants: NSG, WG (32 NSG), BM (16 NSG), BK (64 keys), D (64 or 128), PREFETCH. The
// chunk of rows comes from `segment(wid.z, lid)` as in flash_attention.wgsl. Needs
// common/coop_out.wgsl and common/half8.wgsl.

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
    n_split: u32,     // workgroups a row tile's keys are split among (1: no split)
    split_keys: u32,  // keys each takes (a multiple of BK)
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
// The caches as 16-byte vectors of words, eight halves a load (as f16 vectors they took two
// 8-byte loads), made halves as they are stored (common/half8.wgsl's halves_of_words). Rows
// start at multiples of 8 halves (D and the cache's row stride are).
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
// Split keys: each split's unnormalized output rows ([split][row][D / 4]), then each row's
// max and sum ([split][row], as (max, sum, 0, 0)), for flash_combine.wgsl.
@group(0) @binding(6) var<storage, read_write> partial: array<vec4<f32>>;

const LDS: u32 = D + 8u;       // f16 row stride of the Q, K and V tiles (bank padding)
const LDV: u32 = LDS / 4u;     // the same in vec4s (the tiles' elements)
// Row strides, in vec4s, of a subgroup's probabilities (f16, 16 x BK) and of its scores (f32,
// 16 x BK) or output (16 x D): 2 mod 8 vec4s, so that the lanes of a quarter of a subgroup
// (4 rows x 2 halves of a row) reach 8 different 16-byte banks.
const PS4: u32 = (BK + 8u) / 4u;
const SS4: u32 = (max(BK, D) + 8u) / 4u;
// The probabilities of a tile are taken relative to a row's max as last raised: it is raised
// (and the output accumulators rescaled) only when a tile's max exceeds it by more than TH
// (base 2), so probabilities stay below 2^TH and most tiles rescale nothing.
const TH: f32 = 8.0;

// SEP (64 dimensions): K and V tiles in buffers of their own, so that both are staged at once
// and the subgroups meet at two workgroup barriers a tile; within a subgroup, its scores and
// probabilities pass through workgroup memory behind subgroup barriers only. 128 dimensions:
// V in K's place (the tiles would not fit in 48 KiB), four workgroup barriers a tile. Q is
// staged through kv before the loop.
const SEP: bool = D == 64u;
var<workgroup> kv: array<vec4<f16>, BK * LDV>;
var<workgroup> vs: array<vec4<f16>, select(2u, BK * LDV, SEP)>;
var<workgroup> ss: array<vec4<f32>, NSG * 16u * SS4>;
var<workgroup> ps: array<vec4<f16>, NSG * 16u * PS4>;

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

// Four halves at half t (a multiple of 4) of vs (which == 2, SEP) or kv: one 8-byte store.
fn put4(t: u32, h: vec4<f16>, which: u32) {
    if (SEP && which == 2u) {
        vs[t / 4u] = h;
    } else {
        kv[t / 4u] = h;
    }
}

// Eight halves at half t (a multiple of 8) from a cache's words.
fn put8(t: u32, w: vec4<u32>, which: u32) {
    let h = halves_of_words(w);
    put4(t, h.lo, which);
    put4(t + 4u, h.hi, which);
}

// 8-half chunks of a K or V tile each invocation stages (BK x D halves: 4 for 64 dimensions
// and 4 subgroups, 16 for 128 and 2).
const KV_PER: u32 = BK * D / 8u / WG;
// PREFETCH (header, `flash_attention::coop_prefetches`): where that is a few registers, the
// next tile's K and V are loaded while this tile computes (held in registers, written to
// workgroup memory at the next tile); else each is loaded when it is staged.
// The registers that hold them (one, unused, without PREFETCH).
const PF_LEN: u32 = select(1u, KV_PER, PREFETCH);

// The i-th 8-half chunk of keys j0 .. j0 + BK of K (which_v false) or V, zeros past n_keys.
fn load_kv(i: u32, j0: u32, n_keys: u32, kv_base: u32, which_v: bool) -> vec4<u32> {
    let key = j0 + i / (D / 8u);
    let src = (min(key, n_keys - 1u) * p.kv_stride + kv_base) / 8u + i % (D / 8u);
    var w: vec4<u32>;
    if (which_v) { w = v_cache[src]; } else { w = k_cache[src]; }
    return select(vec4<u32>(0u), w, key < n_keys);
}

// Where the i-th chunk of a tile goes in kv, in halves.
fn tile_at(i: u32) -> u32 { return (i / (D / 8u)) * LDS + (i % (D / 8u)) * 8u; }

// This invocation's share of a tile (PREFETCH), held in registers ...
fn fetch_kv(lid: u32, j0: u32, n_keys: u32, kv_base: u32, which_v: bool) -> array<vec4<u32>, PF_LEN> {
    var r: array<vec4<u32>, PF_LEN>;
    for (var u = 0u; u < PF_LEN; u++) { r[u] = load_kv(lid + u * WG, j0, n_keys, kv_base, which_v); }
    return r;
}

// ... and written into the tile in kv.
fn put_kv(lid: u32, r: array<vec4<u32>, PF_LEN>, which: u32) {
    for (var u = 0u; u < PF_LEN; u++) { put8(tile_at(lid + u * WG), r[u], which); }
}

// Without PREFETCH, the tile loaded and stored STAGE_BATCH chunks at a time, a batch's loads
// in flight together in 32 registers (holding a whole tile's share in registers cost
// Llama-7B's 128-dimension heads 14% of pp512 on an H200, run 118). One 8-byte load at a time,
// each waiting on its own round trip, took Llama-7B's heads 146.6 µs at 512 tokens; batches of
// four 16-byte chunks 97.2, of eight 85.5 (runs 286-287; of 8 and 4 f16 vec4s 110.5 and 144.0).
const STAGE_BATCH: u32 = min(8u, KV_PER);
// Q's 4-value chunks each invocation stages (BM x D / 4 over WG: 8 for 64 dimensions, 16 for
// 128), loaded Q_BATCH at a time.
const Q_PER: u32 = BM * D / 4u / WG;
const Q_BATCH: u32 = min(8u, Q_PER);
const_assert BM * D / 4u == Q_PER * WG && Q_PER % Q_BATCH == 0u;
fn stage_kv(lid: u32, j0: u32, n_keys: u32, kv_base: u32, which_v: bool) {
    for (var i0 = 0u; i0 < KV_PER; i0 += STAGE_BATCH) {
        var r: array<vec4<u32>, STAGE_BATCH>;
        for (var u = 0u; u < STAGE_BATCH; u++) { r[u] = load_kv(lid + (i0 + u) * WG, j0, n_keys, kv_base, which_v); }
        for (var u = 0u; u < STAGE_BATCH; u++) { put8(tile_at(lid + (i0 + u) * WG), r[u], 1u); }
    }
}


// The output of a subgroup's 16 rows, in accumulators across the whole loop:
// common/coop_out.wgsl.

// The cooperative operations below run in subgroup-uniform control flow; in functions so that
// naga (whose analysis knows workgroup uniformity only) accepts them under a subgroup's branch.

// This subgroup's 16 x 64 scores of the K tile in kv, into its slice of ss, from its Q
// fragments q0 .. (16 dimensions each; D / 16 of them), loaded once before the loop (run 172:
// TinyLlama's heads over 4,096 tokens 854 -> 825 µs).
fn scores(q0: TileA, q1: TileA, q2: TileA, q3: TileA, q4: TileA, q5: TileA, q6: TileA, q7: TileA, slice4: u32) {
    var s0 = TileC();
    var s1 = TileC();
    var s2 = TileC();
    var s3 = TileC();
    for (var d0 = 0u; d0 < D; d0 += 16u) {
        var a = q0;
        switch d0 / 16u {
            case 1u: { a = q1; }
            case 2u: { a = q2; }
            case 3u: { a = q3; }
            case 4u: { a = q4; }
            case 5u: { a = q5; }
            case 6u: { a = q6; }
            case 7u: { a = q7; }
            default: {}
        }
        let b0 = coopLoad<TileB>(&kv[d0 / 4u], LDV);
        let b1 = coopLoad<TileB>(&kv[(16u * LDS + d0) / 4u], LDV);
        let b2 = coopLoad<TileB>(&kv[(32u * LDS + d0) / 4u], LDV);
        let b3 = coopLoad<TileB>(&kv[(48u * LDS + d0) / 4u], LDV);
        s0 = coopMultiplyAdd(a, b0, s0);
        s1 = coopMultiplyAdd(a, b1, s1);
        s2 = coopMultiplyAdd(a, b2, s2);
        s3 = coopMultiplyAdd(a, b3, s3);
    }
    coopStoreT(s0, &ss[slice4], SS4);
    coopStoreT(s1, &ss[slice4 + 4u], SS4);
    coopStoreT(s2, &ss[slice4 + 8u], SS4);
    coopStoreT(s3, &ss[slice4 + 12u], SS4);
}

// O += P·V: this subgroup's probabilities (ps) times the V tile in kv.
fn weigh(pslice4: u32) {
    for (var c0 = 0u; c0 < BK; c0 += 16u) {
        let a = coopLoadT<TileA>(&ps[pslice4 + c0 / 4u], PS4);
        var b0: TileB;
        var b1: TileB;
        var b2: TileB;
        var b3: TileB;
        if (SEP) {
            b0 = coopLoadT<TileB>(&vs[(c0 * LDS) / 4u], LDV);
            b1 = coopLoadT<TileB>(&vs[(c0 * LDS + 16u) / 4u], LDV);
            b2 = coopLoadT<TileB>(&vs[(c0 * LDS + 32u) / 4u], LDV);
            b3 = coopLoadT<TileB>(&vs[(c0 * LDS + 48u) / 4u], LDV);
        } else {
            b0 = coopLoadT<TileB>(&kv[(c0 * LDS) / 4u], LDV);
            b1 = coopLoadT<TileB>(&kv[(c0 * LDS + 16u) / 4u], LDV);
            b2 = coopLoadT<TileB>(&kv[(c0 * LDS + 32u) / 4u], LDV);
            b3 = coopLoadT<TileB>(&kv[(c0 * LDS + 48u) / 4u], LDV);
        }
        o0 = coopMultiplyAdd(a, b0, o0);
        o1 = coopMultiplyAdd(a, b1, o1);
        o2 = coopMultiplyAdd(a, b2, o2);
        o3 = coopMultiplyAdd(a, b3, o3);
        if (D == 128u) {
            let b4 = coopLoadT<TileB>(&kv[(c0 * LDS + 64u) / 4u], LDV);
            let b5 = coopLoadT<TileB>(&kv[(c0 * LDS + 80u) / 4u], LDV);
            let b6 = coopLoadT<TileB>(&kv[(c0 * LDS + 96u) / 4u], LDV);
            let b7 = coopLoadT<TileB>(&kv[(c0 * LDS + 112u) / 4u], LDV);
            o4 = coopMultiplyAdd(a, b4, o4);
            o5 = coopMultiplyAdd(a, b5, o5);
            o6 = coopMultiplyAdd(a, b6, o6);
            o7 = coopMultiplyAdd(a, b7, o7);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = p.group;
    let kvh = wid.y;
    // The chunk of one sequence this workgroup's rows belong to (`segment`, wid.z); grids
    // span the longest chunk, so a shorter one's surplus workgroups leave at once.
    let seg = segment(wid.z, lid);
    // Long contexts split a row tile's keys among n_split workgroups (wid.x = tile x n_split +
    // split), whose partial outputs flash_combine.wgsl merges: a prompt's last tiles would
    // otherwise leave most of the GPU idle (a 512-token step of TinyLlama: 256 workgroups).
    let n_split = max(p.n_split, 1u);
    let split = wid.x % n_split;
    if (wid.x / n_split >= seg.n_tiles) { return; }
    let tile = row_tile(seg, wid.x / n_split, BM, g);
    let r0 = tile.r0;
    let rows = tile.rows;
    let n_keys = tile.n_keys;
    let k_begin = split * p.split_keys;
    let k_end = select(n_keys, min(n_keys, k_begin + p.split_keys), n_split > 1u);
    let kv_base = seg.kv_off + kvh * D;
    let sg = lid / 32u;
    let lane = lid % 32u;

    // Q, scaled, as f16 (rows past the step: zeros), Q_BATCH loads in flight at once from
    // rows clamped inside the step. (Each load behind its row's check waited on its own round
    // trip: 8 of them, ~4.8 µs of a TinyLlama 512-token step's 25, H200 run 380.)
    for (var u0 = 0u; u0 < Q_PER; u0 += Q_BATCH) {
        var qv: array<vec4<f32>, Q_BATCH>;
        for (var u = 0u; u < Q_BATCH; u++) {
            let i = lid + (u0 + u) * WG;
            let rr = min(r0 + i / (D / 4u), max(rows, 1u) - 1u);
            qv[u] = q[((seg.row0 + rr / g) * p.q_stride + (kvh * g + rr % g) * D) / 4u + i % (D / 4u)];
        }
        for (var u = 0u; u < Q_BATCH; u++) {
            let i = lid + (u0 + u) * WG;
            let r = i / (D / 4u);
            let v = select(vec4<f32>(0.0), qv[u] * p.scale, r0 + r < rows);
            put4(r * LDS + (i % (D / 4u)) * 4u, vec4<f16>(v), 1u);
        }
    }

    // Lanes 2r and 2r + 1 take row r of the subgroup's 16: its last visible key, the max its
    // probabilities are relative to and their sum (both lanes hold them), and of each row of
    // scores, probabilities or output the 4-value chunks h, h + 2, h + 4, ... (h = lane % 2).
    let orow = lane / 2u;
    let h = lane % 2u;
    let my_last = seg.pos0 + min((r0 + sg * 16u + orow) / g, seg.m - 1u);
    var m_used = -3.0e38;
    var run_sum = 0.0;
    clear_o();
    let slice4 = sg * 16u * SS4;
    let pslice4 = sg * 16u * PS4;
    let srow = slice4 + orow * SS4 + h;
    let prow = pslice4 + orow * PS4 + h;
    // The subgroup's Q fragments (64 dimensions: the last four repeat the first, unused).
    let qa = sg * 16u * LDS;
    workgroupBarrier();
    let qf0 = coopLoadT<TileA>(&kv[qa / 4u], LDV);
    let qf1 = coopLoadT<TileA>(&kv[(qa + 16u) / 4u], LDV);
    let qf2 = coopLoadT<TileA>(&kv[(qa + 32u) / 4u], LDV);
    let qf3 = coopLoadT<TileA>(&kv[(qa + 48u) / 4u], LDV);
    let qf4 = coopLoadT<TileA>(&kv[(qa + select(0u, 64u, D == 128u)) / 4u], LDV);
    let qf5 = coopLoadT<TileA>(&kv[(qa + select(0u, 80u, D == 128u)) / 4u], LDV);
    let qf6 = coopLoadT<TileA>(&kv[(qa + select(0u, 96u, D == 128u)) / 4u], LDV);
    let qf7 = coopLoadT<TileA>(&kv[(qa + select(0u, 112u, D == 128u)) / 4u], LDV);

    // The next tile's share of K and V (PREFETCH).
    var k_next: array<vec4<u32>, PF_LEN>;
    var v_next: array<vec4<u32>, PF_LEN>;
    if (PREFETCH) {
        k_next = fetch_kv(lid, k_begin, n_keys, kv_base, false);
        v_next = fetch_kv(lid, k_begin, n_keys, kv_base, true);
    }
    for (var j0 = k_begin; j0 < k_end; j0 += BK) {
        workgroupBarrier();
        if (PREFETCH) { put_kv(lid, k_next, 1u); } else { stage_kv(lid, j0, n_keys, kv_base, false); }
        if (SEP) { put_kv(lid, v_next, 2u); }
        workgroupBarrier();
        // The next tile's K (and with SEP its V), in flight while this one's scores are taken.
        if (PREFETCH) { k_next = fetch_kv(lid, j0 + BK, n_keys, kv_base, false); }
        if (SEP) { v_next = fetch_kv(lid, j0 + BK, n_keys, kv_base, true); }
        scores(qf0, qf1, qf2, qf3, qf4, qf5, qf6, qf7, slice4);
        if (SEP) { subgroupBarrier(); } else { workgroupBarrier(); }

        // Online softmax of row orow, half a tile per lane (16-byte reads); masked keys get
        // probability 0.
        var sc: array<vec4<f32>, BK / 8u>;
        var mx = -3.0e38;
        for (var c = 0u; c < BK / 8u; c++) {
            let key = j0 + (2u * c + h) * 4u;
            let vis = vec4<u32>(key, key + 1u, key + 2u, key + 3u) <= vec4<u32>(my_last);
            sc[c] = select(vec4<f32>(-3.0e38), ss[srow + 2u * c], vis);
            mx = max(mx, max(max(sc[c].x, sc[c].y), max(sc[c].z, sc[c].w)));
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        let raise = mx > m_used + TH;
        let m_new = select(m_used, mx, raise);
        let alpha = exp2(m_used - m_new);
        m_used = m_new;
        var sum = 0.0;
        for (var c = 0u; c < BK / 8u; c++) {
            let e = exp2(sc[c] - m_used);
            ps[prow + 2u * c] = vec4<f16>(e);
            sum += (e.x + e.y) + (e.z + e.w);
        }
        sum += subgroupShuffleXor(sum, 1u);
        run_sum = run_sum * alpha + sum;
        // A raised max rescales the subgroup's output (rarely past the first tile, where the
        // output is still zero): out to ss (its scores are all read), scaled, back.
        let rescale = subgroupAny(raise) && j0 > k_begin;
        if (rescale) { store_o(slice4); }
        if (SEP) { subgroupBarrier(); } else { workgroupBarrier(); }
        if (!SEP) {
            if (PREFETCH) { put_kv(lid, v_next, 1u); } else { stage_kv(lid, j0, n_keys, kv_base, true); }
        }
        if (rescale) {
            for (var c = 0u; c < D / 8u; c++) { ss[srow + 2u * c] *= alpha; }
        }
        if (SEP) { subgroupBarrier(); } else { workgroupBarrier(); }
        if (PREFETCH && !SEP) { v_next = fetch_kv(lid, j0 + BK, n_keys, kv_base, true); }
        if (rescale) { load_o(slice4); }
        weigh(pslice4);
    }

    workgroupBarrier();
    store_o(slice4);
    workgroupBarrier();
    let rr = r0 + sg * 16u + orow;
    if (rr < rows) {
        let row = (seg.row0 + rr / g) * (p.q_stride / D) + kvh * g + rr % g;
        let base = row * (D / 4u);
        if (n_split == 1u) {
            let inv = 1.0 / run_sum;
            for (var c = 0u; c < D / 8u; c++) { out[base + 2u * c + h] = ss[srow + 2u * c] * inv; }
        } else {
            // A split that shows the row no key leaves its max at -3e38 (its masked keys'
            // probabilities, exp2(0), then mean nothing): the combine pass weighs it 0.
            let n_rows = p.m * (p.q_stride / D);
            let at = split * n_rows * (D / 4u) + base;
            for (var c = 0u; c < D / 8u; c++) { partial[at + 2u * c + h] = ss[srow + 2u * c]; }
            if (h == 0u) { partial[n_split * n_rows * (D / 4u) + split * n_rows + row] = vec4<f32>(m_used, run_sum, 0.0, 0.0); }
        }
    }
}
