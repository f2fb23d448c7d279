// Tiled GEMM for prefill: Y[m, n] = sum_k X[m, k] * W[n, k], one body for every weight format.
// A workgroup computes a BM x BN tile of Y, stepping through K by BK; W tiles are decoded
// from their block format into workgroup memory once per step and reused by all BM rows.
// Each invocation accumulates a TM x TN register tile in f32.
// Header constants: BM, BN, BK (a multiple of 8), TM, TN (4 or 8), WG = BM/TM * BN/TN.
// The register tile lives in gemm_micro_<TM>x<TN>.wgsl, written out with constant indices so
// drivers keep it in registers.
// Parameters: common/matmul_params.wgsl; weights binding: common/weights_*.wgsl; X, Y:
// common/gemm_io.wgsl; the epilogue (pairs of adjacent columns): common/matmul_epilogue.wgsl.
// With EPI_PARTIAL (split-K) each workgroup_id.z sums one range of p.split_k weights.
//
// The next K step's loads are issued before the products of this one and held in registers
// until the step after (one tile in workgroup memory, two barriers a step: adapters may offer
// no more than 16 KiB). The tiles hold four consecutive k of a row as a vec4 ([k / 4][row]),
// so X's vectors and W's decoded halves are stored as loaded, and an invocation's products
// over four k are dot products of its rows' and columns' vec4s. An invocation owns rows
// ty + NTY i and column pairs 2 (tx + NTX jj) + {0, 1} (pairs: the epilogue takes adjacent
// columns), and eight consecutive invocations are 4 tx by 2 ty, so that a 16-byte access (served
// eight invocations at a time) reads 4 distinct W vectors and 2 distinct X vectors, none in the
// same bank group; rows are XOR-swizzled within each 8 by the k-quad (x_swizzle, w_swizzle) so
// that the stores of a step's loads fall in different bank groups too, with no padding.

const NTX: u32 = BN / TN;
const NTY: u32 = BM / TM;
const KQ: u32 = BK / 4u;              // k-quads a step
const X_VECS: u32 = BM * KQ;          // X vec4s a step
const W_CHUNKS: u32 = BN * (BK / 8u); // W chunks of 8 a step
const XN: u32 = (X_VECS + WG - 1u) / WG;
const WN: u32 = (W_CHUNKS + WG - 1u) / WG;
const_assert XN <= 4u && WN <= 2u && NTX % 4u == 0u && NTY % 2u == 0u && BM % 8u == 0u && BN % 8u == 0u;

var<workgroup> xs: array<vec4<f32>, KQ * BM>;   // [k / 4][m ^ x_swizzle]: k 4q .. 4q + 3 of row m
var<workgroup> ws: array<vec4<f32>, KQ * BN>;   // [k / 4][n ^ w_swizzle]

// A step's loads (X's vectors i = lid + s WG, W's chunks likewise) for `stash`, by name: arrays
// indexed in loops may live in slow local memory.
struct Ahead {
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
    w0: RawW8,
    w1: RawW8,
}

// For the register tiles (gemm_micro_*.wgsl): four columns' sums c plus a row's four k (a)
// times their weights at those k (t0..t3: weight k of each column), one fma a product.
fn quad(c: vec4<f32>, a: vec4<f32>, t0: vec4<f32>, t1: vec4<f32>, t2: vec4<f32>, t3: vec4<f32>) -> vec4<f32> {
    return fma(vec4<f32>(a.w), t3, fma(vec4<f32>(a.z), t2, fma(vec4<f32>(a.y), t1, fma(vec4<f32>(a.x), t0, c))));
}

fn x_swizzle(q: u32) -> u32 { return 2u * (q % 4u); }
fn w_swizzle(q: u32) -> u32 { return 4u * ((q / 2u) % 2u); }
fn x_at(q: u32, m: u32) -> vec4<f32> { return xs[q * BM + (m ^ x_swizzle(q))]; }
fn w_at(q: u32, n: u32) -> vec4<f32> { return ws[q * BN + (n ^ w_swizzle(q))]; }

// X vector s of this invocation: four consecutive invocations take one row's step.
fn fetch_x(lid: u32, s: u32, m0: u32, k0: u32) -> vec4<f32> {
    let i = lid + s * WG;
    return load_x4(m0 + i / KQ, k0 + (i % KQ) * 4u);
}

fn fetch_w(lid: u32, s: u32, n0: u32, k0: u32) -> RawW8 {
    let i = lid + s * WG;
    return fetch_w8(n0 + i / (BK / 8u), k0 / 8u + i % (BK / 8u));
}

// Every load of the step at k0 (past K or the tile they load nothing used: clamped or zero).
fn fetch(lid: u32, m0: u32, n0: u32, k0: u32) -> Ahead {
    var a: Ahead;
    a.x0 = fetch_x(lid, 0u, m0, k0);
    if (XN >= 2u) { a.x1 = fetch_x(lid, 1u, m0, k0); }
    if (XN >= 3u) { a.x2 = fetch_x(lid, 2u, m0, k0); }
    if (XN >= 4u) { a.x3 = fetch_x(lid, 3u, m0, k0); }
    a.w0 = fetch_w(lid, 0u, n0, k0);
    if (WN >= 2u) { a.w1 = fetch_w(lid, 1u, n0, k0); }
    return a;
}

fn put_x(lid: u32, s: u32, v: vec4<f32>) {
    let i = lid + s * WG;
    if (i < X_VECS) {
        let q = i % KQ;
        xs[q * BM + ((i / KQ) ^ x_swizzle(q))] = v;
    }
}

fn put_w(lid: u32, s: u32, w: RawW8) {
    let i = lid + s * WG;
    if (i < W_CHUNKS) {
        let h = unpack_w8(w);
        let q = (i % (BK / 8u)) * 2u;
        let n = i / (BK / 8u);
        ws[q * BN + (n ^ w_swizzle(q))] = h[0];
        ws[(q + 1u) * BN + (n ^ w_swizzle(q + 1u))] = h[1];
    }
}

fn stash(lid: u32, a: Ahead) {
    put_x(lid, 0u, a.x0);
    if (XN >= 2u) { put_x(lid, 1u, a.x1); }
    if (XN >= 3u) { put_x(lid, 2u, a.x2); }
    if (XN >= 4u) { put_x(lid, 3u, a.x3); }
    put_w(lid, 0u, a.w0);
    if (WN >= 2u) { put_w(lid, 1u, a.w1); }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    // Eight consecutive invocations: tx 4 consecutive, ty 2.
    let g = lid / 8u;
    let tx = lid % 4u + 4u * (g % (NTX / 4u));
    let ty = (lid % 8u) / 4u + 2u * (g / (NTX / 4u));
    var acc: Acc;
    let ks = k_range(wid.z);

    // The loads of the step after each are issued unconditionally (past the range they read
    // what is never stored): a load behind a branch would be joined, and a join waits for it.
    var ahead = fetch(lid, m0, n0, ks.x);
    for (var k0 = ks.x; k0 < ks.y; k0 += BK) {
        stash(lid, ahead);
        workgroupBarrier();
        ahead = fetch(lid, m0, n0, k0 + BK);
        for (var q = 0u; q < KQ; q++) {
            acc = micro_step(acc, q, tx, ty);
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j += 2u) {
            store_pair(m0 + ty + NTY * i, n0 + 2u * (tx + NTX * (j / 2u)), micro_get(acc, i, j), micro_get(acc, i, j + 1u));
        }
    }
}
