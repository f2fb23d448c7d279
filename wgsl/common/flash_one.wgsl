// Flash attention over one sequence's prompt chunk: the uniform's m queries at positions
// pos0.. of the region at element kv_off (the including file declares `p: Params`).

fn segment(z: u32, lid: u32) -> Segment { return Segment(p.m, p.pos0, p.kv_off, 0u, p.n_tiles, 0u, 0u, 0u); }
