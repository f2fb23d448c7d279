// Tiled GEMM on cooperative matrices (tensor cores, matrix cores): Y[m, n] = sum_k X[m, k] * W[n, k]
// for prefill, where the adapter offers 16x16x16 f16 x f16 -> f32 matrix multiply-adds.
// A workgroup computes a BM x BN tile of Y. It is warp-specialized: WG invocations (WG / 32
// subgroups, SGN of them along N) only multiply, each subgroup owning FM x FN accumulators of
// 16 x 16 in f32 (a (16 FM) x (16 FN) block); the LWG invocations after them only load, decode
// and store the tiles. Per K step of BK the loaders fill one of two buffers while the
// multipliers read the other, one barrier a step. (When every subgroup loaded its share before
// its multiply-adds, each step waited on memory: on an H200 the loads alone took half the
// kernel's time, run 132, and neither loading further ahead nor ordering the loads helped,
// runs 133-136; with loaders the F16 GEMM at 4096^3 went 108 -> 128 TFLOP/s, run 137.)
// The 256x128 tile (64x64 a subgroup) has no loaders (LWG 0, SHARED): its accumulators leave
// no registers for loader subgroups beside them, so every subgroup loads its share as well,
// four steps ahead in inner tiles, two in edge tiles (k_steps_shared_full/edge; 4096^3 in 667 us
// against 128x128's 722, runs 407, 415).
// LOAD_AHEAD (plan::coop_loads_ahead: 1 or 2 steps by format): the loaders issue the loads of
// the step LOAD_AHEAD after the next right after storing the next step and hold them in
// registers across the barriers, so that a step's loads have LOAD_AHEAD + 1 steps to arrive.
// Nothing may touch what they hold before the barrier, or the loader waits for its loads
// there: F16 weights stay words until stored (as halves they were unpacked on arrival), and
// tiles inside X and W and edge tiles run a K loop each (k_steps_full, k_steps_edge; with one
// loop the compiler copied the held registers where the two fetches joined). H200, TFLOP/s at 4096^3 before -> after: F16 127 -> 168 (runs 310,
// 314), Q8_0 127 -> 149, Q6_K 109 -> 121 (run 314).
// The X tile (f16 already: common/gemm_x_f16.wgsl, to_half.wgsl) and the W tile (F16 as it
// is: common/coop_w_half.wgsl; block formats decoded by the format file's fetch8 and unpack8:
// common/coop_w_decode.wgsl) are stored k-contiguous: X row-major (A, loaded with coopLoadT), W
// as the column-major K x N matrix B (coopLoad). Rows are padded by 8 halves (LDS) so a
// fragment's 16 rows fall in different banks, and the loaders' chunks are spread over rows so
// that their stores do too (row_of). The tiles are arrays of vec4<f16> (LDV a row; cooperative
// loads take their strides in the array's elements): a chunk of eight halves is two 8-byte
// stores, not eight 2-byte ones (NVIDIA's compiler joins them into one 16-byte store).
// Loads are instruction-bound (kernels bench, 4096^3 F16: converting X from f32 inside the
// kernel, loads behind bounds checks, and addresses recomputed per chunk each cost about a
// third). So tiles that lie inside X and W with whole K steps (`full`, uniform per workgroup)
// load from row bases computed once, with no clamps or masks; edge tiles clamp every load and
// zero what lies outside when storing it (a load is never behind a branch).
// Accumulation is f32. The epilogue (bias, residual add, SwiGLU, RoPE into the KV cache,
// ragged edges) takes one 16 x 16 accumulator at a time through a per-subgroup slice of
// workgroup memory, each subgroup on its own behind subgroup barriers (the loaders leave).
// Header constants: BM, BN, BK (a multiple of 16), WG (multiplying invocations), LWG (loading
// ones; 0: SHARED), SGN, FM (1, 2 or 4), FN (1, 2 or 4; 4 only with FM 4), LOAD_AHEAD (0, 1 or 2).
// FM 1 (16-row tiles) is for a few columns: batched decode steps, short prompts.
// Parameters: common/matmul_params.wgsl (x_stride in halves); Y, bias, K range:
// common/gemm_io.wgsl; the epilogue: common/matmul_epilogue.wgsl.

