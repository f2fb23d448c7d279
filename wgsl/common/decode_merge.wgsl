// Decode attention whose split workgroups merge their own partials (MERGE): the last of a head
// block's splits to finish does what attention_combine.wgsl's pass would, so a split context
// takes one dispatch, not two (a dependent dispatch costs ~1.7 µs on an H200 and the combine
// pass ~3 µs back to back: `cargo bench --bench kernels -- attention_decode`, "combine alone").
// Each split workgroup writes its partials to `merge_part`, then counts itself done on its
// block's counter; the workgroup whose count completes the block reads every split's partials
// and writes the output. `storageBarrier` before the count is a device-scope release of the
// workgroup's writes (naga: OpControlBarrier with Device memory scope and UniformMemory
// semantics), the one after it the acquire (not on NVIDIA: `merge_ticket`), and the partials
// are bound @coherent so that their reads see other workgroups' writes, not a stale cache line
// (the "last block" pattern of CUDA's threadFenceReduction and AMD's FidelityFX SPD). Needs
// the adapter's MEMORY_DECORATION_COHERENT (`Caps::decode_merge`).
// Layout of the partials: per head and split a row of RV = head_dim / 4 + 1 vec4s, the split's
// unnormalized output then (max of its scores (natural log), sum of exp(score - max), 0, 0).
// The merge reads them as vec4s, up to 8 invocations sharing an output's splits, each with
// sixteen splits' loads in flight at a time: one 16-row tile of 8 heads over 32 splits is 64 KiB,
// a few round trips of the L2 cache.
// The includer declares `dst` (binding 4: the output [n_head * head_dim] f32, written without
// Q8_OUT) and, with Q8_OUT, `xq_out` (binding 6: the output as int8 blocks of 32 values,
// common/q8_block.wgsl's layout, written through common/q8_lanes8.wgsl: subgroups of 8 or
// more), and the constants WG, WO_AHEAD (`merge_wo_ahead`) and one of the `merge_acquire` files.

@group(0) @binding(7) @coherent var<storage, read_write> merge_part: array<vec4<f32>>;
// One counter per head block, zero between dispatches (the last workgroup resets its own),
// then a word nothing reads (`merge_wo_ahead`'s sink).
@group(0) @binding(8) var<storage, read_write> merge_done: array<atomic<u32>>;

// The output projection's weights (its first chunk), which the workgroups that do not merge
// read into L2 (`merge_wo_ahead`) while the last ones merge.
@group(0) @binding(9) var<storage, read> wo_ahead: array<vec4<u32>>;

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
    return merge_ticket(lid, c, n_used) + 1u == n_used;
}

// `merge_is_last`'s count, returning the workgroup's place among the n_used (0: the first to
// finish; n_used - 1: the last, which merges), then `merge_acquire` (the acquire for the last:
// common/decode_merge_acquire.wgsl, or none on NVIDIA, common/decode_merge_acquire_none.wgsl).
fn merge_ticket(lid: u32, c: u32, n_used: u32) -> u32 {
    storageBarrier();
    if (lid == 0u) {
        let t = atomicAdd(&merge_done[c], 1u);
        if (t + 1u == n_used) { atomicStore(&merge_done[c], 0u); }
        merge_last = t;
    }
    let t = workgroupUniformLoad(&merge_last);
    merge_acquire(t + 1u == n_used);
    return t;
}

