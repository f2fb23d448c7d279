// A block of 32 values quantized by 8 neighbouring invocations of a subgroup (common/
// q8_block.wgsl's block: d = max |x| / 127, q = round(x / d)), neighbour j (0-7) holding values
// 4j .. 4j + 3: every invocation of the block busy, the block's largest magnitude and its
// halves' sums taken through subgroup shuffles. Subgroups of 8 or more, whose 8 neighbours are
// the block's; uniform control flow (every invocation of the subgroup calls it).
struct Q8Lanes8 {
    q: u32,       // neighbour j's four quants: word j % 4 of the block's quants j / 4 (lo, hi)
    sums: vec4<f32>,   // the block's (d, d * sum of quants 0-15, d * sum of quants 16-31, 0)
}

fn q8_lanes8(w: vec4<f32>, j: u32) -> Q8Lanes8 {
    return q8_lanes8_apart(w, j, 1u);
}

// The same with the block's neighbours `apart` invocations from one another (a power of two:
// 8 * apart invocations of one subgroup hold the block, neighbour j at j * apart + k, and the
// k-th of each neighbour's invocations quantize the block together).
fn q8_lanes8_apart(w: vec4<f32>, j: u32, apart: u32) -> Q8Lanes8 {
    var m = max(max(abs(w.x), abs(w.y)), max(abs(w.z), abs(w.w)));
    m = max(m, subgroupShuffleXor(m, apart));
    m = max(m, subgroupShuffleXor(m, 2u * apart));
    m = max(m, subgroupShuffleXor(m, 4u * apart));
    let d = m / 127.0;
    let id = select(0.0, 1.0 / d, d > 0.0);
    let q = pack_q8(w, id);
    // Neighbours 0-3's sum and 4-7's, each in its own half, then swapped across.
    var s = dot4I8Packed(q, 0x01010101u);
    s += subgroupShuffleXor(s, apart);
    s += subgroupShuffleXor(s, 2u * apart);
    let other = subgroupShuffleXor(s, 4u * apart);
    let lo = select(s, other, j >= 4u);
    let hi = select(other, s, j >= 4u);
    return Q8Lanes8(q, vec4<f32>(d, d * f32(lo), d * f32(hi), 0.0));
}
