// Elementwise ops on n values: out = silu(a) * b (SwiGLU), or out = a + b (residual).
// Header constants: WG, OP (0 = silu_mul, 1 = add).

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.n) { return; }
    let av = a[i];
    if (OP == 0u) {
        out[i] = av / (1.0 + exp(-av)) * b[i];
    } else {
        out[i] = av + b[i];
    }
}
