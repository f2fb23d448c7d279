//! Synthetic models: the tensor names, shapes and format mix of real GGUF files (Q4_K_M as
//! llama.cpp makes it), with random but valid blocks, so kiln can be run and benchmarked
//! without downloading anything.

use crate::error::{KilnError, Result};
use crate::gguf::writer::{GgufWriter, MetaValue};
use crate::quant::{random_blocks, WeightFormat};

/// Shapes of a model family.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    pub name: &'static str,
    pub arch: &'static str,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    pub n_vocab: u32,
    pub n_ctx: u32,
    pub rope_base: f32,
    pub tied: bool,
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "tinyllama-1.1b",
        arch: "llama",
        n_layer: 22,
        n_embd: 2048,
        n_ff: 5632,
        n_head: 32,
        n_kv_head: 4,
        head_dim: 64,
        n_vocab: 32000,
        n_ctx: 2048,
        rope_base: 10000.0,
        tied: false,
    },
    Preset {
        name: "llama-7b",
        arch: "llama",
        n_layer: 32,
        n_embd: 4096,
        n_ff: 11008,
        n_head: 32,
        n_kv_head: 32,
        head_dim: 128,
        n_vocab: 32000,
        n_ctx: 4096,
        rope_base: 10000.0,
        tied: false,
    },
    Preset {
        name: "qwen3-0.6b",
        arch: "qwen3",
        n_layer: 28,
        n_embd: 1024,
        n_ff: 3072,
        n_head: 16,
        n_kv_head: 8,
        head_dim: 128,
        n_vocab: 151936,
        n_ctx: 40960,
        rope_base: 1_000_000.0,
        tied: true,
    },
    // What `kiln bench` runs on CPU adapters (lavapipe): 4 narrow layers and an 8K
    // vocabulary (21M parameters), so a default run takes about a minute.
    Preset {
        name: "mini-llama",
        arch: "llama",
        n_layer: 4,
        n_embd: 512,
        n_ff: 1536,
        n_head: 8,
        n_kv_head: 4,
        head_dim: 64,
        n_vocab: 8192,
        n_ctx: 2048,
        rope_base: 10000.0,
        tied: false,
    },
    // Small enough for CPU adapters: quick runs on lavapipe.
    Preset {
        name: "tiny-test",
        arch: "llama",
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        n_vocab: 1024,
        n_ctx: 512,
        rope_base: 10000.0,
        tied: false,
    },
    // The qwen2 and qwen3 code paths at the same small size.
    Preset {
        name: "tiny-qwen2",
        arch: "qwen2",
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        n_vocab: 1024,
        n_ctx: 512,
        rope_base: 1_000_000.0,
        tied: true,
    },
    Preset {
        name: "tiny-qwen3",
        arch: "qwen3",
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 128,
        n_vocab: 1024,
        n_ctx: 512,
        rope_base: 1_000_000.0,
        tied: true,
    },
];

/// How the weights are quantized, as llama.cpp's file types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Q4KM,
    Q5KM,
    Q6K,
    Q8_0,
    F16,
}

impl FileType {
    pub fn parse(s: &str) -> Option<FileType> {
        match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Some(FileType::Q4KM),
            "q5_k_m" => Some(FileType::Q5KM),
            "q6_k" => Some(FileType::Q6K),
            "q8_0" => Some(FileType::Q8_0),
            "f16" => Some(FileType::F16),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            FileType::Q4KM => "q4_k_m",
            FileType::Q5KM => "q5_k_m",
            FileType::Q6K => "q6_k",
            FileType::Q8_0 => "q8_0",
            FileType::F16 => "f16",
        }
    }
    /// llama.cpp's `general.file_type` number.
    fn ggml_ftype(self) -> u32 {
        match self {
            FileType::Q4KM => 15,
            FileType::Q5KM => 17,
            FileType::Q6K => 18,
            FileType::Q8_0 => 7,
            FileType::F16 => 1,
        }
    }
}

/// llama.cpp's use_more_bits: the layers whose attn_v / ffn_down get Q6_K in *_K_M files.
fn use_more_bits(i: u32, n: u32) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
}

