// The parameters of every matmul kernel (GEMM, both GEMVs, the activation quantizer): one
// layout, mirrored by MatmulParams in src/kernels/matmul.rs.

struct Params {
    n_cols: u32,     // active columns (m): rows of X and Y
    k: u32,          // weights per row
    n_rows: u32,     // rows in this weight chunk (columns of Y it produces)
    row_offset: u32, // output column of the chunk's first row
    x_stride: u32,   // elements between input rows (m)
    y_stride: u32,   // elements between output rows (m)
    has_bias: u32,   // add bias[row_offset + r]
    accumulate: u32, // add the value already in Y (fused residual)
    eps: f32,        // RMSNorm epsilon (fused RMSNorm)
    splits: u32,     // split-K: K ranges (GEMM partials, gemm_reduce.wgsl)
    split_k: u32,    // split-K: weights per K range (a multiple of the GEMM's BK)
    first_rows: u32, // rows from the weights at binding 1 (GEMVs over two formats: the rest from 10)
}

@group(0) @binding(0) var<uniform> p: Params;

// The first of the NCOLS columns this workgroup takes (GEMVs and the quantizer): columns
// come in groups of NCOLS, one group per workgroup_id.z, so a GEMV over more columns than
// one workgroup holds in registers is still one dispatch. 0 elsewhere.
var<private> col0: u32;

// The K range of a split-K GEMM (workgroup_id.z; EPI_PARTIAL): its first weight and its end.
var<private> split_z: u32;