const LDS: u32 = BK + 8u;
const LDV: u32 = LDS / 4u;
const N_SG: u32 = WG / 32u;
// Per loading invocation and K step: 8-value chunks of X and of W. A 16-row tile has fewer X
// chunks than loading invocations: the first X_CHUNKS (whole subgroups) move one each.
const X_CHUNKS: u32 = BM * BK / 8u;
// SHARED (LWG 0): no loading subgroups; every invocation loads its share and multiplies
// (k_steps_shared). NL: the invocations that load.
const SHARED: bool = LWG == 0u;
const NL: u32 = select(LWG, WG, SHARED);
const X_PER: u32 = max(1u, X_CHUNKS / NL);
const W_PER: u32 = BN * BK / 8u / NL;
const_assert ((FN == 2u || FM == 1u || (FN == 4u && FM == 4u)) && (X_PER == 1u || X_PER == 2u || X_PER == 4u) && (W_PER == 1u || W_PER == 2u));

var<workgroup> xs: array<vec4<f16>, 2u * BM * LDV>;   // A: [buffer][m][k / 4]
var<workgroup> ws: array<vec4<f16>, 2u * BN * LDV>;   // B: [buffer][n][k / 4], i.e. K x N column-major
var<workgroup> cs: array<f32, N_SG * 256u>;      // one 16 x 16 accumulator per multiplying subgroup: [m][n]

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

// The X chunks and W words of one K step that one loading invocation moves, as loaded, until
// stash decodes (block formats) and stores them. Named fields, not arrays indexed in loops,
// which the compiler may keep in slow local memory (X_PER is 1, 2 or 4, W_PER 1 or 2).
struct Staged {
    x0: XStage,
    x1: XStage,
    x2: XStage,
    x3: XStage,
    w0: WStage,
    w1: WStage,
}

// Below, lid is a loading invocation's index among the loaders.
// Whether it moves an X chunk (all do but in 16-row tiles; uniform per subgroup).
fn moves_x(lid: u32) -> bool { return X_CHUNKS >= NL || lid < X_CHUNKS; }

// Its chunk j: i = lid + j NL of the tile's rows x CH chunks. A 16-byte access is served a
// quarter-warp (8 invocations) at a time, so what each 8 consecutive i touch sets its cost: they
// take 8 / CH whole rows (as few lines of X and W as a K step allows), CH rows apart (rows 0, 2,
// 4, 6 at BK 16; 0, 4 at BK 32), so that their stores into rows of CH + 1 16-byte units (LDS)
// fall in eight different bank groups; consecutive rows put two in one group. Each 32
// consecutive i cover 32 / CH whole rows. H200, run 480, F16 4096^3: 256x128x16 667.8 -> 640.3
// µs, 128x128x32 724.6 -> 670.2; pp512 TinyLlama Q4_K_M +3.5%, Llama-7B +5.5%. (One chunk of 8
// consecutive rows a quarter-warp makes the stores conflict-free too but spreads the loads over
// 8 lines: 674.4 -> 818.4 µs, run 479.)
const CH: u32 = BK / 8u;
const_assert CH == 2u || CH == 4u;
fn row_of(lid: u32, j: u32) -> u32 {
    let i = lid + j * NL;
    let quarter = (i % 32u) / 8u;
    return (i / 32u) * (32u / CH) + quarter % CH + (quarter / CH) * 8u + CH * ((i % 8u) / CH);
}
fn chunk_of(lid: u32, j: u32) -> u32 { return (lid + j * NL) % CH; }

// Where chunk j of this invocation goes in buffer buf of a tile of `rows` rows.
fn slot(lid: u32, j: u32, buf: u32, rows: u32) -> u32 {
    return buf * rows * LDS + row_of(lid, j) * LDS + chunk_of(lid, j) * 8u;
}

