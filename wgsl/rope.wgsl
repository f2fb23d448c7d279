// Rotary position embedding over [n_tokens, n_heads, head_dim] rows; token t sits at position
// pos0 + t of its sequence, whose cache rows start at kv_base: both from the step state
// (common/step_one.wgsl), which chained decode steps each copy their own into. Modes: adjacent
// pairs (2i, 2i+1) ("norm", Llama) or halves (i, i + n_rot/2) ("neox", Qwen). theta_i = pos *
// freq_scale * base^(-2i / n_rot).
// Entry `main` rotates `x` where it lies (one invocation per rotated pair, Q). Entry
// `to_cache` writes the result into KV cache row pos0 + t as f32 or f16 (K); with ROPE false
// it is a plain copy (V). Entry `kv_write` does K and V in one dispatch.
// Header constants: WG, ROPE, NEOX. The parameters' pos0 and dst_offset are the CPU
// reference's; the kernels read the step's.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    pos0: u32,
    src_stride: u32,   // elements between tokens in the source
    dst_stride: u32,   // elements between cache rows
    dst_offset: u32,   // cache element of (row 0, head 0, dim 0)
    freq_base: f32,
    freq_scale: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> kv_dst: array<KvWord>;

fn theta(pos: u32, i: u32) -> f32 {
    return f32(pos) * p.freq_scale * pow(p.freq_base, -2.0 * f32(i) / f32(p.n_rot));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    let half_d = p.head_dim / 2u;
    let t = idx / (p.n_heads * half_d);
    if (t >= p.n_tokens) { return; }
    let h = (idx / half_d) % p.n_heads;
    let i = idx % half_d;
    let pos = step.pos0 + t;
    let src = t * p.src_stride + h * p.head_dim;
    {
        // Pair i of the rotation.
        var a: u32;
        var b: u32;
        var ti: u32;
        if (NEOX) {
            a = i; b = i + p.n_rot / 2u; ti = i;
            if (i >= p.n_rot / 2u) { return; }
        } else {
            a = 2u * i; b = 2u * i + 1u; ti = i;
            if (2u * i >= p.n_rot) { return; }
        }
        let th = theta(pos, ti);
        let c = cos(th);
        let s = sin(th);
        let x0 = x[src + a];
        let x1 = x[src + b];
        x[src + a] = x0 * c - x1 * s;
        x[src + b] = x0 * s + x1 * c;
    }
}

// Elements e and e+1 of head row `src` of x, rotated for position pos when ROPE (pair
// index i = e / 2 for the adjacent layout).
fn rotated_pair(src: u32, e: u32, pos: u32) -> vec2<f32> {
    var o = vec2<f32>(x[src + e], x[src + e + 1u]);
    if (ROPE && e < p.n_rot) {
        if (NEOX) {
            let hr = p.n_rot / 2u;
            for (var u = 0u; u < 2u; u++) {
                let d = e + u;
                if (d < hr) {
                    let th = theta(pos, d);
                    o[u] = x[src + d] * cos(th) - x[src + d + hr] * sin(th);
                } else {
                    let th = theta(pos, d - hr);
                    o[u] = x[src + d] * cos(th) + x[src + d - hr] * sin(th);
                }
            }
        } else {
            let th = theta(pos, e / 2u);
            let c = cos(th);
            let s = sin(th);
            o = vec2<f32>(o.x * c - o.y * s, o.x * s + o.y * c);
        }
    }
    return o;
}

@compute @workgroup_size(WG)
fn to_cache(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    let half_d = p.head_dim / 2u;
    let t = idx / (p.n_heads * half_d);
    if (t >= p.n_tokens) { return; }
    let h = (idx / half_d) % p.n_heads;
    let e = 2u * (idx % half_d);   // elements e, e+1: whole words of a packed f16 cache
    let pos = step.pos0 + t;
    let o = rotated_pair(t * p.src_stride + h * p.head_dim, e, pos);
    let dst = (step.kv_base + pos) * p.dst_stride + h * p.head_dim + e;
    let w = kv_pair_words(o.x, o.y);
    for (var u = 0u; u < 2u / KV_PER_WORD; u++) { kv_dst[dst / KV_PER_WORD + u] = w[u]; }
}

// K and V rows into their caches in one dispatch: the first half of the invocations rotate
// K (x) into kv_dst, the second half copy V (v_src) into v_dst.
@group(0) @binding(4) var<storage, read> v_src: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_dst: array<KvWord>;

@compute @workgroup_size(WG)
fn kv_write(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    let half_d = p.head_dim / 2u;
    let per = p.n_tokens * p.n_heads * half_d;
    if (idx >= 2u * per) { return; }
    let is_v = idx >= per;
    let j = idx % per;
    let t = j / (p.n_heads * half_d);
    let h = (j / half_d) % p.n_heads;
    let e = 2u * (j % half_d);
    let pos = step.pos0 + t;
    let src = t * p.src_stride + h * p.head_dim;
    let dst = (step.kv_base + pos) * p.dst_stride + h * p.head_dim + e;
    if (is_v) {
        let w = kv_pair_words(v_src[src + e], v_src[src + e + 1u]);
        for (var u = 0u; u < 2u / KV_PER_WORD; u++) { v_dst[dst / KV_PER_WORD + u] = w[u]; }
    } else {
        let o = rotated_pair(src, e, pos);
        let w = kv_pair_words(o.x, o.y);
        for (var u = 0u; u < 2u / KV_PER_WORD; u++) { kv_dst[dst / KV_PER_WORD + u] = w[u]; }
    }
}
