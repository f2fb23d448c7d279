// Flash attention over several sequences' prompt chunks side by side in Q (a server's
// prompts prefilled together): workgroup z takes chunk z of the table the host writes per
// step, each chunk its own sequence, positions and cache region.

@group(0) @binding(5) var<storage, read> segments: array<Segment>;
var<workgroup> this_segment: Segment;

// Read through workgroup memory so that the workgroup's control flow, which depends on it,
// is uniform (barriers and cooperative-matrix operations need that). Called by every
// invocation, in uniform control flow.
fn segment(z: u32, lid: u32) -> Segment {
    if (lid == 0u) { this_segment = segments[z]; }
    return workgroupUniformLoad(&this_segment);
}