// Tiles on the edge of X or W, or with a ragged last K step: every load clamped inside X and
// W, what lies outside zeroed when stored.
fn fetch_edge(lid: u32, m0: u32, n0: u32, k0: u32) -> Staged {
    var s: Staged;
    if (moves_x(lid)) { s.x0 = load_x8(m0 + row_of(lid, 0u), k0 + chunk_of(lid, 0u) * 8u); }
    if (X_PER >= 2u) { s.x1 = load_x8(m0 + row_of(lid, 1u), k0 + chunk_of(lid, 1u) * 8u); }
    if (X_PER >= 4u) {
        s.x2 = load_x8(m0 + row_of(lid, 2u), k0 + chunk_of(lid, 2u) * 8u);
        s.x3 = load_x8(m0 + row_of(lid, 3u), k0 + chunk_of(lid, 3u) * 8u);
    }
    s.w0 = stage_w(n0 + row_of(lid, 0u), k0 / 8u + chunk_of(lid, 0u));
    if (W_PER >= 2u) { s.w1 = stage_w(n0 + row_of(lid, 1u), k0 / 8u + chunk_of(lid, 1u)); }
    return s;
}

// Tiles inside X and W with whole K steps: the loads alone, from each chunk's row base
// (computed once) plus the step's chunk c8.
struct Bases {
    x0: u32,
    x1: u32,
    x2: u32,
    x3: u32,
    w0: u32,
    w1: u32,
}

fn bases(lid: u32, m0: u32, n0: u32) -> Bases {
    var b: Bases;
    if (moves_x(lid)) { b.x0 = x_base(m0 + row_of(lid, 0u)) + chunk_of(lid, 0u); }
    if (X_PER >= 2u) { b.x1 = x_base(m0 + row_of(lid, 1u)) + chunk_of(lid, 1u); }
    if (X_PER >= 4u) {
        b.x2 = x_base(m0 + row_of(lid, 2u)) + chunk_of(lid, 2u);
        b.x3 = x_base(m0 + row_of(lid, 3u)) + chunk_of(lid, 3u);
    }
    b.w0 = w_base(n0 + row_of(lid, 0u));
    if (W_PER >= 2u) { b.w1 = w_base(n0 + row_of(lid, 1u)); }
    return b;
}

fn fetch_full(lid: u32, b: Bases, c8: u32) -> Staged {
    var s: Staged;
    if (moves_x(lid)) { s.x0 = load_x8_at(b.x0, c8); }
    if (X_PER >= 2u) { s.x1 = load_x8_at(b.x1, c8); }
    if (X_PER >= 4u) {
        s.x2 = load_x8_at(b.x2, c8);
        s.x3 = load_x8_at(b.x3, c8);
    }
    s.w0 = stage_w_at(b.w0, c8 + chunk_of(lid, 0u));
    if (W_PER >= 2u) { s.w1 = stage_w_at(b.w1, c8 + chunk_of(lid, 1u)); }
    return s;
}

// Eight halves at half t (a multiple of 8) of xs (which == 0) or ws.
fn put8(t: u32, h: Half8, which: u32) {
    let v = t / 4u;
    if (which == 0u) {
        xs[v] = h.lo;
        xs[v + 1u] = h.hi;
    } else {
        ws[v] = h.lo;
        ws[v + 1u] = h.hi;
    }
}

