// Sampling on the GPU, second pass: one workgroup per row of logits picks a token with
// llama.cpp's chain (repetition, frequency and presence penalties over the recent tokens, then
// greedy, or top-k, top-p and min-p on the softmax, temperature, and a seeded draw), appends it
// to the row's history and writes its id where the next step's embedding gather reads it. The
// first pass (sample_prune.wgsl) applied the penalties and bans and left, per slice of the
// row, its largest logit and a floor under its top_k largest. The CPU reference is `Sampler`
// in src/sample.rs: the same steps in the same order and precision.
// Configuration, state and bindings: common/sample_common.wgsl; where a row's configuration
// and state come from: common/sample_one.wgsl (the uniform; state row = row) or
// common/sample_columns.wgsl (a batched decode step: each row its slot's). Header constants:
// WG (a power of two), SLICE, CAP (most candidates, a power of two <= 4 WG), HIST, BAN,
// TOPS (the first pass kept each slice's candidates in order: merge them, merge_tops), SCAP
// (most candidates a slice keeps), PSTRIDE (16-byte words per slice in `prune`),
// MAX_TOPS_SLICES, ONE_PASS (a greedy sampler's only pass: no first pass; this one applies the
// penalties and bans and reads the row for its largest logit itself, one dispatch instead of
// two).

// Candidates per invocation while they are ranked.
const HELD: u32 = (CAP + WG - 1u) / WG;

// The candidates' values and ids. Scalars: the merge's binary searches read one entry at a
// time, and as vectors with a component picked at run time they cost a third more (H200, run
// 352: 25.5 -> 23.6 µs a pick with the searches' comparison unbranched too).
var<workgroup> cand_v: array<f32, CAP>;
var<workgroup> cand_i: array<u32, CAP>;
// The kept candidates' exp(v - top), for the draw (their weights exp((v - top) / temp)
// replace their values in cand_v).
var<workgroup> ex: array<vec4<f32>, CAP / 4u>;
var<workgroup> n_cand: atomic<u32>;
var<workgroup> bins: array<atomic<u32>, 256>;
var<workgroup> picked: u32;
// TOPS: each slice's candidates taken (at most top_k) and where they start among cand_*.
var<workgroup> slice_n: array<u32, MAX_TOPS_SLICES>;
var<workgroup> slice_off: array<u32, MAX_TOPS_SLICES + 1u>;

// A 32-bit hash (PCG's output permutation), the RNG of both samplers.
fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

// Draw n of a seed: uniform in [0, 1) with 24 random bits.
fn uniform01(seed_lo: u32, seed_hi: u32, n: u32) -> f32 {
    let h = pcg(pcg(pcg(seed_lo) ^ seed_hi) + n);
    return f32(h >> 8u) * (1.0 / 16777216.0);
}

// A float as an unsigned key in the same order.
fn sort_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// The key of the k-th largest logit of the row: four passes of an 8-bit radix select from
// the most significant digit. Uniform control flow.
fn kth_largest_key(base: u32, n: u32, k: u32, lane: Lane) -> u32 {
    var prefix = 0u;
    var mask = 0u;
    var left = k;
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        for (var b = lane.lid; b < 256u; b += WG) { atomicStore(&bins[b], 0u); }
        workgroupBarrier();
        for (var i = lane.lid; i < n; i += WG) {
            let v = logits[base + i];
            let key = sort_key(v);
            if (usable(v) && (key & mask) == prefix) { atomicAdd(&bins[(key >> shift) & 255u], 1u); }
        }
        workgroupBarrier();
        if (lane.lid == 0u) {
            var run = 0u;
            var digit = 0u;
            for (var b = 255; b >= 0; b--) {
                let c = atomicLoad(&bins[u32(b)]);
                if (run + c >= left) {
                    digit = u32(b);
                    break;
                }
                run += c;
            }
            left -= run;
            picked = digit;
        }
        let digit = workgroupUniformLoad(&picked);
        prefix |= digit << shift;
        mask |= 255u << shift;
    }
    return prefix;
}

// Gathers the row's usable logits at or above `t` (exact: those whose sort key is at least
// `key`) into the candidates, at most CAP of them; returns how many there were (uniform).
fn gather(base: u32, n: u32, t: f32, key: u32, exact: bool, lane: Lane) -> u32 {
    if (lane.lid == 0u) { atomicStore(&n_cand, 0u); }
    workgroupBarrier();
    for (var i = lane.lid; i < n; i += WG) {
        let v = logits[base + i];
        let keep = select(v >= t, sort_key(v) >= key, exact);
        if (usable(v) && keep) {
            let slot = atomicAdd(&n_cand, 1u);
            if (slot < CAP) {
                cand_v[slot] = v;
                cand_i[slot] = i;
            }
        }
    }
    workgroupBarrier();
    if (lane.lid == 0u) { picked = atomicLoad(&n_cand); }
    return workgroupUniformLoad(&picked);
}

