// The weights bound as 32-bit words (WGSL has no portable 8- or 16-bit storage). Format files
// read them through w32 (one word), w64 (two words from an even word index) and w128 (four
// words from a 16-byte aligned word index), so the same format file serves kernels that bind
// them as words or as vec4s.
@group(0) @binding(1) var<storage, read> wq: array<u32>;

fn w32(i: u32) -> u32 { return wq[i]; }

// Words i and i + 1 (i even).
fn w64(i: u32) -> vec2<u32> { return vec2<u32>(wq[i], wq[i + 1u]); }

// Words 4i .. 4i + 3.
fn w128(i: u32) -> vec4<u32> { return vec4<u32>(wq[4u * i], wq[4u * i + 1u], wq[4u * i + 2u], wq[4u * i + 3u]); }