fn stash(lid: u32, s: Staged, buf: u32, full: bool) {
    if (full) {
        if (moves_x(lid)) { put8(slot(lid, 0u, buf, BM), x_halves_full(s.x0), 0u); }
        if (X_PER >= 2u) { put8(slot(lid, 1u, buf, BM), x_halves_full(s.x1), 0u); }
        if (X_PER >= 4u) {
            put8(slot(lid, 2u, buf, BM), x_halves_full(s.x2), 0u);
            put8(slot(lid, 3u, buf, BM), x_halves_full(s.x3), 0u);
        }
        put8(slot(lid, 0u, buf, BN), halves_w_full(s.w0), 1u);
        if (W_PER >= 2u) { put8(slot(lid, 1u, buf, BN), halves_w_full(s.w1), 1u); }
        return;
    }
    if (moves_x(lid)) { put8(slot(lid, 0u, buf, BM), x_halves(s.x0), 0u); }
    if (X_PER >= 2u) { put8(slot(lid, 1u, buf, BM), x_halves(s.x1), 0u); }
    if (X_PER >= 4u) {
        put8(slot(lid, 2u, buf, BM), x_halves(s.x2), 0u);
        put8(slot(lid, 3u, buf, BM), x_halves(s.x3), 0u);
    }
    put8(slot(lid, 0u, buf, BN), halves_w(s.w0), 1u);
    if (W_PER >= 2u) { put8(slot(lid, 1u, buf, BN), halves_w(s.w1), 1u); }
}

// The accumulators (private: the multiply-adds live in a function the multiplying subgroups
// call, see main).
var<private> c00: TileC;
var<private> c01: TileC;
var<private> c10: TileC;
var<private> c11: TileC;
var<private> c20: TileC;
var<private> c21: TileC;
var<private> c30: TileC;
var<private> c31: TileC;
// FN 4 (256x128 tiles, 64x64 a subgroup): the third and fourth columns of accumulators.
var<private> c02: TileC;
var<private> c03: TileC;
var<private> c12: TileC;
var<private> c13: TileC;
var<private> c22: TileC;
var<private> c23: TileC;
var<private> c32: TileC;
var<private> c33: TileC;

// One K step's multiply-adds of a multiplying subgroup, from buffer cur. Accumulators,
// fragments and multiply-adds are written out by name (FM is 1, 2 or 4, FN 1, 2 or 4; FN 1
// only with FM 1, FN 4 only with FM 4): arrays of cooperative matrices indexed in loops may
// live in slow local memory.
fn multiply(cur: u32, sm: u32, sn: u32) {
    for (var kk = 0u; kk < BK; kk += 16u) {
        let ia = cur * BM * LDS + sm * LDS + kk;
        let ib = cur * BN * LDS + sn * LDS + kk;
        let a0 = coopLoadT<TileA>(&xs[ia / 4u], LDV);
        let b0 = coopLoad<TileB>(&ws[ib / 4u], LDV);
        c00 = coopMultiplyAdd(a0, b0, c00);
        if (FN >= 2u) {
            let b1 = coopLoad<TileB>(&ws[(ib + 16u * LDS) / 4u], LDV);
            c01 = coopMultiplyAdd(a0, b1, c01);
            if (FM >= 2u) {
                let a1 = coopLoadT<TileA>(&xs[(ia + 16u * LDS) / 4u], LDV);
                c10 = coopMultiplyAdd(a1, b0, c10);
                c11 = coopMultiplyAdd(a1, b1, c11);
            }
            if (FM == 4u) {
                let a2 = coopLoadT<TileA>(&xs[(ia + 32u * LDS) / 4u], LDV);
                let a3 = coopLoadT<TileA>(&xs[(ia + 48u * LDS) / 4u], LDV);
                c20 = coopMultiplyAdd(a2, b0, c20);
                c21 = coopMultiplyAdd(a2, b1, c21);
                c30 = coopMultiplyAdd(a3, b0, c30);
                c31 = coopMultiplyAdd(a3, b1, c31);
                if (FN == 4u) {
                    // a1 again (the one above is scoped to its block): the machine code loads
                    // it once, 8 fragment loads a step (H200 run 409).
                    let a1 = coopLoadT<TileA>(&xs[(ia + 16u * LDS) / 4u], LDV);
                    let b2 = coopLoad<TileB>(&ws[(ib + 32u * LDS) / 4u], LDV);
                    let b3 = coopLoad<TileB>(&ws[(ib + 48u * LDS) / 4u], LDV);
                    c02 = coopMultiplyAdd(a0, b2, c02);
                    c03 = coopMultiplyAdd(a0, b3, c03);
                    c12 = coopMultiplyAdd(a1, b2, c12);
                    c13 = coopMultiplyAdd(a1, b3, c13);
                    c22 = coopMultiplyAdd(a2, b2, c22);
                    c23 = coopMultiplyAdd(a2, b3, c23);
                    c32 = coopMultiplyAdd(a3, b2, c32);
                    c33 = coopMultiplyAdd(a3, b3, c33);
                }
            }
        }
    }
}

