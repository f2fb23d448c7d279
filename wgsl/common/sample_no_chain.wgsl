// Steps that are not chained (prompts, single steps, batched steps): the host writes each
// step's state and reads its picks (common/sample_chain.wgsl for the chained ones).

fn pass_on(t: u32) {}
