// KV cache of f32 values.
alias KvWord = f32;
const KV_PER_WORD: u32 = 1u;
fn kv_get(w: KvWord, i: u32) -> f32 { return w; }
fn kv_pair_words(a: f32, b: f32) -> array<KvWord, 2> { return array<KvWord, 2>(a, b); }