// The K loop, once for tiles inside X and W (loads from row bases, no clamps) and once for
// edge tiles: two copies, so that what the loaders hold across the barrier (LOAD_AHEAD) stays
// in the registers its loads landed in. One loop over both kinds of fetch made the compiler
// copy those registers where the two paths join, before the barrier, and a copy waits for its
// load (Q8_0's machine code, H200 run 313).
// The multipliers' path sets what the loaders hold to zero after its multiply-adds: the
// compiler does not know that an invocation's role holds for the whole loop, and without the
// assignment kept the held loads' registers live across the multiply-adds too (H200, run 374:
// F16 4096^3 774 -> 729 µs). With LOAD_AHEAD 2 the loaders hold two steps, in `a` (the odd
// step after an even one) and `c` (the even one after that), the loop unrolled by two so that
// each is refilled right after it is stored, never copied.
fn k_steps_full(loader: bool, plid: u32, b: Bases, k_begin: u32, steps: u32, sm: u32, sn: u32) {
    var a: Staged;
    var c: Staged;
    if (loader) {
        stash(plid, fetch_full(plid, b, k_begin / 8u), 0u, true);
        if (LOAD_AHEAD >= 1u && steps > 1u) { a = fetch_full(plid, b, (k_begin + BK) / 8u); }
        if (LOAD_AHEAD == 2u && steps > 2u) { c = fetch_full(plid, b, (k_begin + 2u * BK) / 8u); }
    }
    workgroupBarrier();
    for (var step = 0u; step < steps; step += 2u) {
        if (loader) {
            if (step + 1u < steps) {
                if (LOAD_AHEAD >= 1u) {
                    stash(plid, a, 1u, true);
                    let next = step + 1u + LOAD_AHEAD;
                    if (next < steps) { a = fetch_full(plid, b, (k_begin + next * BK) / 8u); }
                } else {
                    stash(plid, fetch_full(plid, b, (k_begin + (step + 1u) * BK) / 8u), 1u, true);
                }
            }
        } else {
            multiply(0u, sm, sn);
            a = Staged();
            c = Staged();
        }
        workgroupBarrier();
        if (step + 1u < steps) {
            if (loader) {
                if (step + 2u < steps) {
                    if (LOAD_AHEAD == 2u) {
                        stash(plid, c, 0u, true);
                        if (step + 4u < steps) { c = fetch_full(plid, b, (k_begin + (step + 4u) * BK) / 8u); }
                    } else if (LOAD_AHEAD == 1u) {
                        stash(plid, a, 0u, true);
                        if (step + 3u < steps) { a = fetch_full(plid, b, (k_begin + (step + 3u) * BK) / 8u); }
                    } else {
                        stash(plid, fetch_full(plid, b, (k_begin + (step + 2u) * BK) / 8u), 0u, true);
                    }
                }
            } else {
                multiply(1u, sm, sn);
                a = Staged();
                c = Staged();
            }
            workgroupBarrier();
        }
    }
}