/// The format of a matrix in a file of type `ft`.
pub fn tensor_format(ft: FileType, name: &str, layer: Option<u32>, n_layer: u32) -> WeightFormat {
    let more = layer.map(|i| use_more_bits(i, n_layer)).unwrap_or(false);
    let base = match ft {
        FileType::Q4KM => WeightFormat::Q4K,
        FileType::Q5KM => WeightFormat::Q5K,
        FileType::Q6K => WeightFormat::Q6K,
        FileType::Q8_0 => WeightFormat::Q8_0,
        FileType::F16 => WeightFormat::F16,
    };
    match ft {
        FileType::Q4KM | FileType::Q5KM => {
            if name == "output.weight"
                || ((name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight")) && more)
            {
                WeightFormat::Q6K
            } else {
                base
            }
        }
        _ => base,
    }
}

/// "tinyllama-1.1b:q4_k_m" → (preset, file type).
pub fn parse_spec(spec: &str) -> Result<(Preset, FileType)> {
    let (p, f) = spec.split_once(':').unwrap_or((spec, "q4_k_m"));
    let preset = PRESETS.iter().find(|x| x.name == p).copied().ok_or_else(|| {
        KilnError::invalid(
            "--synthetic",
            format!(
                "unknown preset {p:?} (presets: {})",
                PRESETS.iter().map(|x| x.name).collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let ft = FileType::parse(f).ok_or_else(|| {
        KilnError::invalid("--synthetic", format!("unknown format {f:?} (q4_k_m, q5_k_m, q6_k, q8_0, f16)"))
    })?;
    Ok((preset, ft))
}

/// The synthetic models' SentencePiece vocabulary of `n` tokens: tokens, scores and token
/// types. Specials, the 256 byte tokens, then letter pieces ("▁a", "a", "▁b", …, "▁aa", …)
/// scored by their order; "▁" alone is not a piece.
pub fn vocabulary(n: u32) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let letters: Vec<char> = ('a'..='z').collect();
    let mut len = 1;
    'outer: while (tokens.len() as u32) < n {
        let count = letters.len().pow(len);
        for i in 0..count {
            let mut s = String::new();
            let mut k = i;
            for _ in 0..len {
                s.push(letters[k % letters.len()]);
                k /= letters.len();
            }
            for piece in [format!("\u{2581}{s}"), s] {
                if tokens.len() as u32 >= n {
                    break 'outer;
                }
                tokens.push(piece);
                types.push(1);
            }
        }
        len += 1;
    }
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    (tokens, scores, types)
}

/// Random valid blocks for a [rows, k] tensor: a slab of rows repeated (GPU caches cannot
/// tell a repeated slab from fresh data at these sizes).
fn random_matrix(format: WeightFormat, rows: usize, k: usize, seed: u64) -> Result<Vec<u8>> {
    let slab_rows = rows.min(16);
    let slab = random_blocks(format, slab_rows * k, seed)?;
    let total =
        format.tensor_bytes(rows, k).ok_or_else(|| KilnError::invalid("synthetic model", "tensor too large"))?;
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let n = slab.len().min(total - out.len());
        out.extend_from_slice(&slab[..n]);
    }
    Ok(out)
}

/// Makes every row of a `random_matrix` its own: each row's quants (or the low mantissa bits of
/// float weights) XORed with a pattern of its index, block headers (the scales) untouched so
/// every block stays valid and finite. For the matrix that makes the logits: with the slab
/// repeated, each logit had about n_vocab / 16 exact copies (2,000 for TinyLlama), which no
/// trained model's logits have and which sent the GPU sampler to its slowest path.
fn distinct_rows(format: WeightFormat, data: &mut [u8], rows: usize) {
    let row_bytes = data.len() / rows.max(1);
    let block = format.block_bytes();
    // The quants' bytes in a block (GGUF layout).
    let quants = match format {
        WeightFormat::Q4K => 16..144,
        WeightFormat::Q5K => 48..176,
        WeightFormat::Q6K => 0..128,
        WeightFormat::Q8_0 => 2..34,
        // Floats: the lowest byte of each value (mantissa bits only).
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => 0..1,
    };
    let mask = if format.is_quantized() { 0xff } else { 0x0f };
    for (r, row) in data.chunks_mut(row_bytes).enumerate() {
        let h = (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for (i, b) in row.chunks_mut(block).enumerate() {
            for (j, x) in b[quants.clone()].iter_mut().enumerate() {
                *x ^= (h >> (8 * ((i + j) % 8))) as u8 & mask;
            }
        }
    }
}

fn norm_weights(n: usize) -> Vec<u8> {
    bytemuck::cast_slice(&vec![1.0f32; n]).to_vec()
}

/// Builds the synthetic model of `preset` in file type `ft`.
pub fn build(preset: &Preset, ft: FileType) -> Result<GgufWriter> {
    Ok(build_impl(preset, ft, true)?.0)
}

/// The bytes of tensor data the model of `preset` in `ft` has, and of its largest tensor,
/// without generating any of it.
pub fn data_bytes(preset: &Preset, ft: FileType) -> Result<(u64, u64)> {
    let (_, total, largest) = build_impl(preset, ft, false)?;
    Ok((total, largest))
}

/// The model of `preset` in `ft` with every matrix all zeros, as a GGUF image in memory that
/// costs only its header (the tensor data is a hole): for what depends on shapes alone, e.g.
/// whether a model's sessions fit an adapter.
pub fn layout(preset: &Preset, ft: FileType) -> Result<crate::gguf::GgufFile> {
    build_impl(preset, ft, false)?.0.into_gguf(&format!("{}:{} (layout)", preset.name, ft.name()))
}

/// Builds the model (`fill`: with random data; else with zero matrices, only sized) and
/// returns it with its total and largest tensor data sizes.
fn build_impl(preset: &Preset, ft: FileType, fill: bool) -> Result<(GgufWriter, u64, u64)> {
    let p = preset;
    let a = p.arch;
    let mut w = GgufWriter::default();
    let key = |k: &str| format!("{a}.{k}");
    w.meta("general.architecture", MetaValue::Str(a.into()));
    w.meta("general.name", MetaValue::Str(format!("synthetic {} {}", p.name, ft.name())));
    w.meta("general.file_type", MetaValue::U32(ft.ggml_ftype()));
    w.meta(&key("context_length"), MetaValue::U32(p.n_ctx));
    w.meta(&key("embedding_length"), MetaValue::U32(p.n_embd));
    w.meta(&key("block_count"), MetaValue::U32(p.n_layer));
    w.meta(&key("feed_forward_length"), MetaValue::U32(p.n_ff));
    w.meta(&key("attention.head_count"), MetaValue::U32(p.n_head));
    w.meta(&key("attention.head_count_kv"), MetaValue::U32(p.n_kv_head));
    w.meta(&key("attention.key_length"), MetaValue::U32(p.head_dim));
    w.meta(&key("attention.value_length"), MetaValue::U32(p.head_dim));
    w.meta(&key("rope.dimension_count"), MetaValue::U32(p.head_dim));
    w.meta(&key("rope.freq_base"), MetaValue::F32(p.rope_base));
    w.meta(&key("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5));
    let (tokens, scores, types) = vocabulary(p.n_vocab);
    w.meta("tokenizer.ggml.model", MetaValue::Str("llama".into()));
    w.meta("tokenizer.ggml.tokens", MetaValue::ArrStr(tokens));
    w.meta("tokenizer.ggml.scores", MetaValue::ArrF32(scores));
    w.meta("tokenizer.ggml.token_type", MetaValue::ArrI32(types));
    w.meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
    w.meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    w.meta("tokenizer.ggml.unknown_token_id", MetaValue::U32(0));

    let (e, ff, q, kv, v) = (
        p.n_embd as usize,
        p.n_ff as usize,
        (p.n_head * p.head_dim) as usize,
        (p.n_kv_head * p.head_dim) as usize,
        p.n_vocab as usize,
    );
    let mut seed = 1u64;
    let (mut total, mut largest) = (0u64, 0u64);
    let mut mat = |w: &mut GgufWriter, name: &str, layer: Option<u32>, rows: usize, k: usize| -> Result<()> {
        // token_embd keeps the base type, as llama.cpp does for *_K_M.
        let fmt = tensor_format(ft, name, layer, p.n_layer);
        seed += 1;
        let bytes =
            fmt.tensor_bytes(rows, k).ok_or_else(|| KilnError::invalid("synthetic model", "tensor too large"))?;
        total += bytes as u64;
        largest = largest.max(bytes as u64);
        if fill {
            let mut data = random_matrix(fmt, rows, k, seed)?;
            // The matrix that makes the logits (the embeddings where they are tied).
            if name == "output.weight" || (name == "token_embd.weight" && p.tied) {
                distinct_rows(fmt, &mut data, rows);
            }
            w.tensor(name, fmt, vec![k as u64, rows as u64], data);
        } else {
            w.tensor_zeros(name, fmt, vec![k as u64, rows as u64], bytes as u64);
        }
        Ok(())
    };
    mat(&mut w, "token_embd.weight", None, v, e)?;
    w.tensor("output_norm.weight", WeightFormat::F32, vec![e as u64], norm_weights(e));
    if !p.tied {
        mat(&mut w, "output.weight", None, v, e)?;
    }
    for i in 0..p.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        w.tensor(&n("attn_norm.weight"), WeightFormat::F32, vec![e as u64], norm_weights(e));
        mat(&mut w, &n("attn_q.weight"), Some(i), q, e)?;
        mat(&mut w, &n("attn_k.weight"), Some(i), kv, e)?;
        mat(&mut w, &n("attn_v.weight"), Some(i), kv, e)?;
        mat(&mut w, &n("attn_output.weight"), Some(i), e, q)?;
        if a == "qwen2" {
            let bias = |len: usize, s: u64| bytemuck::cast_slice(&crate::quant::random_values(len, s, 0.1)).to_vec();
            w.tensor(&n("attn_q.bias"), WeightFormat::F32, vec![q as u64], bias(q, 100 + i as u64));
            w.tensor(&n("attn_k.bias"), WeightFormat::F32, vec![kv as u64], bias(kv, 200 + i as u64));
            w.tensor(&n("attn_v.bias"), WeightFormat::F32, vec![kv as u64], bias(kv, 300 + i as u64));
        }
        if a == "qwen3" {
            let hd = p.head_dim as usize;
            w.tensor(&n("attn_q_norm.weight"), WeightFormat::F32, vec![hd as u64], norm_weights(hd));
            w.tensor(&n("attn_k_norm.weight"), WeightFormat::F32, vec![hd as u64], norm_weights(hd));
        }
        w.tensor(&n("ffn_norm.weight"), WeightFormat::F32, vec![e as u64], norm_weights(e));
        mat(&mut w, &n("ffn_gate.weight"), Some(i), ff, e)?;
        mat(&mut w, &n("ffn_up.weight"), Some(i), ff, e)?;
        mat(&mut w, &n("ffn_down.weight"), Some(i), e, ff)?;
    }
    // Norms and biases are small next to the matrices; the writer counts everything.
    let all = w.data_bytes().0;
    Ok((w, all.max(total), largest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_mix_follows_llama_cpp() {
        // 22 layers (TinyLlama): layers 0-1, 19-21 and every third from 4 get Q6_K.
        let q6: Vec<u32> = (0..22)
            .filter(|&i| tensor_format(FileType::Q4KM, "blk.x.ffn_down.weight", Some(i), 22) == WeightFormat::Q6K)
            .collect();
        assert_eq!(q6, vec![0, 1, 4, 7, 10, 13, 16, 19, 20, 21]);
        assert_eq!(tensor_format(FileType::Q4KM, "output.weight", None, 22), WeightFormat::Q6K);
        assert_eq!(tensor_format(FileType::Q4KM, "token_embd.weight", None, 22), WeightFormat::Q4K);
        assert_eq!(tensor_format(FileType::Q4KM, "blk.3.attn_q.weight", Some(3), 22), WeightFormat::Q4K);
    }

    #[test]
    fn logit_rows_are_distinct_and_finite() {
        let (rows, k) = (64, 512);
        for format in WeightFormat::ALL {
            let mut data = random_matrix(format, rows, k, 3).unwrap();
            distinct_rows(format, &mut data, rows);
            let mut values = vec![0f32; rows * k];
            crate::quant::dequantize(format, &data, rows * k, &mut values).unwrap();
            assert!(values.iter().all(|v| v.is_finite()), "{format:?}");
            let mut seen: Vec<&[f32]> = values.chunks(k).collect();
            seen.sort_by(|a, b| a.partial_cmp(b).unwrap());
            seen.dedup();
            assert_eq!(seen.len(), rows, "{format:?}: rows repeat");
        }
    }

    #[test]
    fn sizing_matches_the_built_model() {
        for spec in ["tiny-test:q4_k_m", "tiny-qwen2:q8_0", "tiny-qwen3:f16", "mini-llama:q6_k"] {
            let (p, f) = parse_spec(spec).unwrap();
            let w = build(&p, f).unwrap();
            let (total, largest) = data_bytes(&p, f).unwrap();
            assert_eq!(total, w.data_bytes().0, "{spec}");
            assert_eq!(largest, w.data_bytes().1, "{spec}");
            // The in-memory image holds the same tensors as the written file.
            let len = w.len();
            let file = w.into_gguf(spec).unwrap();
            assert_eq!(file.file_len(), len);
            assert_eq!(file.tensors.iter().map(|t| t.bytes).sum::<u64>(), total, "{spec}");
        }
    }

    #[test]
    fn specs_parse() {
        let (p, f) = parse_spec("tinyllama-1.1b:q8_0").unwrap();
        assert_eq!((p.name, f), ("tinyllama-1.1b", FileType::Q8_0));
        assert!(parse_spec("gpt-5:q4_k_m").is_err());
        assert!(parse_spec("llama-7b:q3").is_err());
    }
}
