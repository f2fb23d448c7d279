// Chained decode steps of one sequence (Session::generate_chained): the pick also moves the
// step state the kernels read on to the next token's position and appends the token to the
// chain's list, which the host copies out once per group of steps. (A copy of each step's
// state before it and of its token after it cost an H200 ~7 us a TinyLlama step, run 254.)
// The step state's layout: common/step_one.wgsl's Step.

struct ChainStep {
    n_tokens: u32,
    pos0: u32,
    kv_len: u32,
    kv_base: u32,
}

@group(0) @binding(5) var<storage, read_write> chain_step: ChainStep;
// [0]: tokens appended since the host reset it; [1 + i]: the i-th of them.
@group(0) @binding(6) var<storage, read_write> chain_tokens: array<u32>;

// Called once per step, by the invocation that wrote the pick.
fn pass_on(t: u32) {
    chain_step.pos0 += 1u;
    chain_step.kv_len += 1u;
    let n = chain_tokens[0];
    chain_tokens[1u + n] = t;
    chain_tokens[0] = n + 1u;
}
