// Where a matmul's outputs go: the epilogue both GEMV bodies and both GEMM bodies call with
// pairs of adjacent output rows (weight rows 2i, 2i + 1 of one column m). Header constant EPI:
//   EPI_PLAIN  Y (+ bias) (+ the value already there): write_y / write_one.
//   EPI_SWIGLU the weight rows are gate and up interleaved (2i = gate_i, 2i + 1 = up_i):
//              Y[m, i] = silu(gate) * up, so SwiGLU needs no dispatch and no gate/up buffers.
//   EPI_QKV    the weight rows are Q, K and V stacked (Q and K rows of a NeoX model reordered
//              at load so each rotated pair is adjacent: [0, r/2, 1, r/2 + 1, ...] per head,
//              r = n_rot): Q is rotated into Y, K rotated and V copied straight into their
//              KV-cache rows at the token's position, so RoPE and the cache write need no
//              dispatch of their own.
//   EPI_PARTIAL a split-K GEMM's raw sums over its K range (split_z): Y is the partials
//              scratch [splits][m][n_rows]; gemm_reduce.wgsl adds them up and applies the
//              real epilogue.
//   EPI_SWIGLU_Q8 as EPI_SWIGLU, and the int8 GEMV (gemv_q8.wgsl, grouped shapes whose
//              workgroups cover whole blocks of 32 outputs) also quantizes Y's blocks into
//              the down projection's int8 input (common/q8_out.wgsl).
//   EPI_SWIGLU_F16 as EPI_SWIGLU into halves (common/epilogue_f16_out.wgsl: store_half), the
//              f16 input of the cooperative GEMM after it, instead of the float Y (GEMMs).
//   EPI_ADD_Q8_NORM as EPI_PLAIN (a projection added to the residual stream), and the int8
//              GEMV (gemv_q8.wgsl, one column, grouped shapes whose workgroups cover whole
//              blocks of 32 rows) also quantizes Y's blocks times the next RMSNorm's weights,
//              with each block's sum of squares of Y, as quantize_q8_lanes.wgsl would for the
//              GEMV after it (common/q8_out.wgsl, common/q8_out_norm.wgsl): no quantize
//              dispatch before that GEMV.
// The including file declares y (binding 3) and bias (binding 4) and `p` (matmul_params);
// store_qkv and store_half come from common/epilogue_qkv.wgsl (EPI_QKV),
// epilogue_f16_out.wgsl (EPI_SWIGLU_F16) or epilogue_none.wgsl.

const EPI_PLAIN: u32 = 0u;
const EPI_SWIGLU: u32 = 1u;
const EPI_QKV: u32 = 2u;
const EPI_PARTIAL: u32 = 3u;
const EPI_SWIGLU_Q8: u32 = 4u;
const EPI_SWIGLU_F16: u32 = 5u;
const EPI_ADD_Q8_NORM: u32 = 6u;

// One value of Y, plain (ragged last rows of a plain matmul).
fn write_one(gm: u32, row: u32, v: f32) {
    if (gm >= p.n_cols || row >= p.n_rows) { return; }
    let n = p.row_offset + row;
    let o = gm * p.y_stride + n;
    var r = v;
    if (p.has_bias != 0u) { r += bias[n]; }
    if (p.accumulate != 0u) { r += y[o]; }
    y[o] = r;
}

fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }

// SwiGLU of gate and up sums v0, v1 at rows n, n + 1 (n even, with the chunk's offset).
fn swiglu_pair(n: u32, v0: f32, v1: f32) -> f32 {
    var a = v0;
    var b = v1;
    if (p.has_bias != 0u) {
        a += bias[n];
        b += bias[n + 1u];
    }
    return silu(a) * b;
}

// Rows `row` and `row + 1` (row even, within the chunk) of column gm.
fn store_pair(gm: u32, row: u32, v0: f32, v1: f32) {
    if (EPI == EPI_PARTIAL) {
        if (gm >= p.n_cols || row >= p.n_rows) { return; }
        let o = (split_z * p.n_cols + gm) * p.n_rows + row;
        y[o] = v0;
        if (row + 1u < p.n_rows) { y[o + 1u] = v1; }
        return;
    }
    if (EPI == EPI_PLAIN || EPI == EPI_ADD_Q8_NORM) {
        write_one(gm, row, v0);
        write_one(gm, row + 1u, v1);
        return;
    }
    if (gm >= p.n_cols || row >= p.n_rows) { return; }
    let n = p.row_offset + row;
    if (EPI == EPI_SWIGLU || EPI == EPI_SWIGLU_Q8) {
        y[gm * p.y_stride + n / 2u] = swiglu_pair(n, v0, v1);
        return;
    }
    if (EPI == EPI_SWIGLU_F16) {
        store_half(gm * p.y_stride + n / 2u, swiglu_pair(n, v0, v1));
        return;
    }
    var a = v0;
    var b = v1;
    if (p.has_bias != 0u) {
        a += bias[n];
        b += bias[n + 1u];
    }
    store_qkv(gm, n, a, b);
}