fn k_steps_edge(loader: bool, plid: u32, m0: u32, n0: u32, k_begin: u32, steps: u32, sm: u32, sn: u32) {
    var a: Staged;
    var c: Staged;
    if (loader) {
        stash(plid, fetch_edge(plid, m0, n0, k_begin), 0u, false);
        if (LOAD_AHEAD >= 1u && steps > 1u) { a = fetch_edge(plid, m0, n0, k_begin + BK); }
        if (LOAD_AHEAD == 2u && steps > 2u) { c = fetch_edge(plid, m0, n0, k_begin + 2u * BK); }
    }
    workgroupBarrier();
    for (var step = 0u; step < steps; step += 2u) {
        if (loader) {
            if (step + 1u < steps) {
                if (LOAD_AHEAD >= 1u) {
                    stash(plid, a, 1u, false);
                    let next = step + 1u + LOAD_AHEAD;
                    if (next < steps) { a = fetch_edge(plid, m0, n0, k_begin + next * BK); }
                } else {
                    stash(plid, fetch_edge(plid, m0, n0, k_begin + (step + 1u) * BK), 1u, false);
                }
            }
        } else {
            multiply(0u, sm, sn);
            a = Staged();
            c = Staged();
        }
        workgroupBarrier();
        if (step + 1u < steps) {
            if (loader) {
                if (step + 2u < steps) {
                    if (LOAD_AHEAD == 2u) {
                        stash(plid, c, 0u, false);
                        if (step + 4u < steps) { c = fetch_edge(plid, m0, n0, k_begin + (step + 4u) * BK); }
                    } else if (LOAD_AHEAD == 1u) {
                        stash(plid, a, 0u, false);
                        if (step + 3u < steps) { a = fetch_edge(plid, m0, n0, k_begin + (step + 3u) * BK); }
                    } else {
                        stash(plid, fetch_edge(plid, m0, n0, k_begin + (step + 2u) * BK), 0u, false);
                    }
                }
            } else {
                multiply(1u, sm, sn);
                a = Staged();
                c = Staged();
            }
            workgroupBarrier();
        }
    }
}

// SHARED: every invocation loads and multiplies. Each step's loads are issued at the start of
// the step four before the one that reads them (two in edge tiles) and held in registers
// across the multiply-adds in between, stored after the last of them into the buffer not being
// read, one barrier a step, whatever LOAD_AHEAD says. H200, F16 4096^3 alone: one step ahead
// took 24% longer than two (run 409); four 679.6 -> 667.0 µs (235 registers against 207), three
// (unrolled by three, buffers picked at run time) 713.5 (run 415). For tiles whose subgroups
// need more registers than loader subgroups would leave (64x64 a subgroup: a kernel's register
// count is every invocation's).
fn k_steps_shared_full(b: Bases, k_begin: u32, steps: u32, lid: u32, sm: u32, sn: u32) {
    var a: Staged;
    var c: Staged;
    var e: Staged;
    var f: Staged;
    stash(lid, fetch_full(lid, b, (k_begin) / 8u), 0u, true);
    if (steps > 1u) { a = fetch_full(lid, b, (k_begin + BK) / 8u); }
    if (steps > 2u) { c = fetch_full(lid, b, (k_begin + 2u * BK) / 8u); }
    if (steps > 3u) { e = fetch_full(lid, b, (k_begin + 3u * BK) / 8u); }
    workgroupBarrier();
    // Unrolled by four, so that each held set is refilled in place (a, c, e, f: steps 1, 2, 3, 0
    // mod 4) and the buffers alternate by name.
    for (var step = 0u; step < steps; step += 4u) {
        if (step + 4u < steps) { f = fetch_full(lid, b, (k_begin + (step + 4u) * BK) / 8u); }
        multiply(0u, sm, sn);
        if (step + 1u < steps) { stash(lid, a, 1u, true); }
        workgroupBarrier();
        if (step + 1u < steps) {
            if (step + 5u < steps) { a = fetch_full(lid, b, (k_begin + (step + 5u) * BK) / 8u); }
            multiply(1u, sm, sn);
            if (step + 2u < steps) { stash(lid, c, 0u, true); }
            workgroupBarrier();
        }
        if (step + 2u < steps) {
            if (step + 6u < steps) { c = fetch_full(lid, b, (k_begin + (step + 6u) * BK) / 8u); }
            multiply(0u, sm, sn);
            if (step + 3u < steps) { stash(lid, e, 1u, true); }
            workgroupBarrier();
        }
        if (step + 3u < steps) {
            if (step + 7u < steps) { e = fetch_full(lid, b, (k_begin + (step + 7u) * BK) / 8u); }
            multiply(1u, sm, sn);
            if (step + 4u < steps) { stash(lid, f, 0u, true); }
            workgroupBarrier();
        }
    }
}

