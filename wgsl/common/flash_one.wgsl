// Flash attention over one sequence's prompt chunk: the uniform's m queries at positions
// pos0.. of the region at element kv_off (the including file declares `p: Params`).

struct Segment {
    m: u32,         // query tokens
    pos0: u32,      // position of token 0
    kv_off: u32,    // cache element of the sequence's row 0
    row0: u32,      // the chunk's first row of Q and of the output
    n_tiles: u32,   // row tiles of the chunk per KV head
}

fn segment(z: u32, lid: u32) -> Segment { return Segment(p.m, p.pos0, p.kv_off, 0u, p.n_tiles); }
