// GEMV for decode and few-token batches: Y[m, n] = sum_k W[n, k] * X[m, k] for m < n_cols,
// NCOLS columns per workgroup (common/matmul_params.wgsl's col0),
// one body for every weight format (the format file supplies the unit functions). Each
// workgroup owns ROWS rows of one weight chunk; its invocations stride over the row's units.
// Parameters: common/matmul_params.wgsl; input (fused RMSNorm, SwiGLU): common/gemv_input.wgsl;
// output and the final reduction: common/gemv_output.wgsl.

var<workgroup> partial: array<f32, ROWS * NCOLS * LANE_GROUPS_MAX>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    col0 = wid.z * NCOLS;
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let n_units = unit_count(p.k);
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }
    // The fused RMSNorm's 1 / rms scales each column's sums at the end (the products take
    // x times the norm weights, load_in's factor 1): the weights' loads need not wait for the
    // row's reduction.

    if (NCOLS == 1u) {
        // One column (decode): x's slice loaded once per unit for all rows, each row decoded
        // and multiplied in turn (F16 decode was 8% slower with the rows decoded first).
        // Consecutive invocations take consecutive units of the row, so reads coalesce; each
        // unit's header (scales) is unpacked once for its one or two chunks, and its slice of x
        // is loaded once for all ROWS rows. Chunks are held in named variables, not arrays
        // indexed by a loop counter, which drivers may move to slow local memory.
        for (var u = lane.lid; u < n_units; u += WG) {
            let c0 = unit_chunk(u, 0u);
            let c1 = unit_chunk(u, 1u);
            var x0l: array<vec4<f32>, NCOLS>;
            var x0h: array<vec4<f32>, NCOLS>;
            var x1l: array<vec4<f32>, NCOLS>;
            var x1h: array<vec4<f32>, NCOLS>;
            var s0: array<f32, NCOLS>;
            var s1: array<f32, NCOLS>;
            for (var m = 0u; m < NCOLS; m++) {
                let xr = min(col0 + m, p.n_cols - 1u) * (p.x_stride / 4u);
                x0l[m] = load_in(xr, c0, 0u, 1.0);
                x0h[m] = load_in(xr, c0, 1u, 1.0);
                s0[m] = dot(x0l[m] + x0h[m], vec4<f32>(1.0));
                if (UNIT_CHUNKS == 2u) {
                    x1l[m] = load_in(xr, c1, 0u, 1.0);
                    x1h[m] = load_in(xr, c1, 1u, 1.0);
                    s1[m] = dot(x1l[m] + x1h[m], vec4<f32>(1.0));
                }
            }
            for (var r = 0u; r < ROWS; r++) {
                let row = row0 + r;
                if (row < p.n_rows) {
                    let h = unit_header(row, u, p.k);
                    let ch0 = unit_decode(h, 0u);
                    for (var m = 0u; m < NCOLS; m++) {
                        acc[r * NCOLS + m] += ch0.scale * (dot(ch0.lo, x0l[m]) + dot(ch0.hi, x0h[m])) + ch0.offset * s0[m];
                    }
                    if (UNIT_CHUNKS == 2u) {
                        let ch1 = unit_decode(h, 1u);
                        for (var m = 0u; m < NCOLS; m++) {
                            acc[r * NCOLS + m] += ch1.scale * (dot(ch1.lo, x1l[m]) + dot(ch1.hi, x1h[m])) + ch1.offset * s1[m];
                        }
                    }
                }
            }
        }
    } else {
        // Consecutive invocations take consecutive units of the row, so reads coalesce. Each
        // unit's ROWS rows are decoded once (their scales unpacked, their chunks converted), then
        // every column's slice of x is loaded and multiplied with all of them: the registers
        // hold ROWS rows of decoded weights and one column of x at a time, not every column's x
        // (with 8 columns, that was 128 floats a lane and the batched step ran 4x slower than
        // one token). Chunks are held in named variables or arrays indexed by constant-trip
        // loops, which drivers unroll into registers.
        for (var u = lane.lid; u < n_units; u += WG) {
            let c0 = unit_chunk(u, 0u);
            let c1 = unit_chunk(u, 1u);
            var w0: array<Chunk8, ROWS>;
            var w1: array<Chunk8, ROWS>;
            for (var r = 0u; r < ROWS; r++) {
                let row = row0 + r;
                if (row < p.n_rows) {
                    let h = unit_header(row, u, p.k);
                    w0[r] = unit_decode(h, 0u);
                    if (UNIT_CHUNKS == 2u) { w1[r] = unit_decode(h, 1u); }
                } else {
                    // Rows past the end add exact zeros (write_rows never stores them).
                    w0[r] = Chunk8(vec4<f32>(0.0), vec4<f32>(0.0), 0.0, 0.0);
                    w1[r] = w0[r];
                }
            }
            for (var m = 0u; m < NCOLS; m++) {
                let xr = min(col0 + m, p.n_cols - 1u) * (p.x_stride / 4u);
                let x0l = load_in(xr, c0, 0u, 1.0);
                let x0h = load_in(xr, c0, 1u, 1.0);
                let s0 = dot(x0l + x0h, vec4<f32>(1.0));
                for (var r = 0u; r < ROWS; r++) {
                    acc[r * NCOLS + m] += w0[r].scale * (dot(w0[r].lo, x0l) + dot(w0[r].hi, x0h)) + w0[r].offset * s0;
                }
                if (UNIT_CHUNKS == 2u) {
                    let x1l = load_in(xr, c1, 0u, 1.0);
                    let x1h = load_in(xr, c1, 1u, 1.0);
                    let s1 = dot(x1l + x1h, vec4<f32>(1.0));
                    for (var r = 0u; r < ROWS; r++) {
                        acc[r * NCOLS + m] += w1[r].scale * (dot(w1[r].lo, x1l) + dot(w1[r].hi, x1h)) + w1[r].offset * s1;
                    }
                }
            }
        }
    }

    if (NORM) {
        let rms = row_inv_rms(lane);
        for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] *= rms[i % NCOLS]; }
    }
    write_rows(acc, row0, lane);
}
