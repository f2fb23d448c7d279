// The sampler's rows are the columns of a batched decode step (common/step_columns.wgsl):
// row r samples for the slot the step's table names, with that slot's configuration and
// state row. Binding 0 (the uniform) is unused.
@group(0) @binding(4) var<storage, read> cfgs: array<Config>;
@group(0) @binding(5) var<storage, read> step: Step;

fn row_config(row: u32) -> Config { return cfgs[step.cols[row].slot]; }
fn row_slot(row: u32) -> u32 { return step.cols[row].slot; }

// Per row and slice of the row's logits, from the first pass (sample_prune.wgsl): the slice's
// largest logit and its index, the floor under its top_k largest and whether it has one.
@group(0) @binding(6) var<storage, read_write> prune: array<vec4<u32>>;
