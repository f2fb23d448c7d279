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

// The rows a workgroup takes of its chunk, bm a tile, g the GQA group: tile x counted from the
// chunk's end (the last tiles see the most keys: dispatched first, they do not trail at the
// end), the chunk's rows (token * g + head in group) and the keys its last row sees.
struct RowTile {
    r0: u32,
    rows: u32,
    n_keys: u32,
}

fn row_tile(seg: Segment, x: u32, bm: u32, g: u32) -> RowTile {
    let r0 = (seg.n_tiles - 1u - x) * bm;
    let rows = seg.m * g;
    return RowTile(r0, rows, seg.pos0 + (min(r0 + bm, rows) - 1u) / g + 1u);
}
