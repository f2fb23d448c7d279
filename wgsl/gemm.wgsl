// Tiled GEMM for prefill: Y[m, n] = sum_k X[m, k] * W[n, k], one body for every weight format.
// A workgroup computes a BM x BN tile of Y, stepping through K by BK; W tiles are decoded
// from their block format into workgroup memory once per step and reused by all BM rows.
// Each invocation accumulates a TM x TN register tile in f32.
// Header constants: BM, BN, BK (a multiple of 8), TM, TN (multiples of 4), WG = BM/TM * BN/TN.
// The register tile lives in gemm_micro_<TM>x<TN>.wgsl, written out with constant indices so
// drivers keep it in registers.
// Parameters: common/matmul_params.wgsl; weights binding: common/weights_*.wgsl; X, Y:
// common/gemm_io.wgsl; the epilogue (pairs of adjacent columns): common/matmul_epilogue.wgsl.
// With EPI_PARTIAL (split-K) each workgroup_id.z sums one range of p.split_k weights.

// Tiles stored k-major ([k][m] and [k][n]) so the inner loop reads TM and TN as vec4s.
var<workgroup> xs: array<vec4<f32>, BK * BM / 4u>;
var<workgroup> ws: array<vec4<f32>, BK * BN / 4u>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let tx = lid % (BN / TN);
    let ty = lid / (BN / TN);
    var acc: Acc;
    let ks = k_range(wid.z);

    for (var k0 = ks.x; k0 < ks.y; k0 += BK) {
        // X tile, four k at a time: consecutive invocations read consecutive vec4s of a row.
        for (var i = lid; i < BM * BK / 4u; i += WG) {
            let mm = i / (BK / 4u);
            let kq = (i % (BK / 4u)) * 4u;
            let v = load_x4(m0 + mm, k0 + kq);
            for (var j = 0u; j < 4u; j++) {
                let t = (kq + j) * BM + mm;
                xs[t / 4u][t % 4u] = v[j];
            }
        }
        // W tile: one 8-weight chunk per iteration, decoded in registers.
        for (var i = lid; i < BN * (BK / 8u); i += WG) {
            let nn = i / (BK / 8u);
            let cc = i % (BK / 8u);
            let w = load_w8(n0 + nn, k0 / 8u + cc);
            for (var j = 0u; j < 4u; j++) {
                let t0 = (cc * 8u + j) * BN + nn;
                ws[t0 / 4u][t0 % 4u] = w[0][j];
                let t1 = (cc * 8u + 4u + j) * BN + nn;
                ws[t1 / 4u][t1 % 4u] = w[1][j];
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            acc = micro_step(acc, (kk * BM + ty * TM) / 4u, (kk * BN + tx * TN) / 4u);
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j += 2u) {
            store_pair(m0 + ty * TM + i, n0 + tx * TN + j, micro_get(acc, i, j), micro_get(acc, i, j + 1u));
        }
    }
}
