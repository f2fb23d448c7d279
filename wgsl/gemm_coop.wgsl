// Tiled GEMM on cooperative matrices (tensor cores, matrix cores): Y[m, n] = sum_k X[m, k] * W[n, k]
// for prefill, where the adapter offers 16x16x16 f16 x f16 -> f32 matrix multiply-adds.
// A workgroup computes a BM x BN tile of Y with WG / 32 subgroups, SGN of them along N; each
// subgroup owns FM x FN accumulators of 16 x 16 in f32 (a (16 FM) x (16 FN) block).
// Per K step of BK, the X tile and the W tile (decoded from its block format by the format
// file's decode8) are stored in workgroup memory as f16, both k-contiguous: X row-major (A,
// loaded with coopLoadT), W as the column-major K x N matrix B (coopLoad). Rows are padded by
// 8 halves (LDS) so a fragment's 16 rows fall in different banks.
// Double-buffered: the next K step's X values and decoded weights are read into registers
// (before or after this step's multiply-adds: FETCH_FIRST) and stored into the other buffer,
// so global latency can hide behind the matrix cores and each K step needs one barrier.
// (H200, F16 operands, examples/coop_lab.rs: padding and double buffering took a 64x64 tile
// from 25 to ~90 TFLOP/s; 128x128 tiles of 8 subgroups reach ~150 at 4096^3.)
// Activations and weights are rounded to f16 (as llama.cpp's cooperative-matrix matmul);
// accumulation is f32. The epilogue (bias, residual add, SwiGLU, RoPE into the KV cache,
// ragged edges) takes one 16 x 16 accumulator at a time through a per-subgroup slice of
// workgroup memory. Header constants: BM, BN, BK (a multiple of 16), WG, SGN, FM (2 or 4),
// FN (2), FETCH_FIRST.
// Parameters: common/matmul_params.wgsl; weights binding: common/weights_*.wgsl; X, Y and
// the epilogue: common/gemm_io.wgsl.

const LDS: u32 = BK + 8u;
const N_SG: u32 = WG / 32u;
// Per invocation and K step: vec4s of X, and 8-weight chunks of W.
const X_PER: u32 = BM * BK / 4u / WG;
const W_PER: u32 = BN * BK / 8u / WG;

var<workgroup> xs: array<f16, 2u * BM * LDS>;   // A: [buffer][m][k]
var<workgroup> ws: array<f16, 2u * BN * LDS>;   // B: [buffer][n][k], i.e. K x N column-major
var<workgroup> cs: array<f32, N_SG * 256u>;      // one 16 x 16 accumulator per subgroup: [m][n]

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

// The X values and decoded weights of one K step that one invocation moves (X as loaded:
// nothing waits on those loads until they are stored).
struct Staged {
    x: array<vec4<f32>, X_PER>,
    wl: array<vec4<f16>, W_PER>,
    wh: array<vec4<f16>, W_PER>,
}

fn fetch(lid: u32, m0: u32, n0: u32, k0: u32) -> Staged {
    var s: Staged;
    // X: consecutive invocations read consecutive vec4s of a row.
    for (var j = 0u; j < X_PER; j++) {
        let i = lid + j * WG;
        s.x[j] = load_x4(m0 + i / (BK / 4u), k0 + (i % (BK / 4u)) * 4u);
    }
    // W: one 8-weight chunk per slot, decoded in registers.
    for (var j = 0u; j < W_PER; j++) {
        let i = lid + j * WG;
        let w = load_w8(n0 + i / (BK / 8u), k0 / 8u + i % (BK / 8u));
        s.wl[j] = vec4<f16>(w[0]);
        s.wh[j] = vec4<f16>(w[1]);
    }
    return s;
}

fn stash(lid: u32, s: Staged, buf: u32) {
    for (var j = 0u; j < X_PER; j++) {
        let i = lid + j * WG;
        let t = buf * BM * LDS + (i / (BK / 4u)) * LDS + (i % (BK / 4u)) * 4u;
        let h = vec4<f16>(s.x[j]);
        xs[t] = h.x;
        xs[t + 1u] = h.y;
        xs[t + 2u] = h.z;
        xs[t + 3u] = h.w;
    }
    for (var j = 0u; j < W_PER; j++) {
        let i = lid + j * WG;
        let t = buf * BN * LDS + (i / (BK / 8u)) * LDS + (i % (BK / 8u)) * 8u;
        ws[t] = s.wl[j].x;
        ws[t + 1u] = s.wl[j].y;
        ws[t + 2u] = s.wl[j].z;
        ws[t + 3u] = s.wl[j].w;
        ws[t + 4u] = s.wh[j].x;
        ws[t + 5u] = s.wh[j].y;
        ws[t + 6u] = s.wh[j].z;
        ws[t + 7u] = s.wh[j].w;
    }
}

