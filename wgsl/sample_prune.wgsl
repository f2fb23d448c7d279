// Sampling's first pass (sample.wgsl is the second): one workgroup per SLICE logits of a row
// (grid: slices x rows) applies the row's penalties and bans to its slice of the logits, then
// writes the slice's largest logit (its lowest index on ties) and a floor under its top_k
// largest: a value that at least top_k of the slice's logits reach. Every one of the row's
// top_k largest logits reaches the largest of its slices' floors (that slice alone holds top_k
// logits at or above it), so the second pass gathers the candidates in one read of the row,
// and greedy rows need no read at all. One workgroup reading a 32,000-token row again and
// again to search for a threshold (as the second pass did alone) took 30-40 µs on an H200;
// here each slice's search runs on values held in registers, all slices at once.
// The including file supplies row_config, row_slot and the `prune` buffer (common/
// sample_one.wgsl or sample_columns.wgsl). Header constants: WG, SLICE (a multiple of WG),
// CAP, HIST, BAN, PHASES, TOPS, SCAP, PSTRIDE (as sample.wgsl).
// TOPS: the slice also keeps its candidates, its usable logits at or above its floor (at most
// SCAP; its count tells the second pass whether it kept them), in the CPU reference's order
// (larger first, lower index on ties), so that the second pass merges the slices' lists
// instead of reading the row and ranking the several hundred logits at or above the largest
// floor.

// Logits per invocation, held in registers.
const HELD: u32 = SLICE / WG;

// The search for a floor under the top_k largest of the values the workgroup holds (HELD per
// invocation, NaN where none), mx their largest: a distance below mx within which at least
// top_k of them lie. Each round counts the values within four distances (one batched reduction;
// no atomics, which crowd when values bunch up) and narrows the interval where the count
// crosses top_k. The first round brackets `hint`, the distance this slice's search found at
// the step before (0: none; logits of one model keep their spread from token to token, so
// it mostly holds between top_k and twice top_k at once; whatever it is, the floor found is
// exact). While no finite distance holds top_k yet, the distances grow geometrically (the
// last one unbounded: all of them); once one does, they split [near, far] evenly (split
// evenly from an unbounded far, they stayed astronomically large), until far holds at most
// twice top_k or six rounds have passed. `found` false: no finite distance was found to hold
// top_k (then far is unbounded). Uniform control flow.
struct Floor {
    far: f32,
    found: bool,
}

// Two halves, used by turns, so that a round's counts need one barrier: the next round writes
// the other half.
var<workgroup> sums: array<f32, 8u * LANE_GROUPS_MAX>;
// TOPS: the slice's candidates while they are ranked, and their count; values and ids four
// to a vector, so that ranking them reads four at a time.
var<workgroup> sl_v: array<vec4<f32>, SCAP / 4u>;
var<workgroup> sl_i: array<vec4<u32>, SCAP / 4u>;
var<workgroup> sl_n: atomic<u32>;
var<workgroup> sl_count: u32;

// How many of the values lie within each distance d[j] below mx (mx - v <= d[j]), counted in
// half `h` (0 or 1) of sums.
fn count_within(v: array<f32, HELD>, mx: f32, d: vec4<f32>, h: u32, lane: Lane) -> vec4<u32> {
    var c = vec4<u32>(0u);
    for (var j = 0u; j < HELD; j++) {
        if (usable(v[j])) { c += vec4<u32>(vec4<f32>(mx - v[j]) <= d); }
    }
    for (var j = 0u; j < 4u; j++) {
        // Exact in f32: counts stay far below 2^24.
        let s = group_sum(f32(c[j]), lane);
        if (lane_is_leader(lane)) { sums[(4u * h + j) * LANE_GROUPS_MAX + lane_group(lane)] = s; }
    }
    workgroupBarrier();
    var out = vec4<u32>(0u);
    for (var j = 0u; j < 4u; j++) {
        var t = 0.0;
        for (var g = 0u; g < lane_groups(lane); g++) { t += sums[(4u * h + j) * LANE_GROUPS_MAX + g]; }
        out[j] = u32(t);
    }
    return out;
}

