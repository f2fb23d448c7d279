// Decode attention on cooperative matrices (attention_decode_coop.wgsl): a subgroup's tile
// straight from the cache into fragments, K as the column-major B of Q·Kᵀ and V as the
// row-major B of P·V, every load of a tile in flight together (V's with K's for 64 dimensions,
// before Q has arrived). For 128-dimension heads, and 64-key tiles, whose workgroup memory
// would not hold the staged tiles (common/decode_coop_staged.wgsl).

@group(0) @binding(2) var<storage, read> k_cache: array<f16>;
@group(0) @binding(3) var<storage, read> v_cache: array<f16>;

// The subgroup's fragments, each named (arrays of cooperative matrices may live in slow
// memory): K's kDC (16 dimensions D, 16 keys C), V's vCD; the output's (oD) are in
// common/coop_out.wgsl.
var<private> k00: TileB; var<private> k01: TileB; var<private> k02: TileB; var<private> k03: TileB;
var<private> k10: TileB; var<private> k11: TileB; var<private> k12: TileB; var<private> k13: TileB;
var<private> k20: TileB; var<private> k21: TileB; var<private> k22: TileB; var<private> k23: TileB;
var<private> k30: TileB; var<private> k31: TileB; var<private> k32: TileB; var<private> k33: TileB;
var<private> k40: TileB; var<private> k41: TileB; var<private> k42: TileB; var<private> k43: TileB;
var<private> k50: TileB; var<private> k51: TileB; var<private> k52: TileB; var<private> k53: TileB;
var<private> k60: TileB; var<private> k61: TileB; var<private> k62: TileB; var<private> k63: TileB;
var<private> k70: TileB; var<private> k71: TileB; var<private> k72: TileB; var<private> k73: TileB;
var<private> v00: TileB; var<private> v01: TileB; var<private> v02: TileB; var<private> v03: TileB;
var<private> v04: TileB; var<private> v05: TileB; var<private> v06: TileB; var<private> v07: TileB;
var<private> v10: TileB; var<private> v11: TileB; var<private> v12: TileB; var<private> v13: TileB;
var<private> v14: TileB; var<private> v15: TileB; var<private> v16: TileB; var<private> v17: TileB;
var<private> v20: TileB; var<private> v21: TileB; var<private> v22: TileB; var<private> v23: TileB;
var<private> v24: TileB; var<private> v25: TileB; var<private> v26: TileB; var<private> v27: TileB;
var<private> v30: TileB; var<private> v31: TileB; var<private> v32: TileB; var<private> v33: TileB;
var<private> v34: TileB; var<private> v35: TileB; var<private> v36: TileB; var<private> v37: TileB;
// The cooperative operations and subgroup barriers run in subgroup-uniform control flow; in
// functions so that naga (whose analysis knows workgroup uniformity only) accepts them there.

// Fragments of the tile whose first key's first dimension is element r of the cache.
fn kfrag(r: u32, key: u32, d0: u32) -> TileB {
    return coopLoad<TileB>(&k_cache[r + key * p.kv_stride + d0], p.kv_stride);
}

fn vfrag(r: u32, key: u32, d0: u32) -> TileB {
    return coopLoadT<TileB>(&v_cache[r + key * p.kv_stride + d0], p.kv_stride);
}

// Key chunk c (keys 16c .. 16c + 15 of the tile) of K's fragments kDC, for every
// 16-dimension chunk D, and of V's, vCD.
fn load_k(r: u32) {
    k00 = kfrag(r, 0u, 0u); k10 = kfrag(r, 0u, 16u); k20 = kfrag(r, 0u, 32u); k30 = kfrag(r, 0u, 48u);
    if (D == 128u) {
        k40 = kfrag(r, 0u, 64u); k50 = kfrag(r, 0u, 80u); k60 = kfrag(r, 0u, 96u);
        k70 = kfrag(r, 0u, 112u);
    }
    if (BK >= 32u) {
        k01 = kfrag(r, 16u, 0u); k11 = kfrag(r, 16u, 16u); k21 = kfrag(r, 16u, 32u); k31 = kfrag(r, 16u, 48u);
        if (D == 128u) {
            k41 = kfrag(r, 16u, 64u); k51 = kfrag(r, 16u, 80u); k61 = kfrag(r, 16u, 96u);
            k71 = kfrag(r, 16u, 112u);
        }
    }
    if (BK == 64u) {
        k02 = kfrag(r, 32u, 0u); k12 = kfrag(r, 32u, 16u); k22 = kfrag(r, 32u, 32u);
        k32 = kfrag(r, 32u, 48u); k03 = kfrag(r, 48u, 0u); k13 = kfrag(r, 48u, 16u);
        k23 = kfrag(r, 48u, 32u); k33 = kfrag(r, 48u, 48u);
        if (D == 128u) {
            k42 = kfrag(r, 32u, 64u); k52 = kfrag(r, 32u, 80u); k62 = kfrag(r, 32u, 96u);
            k72 = kfrag(r, 32u, 112u); k43 = kfrag(r, 48u, 64u); k53 = kfrag(r, 48u, 80u);
            k63 = kfrag(r, 48u, 96u); k73 = kfrag(r, 48u, 112u);
        }
    }
}