// How many of the merged candidates of slices s0 .. s0 + 3 (cand_* from slice_off[s]; none
// past the last slice) come before (v, id): each list is in order, so those are a prefix of
// it, found by a binary search of fixed steps (SCAP down to 1) with no branch, the four
// slices' searches side by side. (Against one slice at a time in a branching loop: 1.3 µs
// less of the ~13 µs that merging 16 slices' lists of 40 costs a pick on an H200, run 325.
// Still ~7 µs of a pick in run 352; counting each candidate's place over all of them, as the
// candidates gathered from the row are ranked, cost more: 17 µs over 640, run 351.)
fn ahead_in_slices4(s0: u32, slices: u32, v: f32, id: u32) -> u32 {
    var first = vec4<u32>(0u);
    var len = vec4<u32>(0u);
    for (var k = 0u; k < 4u; k++) {
        let s = min(s0 + k, slices - 1u);
        first[k] = slice_off[s];
        len[k] = select(0u, slice_off[s + 1u] - slice_off[s], s0 + k < slices);
    }
    var pos = vec4<u32>(0u);
    for (var step = SCAP; step > 0u; step >>= 1u) {
        for (var k = 0u; k < 4u; k++) {
            let probe = pos[k] + step;
            let at = min(first[k] + min(probe, max(len[k], 1u)) - 1u, CAP - 1u);
            let mv = cand_v[at];
            let mi = cand_i[at];
            pos[k] = select(pos[k], probe, probe <= len[k] && comes_before(mv, mi, v, id));
        }
    }
    return pos.x + pos.y + pos.z + pos.w;
}

// TOPS: the row's top_k candidates in order in cand_*, merged from the first pass's slices'
// lists (each slice's first top_k: the row's top_k are among them): each candidate's place is
// how many come before it in every list. Returns how many (uniform), or 0xffffffff where a
// slice kept none (more than SCAP at or above its floor), or the row has too many slices or
// candidates: then the caller gathers them from the row.
fn merge_tops(row: u32, slices: u32, top_k: u32, lane: Lane) -> u32 {
    if (slices > MAX_TOPS_SLICES) { return 0xffffffffu; }
    for (var s = lane.lid; s < slices; s += WG) { slice_n[s] = prune[(row * slices + s) * PSTRIDE].w >> 1u; }
    workgroupBarrier();
    if (lane.lid == 0u) {
        var off = 0u;
        var kept = true;
        for (var s = 0u; s < slices; s++) {
            kept = kept && slice_n[s] <= SCAP;
            slice_off[s] = off;
            off += min(slice_n[s], top_k);
        }
        slice_off[slices] = off;
        picked = select(0xffffffffu, off, kept && off <= CAP);
    }
    let total = workgroupUniformLoad(&picked);
    if (total == 0xffffffffu) { return total; }
    // Entry r of slice s by invocation s SCAP + r (strided), to its place after the slices
    // before it.
    for (var c = lane.lid; c < slices * SCAP; c += WG) {
        let s = c / SCAP;
        let r = c % SCAP;
        if (r < slice_off[s + 1u] - slice_off[s]) {
            let e = prune[(row * slices + s) * PSTRIDE + 1u + r / 2u];
            let at = slice_off[s] + r;
            cand_v[at] = bitcast<f32>(select(e.x, e.z, r % 2u == 1u));
            cand_i[at] = select(e.y, e.w, r % 2u == 1u);
        }
    }
    workgroupBarrier();
    var mine_v: array<f32, HELD>;
    var mine_i: array<u32, HELD>;
    var place: array<u32, HELD>;
    for (var j = 0u; j < HELD; j++) {
        let c = lane.lid + j * WG;
        place[j] = 0xffffffffu;
        if (c < total) {
            mine_v[j] = cand_v[c];
            mine_i[j] = cand_i[c];
            var r = 0u;
            for (var s0 = 0u; s0 < slices; s0 += 4u) { r += ahead_in_slices4(s0, slices, mine_v[j], mine_i[j]); }
            place[j] = r;
        }
    }
    workgroupBarrier();
    let keep = min(total, top_k);
    put_in_place(mine_v, mine_i, place, keep);
    workgroupBarrier();
    return keep;
}

