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
