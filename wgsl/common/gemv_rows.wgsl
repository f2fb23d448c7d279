// The float GEMV's (gemv.wgsl) work over one workgroup's rows of one weights binding: the
// products with x, the fused RMSNorm's scale, the reduction and the output. Apart from
// gemv.wgsl's entry point so that a GEMV over two weight formats
// (common/gemv_two_formats.wgsl) composes it a second time over its second weights
// (`Composer::include_renamed`). The format file supplies the unit functions.

// One chunk (8 values) of the (one) column of x as the products take it (load_in's values:
// the fused RMSNorm's weights applied, not yet its 1 / rms), their sum (for the chunk's
// offset) and, with the fused RMSNorm, the raw values' sum of squares.
struct XChunk {
    lo: vec4<f32>,
    hi: vec4<f32>,
    sum: f32,
    ss: f32,
}

fn x_chunk(xr: u32, c: u32) -> XChunk {
    let a = load_x(xr, c, 0u);
    let b = load_x(xr, c, 1u);
    return x_chunk_of(a, b, input_of(a, xr, c, 0u, 1.0), input_of(b, xr, c, 1u, 1.0));
}

// The chunk from x's raw values a, b and the products' inputs lo, hi made of them.
fn x_chunk_of(a: vec4<f32>, b: vec4<f32>, lo: vec4<f32>, hi: vec4<f32>) -> XChunk {
    var x = XChunk(lo, hi, dot(lo + hi, vec4<f32>(1.0)), 0.0);
    if (NORM) { x.ss = dot(a, a) + dot(b, b); }
    return x;
}

// A unit's chunks of x: chunk 0 and, for two-chunk units, chunk 1.
struct XUnit {
    c0: XChunk,
    c1: XChunk,
}

fn x_unit(xr: u32, u: u32) -> XUnit {
    var x: XUnit;
    x.c0 = x_chunk(xr, unit_chunk(u, 0u));
    if (UNIT_CHUNKS == 2u) { x.c1 = x_chunk(xr, unit_chunk(u, 1u)); }
    return x;
}

// x_chunk and x_unit for rows of k % 8 == 0, every chunk inside the row: no bounds checks.
fn x_chunk_inside(xr: u32, c: u32) -> XChunk {
    let a = load_x_inside(xr, c, 0u);
    let b = load_x_inside(xr, c, 1u);
    return x_chunk_of(a, b, input_inside(a, xr, c, 0u), input_inside(b, xr, c, 1u));
}

fn x_unit_inside(xr: u32, u: u32) -> XUnit {
    var x: XUnit;
    x.c0 = x_chunk_inside(xr, unit_chunk(u, 0u));
    if (UNIT_CHUNKS == 2u) { x.c1 = x_chunk_inside(xr, unit_chunk(u, 1u)); }
    return x;
}

// unit_dot for rows of k % 8 == 0: float weights (one chunk a unit, scale 1, offset 0) from
// one load with no branch in front of it; block formats as unit_dot.
fn unit_dot_inside(row: u32, u: u32, x: XUnit) -> f32 {
    if (BLOCK_ELEMS == 1u) {
        let ch = unpack8(fetch8_inside(row, u, p.k));
        return dot(ch.lo, x.c0.lo) + dot(ch.hi, x.c0.hi);
    }
    return unit_dot(row, u, x);
}

// Row `row`'s products with unit u: its header unpacked once for its one or two chunks.
fn unit_dot(row: u32, u: u32, x: XUnit) -> f32 {
    let h = unit_header(row, u, p.k);
    let ch0 = unit_decode(h, 0u);
    var t = ch0.scale * (dot(ch0.lo, x.c0.lo) + dot(ch0.hi, x.c0.hi)) + ch0.offset * x.c0.sum;
    if (UNIT_CHUNKS == 2u) {
        let ch1 = unit_decode(h, 1u);
        t += ch1.scale * (dot(ch1.lo, x.c1.lo) + dot(ch1.hi, x.c1.hi)) + ch1.offset * x.c1.sum;
    }
    return t;
}

// The workgroup's rows from row row0 of its weights (grouped: group g's from row0 + g ROWS),
// none past last_row (the last rows' clamped reads repeat it), written as Y's rows from
// out0 on.
fn gemv_rows(row0: u32, last_row: u32, out0: u32, lane: Lane) {
    let n_units = unit_count(p.k);
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }
    // The fused RMSNorm's 1 / rms scales each column's sums at the end (the products take
    // x times the norm weights, load_in's factor 1): the weights' loads need not wait for the
    // row's reduction. Over one column, the sum of squares comes from the x values the loop
    // loads anyway (ss), not from a pass of its own.
    var ss = 0.0;

    if (NCOLS == 1u) {
        // One column (decode): x's slice loaded once per unit for all rows, each row decoded
        // and multiplied in turn (F16 decode was 8% slower with the rows decoded first).
        // Consecutive invocations take consecutive units of the row, so reads coalesce; each
        // unit's header (scales) is unpacked once for its one or two chunks, and its slice of x
        // is loaded once for all ROWS rows. Chunks are held in named variables, not arrays
        // indexed by a loop counter, which drivers may move to slow local memory. Grouped:
        // group g's lanes stride over its rows' units.
        let grow0 = row0 + (lane.lid / K_LANES) * ROWS;
        let xr = min(col0, p.n_cols - 1u) * (p.x_stride / 4u);
        // Rows whose chunks all lie inside them (k % 8 == 0: every model's) take the loop
        // without bounds checks, so that no load waits behind a branch; rows past the weights'
        // end (in their last workgroup) read the last row again, their sums never stored.
        if (p.k % 8u == 0u) {
            for (var u = lane.lid % K_LANES; u < n_units; u += K_LANES) {
                let xu = x_unit_inside(xr, u);
                ss += xu.c0.ss + xu.c1.ss;
                for (var r = 0u; r < ROWS; r++) {
                    acc[r] += unit_dot_inside(min(grow0 + r, last_row), u, xu);
                }
            }
        } else {
            for (var u = lane.lid % K_LANES; u < n_units; u += K_LANES) {
                let xu = x_unit(xr, u);
                ss += xu.c0.ss + xu.c1.ss;
                for (var r = 0u; r < ROWS; r++) {
                    acc[r] += unit_dot(min(grow0 + r, last_row), u, xu);
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
                if (row <= last_row) {
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
    if (NORM && NCOLS == 1u) {
        // Every group of invocations loads the whole row once: the workgroup's sum of squares is
        // ROW_GROUPS times the row's.
        let inv = inv_rms_from(ss, f32(ROW_GROUPS * p.k), lane);
        for (var i = 0u; i < ROWS; i++) { acc[i] *= inv; }
    } else if (NORM) {
        let rms = row_inv_rms(lane);
        for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] *= rms[i % NCOLS]; }
    }
    if (ROW_GROUPS > 1u) {
        write_group_rows(acc, out0, lane);
        return;
    }
    write_rows(acc, out0, lane);
}
