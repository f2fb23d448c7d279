// A batched step: column gm is a token of its own sequence (a server slot), at its own
// position, with its own KV-cache region and sampler state: the next token of each sequence
// (a batched decode step), or the rows of several sequences' prompt chunks side by side. The
// host writes the table once per step, after the header that single-sequence kernels read
// (the same buffer). The including file declares `step: Step`.

struct Column {
    pos: u32,       // the token's position in its sequence
    kv_len: u32,    // positions its attention sees (pos + 1)
    kv_base: u32,   // its sequence's first cache row
    slot: u32,      // its sequence's sampler state and configuration
}

struct Step {
    n_tokens: u32,
    pos0: u32,
    kv_len: u32,
    kv_base: u32,
    cols: array<Column>,   // as long as the step's tokens (the buffer holds them)
}

const BATCHED: bool = true;

fn col_pos(gm: u32) -> u32 { return step.cols[gm].pos; }
fn col_base(gm: u32) -> u32 { return step.cols[gm].kv_base; }
fn col_len(gm: u32) -> u32 { return step.cols[gm].kv_len; }
