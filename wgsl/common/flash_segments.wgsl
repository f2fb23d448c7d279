// Flash attention over several sequences' prompt chunks side by side in Q (a server's
// prompts prefilled together): workgroup z takes chunk z of the table the host writes per
// step, each chunk its own sequence, positions and cache region.

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

@group(0) @binding(5) var<storage, read> segments: array<Segment>;
var<workgroup> this_segment: Segment;

// Read through workgroup memory so that the workgroup's control flow, which depends on it,
// is uniform (barriers and cooperative-matrix operations need that). Called by every
// invocation, in uniform control flow.
fn segment(z: u32, lid: u32) -> Segment {
    if (lid == 0u) { this_segment = segments[z]; }
    return workgroupUniformLoad(&this_segment);
}
