// The matrix cores' multiply-add rate through wgpu's cooperative matrices: every subgroup runs
// p.iters rounds of eight independent 16x16x16 f16 x f16 -> f32 multiply-adds on operands
// that stay in registers (8192 flops each), nothing read from memory in the loop; the
// cooperative GEMM (gemm_coop.wgsl) is measured against it. Header constant: WG (a multiple
// of the 32-wide subgroup). The result is stored only where no run writes it.

struct Params {
    n: u32,
    iters: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

var<workgroup> tile: array<f16, 512>;
var<workgroup> out: array<f32, 256>;

alias TileA = coop_mat16x16<f16, A>;
alias TileB = coop_mat16x16<f16, B>;
alias TileC = coop_mat16x16<f32, C>;

@compute @workgroup_size(WG)
fn mma_peak(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    for (var i = lid; i < 512u; i += WG) {
        tile[i] = f16(f32(i % 7u) * 0.001);
    }
    workgroupBarrier();
    let a = coopLoad<TileA>(&tile[0], 16u);
    let b = coopLoad<TileB>(&tile[256], 16u);
    var c0 = TileC();
    var c1 = TileC();
    var c2 = TileC();
    var c3 = TileC();
    var c4 = TileC();
    var c5 = TileC();
    var c6 = TileC();
    var c7 = TileC();
    for (var it = 0u; it < p.iters; it++) {
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
        c4 = coopMultiplyAdd(a, b, c4);
        c5 = coopMultiplyAdd(a, b, c5);
        c6 = coopMultiplyAdd(a, b, c6);
        c7 = coopMultiplyAdd(a, b, c7);
    }
    // Every accumulator feeds the (never taken) store, so none is optimized away.
    if (p.n == 0xffffffffu) {
        coopStore(c0, &out[0], 16u);
        coopStore(c1, &out[0], 16u);
        coopStore(c2, &out[0], 16u);
        coopStore(c3, &out[0], 16u);
        coopStore(c4, &out[0], 16u);
        coopStore(c5, &out[0], 16u);
        coopStore(c6, &out[0], 16u);
        coopStore(c7, &out[0], 16u);
        workgroupBarrier();
        dst[wid.x & 63u] = out[lid % 256u] + src[0];
    }
}