fn load_v(r: u32) {
    v00 = vfrag(r, 0u, 0u); v01 = vfrag(r, 0u, 16u); v02 = vfrag(r, 0u, 32u); v03 = vfrag(r, 0u, 48u);
    if (D == 128u) {
        v04 = vfrag(r, 0u, 64u); v05 = vfrag(r, 0u, 80u); v06 = vfrag(r, 0u, 96u);
        v07 = vfrag(r, 0u, 112u);
    }
    if (BK >= 32u) {
        v10 = vfrag(r, 16u, 0u); v11 = vfrag(r, 16u, 16u); v12 = vfrag(r, 16u, 32u); v13 = vfrag(r, 16u, 48u);
        if (D == 128u) {
            v14 = vfrag(r, 16u, 64u); v15 = vfrag(r, 16u, 80u); v16 = vfrag(r, 16u, 96u);
            v17 = vfrag(r, 16u, 112u);
        }
    }
    if (BK == 64u) {
        v20 = vfrag(r, 32u, 0u); v21 = vfrag(r, 32u, 16u); v22 = vfrag(r, 32u, 32u);
        v23 = vfrag(r, 32u, 48u); v30 = vfrag(r, 48u, 0u); v31 = vfrag(r, 48u, 16u);
        v32 = vfrag(r, 48u, 32u); v33 = vfrag(r, 48u, 48u);
        if (D == 128u) {
            v24 = vfrag(r, 32u, 64u); v25 = vfrag(r, 32u, 80u); v26 = vfrag(r, 32u, 96u);
            v27 = vfrag(r, 32u, 112u); v34 = vfrag(r, 48u, 64u); v35 = vfrag(r, 48u, 80u);
            v36 = vfrag(r, 48u, 96u); v37 = vfrag(r, 48u, 112u);
        }
    }
}

// The tile's 16 x BK scores from Q's fragments (qs), into the subgroup's slice of ss.
fn scores(slice4: u32) {
    let q0 = coopLoadT<TileA>(&qs[0], LDQ);
    let q1 = coopLoadT<TileA>(&qs[16], LDQ);
    let q2 = coopLoadT<TileA>(&qs[32], LDQ);
    let q3 = coopLoadT<TileA>(&qs[48], LDQ);
    let q4 = coopLoadT<TileA>(&qs[select(0u, 64u, D == 128u)], LDQ);
    let q5 = coopLoadT<TileA>(&qs[select(0u, 80u, D == 128u)], LDQ);
    let q6 = coopLoadT<TileA>(&qs[select(0u, 96u, D == 128u)], LDQ);
    let q7 = coopLoadT<TileA>(&qs[select(0u, 112u, D == 128u)], LDQ);
    var s0 = TileC();
    var s1 = TileC();
    var s2 = TileC();
    var s3 = TileC();
    s0 = coopMultiplyAdd(q0, k00, s0); s0 = coopMultiplyAdd(q1, k10, s0);
    s0 = coopMultiplyAdd(q2, k20, s0); s0 = coopMultiplyAdd(q3, k30, s0);
    if (D == 128u) {
        s0 = coopMultiplyAdd(q4, k40, s0); s0 = coopMultiplyAdd(q5, k50, s0);
        s0 = coopMultiplyAdd(q6, k60, s0); s0 = coopMultiplyAdd(q7, k70, s0);
    }
    if (BK >= 32u) {
        s1 = coopMultiplyAdd(q0, k01, s1); s1 = coopMultiplyAdd(q1, k11, s1);
        s1 = coopMultiplyAdd(q2, k21, s1); s1 = coopMultiplyAdd(q3, k31, s1);
        if (D == 128u) {
            s1 = coopMultiplyAdd(q4, k41, s1); s1 = coopMultiplyAdd(q5, k51, s1);
            s1 = coopMultiplyAdd(q6, k61, s1); s1 = coopMultiplyAdd(q7, k71, s1);
        }
    }
    if (BK == 64u) {
        s2 = coopMultiplyAdd(q0, k02, s2); s2 = coopMultiplyAdd(q1, k12, s2);
        s2 = coopMultiplyAdd(q2, k22, s2); s2 = coopMultiplyAdd(q3, k32, s2);
        s3 = coopMultiplyAdd(q0, k03, s3); s3 = coopMultiplyAdd(q1, k13, s3);
        s3 = coopMultiplyAdd(q2, k23, s3); s3 = coopMultiplyAdd(q3, k33, s3);
        if (D == 128u) {
            s2 = coopMultiplyAdd(q4, k42, s2); s2 = coopMultiplyAdd(q5, k52, s2);
            s2 = coopMultiplyAdd(q6, k62, s2); s2 = coopMultiplyAdd(q7, k72, s2);
            s3 = coopMultiplyAdd(q4, k43, s3); s3 = coopMultiplyAdd(q5, k53, s3);
            s3 = coopMultiplyAdd(q6, k63, s3); s3 = coopMultiplyAdd(q7, k73, s3);
        }
    }
    coopStoreT(s0, &ss[slice4], SS4);
    if (BK >= 32u) { coopStoreT(s1, &ss[slice4 + 4u], SS4); }
    if (BK == 64u) { coopStoreT(s2, &ss[slice4 + 8u], SS4); coopStoreT(s3, &ss[slice4 + 12u], SS4); }
    subgroupBarrier();
}

