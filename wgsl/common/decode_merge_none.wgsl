// Decode attention whose splits are merged by attention_combine.wgsl's pass (MERGE false): the
// functions of common/decode_merge.wgsl, never called.

fn merge_row(h: u32, s: u32, n_splits: u32, hd: u32) -> u32 { return 0u; }
fn merge_put(i: u32, v: vec4<f32>) {}
fn merge_is_last(lid: u32, c: u32, n_used: u32) -> bool { return false; }
fn merge_splits(lid: u32, h0: u32, nh: u32, hd: u32, n_used: u32, n_splits: u32) {}
fn merge_splits_in(lid: u32, h0: u32, nh: u32, hd: u32, n_used: u32, n_splits: u32, sg: u32) {}
fn merge_ticket(lid: u32, c: u32, n_used: u32) -> u32 { return 0u; }
fn merge_wo_ahead(lid: u32, slice: u32, slices: u32) {}
