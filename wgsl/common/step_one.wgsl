// The step of one sequence (a prompt chunk or a decode token): its tokens sit at consecutive
// positions pos0.. of the sequence, whose KV-cache region starts at row kv_base. Written by
// the host before a step (chained decoding copies each step's own). The including file
// declares `step: Step` (a read-only storage binding); column gm is the step's token gm.

struct Step {
    n_tokens: u32,
    pos0: u32,
    kv_len: u32,    // positions attention sees (pos0 + n_tokens)
    kv_base: u32,   // the sequence's first cache row
}

const BATCHED: bool = false;

// Token gm's position in its sequence (RoPE), its sequence's first cache row, and the
// positions its attention sees.
fn col_pos(gm: u32) -> u32 { return step.pos0 + gm; }
fn col_base(gm: u32) -> u32 { return step.kv_base; }
fn col_len(gm: u32) -> u32 { return step.kv_len; }
