//! Hyper-parameters of a Llama-family model, read from GGUF metadata and checked in one place.

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use crate::kernels::rope::RopeMode;

/// The architectures kiln runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, TinyLlama, Mistral.
    Llama,
    /// Qwen2: biases on Q, K and V.
    Qwen2,
    /// Qwen3: RMSNorm on each head of Q and K.
    Qwen3,
}

impl Arch {
    pub const SUPPORTED: &'static str = "llama, qwen2, qwen3";
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
    pub fn rope_mode(self) -> RopeMode {
        match self {
            Arch::Llama => RopeMode::Norm,
            Arch::Qwen2 | Arch::Qwen3 => RopeMode::Neox,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: Arch,
    pub name: String,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    pub n_vocab: u32,
    /// Context length the model was trained for.
    pub n_ctx_train: u32,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Multiplier on positions (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    pub rope_mode: RopeMode,
    /// No output.weight: the LM head reuses token_embd.weight.
    pub tied_embeddings: bool,
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig> {
        let bad = |m: String| KilnError::File { path: f.path.clone(), message: m };
        let arch_name = f
            .get_str("general.architecture")?
            .ok_or_else(|| bad("metadata key general.architecture is missing".into()))?;
        let arch = Arch::parse(arch_name).ok_or_else(|| {
            bad(format!("architecture {arch_name:?} is not supported (kiln runs {})", Arch::SUPPORTED))
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let u32_of = |k: &str| -> Result<u32> {
            let v = f.require_u64(&key(k))?;
            u32::try_from(v).map_err(|_| bad(format!("metadata {} = {v} is out of range", key(k))))
        };
        let opt_u32 = |k: &str| -> Result<Option<u32>> {
            match f.get_u64(&key(k))? {
                None => Ok(None),
                Some(v) => {
                    u32::try_from(v).map(Some).map_err(|_| bad(format!("metadata {} = {v} is out of range", key(k))))
                }
            }
        };
        let n_embd = u32_of("embedding_length")?;
        let n_layer = u32_of("block_count")?;
        let n_ff = u32_of("feed_forward_length")?;
        let n_head = u32_of("attention.head_count")?;
        let n_kv_head = opt_u32("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_kv_head == 0 || n_layer == 0 || n_embd == 0 {
            return Err(bad(format!(
                "zero-sized model: {n_layer} layers, {n_embd} embedding, {n_head} heads, {n_kv_head} KV heads"
            )));
        }
        if n_head % n_kv_head != 0 {
            return Err(bad(format!("{n_head} attention heads do not divide into {n_kv_head} KV heads")));
        }
        let head_dim = match opt_u32("attention.key_length")? {
            Some(d) => d,
            None => {
                if n_embd % n_head != 0 {
                    return Err(bad(format!("embedding length {n_embd} is not a multiple of {n_head} heads")));
                }
                n_embd / n_head
            }
        };
        // Sizes kiln computes in u32 (and allocates from): refuse what cannot be real.
        let fits = |heads: u32| heads.checked_mul(head_dim).filter(|&d| d <= 1 << 20).is_some();
        if !fits(n_head) || !fits(n_kv_head) || n_embd > 1 << 20 || n_ff > 1 << 22 || n_layer > 1 << 12 {
            return Err(bad(format!(
                "model dimensions are too large: {n_layer} layers, embedding {n_embd}, FFN {n_ff}, {n_head} heads of {head_dim}"
            )));
        }
        let n_rot = opt_u32("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 || head_dim % 2 != 0 {
            return Err(bad(format!("RoPE over {n_rot} of {head_dim} head dimensions is not supported")));
        }
        let rms_eps = f.get_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
        let rope_base = f.get_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let rope_freq_scale = match f.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => {
                let factor = f.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                if factor <= 0.0 {
                    return Err(bad(format!("RoPE scaling factor {factor} must be positive")));
                }
                1.0 / factor
            }
            Some(other) => return Err(bad(format!("RoPE scaling {other:?} is not supported (kiln supports linear)"))),
        };
        let n_ctx_train = opt_u32("context_length")?.unwrap_or(2048);
        let embd = f.tensor("token_embd.weight").ok_or_else(|| bad("tensor token_embd.weight is missing".into()))?;
        let n_vocab = match opt_u32("vocab_size")? {
            Some(v) => v,
            None => embd.rows_k().0 as u32,
        };
        let tied_embeddings = f.tensor("output.weight").is_none();
        let name = f.get_str("general.name")?.unwrap_or("").to_string();
        Ok(ModelConfig {
            arch,
            name,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_kv_head,
            head_dim,
            n_rot,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_freq_scale,
            rope_mode: arch.rope_mode(),
            tied_embeddings,
        })
    }

    pub fn q_dim(&self) -> u32 {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> u32 {
        self.n_kv_head * self.head_dim
    }

    /// Every tensor the forward pass reads, with its expected (rows, row length).
    pub fn expected_tensors(&self) -> Vec<(String, usize, usize)> {
        let (e, ff, q, kv, v) = (
            self.n_embd as usize,
            self.n_ff as usize,
            self.q_dim() as usize,
            self.kv_dim() as usize,
            self.n_vocab as usize,
        );
        let mut t = vec![("token_embd.weight".to_string(), v, e), ("output_norm.weight".to_string(), 1, e)];
        if !self.tied_embeddings {
            t.push(("output.weight".to_string(), v, e));
        }
        for l in 0..self.n_layer {
            let b = |n: &str| format!("blk.{l}.{n}");
            t.push((b("attn_norm.weight"), 1, e));
            t.push((b("attn_q.weight"), q, e));
            t.push((b("attn_k.weight"), kv, e));
            t.push((b("attn_v.weight"), kv, e));
            t.push((b("attn_output.weight"), e, q));
            t.push((b("ffn_norm.weight"), 1, e));
            t.push((b("ffn_gate.weight"), ff, e));
            t.push((b("ffn_up.weight"), ff, e));
            t.push((b("ffn_down.weight"), e, ff));
            if self.arch == Arch::Qwen2 {
                t.push((b("attn_q.bias"), 1, q));
                t.push((b("attn_k.bias"), 1, kv));
                t.push((b("attn_v.bias"), 1, kv));
            }
            if self.arch == Arch::Qwen3 {
                t.push((b("attn_q_norm.weight"), 1, self.head_dim as usize));
                t.push((b("attn_k_norm.weight"), 1, self.head_dim as usize));
            }
        }
        t
    }

    /// Checks that every tensor is present, shaped as expected, and of a supported type.
    pub fn validate_tensors(&self, f: &GgufFile) -> Result<()> {
        for (name, rows, k) in self.expected_tensors() {
            let t = f.tensor(&name).ok_or_else(|| KilnError::File {
                path: f.path.clone(),
                message: format!("tensor {name} is missing (needed by the {} architecture)", self.arch.name()),
            })?;
            if t.format.is_none() {
                return Err(KilnError::File {
                    path: f.path.clone(),
                    message: format!("tensor {name} has type {}, which kiln does not support (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K)", t.type_name()),
                });
            }
            if t.rows_k() != (rows, k) {
                return Err(KilnError::File {
                    path: f.path.clone(),
                    message: format!("tensor {name} has shape {:?}, expected [{k}, {rows}]", t.dims),
                });
            }
        }
        Ok(())
    }
}