// With WO_AHEAD (`attention::decode_wo_ahead`), run by a workgroup that does not merge: share
// `slice` of `slices` of the output projection's weights read, so that the output projection,
// next, finds them in L2 (the rest of the GPU idles while the last workgroups merge). Sixteen
// 16-byte loads an invocation, all in flight at once; where the shares would need more, none
// is read (part of a GEMV's rows in L2 does not end it sooner: H200, run 447). Their values
// feed only a store into the counters' last word, which nothing reads, behind a condition that
// (all but) never holds: the driver drops a load whose value feeds nothing.
fn merge_wo_ahead(lid: u32, slice: u32, slices: u32) {
    if (!WO_AHEAD) { return; }
    let total = arrayLength(&wo_ahead);
    let per = (total + slices - 1u) / slices;
    let begin = slice * per;
    let end = min(begin + per, total);
    if (per > 16u * WG || begin >= end) { return; }
    var x: array<vec4<u32>, 16>;
    for (var j = 0u; j < 16u; j++) { x[j] = wo_ahead[min(begin + lid + j * WG, end - 1u)]; }
    var acc = vec4<u32>(0u);
    for (var j = 0u; j < 16u; j++) { acc ^= x[j]; }
    if (all(acc == vec4<u32>(0x9e3779b9u, 0x7f4a7c15u, 0x2545f491u, 0x94d049bbu))) {
        atomicMax(&merge_done[arrayLength(&merge_done) - 1u], acc.x);
    }
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

// One split's partial added to a (rescaled to the larger max).
fn merge_one(a: MergeAcc, l: MergeLoad) -> MergeAcc {
    let m = max(a.m, l.s.x);
    return merge_add(merge_rescale(a, m), l, m);
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
    return merge_fold(a, l0, l1, l2, l3, l4, l5, l6, l7);
}

// Eight splits' partials added to a, with one rescale to their largest max.
fn merge_fold(a: MergeAcc, l0: MergeLoad, l1: MergeLoad, l2: MergeLoad, l3: MergeLoad, l4: MergeLoad, l5: MergeLoad, l6: MergeLoad, l7: MergeLoad) -> MergeAcc {
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
    // The subgroup's size (every invocation is here: the caller's control flow is uniform).
    merge_splits_in(lid, h0, nh, hd, n_used, n_splits, subgroupAdd(1u));
}

// `merge_splits` in subgroups of sg invocations, where the caller knows that size (the
// cooperative kernel's 32): no count of the subgroup, and constants in its place.
fn merge_splits_in(lid: u32, h0: u32, nh: u32, hd: u32, n_used: u32, n_splits: u32, sg: u32) {
    let per = hd / 4u;
    let n4 = nh * per;
    let groups = merge_groups(n4, sg);
    if (groups == 1u && n4 <= WG && per <= sg && per % 8u == 0u && (per & (per - 1u)) == 0u && n_used <= 4u * per) {
        merge_shuffled(lid, h0, nh, hd, n_used, n_splits, sg);
        return;
    }
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
            a = merge_one(a, l);
        }
        if (groups > 1u) { a = merge_meet(a, 1u); }
        if (groups > 2u) { a = merge_meet(a, 2u); }
        if (groups > 4u) { a = merge_meet(a, 4u); }
        merge_write(a.v / a.t, h, c, hd, groups, base + lid / groups < n4 && k == 0u);
    }
}

// Output vector c of head h (an index into the output) of a merge: as f32, or with Q8_OUT
// into its int8 block only, whose eight vectors lie on neighbouring groups of `groups`
// invocations (uniform control flow: every invocation of the subgroup calls it; `writes`:
// whether this one stores). With Q8_OUT the output projection reads the blocks alone, so the
// f32 output would be a dead store on the merge's critical path (H200, TinyLlama at depth
// 4,096: +0.6% without it, run 438).
fn merge_write(val: vec4<f32>, h: u32, c: u32, hd: u32, groups: u32, writes: bool) {
    if (writes && !Q8_OUT) {
        let at = h * hd + 4u * c;
        dst[at] = val.x;
        dst[at + 1u] = val.y;
        dst[at + 2u] = val.z;
        dst[at + 3u] = val.w;
    }
    if (Q8_OUT) {
        let j = c % 8u;
        let b = q8_lanes8_apart(val, j, groups);
        if (writes) {
            let blk = (h * (hd / 32u) + c / 8u) * 3u;
            xq_out[blk + j / 4u][j % 4u] = b.q;
            if (j == 0u) { xq_out[blk + 2u] = bitcast<vec4<u32>>(b.sums); }
        }
    }
}

