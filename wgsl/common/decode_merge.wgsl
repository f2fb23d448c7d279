// Decode attention whose split workgroups merge their own partials (MERGE): the last of a head
// block's splits to finish does what attention_combine.wgsl's pass would, so a split context
// takes one dispatch, not two (a dependent dispatch costs ~1.7 µs on an H200 and the combine
// pass ~3 µs back to back: `cargo bench --bench kernels -- attention_decode`, "combine alone").
// Each split workgroup writes its partials to `merge_part`, then counts itself done on its
// block's counter; the workgroup whose count completes the block reads every split's partials
// and writes the output. `storageBarrier` before the count is a device-scope release of the
// workgroup's writes (naga: OpControlBarrier with Device memory scope and UniformMemory
// semantics), the one after it the acquire, and the partials are bound @coherent so that
// their reads see other workgroups' writes, not a stale cache line (the "last block" pattern
// of CUDA's threadFenceReduction and AMD's FidelityFX SPD). Needs the adapter's
// MEMORY_DECORATION_COHERENT (`Caps::decode_merge`).
// Layout of the partials: per head and split a row of RV = head_dim / 4 + 1 vec4s, the split's
// unnormalized output then (max of its scores (natural log), sum of exp(score - max), 0, 0).
// The merge reads them as vec4s, up to 8 invocations sharing an output's splits, each with
// sixteen splits' loads in flight at a time: one 16-row tile of 8 heads over 32 splits is 64 KiB,
// a few round trips of the L2 cache.
// The includer declares `dst` (binding 4: the output [n_head * head_dim] f32) and, with
// Q8_OUT, `xq_out` (binding 6: int8 blocks of 32 values, common/q8_block.wgsl's layout,
// written through common/q8_lanes8.wgsl: subgroups of 8 or more), and the constant WG.

@group(0) @binding(7) @coherent var<storage, read_write> merge_part: array<vec4<f32>>;
// One counter per head block, zero between dispatches (the last workgroup resets its own).
@group(0) @binding(8) var<storage, read_write> merge_done: array<atomic<u32>>;

var<workgroup> merge_last: u32;

// Row (head h, split s) of the partials, in vec4s, for heads of hd dimensions.
fn merge_row(h: u32, s: u32, n_splits: u32, hd: u32) -> u32 {
    return (h * n_splits + s) * (hd / 4u + 1u);
}

// Vector i of the partials.
fn merge_put(i: u32, v: vec4<f32>) {
    merge_part[i] = v;
}

// Called by every invocation of a split workgroup once its partials are written: whether it is
// the last of the n_used splits that count on counter c (uniform across the workgroup).
fn merge_is_last(lid: u32, c: u32, n_used: u32) -> bool {
    storageBarrier();
    if (lid == 0u) {
        let last = atomicAdd(&merge_done[c], 1u) + 1u == n_used;
        if (last) { atomicStore(&merge_done[c], 0u); }
        merge_last = select(0u, 1u, last);
    }
    let last = workgroupUniformLoad(&merge_last) == 1u;
    if (last) { storageBarrier(); }
    return last;
}

// One split's partial for output vector c of head h: (values, (max, sum, 0, 0)).
struct MergeLoad {
    v: vec4<f32>,
    s: vec4<f32>,
}

fn merge_load(h: u32, s: u32, c: u32, n_splits: u32, hd: u32) -> MergeLoad {
    let r = merge_row(h, s, n_splits, hd);
    return MergeLoad(merge_part[r + c], merge_part[r + hd / 4u]);
}

// A running merge: the largest max so far, the values and the sum weighed against it.
struct MergeAcc {
    m: f32,
    v: vec4<f32>,
    t: f32,
}

fn merge_add(a: MergeAcc, l: MergeLoad, m: f32) -> MergeAcc {
    let w = exp(l.s.x - m);
    return MergeAcc(m, fma(vec4<f32>(w), l.v, a.v), fma(w, l.s.y, a.t));
}

fn merge_rescale(a: MergeAcc, m: f32) -> MergeAcc {
    let w = exp(a.m - m);
    return MergeAcc(m, a.v * w, a.t * w);
}

// Split groups of the merge: a power of two up to 8, `groups` neighbouring invocations of a
// subgroup of `sg` taking every groups-th split of one output vector, then meeting through
// shuffles; as many as the workgroup has invocations for (WG / outputs), and with Q8_OUT few
// enough that an int8 block's 8 vectors (8 * groups invocations) stay within one subgroup.
fn merge_groups(n4: u32, sg: u32) -> u32 {
    let most = select(sg, sg / 8u, Q8_OUT);
    var g = 1u;
    while (2u * g <= 8u && 2u * g * n4 <= WG && 2u * g <= most) { g *= 2u; }
    return g;
}

