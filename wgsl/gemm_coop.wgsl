// Tiled GEMM on cooperative matrices (tensor cores, matrix cores): Y[m, n] = sum_k X[m, k] * W[n, k]
// for prefill, where the adapter offers 16x16x16 f16 x f16 -> f32 matrix multiply-adds.
// A workgroup computes a BM x BN tile of Y with four subgroups, each a 32 x 32 quadrant held
// as 2 x 2 accumulators of 16 x 16 in f32. Per K step of BK, the X tile and the W tile
// (decoded from its block format by the format file's decode8) are stored in workgroup
// memory as f16, both k-contiguous: X row-major (A, loaded with coopLoadT), W as the
// column-major K x N matrix B (coopLoad), so every store is a run of consecutive halves.
// Activations and weights are rounded to f16 (as llama.cpp's cooperative-matrix matmul);
// accumulation is f32. (A 128x64 tile with 64x32 quadrants measured 25-35% slower on an H200:
// its 44 KiB of workgroup memory leaves one workgroup per SM.) The accumulators go through workgroup memory for the epilogue (bias,
// residual add, ragged edges). Header constants: BM = BN = 64, BK (a multiple of 16), WG = 128.
// Parameters: common/matmul_params.wgsl; weights binding: common/weights_*.wgsl; X, Y and
// the epilogue: common/gemm_io.wgsl.

var<workgroup> xs: array<f16, BM * BK>;   // A: [m][k]
var<workgroup> ws: array<f16, BN * BK>;   // B: [n][k], i.e. K x N column-major
var<workgroup> cs: array<f32, BM * BN>;   // Y tile: [m][n]

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    // Quadrant of this invocation's subgroup (32 invocations per quadrant in index order:
    // cooperative operations act per subgroup, and every subgroup size up to 32 divides it).
    let quad = lid / 32u;
    let qm = (quad / 2u) * 32u;
    let qn = (quad % 2u) * 32u;
    var c00 = TileC();
    var c01 = TileC();
    var c10 = TileC();
    var c11 = TileC();

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // X tile, four k at a time: consecutive invocations read consecutive vec4s of a row.
        for (var i = lid; i < BM * BK / 4u; i += WG) {
            let mm = i / (BK / 4u);
            let kq = (i % (BK / 4u)) * 4u;
            let h = vec4<f16>(load_x4(m0 + mm, k0 + kq));
            let t = mm * BK + kq;
            xs[t] = h.x;
            xs[t + 1u] = h.y;
            xs[t + 2u] = h.z;
            xs[t + 3u] = h.w;
        }
        // W tile: one 8-weight chunk per iteration, decoded in registers.
        for (var i = lid; i < BN * (BK / 8u); i += WG) {
            let nn = i / (BK / 8u);
            let cc = i % (BK / 8u);
            let w = load_w8(n0 + nn, k0 / 8u + cc);
            let hl = vec4<f16>(w[0]);
            let hh = vec4<f16>(w[1]);
            let t = nn * BK + cc * 8u;
            ws[t] = hl.x;
            ws[t + 1u] = hl.y;
            ws[t + 2u] = hl.z;
            ws[t + 3u] = hl.w;
            ws[t + 4u] = hh.x;
            ws[t + 5u] = hh.y;
            ws[t + 6u] = hh.z;
            ws[t + 7u] = hh.w;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<TileA>(&xs[qm * BK + kk], BK);
            let a1 = coopLoadT<TileA>(&xs[(qm + 16u) * BK + kk], BK);
            let b0 = coopLoad<TileB>(&ws[qn * BK + kk], BK);
            let b1 = coopLoad<TileB>(&ws[(qn + 16u) * BK + kk], BK);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }

    coopStoreT(c00, &cs[qm * BN + qn], BN);
    coopStoreT(c01, &cs[qm * BN + qn + 16u], BN);
    coopStoreT(c10, &cs[(qm + 16u) * BN + qn], BN);
    coopStoreT(c11, &cs[(qm + 16u) * BN + qn + 16u], BN);
    workgroupBarrier();
    for (var i = lid; i < BM * BN / 2u; i += WG) {
        let e = 2u * i;
        store_pair(m0 + e / BN, n0 + e % BN, cs[e], cs[e + 1u]);
    }
}