// Values i0 .. i0 + 7 (i0 a multiple of 8) of ex (in two vector loads), or of cand_v.
fn eight_ex(i0: u32) -> array<f32, 8> { return as_eight(ex[i0 / 4u], ex[i0 / 4u + 1u]); }
fn eight_v(i0: u32) -> array<f32, 8> {
    return array<f32, 8>(cand_v[i0], cand_v[i0 + 1u], cand_v[i0 + 2u], cand_v[i0 + 3u],
                         cand_v[i0 + 4u], cand_v[i0 + 5u], cand_v[i0 + 6u], cand_v[i0 + 7u]);
}
fn as_eight(lo: vec4<f32>, hi: vec4<f32>) -> array<f32, 8> {
    return array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
}

// This invocation's candidates (values, ids) into cand_* at their places, those before `keep`.
fn put_in_place(mine_v: array<f32, HELD>, mine_i: array<u32, HELD>, place: array<u32, HELD>, keep: u32) {
    for (var j = 0u; j < HELD; j++) {
        if (place[j] < keep) {
            cand_v[place[j]] = mine_v[j];
            cand_i[place[j]] = mine_i[j];
        }
    }
}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x;
    let cfg = row_config(row);
    let base = row * cfg.logits_stride;
    let st = row_slot(row) * STATE_WORDS;
    let n = cfg.n_vocab;
    let total = state[st + 1u];

    // The row's largest logit and its lowest index (greedy's answer, and softmax's reference),
    // and the floor every one of its top_k largest logits reaches: from the first pass's
    // slices, in index order (so the first slice with the largest value has its lowest index).
    let slices = (n + SLICE - 1u) / SLICE;
    var best = -3.4028235e38;
    var best_i = 0xffffffffu;
    var fl = -3.4028235e38;
    if (ONE_PASS) {
        // A greedy sampler's only pass: the penalties and bans, then the row's largest logit
        // read here, eight loads in flight an invocation, each invocation's indices in
        // increasing order (so its first largest is its lowest index). Clamped indices past
        // the row repeat its last logit, which changes no answer.
        penalize_and_ban(cfg, st, base, 0u, n, lane.lid);
        for (var i0 = lane.lid; i0 < n; i0 += 8u * WG) {
            var v: array<f32, 8>;
            for (var j = 0u; j < 8u; j++) { v[j] = logits[base + min(i0 + j * WG, n - 1u)]; }
            for (var j = 0u; j < 8u; j++) {
                if (usable(v[j]) && beats(v[j], best, best_i)) {
                    best = v[j];
                    best_i = min(i0 + j * WG, n - 1u);
                }
            }
        }
    } else {
        for (var s = lane.lid; s < slices; s += WG) {
            let e = prune[(row * slices + s) * PSTRIDE];
            let v = bitcast<f32>(e.x);
            if (e.y != 0xffffffffu && beats(v, best, best_i)) {
                best = v;
                best_i = e.y;
            }
            if ((e.w & 1u) != 0u) { fl = max(fl, bitcast<f32>(e.z)); }
        }
    }
    let mx = wg_max(best, lane);
    let arg = wg_min_u32(select(0xffffffffu, best_i, best == mx), lane);
    let floor_t = wg_max(fl, lane);

    if (!ONE_PASS && cfg.greedy == 0u && PHASES > 2u) {
        // Candidates: the top_k largest logits (top-p and min-p act on their softmax below),
        // gathered from those at or above the floor; where more than CAP reach it (logits
        // crowding just below the largest), an exact radix select on their bits finds the
        // top_k-th largest instead.
        var min_key = 0u;
        var count = 0xffffffffu;
        if (TOPS) { count = merge_tops(row, slices, cfg.top_k, lane); }
        let merged = count != 0xffffffffu;
        if (!merged) {
            count = gather(base, n, floor_t, 0u, false, lane);
            if (count > CAP) {
                min_key = kth_largest_key(base, n, cfg.top_k, lane);
                count = gather(base, n, floor_t, min_key, true, lane);
            }
            count = min(count, CAP);
        }
        if (PHASES > 3u) {
            // Merged candidates come in order already.
            if (!merged) {
                // The candidates into the order of the CPU reference: each one's place is how
                // many come before it (larger value first, lower index on ties: a total order, so
                // no two share a place), counted over all of them at once, four at a time. (A
                // bitonic sort took 17 µs on an H200: a barrier of the whole workgroup per stage.)
                for (var i = count + lane.lid; i < (count + 3u) / 4u * 4u; i += WG) {
                    cand_v[i] = -3.4028235e38;
                    cand_i[i] = 0xffffffffu;
                }
                workgroupBarrier();
                var mine_v: array<f32, HELD>;
                var mine_i: array<u32, HELD>;
                var place: array<u32, HELD>;
                for (var j = 0u; j < HELD; j++) {
                    let i = lane.lid + j * WG;
                    place[j] = 0xffffffffu;
                    if (i < count) {
                        let v = cand_v[i];
                        let id = cand_i[i];
                        var r = 0u;
                        for (var o = 0u; o < count; o += 4u) {
                            let v4 = vec4<f32>(cand_v[o], cand_v[o + 1u], cand_v[o + 2u], cand_v[o + 3u]);
                            let i4 = vec4<u32>(cand_i[o], cand_i[o + 1u], cand_i[o + 2u], cand_i[o + 3u]);
                            r += count_before4(v4, i4, v, id);
                        }
                        mine_v[j] = v;
                        mine_i[j] = id;
                        place[j] = r;
                    }
                }
                workgroupBarrier();
                put_in_place(mine_v, mine_i, place, count);
                workgroupBarrier();
            }
            if (PHASES > 4u) {
                // Each kept candidate's exp(v - top) and temperature weight (into cand_v),
                // computed side by side (the expressions of the CPU reference's walk, so the
                // same values), then one invocation walks them in order as the reference does:
                // its sums in the same order, its loads no longer waiting on an exp each.
                let keep0 = min(count, cfg.top_k);
                let top = cand_v[0];
                workgroupBarrier();
                for (var i = lane.lid; i < keep0; i += WG) {
                    let d = cand_v[i] - top;
                    ex[i / 4u][i % 4u] = exp(d);
                    cand_v[i] = exp(d / cfg.temp);
                }
                workgroupBarrier();
                if (lane.lid == 0u) {
                    // Eight values at a time (their loads issued together), each chunk's values
                    // taken in order.
                    var keep = keep0;
                    var sum = 0.0;
                    for (var i0 = 0u; i0 < keep; i0 += 8u) {
                        let e = eight_ex(i0);
                        for (var j = 0u; j < 8u; j++) {
                            if (i0 + j < keep) { sum += e[j]; }
                        }
                    }
                    if (cfg.top_p < 1.0) {
                        var acc = 0.0;
                        var cut = keep;
                        for (var i0 = 0u; i0 < keep && cut == keep; i0 += 8u) {
                            let e = eight_ex(i0);
                            for (var j = 0u; j < 8u; j++) {
                                if (i0 + j < keep && cut == keep) {
                                    acc += e[j] / sum;
                                    if (acc >= cfg.top_p) { cut = i0 + j + 1u; }
                                }
                            }
                        }
                        keep = cut;
                    }
                    if (cfg.min_p > 0.0) {
                        // The first candidate stays; from the second on, those whose
                        // probability reaches min_p times the largest's (1 / sum).
                        let p_floor = cfg.min_p / sum;
                        var k = 1u;
                        var low = false;
                        for (var i0 = 0u; i0 < keep && !low; i0 += 8u) {
                            let e = eight_ex(i0);
                            for (var j = 0u; j < 8u; j++) {
                                let i = i0 + j;
                                if (i >= 1u && i < keep && !low) {
                                    if (e[j] / sum >= p_floor) { k = i + 1u; } else { low = true; }
                                }
                            }
                        }
                        keep = k;
                    }
                    // The weights (exp((v - top) / temp)) are in cand_v now.
                    var weight_total = 0.0;
                    for (var i0 = 0u; i0 < keep; i0 += 8u) {
                        let w = eight_v(i0);
                        for (var j = 0u; j < 8u; j++) {
                            if (i0 + j < keep) { weight_total += w[j]; }
                        }
                    }
                    var r = uniform01(cfg.seed_lo, cfg.seed_hi, state[st]) * weight_total;
                    var at = max(keep, 1u) - 1u;
                    var hit = false;
                    for (var i0 = 0u; i0 < keep && !hit; i0 += 8u) {
                        let w = eight_v(i0);
                        for (var j = 0u; j < 8u; j++) {
                            if (i0 + j < keep && !hit) {
                                if (r < w[j]) {
                                    at = i0 + j;
                                    hit = true;
                                } else {
                                    r -= w[j];
                                }
                            }
                        }
                    }
                    picked = cand_i[at];
                }
            }
            if (lane.lid == 0u && PHASES == 4u) { picked = u32(cand_v[0]) + min_key; }
        }
        if (lane.lid == 0u && PHASES == 3u) { picked = count + min_key; }
    } else if (lane.lid == 0u) {
        picked = arg;
    }
    workgroupBarrier();
    if (lane.lid == 0u) {
        let t = picked;
        ids[row] = t;
        // Chained steps: the next step's position, and the token for the host.
        pass_on(t);
        // The next draw, and the token into the penalties' history.
        state[st] = state[st] + select(1u, 0u, cfg.greedy != 0u);
        state[st + 4u + total % HIST] = t;
        state[st + 1u] = total + 1u;
    }
}
