// GEMV over int8 activations, for the quantized weight formats: Y[m, n] = sum_k W[n, k] X[m, k].
// x comes quantized to int8 by quantize_q8.wgsl or quantize_q8_lanes.wgsl (its own small
// dispatch, once per input rather than once per workgroup: common/q8_in_global.wgsl; the
// latter leaves a fused RMSNorm's 1 / rms to this kernel), or, for shapes of few
// workgroups, by each workgroup itself (common/q8_in_local.wgsl: x_half, prepare_x), so that
// quantized weights multiply with packed 4x8-bit integer dot products (dot4I8Packed: one DP4A
// instruction where the driver offers integer dot products, as Vulkan 1.3 drivers do) instead
// of being converted to floats one by one.
// The result is exactly sum(w * x~) for the rounded activations x~, which differ from x by at
// most d / 2.
// Each invocation streams units of one aligned 16-byte vector of quants (weights bound as
// vec4s: common/weights_vec4.wgsl), so that one load instruction of a subgroup reads whole
// cache lines. The format file supplies dot_unit_count, dot_unit_half (which 16 x values
// part j of a unit multiplies), dot_header and dot_part; the work: common/gemv_q8_rows.wgsl,
// through common/gemv_one_format.wgsl or gemv_two_formats.wgsl; parameters:
// common/matmul_params.wgsl; output and the final reduction: common/gemv_output.wgsl
// (write_rows, or the grouped shape's write_group_rows).

// ROW_GROUPS (header constant) > 1: the invocations split into ROW_GROUPS groups of K_LANES
// (common/gemv_output.wgsl), each group its own ROWS rows; for many
// columns (batched decode steps, short prompts), where every invocation holds the partial sums
// of all NCOLS columns and a whole-workgroup reduction per output would cost more than the dot
// products (common/gemv_q8_rows.wgsl). ROW_GROUPS 1: every invocation along K of the same rows.
var<workgroup> partial: array<f32, PARTIALS>;
// EPI_SWIGLU_Q8: the workgroup's SwiGLU outputs ([output][column]), quantized by blocks of 32
// once all are in (write_group_rows); EPI_ADD_Q8_NORM: its rows of Y (one column), likewise.
// Q8_OUT_BLOCKS blocks a column.
const ADD_Q8: bool = EPI == EPI_ADD_Q8_NORM;
var<workgroup> acts: array<f32, select(GROUP_OUTS / 2u, GROUP_OUTS, ADD_Q8) + 1u>;
// Weight rows per int8 block of outputs: 64 interleaved gate/up rows, or 32 rows of Y.
const BLOCK_ROWS: u32 = select(64u, 32u, ADD_Q8);
const Q8_OUT_BLOCKS: u32 = ROW_GROUPS * ROWS / BLOCK_ROWS;
const_assert !ADD_Q8 || NCOLS == 1u;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    col0 = wid.z * NCOLS;
    prepare_x(lane);
    let row0 = (wid.x + wid.y * nwg.x) * ROWS * ROW_GROUPS;
    gemv_workgroup(row0, lane);
}

// The grouped reduction's hooks (common/gemv_output.wgsl, write_group_rows): with the int8
// SwiGLU epilogue, each row pair's SwiGLU output is kept in acts, and once all are in, the
// workgroup quantizes them.
fn keep_pair(i: u32, row: u32, inside: bool, t0: f32, t1: f32) {
    if (EPI == EPI_SWIGLU_Q8) {
        var v = 0.0;
        if (inside) { v = swiglu_pair(p.row_offset + row, t0, t1); }
        acts[i] = v;
    }
    if (ADD_Q8) {
        // Y's rows as store_pair just wrote them (the residual added): one column, pair i.
        var v = vec2<f32>(0.0);
        if (inside) {
            let o = col0 * p.y_stride + p.row_offset + row;
            v = vec2<f32>(y[o], y[o + 1u]);
        }
        acts[2u * i] = v.x;
        acts[2u * i + 1u] = v.y;
    }
}

fn pairs_kept(row0: u32, lane: Lane) {
    if (EPI == EPI_SWIGLU_Q8 || ADD_Q8) { quantize_outputs(row0, lane); }
}

// The workgroup's outputs (in acts) quantized block by block into the next GEMV's int8 input,
// one invocation per block of 32 and column: EPI_SWIGLU_Q8's SwiGLU outputs, the down
// projection's input; EPI_ADD_Q8_NORM's rows of Y (one column) times the next RMSNorm's
// weights, each block's sum of squares of Y in its sums' last slot (quantize_q8_lanes.wgsl's
// layout through the norm). Block b of column m starts at weight row row0 + BLOCK_ROWS b; its
// index among the row's blocks counts from the whole matrix's first row (p.row_offset: chunks
// start on whole blocks), y_stride / 32 of them a row.
fn quantize_outputs(row0: u32, lane: Lane) {
    workgroupBarrier();
    for (var i = lane.lid; i < Q8_OUT_BLOCKS * NCOLS; i += WG) {
        let m = i % NCOLS;
        let b = i / NCOLS;
        let first = row0 + BLOCK_ROWS * b;
        if (col0 + m < p.n_cols && first < p.n_rows) {
            let a = 32u * b * NCOLS + m;
            // The block's first output (of the matrix's, counting from its first row).
            let n = (p.row_offset + first) / (BLOCK_ROWS / 32u);
            var q = q8_block(out4(a, n, 0u), out4(a, n, 1u), out4(a, n, 2u), out4(a, n, 3u),
                             out4(a, n, 4u), out4(a, n, 5u), out4(a, n, 6u), out4(a, n, 7u));
            if (ADD_Q8) {
                var ss = 0.0;
                for (var j = 0u; j < 8u; j++) {
                    let y4 = acts4(a + 4u * j * NCOLS);
                    ss += dot(y4, y4);
                }
                q.sums.w = bitcast<u32>(ss);
            }
            store_q8_block((col0 + m) * (p.y_stride / 32u) + n / 32u, q);
        }
    }
}

// Outputs 4j .. 4j + 3 of the block whose first is output n (at index a of acts), scaled by the
// next RMSNorm's weights (EPI_ADD_Q8_NORM; common/q8_out_unweighted.wgsl's are 1).
fn out4(a: u32, n: u32, j: u32) -> vec4<f32> {
    let o = n + 4u * j;
    let w = vec4<f32>(q8_out_weight(o), q8_out_weight(o + 1u), q8_out_weight(o + 2u), q8_out_weight(o + 3u));
    return acts4(a + 4u * j * NCOLS) * w;
}

// Four consecutive outputs of one column from acts, starting at index i.
fn acts4(i: u32) -> vec4<f32> {
    return vec4<f32>(acts[i], acts[i + NCOLS], acts[i + 2u * NCOLS], acts[i + 3u * NCOLS]);
}