fn k_steps_shared_edge(m0: u32, n0: u32, k_begin: u32, steps: u32, lid: u32, sm: u32, sn: u32) {
    var a: Staged;
    var c: Staged;
    stash(lid, fetch_edge(lid, m0, n0, k_begin), 0u, false);
    if (steps > 1u) { a = fetch_edge(lid, m0, n0, k_begin + BK); }
    workgroupBarrier();
    // Unrolled by two, so that each held set is refilled in place (a: odd steps, c: even).
    for (var step = 0u; step < steps; step += 2u) {
        if (step + 2u < steps) { c = fetch_edge(lid, m0, n0, k_begin + (step + 2u) * BK); }
        multiply(0u, sm, sn);
        if (step + 1u < steps) { stash(lid, a, 1u, false); }
        workgroupBarrier();
        if (step + 1u < steps) {
            if (step + 3u < steps) { a = fetch_edge(lid, m0, n0, k_begin + (step + 3u) * BK); }
            multiply(1u, sm, sn);
            if (step + 2u < steps) { stash(lid, c, 0u, false); }
            workgroupBarrier();
        }
    }
}

// The first WG invocations multiply, the LWG after them load (see the top of the file).
// Roles are per subgroup (32 invocations in index order), so the cooperative operations run
// in subgroup-uniform control flow; they are in functions so that naga, whose analysis knows
// only workgroup uniformity, accepts them.
// Tiles in groups of GROUP_M rows of tiles, the rows fastest within a group: the workgroups
// that run together share W's tiles (from memory once, then from L2) and X's rows. Before,
// a row of tiles ran whole before the next, and a wide W (TinyLlama's gate/up, 46 MB) was read
// again for each row of tiles (H200, run 391: 512x2048x11264 156.2 -> 147.7 µs, 4096x2048x11264
// 1.104 -> 1.041 ms, 4096^3 unchanged).
const GROUP_M: u32 = 8u;
fn tile_of(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let l = wid.x + wid.y * nwg.x;
    let per_group = GROUP_M * nwg.x;
    let first = (l / per_group) * GROUP_M;
    let rows = min(GROUP_M, nwg.y - first);
    let r = l % per_group;
    return vec2<u32>(r / rows, first + r % rows);
}

@compute @workgroup_size(WG + LWG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = tile_of(wid, nwg);
    let n0 = t.x * BN;
    let m0 = t.y * BM;
    let loader = lid >= WG;
    let plid = lid - WG;
    // This invocation's subgroup and its block of the tile.
    let sg = lid / 32u;
    let sm = (sg / SGN) * (FM * 16u);
    let sn = (sg % SGN) * (FN * 16u);
    if (!loader) { clear(); }

    // This workgroup's K range (split-K: a whole number of BK steps but the last range's).
    let ks = k_range(wid.z);
    let k_begin = ks.x;
    let steps = (ks.y - k_begin + BK - 1u) / BK;
    // Tiles inside X and W whose K steps are all whole take the loads without clamps or masks.
    let full = m0 + BM <= p.n_cols && n0 + BN <= p.n_rows && (ks.y - k_begin) % BK == 0u;
    if (SHARED) {
        if (full) {
            k_steps_shared_full(bases(lid, m0, n0), k_begin, steps, lid, sm, sn);
        } else {
            k_steps_shared_edge(m0, n0, k_begin, steps, lid, sm, sn);
        }
    } else if (full) {
        k_steps_full(loader, plid, bases(plid, m0, n0), k_begin, steps, sm, sn);
    } else {
        k_steps_edge(loader, plid, m0, n0, k_begin, steps, sm, sn);
    }

    // The epilogue: each multiplying subgroup its own accumulators, through its own slice of
    // workgroup memory, behind subgroup barriers; the loaders are done.
    if (!loader) { emit_all(lid % 32u, sg * 256u, m0 + sm, n0 + sn); }
}

