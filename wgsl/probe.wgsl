// Device probes for `kiln info --probe`: read bandwidth of one large dispatch, f32 FMA
// throughput, and the cost of a dispatch that depends on the previous one.
// Header constants: WG. The stores are guarded by a condition that never holds, so the
// compiler must keep the work without the probes writing anything measurable.

struct Params {
    n: u32,
    iters: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

// Grid-stride sum of n vec4s, four independent loads in flight per invocation.
@compute @workgroup_size(WG)
fn read_bw(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let total = nwg.x * WG;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var i = gid.x;
    while (i + 3u * total < p.n) {
        a0 += src[i];
        a1 += src[i + total];
        a2 += src[i + 2u * total];
        a3 += src[i + 3u * total];
        i += 4u * total;
    }
    while (i < p.n) {
        a0 += src[i];
        i += total;
    }
    let a = a0 + a1 + a2 + a3;
    let s = a.x + a.y + a.z + a.w;
    if (s == 1234.5) {
        dst[gid.x & 63u] = s;
    }
}

// Eight independent vec4 FMA chains per invocation: 64 flops per iteration.
@compute @workgroup_size(WG)
fn fma_peak(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = f32(gid.x & 1023u) * 1e-4;
    var a = vec4<f32>(x, x + 0.1, x + 0.2, x + 0.3);
    var b = a + 0.01;
    var c = a + 0.02;
    var d = a + 0.03;
    var e = a + 0.04;
    var f = a + 0.05;
    var g = a + 0.06;
    var h = a + 0.07;
    let m = vec4<f32>(0.9999);
    let k = vec4<f32>(0.0001);
    for (var it = 0u; it < p.iters; it++) {
        a = fma(a, m, k);
        b = fma(b, m, k);
        c = fma(c, m, k);
        d = fma(d, m, k);
        e = fma(e, m, k);
        f = fma(f, m, k);
        g = fma(g, m, k);
        h = fma(h, m, k);
    }
    let v = a + b + c + d + e + f + g + h;
    let s = v.x + v.y + v.z + v.w;
    if (s == 1234.5) {
        dst[gid.x & 63u] = s;
    }
}

// One tiny read-modify-write: back-to-back dispatches of it must wait for each other.
@compute @workgroup_size(WG)
fn chain(@builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        dst[0] = dst[0] + 1.0;
    }
}
