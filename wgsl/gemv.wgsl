// GEMV for decode and few-token batches: Y[m, n] = sum_k W[n, k] * X[m, k] for m < n_cols,
// one body for every weight format (the format file supplies decode8). Each workgroup owns
// ROWS rows of one weight chunk; its invocations stride over the row's 8-weight chunks.
// NORM: x is the residual stream; the kernel applies RMSNorm (weights norm_w) on the fly,
// so the norm needs no dispatch of its own (each workgroup recomputes the row's sum of
// squares, a few KiB it reads from cache).
// GLU: x holds the gate activations and aux (binding 5) the up activations, same layout;
// the kernel feeds silu(gate) * up, so SwiGLU needs no dispatch of its own.
// Header constants: WG, ROWS, NCOLS, NORM, GLU.

struct Params {
    n_cols: u32,     // active columns (m), <= NCOLS
    k: u32,          // weights per row
    n_rows: u32,     // rows in this weight chunk
    row_offset: u32, // output column of the chunk's first row
    x_stride: u32,   // elements between input rows (m)
    y_stride: u32,   // elements between output rows (m)
    has_bias: u32,   // add bias[row_offset + r]
    accumulate: u32, // add the value already in Y (fused residual)
    eps: f32,        // RMSNorm epsilon (gemv with NORM)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // rows of x_stride floats, x_stride % 4 == 0
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> norm_w: array<vec4<f32>>;   // NORM: weights; GLU: up rows

// Half `part` (0: weights 0-3, 1: weights 4-7) of chunk c of an x row; zero past k (the
// last chunk of a ragged row, or a unit's second chunk beyond the row's end).
fn load_x(row_base: u32, c: u32, part: u32) -> vec4<f32> {
    let k0 = c * 8u + part * 4u;
    let kk = vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u);
    if (k0 >= p.k) { return vec4<f32>(0.0); }
    return select(vec4<f32>(0.0), x[row_base + 2u * c + part], kk < vec4<u32>(p.k));
}

// The RMSNorm factor of x values 8c + 4 part .. +3: inv_rms * norm weight (1 without NORM).
fn norm_scale(c: u32, part: u32, inv_rms: f32) -> vec4<f32> {
    if (!NORM) { return vec4<f32>(1.0); }
    let k0 = c * 8u + part * 4u;
    if (k0 >= p.k) { return vec4<f32>(0.0); }
    return inv_rms * norm_w[k0 / 4u];
}

// The GEMV's input values 8c + 4 part .. +3 of the x row at row_base (in vec4s): x itself,
// RMS-normalized x (NORM), or silu(gate) * up (GLU).
fn load_in(row_base: u32, c: u32, part: u32, inv_rms: f32) -> vec4<f32> {
    let v = load_x(row_base, c, part);
    if (GLU) {
        let k0 = c * 8u + part * 4u;
        if (k0 >= p.k) { return vec4<f32>(0.0); }
        let up = norm_w[row_base + 2u * c + part];
        return v / (vec4<f32>(1.0) + exp(-v)) * up;
    }
    return v * norm_scale(c, part, inv_rms);
}

var<workgroup> partial: array<f32, ROWS * NCOLS * LANE_GROUPS_MAX>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let n_units = unit_count(p.k);
    var acc: array<f32, ROWS * NCOLS>;
    for (var i = 0u; i < ROWS * NCOLS; i++) { acc[i] = 0.0; }

    // RMSNorm prologue: 1 / rms of each x row (k % 4 == 0 here).
    var inv: array<f32, NCOLS>;
    for (var m = 0u; m < NCOLS; m++) { inv[m] = 1.0; }
    if (NORM) {
        for (var m = 0u; m < NCOLS; m++) {
            let xr = min(m, p.n_cols - 1u) * (p.x_stride / 4u);
            var ss = 0.0;
            for (var i = lane.lid; i < p.k / 4u; i += WG) {
                let v = x[xr + i];
                ss += dot(v, v);
            }
            let s = group_sum(ss, lane);
            if (lane_is_leader(lane)) { partial[m * LANE_GROUPS_MAX + lane_group(lane)] = s; }
        }
        workgroupBarrier();
        for (var m = 0u; m < NCOLS; m++) {
            var total = 0.0;
            for (var g = 0u; g < lane_groups(lane); g++) { total += partial[m * LANE_GROUPS_MAX + g]; }
            inv[m] = 1.0 / sqrt(total / f32(p.k) + p.eps);
        }
        workgroupBarrier();
    }

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
            let xr = min(m, p.n_cols - 1u) * (p.x_stride / 4u);
            x0l[m] = load_in(xr, c0, 0u, inv[m]);
            x0h[m] = load_in(xr, c0, 1u, inv[m]);
            s0[m] = dot(x0l[m] + x0h[m], vec4<f32>(1.0));
            if (UNIT_CHUNKS == 2u) {
                x1l[m] = load_in(xr, c1, 0u, inv[m]);
                x1h[m] = load_in(xr, c1, 1u, inv[m]);
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

    // All ROWS x NCOLS sums with a single barrier.
    for (var i = 0u; i < ROWS * NCOLS; i++) {
        let s = group_sum(acc[i], lane);
        if (lane_is_leader(lane)) { partial[i * LANE_GROUPS_MAX + lane_group(lane)] = s; }
    }
    workgroupBarrier();
    for (var i = lane.lid; i < ROWS * NCOLS; i += WG) {
        let r = i / NCOLS;
        let m = i % NCOLS;
        let row = row0 + r;
        if (row < p.n_rows && m < p.n_cols) {
            var total = 0.0;
            for (var g = 0u; g < lane_groups(lane); g++) { total += partial[i * LANE_GROUPS_MAX + g]; }
            let n = p.row_offset + row;
            let o = m * p.y_stride + n;
            var v = total;
            if (p.has_bias != 0u) { v += bias[n]; }
            if (p.accumulate != 0u) { v += y[o]; }
            y[o] = v;
        }
    }
}