// O = P·V: the subgroup's probabilities (ps) times the V fragments.
fn weigh(pslice4: u32) {
    subgroupBarrier();
    let a0 = coopLoadT<TileA>(&ps[pslice4 + 0u], PS4); o0 = coopMultiplyAdd(a0, v00, o0);
    o1 = coopMultiplyAdd(a0, v01, o1); o2 = coopMultiplyAdd(a0, v02, o2);
    o3 = coopMultiplyAdd(a0, v03, o3);
    if (D == 128u) {
        o4 = coopMultiplyAdd(a0, v04, o4); o5 = coopMultiplyAdd(a0, v05, o5);
        o6 = coopMultiplyAdd(a0, v06, o6); o7 = coopMultiplyAdd(a0, v07, o7);
    }
    if (BK >= 32u) {
        let a1 = coopLoadT<TileA>(&ps[pslice4 + 4u], PS4); o0 = coopMultiplyAdd(a1, v10, o0);
        o1 = coopMultiplyAdd(a1, v11, o1); o2 = coopMultiplyAdd(a1, v12, o2);
        o3 = coopMultiplyAdd(a1, v13, o3);
        if (D == 128u) {
            o4 = coopMultiplyAdd(a1, v14, o4); o5 = coopMultiplyAdd(a1, v15, o5);
            o6 = coopMultiplyAdd(a1, v16, o6); o7 = coopMultiplyAdd(a1, v17, o7);
        }
    }
    if (BK == 64u) {
        let a2 = coopLoadT<TileA>(&ps[pslice4 + 8u], PS4);
        let a3 = coopLoadT<TileA>(&ps[pslice4 + 12u], PS4); o0 = coopMultiplyAdd(a2, v20, o0);
        o1 = coopMultiplyAdd(a2, v21, o1); o2 = coopMultiplyAdd(a2, v22, o2);
        o3 = coopMultiplyAdd(a2, v23, o3); o0 = coopMultiplyAdd(a3, v30, o0);
        o1 = coopMultiplyAdd(a3, v31, o1); o2 = coopMultiplyAdd(a3, v32, o2);
        o3 = coopMultiplyAdd(a3, v33, o3);
        if (D == 128u) {
            o4 = coopMultiplyAdd(a2, v24, o4); o5 = coopMultiplyAdd(a2, v25, o5);
            o6 = coopMultiplyAdd(a2, v26, o6); o7 = coopMultiplyAdd(a2, v27, o7);
            o4 = coopMultiplyAdd(a3, v34, o4); o5 = coopMultiplyAdd(a3, v35, o5);
            o6 = coopMultiplyAdd(a3, v36, o6); o7 = coopMultiplyAdd(a3, v37, o7);
        }
    }
}

// The tile's path, as common/decode_coop_staged.wgsl's: its loads issued, its scores into ss,
// then P·V into the output accumulators.
fn tile_load(lane: u32, sg: u32, row: u32) {
    load_k(row);
    if (D == 64u) { load_v(row); }
}

fn tile_scores(lane: u32, sg: u32, slice4: u32) {
    scores(slice4);
}

fn tile_weigh(lane: u32, sg: u32, row: u32, pslice4: u32) {
    if (D == 128u) { load_v(row); }
    weigh(pslice4);
}
