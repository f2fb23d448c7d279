// The QKV epilogue (common/matmul_epilogue.wgsl, EPI_QKV): Q rotated into Y, K rotated and V
// copied into their KV-cache rows at each token's position. Needs a KV-cache element file
// (common/kv_*.wgsl) and a step file: common/step_one.wgsl (the tokens of one sequence at
// consecutive positions of its cache region) or common/step_columns.wgsl (a batched decode
// step: each column its own sequence, position and region). Header constant NEOX: rotated
// pairs are halves (i, i + n_rot/2) of a head, whose rows the fused weight holds adjacent;
// else adjacent dimensions (2i, 2i + 1).

struct Rope {
    q_dim: u32,      // rows of Q (heads x head_dim)
    kv_dim: u32,     // rows of K, and of V
    head_dim: u32,
    n_rot: u32,      // rotated dimensions per head (even, <= head_dim)
    freq_base: f32,
    freq_scale: f32,
    kv_stride: u32,  // elements between cache rows
    _pad: u32,
}

@group(0) @binding(6) var<storage, read_write> k_cache: array<KvWord>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<KvWord>;
@group(0) @binding(8) var<uniform> rope: Rope;
@group(0) @binding(9) var<storage, read> step: Step;

// theta_i = pos * freq_scale * base^(-2i / n_rot), as rope.wgsl.
fn rope_theta(pos: u32, i: u32) -> f32 {
    return f32(pos) * rope.freq_scale * pow(rope.freq_base, -2.0 * f32(i) / f32(rope.n_rot));
}

// Values a, b of fused rows n, n + 1 (n even) for column gm of the step.
// (store_half: the f16 SwiGLU epilogue's, unused here.)
fn store_half(i: u32, v: f32) {}

fn store_qkv(gm: u32, n: u32, a: f32, b: f32) {
    let pos = col_pos(gm);
    let row = col_base(gm) + pos;   // the token's cache row
    let qk = rope.q_dim + rope.kv_dim;
    if (n >= qk) {
        // V: dimensions e, e + 1 of the row, as they are.
        let i = row * rope.kv_stride + (n - qk);
        let w = kv_pair_words(a, b);
        for (var u = 0u; u < 2u / KV_PER_WORD; u++) { v_cache[i / KV_PER_WORD + u] = w[u]; }
        return;
    }
    let is_q = n < rope.q_dim;
    let r = select(n - rope.q_dim, n, is_q);
    let hd = rope.head_dim;
    let e = r % hd;
    let head = r - e;
    // The pair's dimensions in the head, and its rotation.
    var d0 = e;
    var d1 = e + 1u;
    var o = vec2<f32>(a, b);
    if (e < rope.n_rot) {
        let i = e / 2u;
        if (NEOX) {
            d0 = i;
            d1 = i + rope.n_rot / 2u;
        }
        let th = rope_theta(pos, i);
        let c = cos(th);
        let s = sin(th);
        o = vec2<f32>(a * c - b * s, a * s + b * c);
    }
    if (is_q) {
        let o_row = gm * p.y_stride + head;
        y[o_row + d0] = o.x;
        y[o_row + d1] = o.y;
        return;
    }
    let base = row * rope.kv_stride + head;
    let w = kv_pair_words(o.x, o.y);
    if (KV_PER_WORD == 1u) {
        k_cache[base + d0] = w[0];
        k_cache[base + d1] = w[1];
    } else {
        // Packed halves: adjacent pairs only (NeoX models keep separate RoPE kernels there).
        k_cache[(base + d0) / KV_PER_WORD] = w[0];
    }
}
