// Sampling on the GPU: one workgroup per row of logits picks a token with llama.cpp's chain
// (repetition, frequency and presence penalties over the recent tokens, then greedy, or top-k,
// top-p and min-p on the softmax, temperature, and a seeded draw), appends it to the row's
// history and writes its id where the next step's embedding gather reads it. The CPU
// reference is `Sampler` in src/sample.rs: the same steps in the same order and precision.
// Where a row's configuration and state come from is an include: common/sample_one.wgsl
// (the uniform; state row = row) or common/sample_columns.wgsl (a batched decode step: each
// row its slot's). Header constants: WG (a power of two), CAP (most candidates, a power of
// two <= 4 WG), HIST (most history tokens the penalties look at), BAN (most banned tokens).

struct Config {
    n_vocab: u32,
    top_k: u32,          // 1 ..= CAP (callers turn 0, "off", into CAP)
    window: u32,         // history tokens the penalties look at (<= HIST)
    greedy: u32,         // 1: argmax (after the penalties)
    temp: f32,
    top_p: f32,
    min_p: f32,
    repeat_penalty: f32,
    freq_penalty: f32,
    presence_penalty: f32,
    seed_lo: u32,
    seed_hi: u32,
    logits_stride: u32,  // floats between rows of logits
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// Per row: draws made so far, tokens ever appended, banned tokens, one unused word, the
// history ring of HIST ids, then the banned ids.
const STATE_WORDS: u32 = 4u + HIST + BAN;

@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> state: array<u32>;

var<workgroup> cand_v: array<f32, CAP>;
var<workgroup> cand_i: array<u32, CAP>;
var<workgroup> n_cand: atomic<u32>;
var<workgroup> bins: array<atomic<u32>, 256>;
var<workgroup> picked: u32;

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

// Candidates before `a` in the sorted order: larger value first, lower index on ties.
fn before(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

// NaN logits never count.
fn usable(v: f32) -> bool { return v == v; }

// How many logits of the row lie within each distance d[j] below the maximum (mx - v <=
// d[j]): counted in registers, added up with one batched reduction (cand_v, unused yet, holds
// the groups' sums). Uniform control flow.
fn count_within(base: u32, n: u32, mx: f32, d: array<f32, 4>, lane: Lane) -> array<u32, 4> {
    var c = vec4<u32>(0u);
    let dv = vec4<f32>(d[0], d[1], d[2], d[3]);
    for (var i = lane.lid; i < n; i += WG) {
        let v = logits[base + i];
        if (usable(v)) { c += vec4<u32>(vec4<f32>(mx - v) <= dv); }
    }
    workgroupBarrier();
    for (var j = 0u; j < 4u; j++) {
        // Exact in f32: counts stay far below 2^24.
        let s = group_sum(f32(c[j]), lane);
        if (lane_is_leader(lane)) { cand_v[j * LANE_GROUPS_MAX + lane_group(lane)] = s; }
    }
    workgroupBarrier();
    var out: array<u32, 4>;
    for (var j = 0u; j < 4u; j++) {
        var t = 0.0;
        for (var g = 0u; g < lane_groups(lane); g++) { t += cand_v[j * LANE_GROUPS_MAX + g]; }
        out[j] = u32(t);
    }
    workgroupBarrier();
    return out;
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

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x;
    let cfg = row_config(row);
    let base = row * cfg.logits_stride;
    let st = row_slot(row) * STATE_WORDS;
    let n = cfg.n_vocab;

    // Penalties: each distinct token of the window once, with its count (llama.cpp: divide
    // positive logits by the repetition penalty and multiply negative ones, then subtract
    // count * frequency and presence).
    let total = state[st + 1u];
    let n_hist = min(min(total, cfg.window), HIST);
    let penalize = cfg.repeat_penalty != 1.0 || cfg.freq_penalty != 0.0 || cfg.presence_penalty != 0.0;
    if (penalize) {
        // The window is the last n_hist tokens of the ring.
        let start = total - n_hist;
        for (var i = lane.lid; i < n_hist; i += WG) {
            let t = state[st + 4u + (start + i) % HIST];
            var first = true;
            var count = 0u;
            for (var j = 0u; j < n_hist; j++) {
                if (state[st + 4u + (start + j) % HIST] == t) {
                    if (j < i) { first = false; }
                    count += 1u;
                }
            }
            if (first && t < n) {
                var l = logits[base + t];
                l = select(l * cfg.repeat_penalty, l / cfg.repeat_penalty, l > 0.0);
                l -= f32(count) * cfg.freq_penalty + cfg.presence_penalty;
                logits[base + t] = l;
            }
        }
    }
    storageBarrier();
    workgroupBarrier();
    // Banned tokens (--ignore-eos) are never drawn.
    for (var i = lane.lid; i < min(state[st + 2u], BAN); i += WG) {
        let t = state[st + 4u + HIST + i];
        if (t < n) { logits[base + t] = -3.4028235e38; }
    }
    storageBarrier();
    workgroupBarrier();

    // The largest logit and its lowest index (greedy's answer, and softmax's reference).
    var best = -3.4028235e38;
    var best_i = 0xffffffffu;
    for (var i = lane.lid; i < n; i += WG) {
        let v = logits[base + i];
        if (usable(v) && (v > best || best_i == 0xffffffffu)) {
            best = v;
            best_i = i;
        }
    }
    let mx = wg_max(best, lane);
    let arg = wg_min_u32(select(0xffffffffu, best_i, best == mx), lane);

    if (cfg.greedy == 0u && PHASES > 1u) {
        // Candidates: the top_k largest logits (top-p and min-p act on their softmax below).
        // A search over distances below the maximum finds a threshold that holds at least
        // top_k and at most CAP of them without sorting the vocabulary: each round counts the
        // logits within four distances (in registers, then one batched reduction: no atomics,
        // which crowd when logits bunch up), and narrows the interval where the count
        // crosses top_k. Where the logits crowd one distance too tightly, an exact radix
        // select on their bits does.
        // While no finite distance holds top_k yet, the distances grow geometrically (the
        // last one unbounded: all of them); once one does, they split [lo, hi] evenly. (Split
        // evenly from an unbounded hi, they stayed astronomically large: logits spread wider
        // than 4 below the maximum went to the radix select every time, a hundred
        // microseconds on an H200.)
        let unbounded = 3.4028235e38;
        var lo = 0.0;            // a distance holding fewer than top_k
        var hi = unbounded;      // a distance holding at least top_k (at first: everything)
        var hi_count = 0xffffffffu;
        var found = false;
        for (var round = 0u; round < 6u && !found; round++) {
            var d: array<f32, 4>;
            if (hi == unbounded) {
                let b = max(lo, 0.125);
                d = array<f32, 4>(4.0 * b, 16.0 * b, 64.0 * b, unbounded);
            } else {
                for (var j = 0u; j < 4u; j++) { d[j] = lo + (hi - lo) * f32(j + 1u) / 5.0; }
            }
            let c = count_within(base, n, mx, d, lane);
            var j = 0u;
            while (j < 4u && c[j] < cfg.top_k) { j++; }
            if (j == 4u && hi == unbounded) {
                // Fewer than top_k in all (a small vocabulary): they are the candidates.
                hi_count = c[3];
                found = true;
            } else if (j == 4u) {
                // The count crosses top_k between the last distance and hi.
                lo = d[3];
            } else if (d[j] == unbounded) {
                // Only everything holds top_k: look further out.
                lo = d[2];
            } else {
                hi = d[j];
                hi_count = c[j];
                if (j > 0u) { lo = d[j - 1u]; }
                // Done once the interval's far end holds at most CAP.
                found = hi_count <= CAP;
            }
        }
        var min_key = 0u;
        let exact = !found;
        if (PHASES > 2u) {
            if (exact) {
                min_key = kth_largest_key(base, n, cfg.top_k, lane);
            }
            if (lane.lid == 0u) { atomicStore(&n_cand, 0u); }
            workgroupBarrier();
            for (var i = lane.lid; i < n; i += WG) {
                let v = logits[base + i];
                let keep = select(mx - v <= hi, sort_key(v) >= min_key, exact);
                if (usable(v) && keep) {
                    let slot = atomicAdd(&n_cand, 1u);
                    if (slot < CAP) {
                        cand_v[slot] = v;
                        cand_i[slot] = i;
                    }
                }
            }
            workgroupBarrier();
            let count = min(atomicLoad(&n_cand), CAP);
            if (PHASES > 3u) {
                // Bitonic sort of the candidates (padded with the smallest float) into the order of
                // the CPU reference.
                var size = 1u;
                while (size < count) { size *= 2u; }
                for (var i = count + lane.lid; i < size; i += WG) {
                    cand_v[i] = -3.4028235e38;
                    cand_i[i] = 0xffffffffu;
                }
                workgroupBarrier();
                for (var k = 2u; k <= size; k *= 2u) {
                    for (var j = k / 2u; j > 0u; j /= 2u) {
                        for (var i = lane.lid; i < size; i += WG) {
                            let o = i ^ j;
                            if (o > i) {
                                let up = (i & k) == 0u;
                                let swap = select(before(cand_v[i], cand_i[i], cand_v[o], cand_i[o]),
                                                  before(cand_v[o], cand_i[o], cand_v[i], cand_i[i]), up);
                                if (swap) {
                                    let tv = cand_v[i];
                                    cand_v[i] = cand_v[o];
                                    cand_v[o] = tv;
                                    let ti = cand_i[i];
                                    cand_i[i] = cand_i[o];
                                    cand_i[o] = ti;
                                }
                            }
                        }
                        workgroupBarrier();
                    }
                }
                // One invocation walks the sorted candidates as the CPU reference does.
                if (lane.lid == 0u && PHASES > 4u) {
                    var keep = min(count, cfg.top_k);
                    let top = cand_v[0];
                    var sum = 0.0;
                    for (var i = 0u; i < keep; i++) { sum += exp(cand_v[i] - top); }
                    if (cfg.top_p < 1.0) {
                        var acc = 0.0;
                        for (var i = 0u; i < keep; i++) {
                            acc += exp(cand_v[i] - top) / sum;
                            if (acc >= cfg.top_p) {
                                keep = i + 1u;
                                break;
                            }
                        }
                    }
                    if (cfg.min_p > 0.0) {
                        let p_floor = cfg.min_p / sum;
                        var k = 1u;
                        while (k < keep && exp(cand_v[k] - top) / sum >= p_floor) { k += 1u; }
                        keep = k;
                    }
                    var weight_total = 0.0;
                    for (var i = 0u; i < keep; i++) { weight_total += exp((cand_v[i] - top) / cfg.temp); }
                    var r = uniform01(cfg.seed_lo, cfg.seed_hi, state[st]) * weight_total;
                    var pick = cand_i[max(keep, 1u) - 1u];
                    for (var i = 0u; i < keep; i++) {
                        let w = exp((cand_v[i] - top) / cfg.temp);
                        if (r < w) {
                            pick = cand_i[i];
                            break;
                        }
                        r -= w;
                    }
                    picked = pick;
                }
                if (lane.lid == 0u && PHASES == 4u) { picked = u32(cand_v[0]) + min_key; }
            }
            if (lane.lid == 0u && PHASES == 3u) { picked = count + min_key; }
        }
        if (lane.lid == 0u && PHASES <= 2u) { picked = u32(hi) + arg; }
    } else if (lane.lid == 0u) {
        picked = arg;
    }
    workgroupBarrier();
    if (lane.lid == 0u) {
        let t = picked;
        ids[row] = t;
        // The next draw, and the token into the penalties' history.
        state[st] = state[st] + select(1u, 0u, cfg.greedy != 0u);
        state[st + 4u + total % HIST] = t;
        state[st + 1u] = total + 1u;
    }
}