fn search_floor(v: array<f32, HELD>, mx: f32, top_k: u32, hint: f32, lane: Lane) -> Floor {
    let unbounded = 3.4028235e38;
    var near = 0.0;          // a distance holding fewer than top_k
    var far = unbounded;     // a distance holding at least top_k
    var found = false;
    var done = false;
    for (var round = 0u; round < 6u && !done; round++) {
        var d: vec4<f32>;
        if (round == 0u && hint > 0.0) {
            d = hint * vec4<f32>(0.5, 0.8, 1.25, 2.0);
        } else if (far == unbounded) {
            let b = max(near, 0.125);
            d = vec4<f32>(4.0 * b, 16.0 * b, 64.0 * b, unbounded);
        } else {
            for (var j = 0u; j < 4u; j++) { d[j] = near + (far - near) * f32(j + 1u) / 5.0; }
        }
        let c = count_within(v, mx, d, round % 2u, lane);
        var j = 0u;
        while (j < 4u && c[j] < top_k) { j++; }
        if (j == 4u && d[3] == unbounded) {
            // Fewer than top_k values in all: they bound nothing.
            done = true;
        } else if (j == 4u) {
            near = d[3];
        } else if (d[j] == unbounded) {
            near = d[2];
        } else {
            far = d[j];
            found = true;
            if (j > 0u) { near = d[j - 1u]; }
            done = c[j] <= 2u * top_k;
        }
    }
    return Floor(far, found);
}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.y;
    let cfg = row_config(row);
    let base = row * cfg.logits_stride;
    let st = row_slot(row) * STATE_WORDS;
    let n = cfg.n_vocab;
    let lo = wid.x * SLICE;
    let hi_i = min(lo + SLICE, n);

    // The distance this slice's floor lay below its largest logit at the step before (its
    // header, which this pass rewrites below), the first round's guess.
    let hdr = (row * nwg.x + wid.x) * PSTRIDE;
    let prev = prune[hdr];
    var hint = 0.0;
    if ((prev.w & 1u) != 0u) {
        let h = bitcast<f32>(prev.x) - bitcast<f32>(prev.z);
        if (h > 0.0 && h < 1.0e30) { hint = h; }
    }

    penalize_and_ban(cfg, st, base, lo, hi_i, lane.lid);

    // The slice in registers (NaN where there is no logit: NaN logits never count), and its
    // largest value with its lowest index.
    var v: array<f32, HELD>;
    var best = -3.4028235e38;
    var best_i = 0xffffffffu;
    let nan = bitcast<f32>(0x7fc00000u);
    for (var j = 0u; j < HELD; j++) {
        let i = lo + j * WG + lane.lid;
        v[j] = nan;
        if (i < hi_i) { v[j] = logits[base + i]; }
        if (usable(v[j]) && beats(v[j], best, best_i)) {
            best = v[j];
            best_i = i;
        }
    }
    let mx = wg_max(best, lane);
    let arg = wg_min_u32(select(0xffffffffu, best_i, best == mx), lane);

    // The floor: the smallest value within a distance below mx that holds at least top_k.
    var far = 3.4028235e38;
    var has_floor = false;
    if (cfg.greedy == 0u && PHASES >= 2u) {
        let f = search_floor(v, mx, cfg.top_k, hint, lane);
        far = f.far;
        has_floor = f.found;
    }
    // The smallest value within `far`: at least top_k values reach it (counted by the same
    // comparison, so rounding cannot drop one).
    var low = 3.4028235e38;
    for (var j = 0u; j < HELD; j++) {
        if (usable(v[j]) && mx - v[j] <= far) { low = min(low, v[j]); }
    }
    let fl = -wg_max(-low, lane);
    var n_top = 0u;
    if (TOPS && cfg.greedy == 0u && PHASES >= 2u) {
        // The candidates (the same comparison as the second pass's gather, against this
        // slice's floor: every logit at or above the row's largest floor is among them).
        if (lane.lid == 0u) { atomicStore(&sl_n, 0u); }
        workgroupBarrier();
        for (var j = 0u; j < HELD; j++) {
            if (usable(v[j]) && v[j] >= fl) {
                let slot = atomicAdd(&sl_n, 1u);
                if (slot < SCAP) {
                    sl_v[slot / 4u][slot % 4u] = v[j];
                    sl_i[slot / 4u][slot % 4u] = lo + j * WG + lane.lid;
                }
            }
        }
        workgroupBarrier();
        if (lane.lid == 0u) { sl_count = atomicLoad(&sl_n); }
        n_top = workgroupUniformLoad(&sl_count);
        // Each one's place: how many come before it, counted four at a time (the last vector
        // padded with entries that come after every candidate). Over SCAP the list is not kept.
        let padded = min((n_top + 3u) / 4u * 4u, SCAP);
        for (var c = n_top + lane.lid; c < padded; c += WG) {
            sl_v[c / 4u][c % 4u] = -3.4028235e38;
            sl_i[c / 4u][c % 4u] = 0xffffffffu;
        }
        workgroupBarrier();
        for (var c = lane.lid; c < n_top && n_top <= SCAP; c += WG) {
            let v0 = sl_v[c / 4u][c % 4u];
            let i0 = sl_i[c / 4u][c % 4u];
            var r = 0u;
            for (var o = 0u; o < n_top; o += 4u) {
                let v4 = sl_v[o / 4u];
                let i4 = sl_i[o / 4u];
                r += count_before4(v4, i4, v0, i0);
            }
            prune[hdr + 1u + r / 2u][2u * (r % 2u)] = bitcast<u32>(v0);
            prune[hdr + 1u + r / 2u][2u * (r % 2u) + 1u] = i0;
        }
    }
    if (lane.lid == 0u) {
        prune[hdr] = vec4<u32>(bitcast<u32>(mx), arg, bitcast<u32>(fl), select(0u, 1u, has_floor) | (n_top << 1u));
    }
}
