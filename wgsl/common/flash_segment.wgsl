// The chunk of one sequence a flash-attention workgroup takes (common/flash_one.wgsl: the
// uniform's; common/flash_segments.wgsl: a table's entry).

struct Segment {
    m: u32,         // query tokens
    pos0: u32,      // position of token 0
    kv_off: u32,    // cache element of the sequence's row 0
    row0: u32,      // the chunk's first row of Q and of the output
    n_tiles: u32,   // row tiles of the chunk per KV head
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
