// KV cache of f32 values.
alias KvWord = f32;
const KV_PER_WORD: u32 = 1u;
fn kv_get(w: KvWord, i: u32) -> f32 { return w; }
fn kv_pair_words(a: f32, b: f32) -> array<KvWord, 2> { return array<KvWord, 2>(a, b); }
// Four values at once, for kernels that read whole rows (attention_decode.wgsl binds the
// cache as KvVec; rows of a multiple of 4 values start on one).
alias KvVec = vec4<f32>;
const KV_PER_VEC: u32 = 4u;
fn kv_vec_get(v: KvVec, e: u32) -> f32 { return v[e]; }