// Accumulators, fragments and multiply-adds are written out by name (FM is 2 or 4, FN 2):
// arrays of cooperative matrices indexed in loops may live in slow local memory.
@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    // This invocation's subgroup and its block of the tile (32 invocations per subgroup in
    // index order: cooperative operations act per subgroup).
    let sg = lid / 32u;
    let sm = (sg / SGN) * (FM * 16u);
    let sn = (sg % SGN) * (FN * 16u);
    var c00 = TileC();
    var c01 = TileC();
    var c10 = TileC();
    var c11 = TileC();
    var c20 = TileC();
    var c21 = TileC();
    var c30 = TileC();
    var c31 = TileC();

    // This workgroup's K range (split-K: the fetch past its end reads into the buffer no one
    // reads).
    let ks = k_range(wid.z);
    let k_begin = ks.x;
    let steps = (ks.y - k_begin + BK - 1u) / BK;
    stash(lid, fetch(lid, m0, n0, k_begin), 0u);
    workgroupBarrier();
    for (var step = 0u; step < steps; step++) {
        let cur = step % 2u;
        // The next step's values (zeros past the last step: fetch reads nothing beyond k;
        // they go to a buffer no one reads). FETCH_FIRST reads them before this step's
        // multiply-adds, otherwise after they are issued, so that the matrix cores work
        // while the loads and the decode wait on memory.
        var next: Staged;
        let k_next = k_begin + (step + 1u) * BK;
        if (FETCH_FIRST) { next = fetch(lid, m0, n0, k_next); }
        for (var kk = 0u; kk < BK; kk += 16u) {
            let ia = cur * BM * LDS + sm * LDS + kk;
            let ib = cur * BN * LDS + sn * LDS + kk;
            let ia1 = ia + 16u * LDS;
            let ib1 = ib + 16u * LDS;
            let a0 = coopLoadT<TileA>(&xs[ia], LDS);
            let a1 = coopLoadT<TileA>(&xs[ia1], LDS);
            let b0 = coopLoad<TileB>(&ws[ib], LDS);
            let b1 = coopLoad<TileB>(&ws[ib1], LDS);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            if (FM == 4u) {
                let ia2 = ia + 32u * LDS;
                let ia3 = ia + 48u * LDS;
                let a2 = coopLoadT<TileA>(&xs[ia2], LDS);
                let a3 = coopLoadT<TileA>(&xs[ia3], LDS);
                c20 = coopMultiplyAdd(a2, b0, c20);
                c21 = coopMultiplyAdd(a2, b1, c21);
                c30 = coopMultiplyAdd(a3, b0, c30);
                c31 = coopMultiplyAdd(a3, b1, c31);
            }
        }
        if (!FETCH_FIRST) { next = fetch(lid, m0, n0, k_next); }
        stash(lid, next, 1u - cur);
        workgroupBarrier();
    }

    let lane = lid % 32u;
    let slice = sg * 256u;
    emit(c00, slice, lane, m0 + sm, n0 + sn);
    emit(c01, slice, lane, m0 + sm, n0 + sn + 16u);
    emit(c10, slice, lane, m0 + sm + 16u, n0 + sn);
    emit(c11, slice, lane, m0 + sm + 16u, n0 + sn + 16u);
    if (FM == 4u) {
        emit(c20, slice, lane, m0 + sm + 32u, n0 + sn);
        emit(c21, slice, lane, m0 + sm + 32u, n0 + sn + 16u);
        emit(c30, slice, lane, m0 + sm + 48u, n0 + sn);
        emit(c31, slice, lane, m0 + sm + 48u, n0 + sn + 16u);
    }
}

// The epilogue of one 16 x 16 accumulator whose first output is (gm, gn): through this
// subgroup's slice of workgroup memory, 128 pairs of outputs over its 32 lanes. Every
// subgroup calls it the same number of times (uniform control flow for the barriers).
fn emit(c: TileC, slice: u32, lane: u32, gm: u32, gn: u32) {
    coopStoreT(c, &cs[slice], 16u);
    workgroupBarrier();
    for (var e = lane * 2u; e < 256u; e += 64u) {
        store_pair(gm + e / 16u, gn + e % 16u, cs[slice + e], cs[slice + e + 1u]);
    }
    workgroupBarrier();
}
