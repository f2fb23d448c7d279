// The float input of a GEMV (gemv.wgsl) or of the activation quantizer (quantize_q8.wgsl):
// x itself, or x with a fused RMSNorm or SwiGLU in front.
// NORM: x is the residual stream; the kernel applies RMSNorm (weights norm_w) on the fly,
// so the norm needs no dispatch of its own (each workgroup recomputes the row's sum of
// squares, a few KiB it reads from cache).
// GLU: x holds the gate activations and aux (binding 5) the up activations, same layout;
// the kernel feeds silu(gate) * up, so SwiGLU needs no dispatch of its own.
// Header constants: WG, NCOLS, NORM, GLU; the including body declares `partial` (workgroup
// f32s, at least NCOLS * LANE_GROUPS_MAX).

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // rows of x_stride floats, x_stride % 4 == 0
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
    return input_of(load_x(row_base, c, part), row_base, c, part, inv_rms);
}

// load_in's value from x's values v (load_x's).
fn input_of(v: vec4<f32>, row_base: u32, c: u32, part: u32, inv_rms: f32) -> vec4<f32> {
    if (GLU) {
        let k0 = c * 8u + part * 4u;
        if (k0 >= p.k) { return vec4<f32>(0.0); }
        return silu_times(v, norm_w[row_base + 2u * c + part]);
    }
    return v * norm_scale(c, part, inv_rms);
}

// SwiGLU's silu(gate) * up.
fn silu_times(gate: vec4<f32>, up: vec4<f32>) -> vec4<f32> {
    return gate / (vec4<f32>(1.0) + exp(-gate)) * up;
}

// load_x and input_of for a chunk inside a row of k % 8 == 0 (the float GEMV's aligned loop):
// the loads alone, with no bounds checks to put a branch in front of them.
fn load_x_inside(row_base: u32, c: u32, part: u32) -> vec4<f32> {
    return x[row_base + 2u * c + part];
}

fn input_inside(v: vec4<f32>, row_base: u32, c: u32, part: u32) -> vec4<f32> {
    if (GLU) { return silu_times(v, norm_w[row_base + 2u * c + part]); }
    if (NORM) { return v * norm_w[2u * c + part]; }
    return v;
}

// 1 / rms of each x row (columns col0 .. col0 + NCOLS - 1) for the fused RMSNorm (k % 4 == 0 there); 1 without NORM.
// Uniform control flow: it has barriers.
fn row_inv_rms(lane: Lane) -> array<f32, NCOLS> {
    var inv: array<f32, NCOLS>;
    for (var m = 0u; m < NCOLS; m++) { inv[m] = 1.0; }
    if (NORM) {
        for (var m = 0u; m < NCOLS; m++) {
            let xr = min(col0 + m, p.n_cols - 1u) * (p.x_stride / 4u);
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
    return inv;
}