// Splits s, s + step, ... s + 7 step of output vector c of head h added to a (their loads
// first, then one rescale).
fn merge_eight(a: MergeAcc, h: u32, s: u32, step: u32, c: u32, n_splits: u32, hd: u32) -> MergeAcc {
    let l0 = merge_load(h, s, c, n_splits, hd);
    let l1 = merge_load(h, s + step, c, n_splits, hd);
    let l2 = merge_load(h, s + 2u * step, c, n_splits, hd);
    let l3 = merge_load(h, s + 3u * step, c, n_splits, hd);
    let l4 = merge_load(h, s + 4u * step, c, n_splits, hd);
    let l5 = merge_load(h, s + 5u * step, c, n_splits, hd);
    let l6 = merge_load(h, s + 6u * step, c, n_splits, hd);
    let l7 = merge_load(h, s + 7u * step, c, n_splits, hd);
    let m8 = max(max(max(l0.s.x, l1.s.x), max(l2.s.x, l3.s.x)), max(max(l4.s.x, l5.s.x), max(l6.s.x, l7.s.x)));
    let m = max(a.m, m8);
    var r = merge_rescale(a, m);
    r = merge_add(r, l0, m);
    r = merge_add(r, l1, m);
    r = merge_add(r, l2, m);
    r = merge_add(r, l3, m);
    r = merge_add(r, l4, m);
    r = merge_add(r, l5, m);
    r = merge_add(r, l6, m);
    return merge_add(r, l7, m);
}

// Partial merges of two invocations `off` apart in the subgroup combined (uniform control flow).
fn merge_meet(a: MergeAcc, off: u32) -> MergeAcc {
    let m = max(a.m, subgroupShuffleXor(a.m, off));
    let r = merge_rescale(a, m);
    return MergeAcc(m, r.v + subgroupShuffleXor(r.v, off), r.t + subgroupShuffleXor(r.t, off));
}

// The last workgroup of a block: heads h0 .. h0 + nh - 1 (indices into the output) merged over
// their n_used splits, one vec4 of output per group of invocations at a time. Long contexts
// split many times (Llama-7B's heads at 4,096 positions: 64 splits), so each output's splits
// are shared by a group of invocations (`merge_groups`), each with eight loads in flight, not
// read one round trip after another by one invocation.
fn merge_splits(lid: u32, h0: u32, nh: u32, hd: u32, n_used: u32, n_splits: u32) {
    let per = hd / 4u;
    let n4 = nh * per;
    // The subgroup's size (every invocation is here: the caller's control flow is uniform).
    let sg = subgroupAdd(1u);
    let groups = merge_groups(n4, sg);
    let k = lid % groups;
    let slots = WG / groups;
    // Whole rounds of WG invocations, so that every invocation of a subgroup takes part in the
    // shuffles (the int8 blocks never straddle the end: per is a multiple of 8 with Q8_OUT).
    for (var base = 0u; base < n4; base += slots) {
        let o = min(base + lid / groups, n4 - 1u);
        let hh = o / per;
        let c = o % per;
        let h = h0 + hh;
        var a = MergeAcc(-3.4028235e38, vec4<f32>(0.0), 0.0);
        var s = k;
        let step = groups;
        // Sixteen splits' loads in flight, then eight, then one at a time.
        for (; s + 15u * step < n_used; s += 16u * step) {
            a = merge_eight(merge_eight(a, h, s, step, c, n_splits, hd), h, s + 8u * step, step, c, n_splits, hd);
        }
        for (; s + 7u * step < n_used; s += 8u * step) {
            a = merge_eight(a, h, s, step, c, n_splits, hd);
        }
        for (; s < n_used; s += step) {
            let l = merge_load(h, s, c, n_splits, hd);
            a = merge_add(merge_rescale(a, max(a.m, l.s.x)), l, max(a.m, l.s.x));
        }
        if (groups > 1u) { a = merge_meet(a, 1u); }
        if (groups > 2u) { a = merge_meet(a, 2u); }
        if (groups > 4u) { a = merge_meet(a, 4u); }
        let val = a.v / a.t;
        let inside = base + lid / groups < n4;
        if (inside && k == 0u) {
            let at = h * hd + 4u * c;
            dst[at] = val.x;
            dst[at + 1u] = val.y;
            dst[at + 2u] = val.z;
            dst[at + 3u] = val.w;
        }
        if (Q8_OUT) {
            // Block c / 8 of the head, its eight vectors on neighbouring groups of invocations.
            let j = c % 8u;
            let b = q8_lanes8_apart(val, j, groups);
            if (inside && k == 0u) {
                let blk = (h * (hd / 32u) + c / 8u) * 3u;
                xq_out[blk + j / 4u][j % 4u] = b.q;
                if (j == 0u) { xq_out[blk + 2u] = bitcast<vec4<u32>>(b.sums); }
            }
        }
    }
}