// A multiplying subgroup's epilogue: its accumulators one at a time, first output (gm, gn).
fn emit_all(lane: u32, slice: u32, gm: u32, gn: u32) {
    emit(0u, slice, lane, gm, gn);
    if (FN >= 2u) { emit(1u, slice, lane, gm, gn + 16u); }
    if (FM >= 2u) {
        emit(2u, slice, lane, gm + 16u, gn);
        emit(3u, slice, lane, gm + 16u, gn + 16u);
    }
    if (FM == 4u) {
        emit(4u, slice, lane, gm + 32u, gn);
        emit(5u, slice, lane, gm + 32u, gn + 16u);
        emit(6u, slice, lane, gm + 48u, gn);
        emit(7u, slice, lane, gm + 48u, gn + 16u);
    }
    if (FN == 4u) {
        for (var r = 0u; r < 4u; r++) {
            emit(8u + 2u * r, slice, lane, gm + 16u * r, gn + 32u);
            emit(9u + 2u * r, slice, lane, gm + 16u * r, gn + 48u);
        }
    }
}

fn clear() {
    c00 = TileC();
    c01 = TileC();
    c10 = TileC();
    c11 = TileC();
    c20 = TileC();
    c21 = TileC();
    c30 = TileC();
    c31 = TileC();
    if (FN == 4u) {
        c02 = TileC();
        c03 = TileC();
        c12 = TileC();
        c13 = TileC();
        c22 = TileC();
        c23 = TileC();
        c32 = TileC();
        c33 = TileC();
    }
}

// Accumulator i (c00, c01, c10, ... in that order) into this subgroup's slice.
fn put_acc(i: u32, slice: u32) {
    switch i {
        case 0u: { coopStoreT(c00, &cs[slice], 16u); }
        case 1u: { coopStoreT(c01, &cs[slice], 16u); }
        case 2u: { coopStoreT(c10, &cs[slice], 16u); }
        case 3u: { coopStoreT(c11, &cs[slice], 16u); }
        case 4u: { coopStoreT(c20, &cs[slice], 16u); }
        case 5u: { coopStoreT(c21, &cs[slice], 16u); }
        case 6u: { coopStoreT(c30, &cs[slice], 16u); }
        case 7u: { coopStoreT(c31, &cs[slice], 16u); }
        case 8u: { coopStoreT(c02, &cs[slice], 16u); }
        case 9u: { coopStoreT(c03, &cs[slice], 16u); }
        case 10u: { coopStoreT(c12, &cs[slice], 16u); }
        case 11u: { coopStoreT(c13, &cs[slice], 16u); }
        case 12u: { coopStoreT(c22, &cs[slice], 16u); }
        case 13u: { coopStoreT(c23, &cs[slice], 16u); }
        case 14u: { coopStoreT(c32, &cs[slice], 16u); }
        default: { coopStoreT(c33, &cs[slice], 16u); }
    }
}

// The epilogue of accumulator i, whose first output is (gm, gn): through this subgroup's slice
// of workgroup memory, 128 pairs of outputs over its 32 lanes.
fn emit(i: u32, slice: u32, lane: u32, gm: u32, gn: u32) {
    put_acc(i, slice);
    subgroupBarrier();
    // (A loop bound by a count, not by the lane: naga takes the barrier after it as uniform.)
    for (var j = 0u; j < 4u; j++) {
        let e = lane * 2u + j * 64u;
        store_pair(gm + e / 16u, gn + e % 16u, cs[slice + e], cs[slice + e + 1u]);
    }
    subgroupBarrier();
}
