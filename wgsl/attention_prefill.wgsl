// Batched 4D attention GEMM for prefill, used twice per layer:
//   scores = alpha * Q · Kᵀ   (A = Q rows,  B = K cache rows, k = head dim)
//   out    = P · V            (A = probabilities, B = V cache, k = position)
// C[b, i, j] = alpha * sum_k A[b, i, k] * B[b, j, k], where batch b is the query head and
// B's batch is the KV head b / group (GQA by indexing; KV heads are never duplicated).
// B element (j, k) lives at b_off + j * b_sj + k * b_sk in the KV cache (f32 or f16).
// Header constants: BM, BN, BK, TM, TN, WG = BM/TM * BN/TN.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    group: u32,      // query heads per KV head
    a_sb: u32,       // A: batch stride
    a_si: u32,       // A: row stride (k is contiguous)
    b_sb: u32,       // B: stride between KV heads
    b_sj: u32,
    b_sk: u32,
    c_sb: u32,
    c_si: u32,       // C: row stride (j is contiguous)
    b_off: u32,      // B: offset of element (0, 0) of KV head 0
    alpha: f32,
    causal_n: u32,   // when nonzero: only j <= i + causal_n - m matters (skip masked tiles)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> kv: array<KvWord>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

var<workgroup> as_: array<f32, BK * BM>;
var<workgroup> bs: array<f32, BK * BN>;

fn b_at(i: u32) -> f32 {
    return kv_get(kv[i / KV_PER_WORD], i);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let batch = wid.z;
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    // Causal skip: this tile's columns all lie beyond every row's last visible position.
    if (p.causal_n != 0u && n0 > m0 + BM - 1u + p.causal_n - p.m) { 
        // Scores there are masked by the softmax; P·V reads only visible positions.
        return;
    }
    let tx = lid % (BN / TN);
    let ty = lid / (BN / TN);
    let a_base = batch * p.a_sb;
    let b_base = p.b_off + (batch / p.group) * p.b_sb;
    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) { acc[i] = 0.0; }

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var i = lid; i < BM * BK; i += WG) {
            let mm = i / BK;
            let kk = i % BK;
            var v = 0.0;
            if (m0 + mm < p.m && k0 + kk < p.k) { v = a[a_base + (m0 + mm) * p.a_si + k0 + kk]; }
            as_[kk * BM + mm] = v;
        }
        for (var i = lid; i < BN * BK; i += WG) {
            var nn: u32;
            var kk: u32;
            // Walk B along its contiguous axis for coalesced reads.
            if (p.b_sk == 1u) { nn = i / BK; kk = i % BK; } else { kk = i / BN; nn = i % BN; }
            var v = 0.0;
            if (n0 + nn < p.n && k0 + kk < p.k) { v = b_at(b_base + (n0 + nn) * p.b_sj + (k0 + kk) * p.b_sk); }
            bs[kk * BN + nn] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            for (var i = 0u; i < TM; i++) {
                let av = as_[kk * BM + ty * TM + i];
                for (var j = 0u; j < TN; j++) {
                    acc[i * TN + j] = fma(av, bs[kk * BN + tx * TN + j], acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < TM; i++) {
        let gm = m0 + ty * TM + i;
        for (var j = 0u; j < TN; j++) {
            let gn = n0 + tx * TN + j;
            if (gm < p.m && gn < p.n) {
                c[batch * p.c_sb + gm * p.c_si + gn] = p.alpha * acc[i * TN + j];
            }
        }
    }
}
