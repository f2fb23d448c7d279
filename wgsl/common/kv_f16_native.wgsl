// KV cache of halves, read and written as the f16 type (adapters with SHADER_F16).
alias KvWord = f16;
const KV_PER_WORD: u32 = 1u;
fn kv_get(w: KvWord, i: u32) -> f32 { return f32(w); }
fn kv_pair_words(a: f32, b: f32) -> array<KvWord, 2> { return array<KvWord, 2>(f16(a), f16(b)); }
// Eight halves at once, for kernels that read whole rows (attention_decode.wgsl binds the
// cache as KvVec; rows of a multiple of 8 values start on one).
alias KvVec = vec4<u32>;
const KV_PER_VEC: u32 = 8u;
fn kv_vec_get(v: KvVec, e: u32) -> f32 { return unpack2x16float(v[e / 2u])[e % 2u]; }
