// The sampler's rows are one sequence's (or independent rows sharing one configuration): row
// r's configuration is the uniform, its state is state row r.
@group(0) @binding(0) var<uniform> config: Config;

fn row_config(row: u32) -> Config { return config; }
fn row_slot(row: u32) -> u32 { return row; }

// Per row and slice of the row's logits, from the first pass (sample_prune.wgsl): the slice's
// largest logit and its index, the floor under its top_k largest and whether it has one.
@group(0) @binding(4) var<storage, read_write> prune: array<vec4<u32>>;
