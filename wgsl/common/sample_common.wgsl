// What both passes of GPU sampling (sample_prune.wgsl, sample.wgsl) share: a row's
// configuration, its state, and the bindings of the logits, the picked ids and the states.

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

// NaN logits never count.
fn usable(v: f32) -> bool { return v == v; }

// Whether logit v, met after every index already seen, replaces (best, best_i) as the largest:
// strictly larger, or the first (0xffffffff: none yet); on ties the lower index stays.
fn beats(v: f32, best: f32, best_i: u32) -> bool { return v > best || best_i == 0xffffffffu; }

// The candidates' order (the CPU reference's): larger value first, lower index on ties, a total
// order. Whether (v, id) comes before (v0, id0), unbranched; and of four, how many do.
fn comes_before(v: f32, id: u32, v0: f32, id0: u32) -> bool { return (v > v0) | ((v == v0) & (id < id0)); }
fn count_before4(v4: vec4<f32>, i4: vec4<u32>, v0: f32, id0: u32) -> u32 {
    let before = (v4 > vec4<f32>(v0)) | ((v4 == vec4<f32>(v0)) & (i4 < vec4<u32>(id0)));
    return dot(vec4<u32>(before), vec4<u32>(1u));
}

// The row's penalties and bans on its logits lo .. hi - 1 (the first pass's slice, or the whole
// row for a greedy sampler's one pass), by a workgroup of WG invocations, lid this one, for
// the row whose configuration is cfg, whose state starts at st and logits at base; the
// logits are rewritten in place and the workgroup sees them when this returns. Penalties:
// each distinct token of the window once, with its count (llama.cpp: divide positive logits
// by the repetition penalty and multiply negative ones, then subtract count * frequency and
// presence). Banned tokens (--ignore-eos) are never drawn: their logits become the lowest
// finite value.
fn penalize_and_ban(cfg: Config, st: u32, base: u32, lo: u32, hi: u32, lid: u32) {
    let total = state[st + 1u];
    let n_hist = min(min(total, cfg.window), HIST);
    let penalize = cfg.repeat_penalty != 1.0 || cfg.freq_penalty != 0.0 || cfg.presence_penalty != 0.0;
    if (penalize) {
        // The window is the last n_hist tokens of the ring.
        let start = total - n_hist;
        for (var i = lid; i < n_hist; i += WG) {
            let t = state[st + 4u + (start + i) % HIST];
            if (t >= lo && t < hi) {
                var first = true;
                var count = 0u;
                for (var j = 0u; j < n_hist; j++) {
                    if (state[st + 4u + (start + j) % HIST] == t) {
                        if (j < i) { first = false; }
                        count += 1u;
                    }
                }
                if (first) {
                    var l = logits[base + t];
                    l = select(l * cfg.repeat_penalty, l / cfg.repeat_penalty, l > 0.0);
                    l -= f32(count) * cfg.freq_penalty + cfg.presence_penalty;
                    logits[base + t] = l;
                }
            }
        }
    }
    storageBarrier();
    workgroupBarrier();
    for (var i = lid; i < min(state[st + 2u], BAN); i += WG) {
        let t = state[st + 4u + HIST + i];
        if (t >= lo && t < hi) { logits[base + t] = -3.4028235e38; }
    }
    storageBarrier();
    workgroupBarrier();
}