// `merge_splits` for one invocation an output vector (one round of them), each head's
// invocations within a subgroup (subgroups in index order, per a power of two of at least 8
// and at most the subgroup's size) and at most four splits an invocation of the head: each
// split's (max, sum) loaded once for the head, by invocation s % per. The head's largest max
// and its sum are taken first, through shuffles among its invocations, and each split's weight
// against that max once, by the invocation that loaded its statistics; each split then costs
// an invocation one load, one shuffle of its weight and a multiply-add (no exp, no rescale).
// sg: the subgroup's size (merge_splits' count).
fn merge_shuffled(lid: u32, h0: u32, nh: u32, hd: u32, n_used: u32, n_splits: u32, sg: u32) {
    let per = hd / 4u;
    let n4 = nh * per;
    let o = min(lid, n4 - 1u);
    let hh = o / per;
    let c = o % per;
    let h = h0 + hh;
    let hl = lid % sg - c;   // the subgroup lane of the head's first invocation
    let last = n_used - 1u;
    // Splits c + q per (q < 4): their (max, sum), none past the used ones; the head's max.
    var st: array<vec2<f32>, 4>;
    var m = -3.4028235e38;
    for (var q = 0u; q < 4u; q++) {
        let s = c + q * per;
        let x = merge_part[merge_row(h, min(s, last), n_splits, hd) + per].xy;
        st[q] = select(vec2<f32>(-3.4028235e38, 0.0), x, s <= last);
        m = max(m, st[q].x);
    }
    for (var off = per / 2u; off > 0u; off /= 2u) { m = max(m, subgroupShuffleXor(m, off)); }
    // Their weights against it (0 past the used ones) and the head's sum.
    var w: array<f32, 4>;
    var t = 0.0;
    for (var q = 0u; q < 4u; q++) {
        w[q] = exp(st[q].x - m);
        t = fma(w[q], st[q].y, t);
    }
    for (var off = per / 2u; off > 0u; off /= 2u) { t += subgroupShuffleXor(t, off); }
    let rs = hd / 4u + 1u;   // vec4s between a head's splits
    let r0 = merge_row(h, 0u, n_splits, hd) + c;
    var acc = vec4<f32>(0.0);
    var s = 0u;
    // Sixteen splits' values in flight, then eight, then one at a time.
    for (; s + 15u < n_used; s += 16u) {
        let x = merge_eight_weighted(acc, r0 + s * rs, rs, merge_w_slot(w, s / per), hl + s % per);
        acc = merge_eight_weighted(x, r0 + (s + 8u) * rs, rs, merge_w_slot(w, (s + 8u) / per), hl + (s + 8u) % per);
    }
    for (; s + 7u < n_used; s += 8u) {
        acc = merge_eight_weighted(acc, r0 + s * rs, rs, merge_w_slot(w, s / per), hl + s % per);
    }
    for (; s < n_used; s++) {
        let ws = subgroupShuffle(merge_w_slot(w, s / per), hl + s % per);
        acc = fma(vec4<f32>(ws), merge_part[r0 + s * rs], acc);
    }
    merge_write(acc / t, h, c, hd, 1u, lid < n4);
}

// Slot `slot` of an invocation's four split weights.
fn merge_w_slot(w: array<f32, 4>, slot: u32) -> f32 {
    return select(select(select(w[0], w[1], slot == 1u), w[2], slot == 2u), w[3], slot == 3u);
}

// Eight splits' values (rows r, r + rs, ...) weighed and added to acc, their weights shuffled
// from lanes j .. j + 7 (wq: this invocation's weight of the slot the eight share).
fn merge_eight_weighted(acc: vec4<f32>, r: u32, rs: u32, wq: f32, j: u32) -> vec4<f32> {
    let v0 = merge_part[r];
    let v1 = merge_part[r + rs];
    let v2 = merge_part[r + 2u * rs];
    let v3 = merge_part[r + 3u * rs];
    let v4 = merge_part[r + 4u * rs];
    let v5 = merge_part[r + 5u * rs];
    let v6 = merge_part[r + 6u * rs];
    let v7 = merge_part[r + 7u * rs];
    var a = fma(vec4<f32>(subgroupShuffle(wq, j)), v0, acc);
    var b = vec4<f32>(subgroupShuffle(wq, j + 1u)) * v1;
    a = fma(vec4<f32>(subgroupShuffle(wq, j + 2u)), v2, a);
    b = fma(vec4<f32>(subgroupShuffle(wq, j + 3u)), v3, b);
    a = fma(vec4<f32>(subgroupShuffle(wq, j + 4u)), v4, a);
    b = fma(vec4<f32>(subgroupShuffle(wq, j + 5u)), v5, b);
    a = fma(vec4<f32>(subgroupShuffle(wq, j + 6u)), v6, a);
    b = fma(vec4<f32>(subgroupShuffle(wq, j + 7u)), v7, b);
    return a + b;
}
