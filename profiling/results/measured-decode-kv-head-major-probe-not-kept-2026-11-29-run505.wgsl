// Decode attention on cooperative matrices (attention_decode_coop.wgsl): a subgroup's tile
// (64-dimension heads, tiles of 16 or 32 keys) loaded as 16-byte vectors (below), K's and V's all in
// flight together into registers before Q has arrived, then through the subgroup's own slice of
// workgroup memory (K, then V in its place) into fragments. Against fragments straight from the
// cache (common/decode_coop_direct.wgsl) on an H200 (runs 205-206): the split kernel at 1,024 /
// 4,096 positions 4.5 / 5.6 -> 3.9 / 4.8 µs, TinyLlama Q4_K_M tg128 at depth 1024 / 4096
// 939-944 / 908-912 -> 950-954 / 913-917 tok/s. (Both paths in one shader, the other's calls
// dead behind a constant, returned NaN from the direct one on the H200: a file each.)

// The cache as 16-byte vectors of words, eight halves a load: read as f16 (four 2-byte loads
// a vec4, which NVIDIA's compiler does not merge: it cannot know their alignment) it took
// a load instruction per 2 bytes. The words become halves as they are stored
// (common/half8.wgsl's halves_of_words). Rows start at multiples of 8 halves (D and the
// cache's row stride are).
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<u32>>;

const LDV: u32 = (D + 8u) / 4u;               // vec4s a staged row (bank padding)
const PER_LANE: u32 = BK * D / 8u / 32u;      // 8-half chunks of a tile each lane loads
var<workgroup> kvs: array<vec4<f16>, NSG * BK * LDV>;
var<private> kx: array<vec4<u32>, PER_LANE>;
var<private> vx: array<vec4<u32>, PER_LANE>;

// This lane's share of the tile (rows of D / 8 chunks) whose first key's first dimension is
// element r of a cache.
fn fetch(lane: u32, r: u32, which_v: bool) -> array<vec4<u32>, PER_LANE> {
    var x: array<vec4<u32>, PER_LANE>;
    for (var i = 0u; i < PER_LANE; i++) {
        let e = lane + 32u * i;
        // PROBE (run 505): head-major addressing, timing only (values wrong).
        let npos = arrayLength(&k_cache) * 8u / p.kv_stride;
        let hoff = r % p.kv_stride;
        let pos = r / p.kv_stride;
        let at = (hoff * npos + (pos + e / (D / 8u)) * D) / 8u + e % (D / 8u);
        if (which_v) { x[i] = v_cache[at]; } else { x[i] = k_cache[at]; }
    }
    return x;
}

// A share into the subgroup's slice of kvs.
fn put(lane: u32, sg: u32, x: array<vec4<u32>, PER_LANE>) {
    for (var i = 0u; i < PER_LANE; i++) {
        let e = lane + 32u * i;
        let at = sg * BK * LDV + (e / (D / 8u)) * LDV + 2u * (e % (D / 8u));
        let h = halves_of_words(x[i]);
        kvs[at] = h.lo;
        kvs[at + 1u] = h.hi;
    }
    subgroupBarrier();
}

// The tile's path: its loads issued, its scores into ss, then P·V into the output accumulators
// (common/coop_out.wgsl). The cooperative operations and subgroup barriers run in
// subgroup-uniform control flow, in functions for naga, as in attention_decode_coop.wgsl.
fn tile_load(lane: u32, sg: u32, row: u32) {
    kx = fetch(lane, row, false);
    vx = fetch(lane, row, true);
}

fn tile_scores(lane: u32, sg: u32, slice4: u32) {
    put(lane, sg, kx);
    let q0 = coopLoadT<TileA>(&qs[0], LDQ);
    let q1 = coopLoadT<TileA>(&qs[16], LDQ);
    let q2 = coopLoadT<TileA>(&qs[32], LDQ);
    let q3 = coopLoadT<TileA>(&qs[48], LDQ);
    for (var c = 0u; c < BK / 16u; c++) {
        let k = sg * BK * LDV + 16u * c * LDV;
        var s = TileC();
        s = coopMultiplyAdd(q0, coopLoad<TileB>(&kvs[k], LDV), s);
        s = coopMultiplyAdd(q1, coopLoad<TileB>(&kvs[k + 4u], LDV), s);
        s = coopMultiplyAdd(q2, coopLoad<TileB>(&kvs[k + 8u], LDV), s);
        s = coopMultiplyAdd(q3, coopLoad<TileB>(&kvs[k + 12u], LDV), s);
        coopStoreT(s, &ss[slice4 + 4u * c], SS4);
    }
    subgroupBarrier();
}

fn tile_weigh(lane: u32, sg: u32, row: u32, pslice4: u32) {
    put(lane, sg, vx);
    for (var c = 0u; c < BK / 16u; c++) {
        let a = coopLoadT<TileA>(&ps[pslice4 + 4u * c], PS4);
        let v = sg * BK * LDV + 16u * c * LDV;
        o0 = coopMultiplyAdd(a, coopLoadT<TileB>(&kvs[v], LDV), o0);
        o1 = coopMultiplyAdd(a, coopLoadT<TileB>(&kvs[v + 4u], LDV), o1);
        o2 = coopMultiplyAdd(a, coopLoadT<TileB>(&kvs[v + 8u], LDV), o2);
        o3 = coopMultiplyAdd(a, coopLoadT<TileB>(&kvs[v + 12u], LDV), o3);
    }
}
