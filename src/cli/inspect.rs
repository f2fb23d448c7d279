//! `kiln inspect MODEL`: metadata, architecture, tensor table, format mix and sizes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;

use crate::cli::pull::{model_path, HubArgs};
use crate::gguf::GgufFile;
use crate::model::ModelConfig;
use crate::tokenizer::Tokenizer;
use crate::Result;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The GGUF file.
    #[arg(required_unless_present = "hf_repo", conflicts_with = "hf_repo")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// Print every tensor (default: the first 40).
    #[arg(long)]
    pub all: bool,
}

fn short(v: &Value) -> String {
    match v {
        Value::Array(a) => {
            let head: Vec<String> = a.iter().take(4).map(short).collect();
            format!("[{}{}] ({} items)", head.join(", "), if a.len() > 4 { ", …" } else { "" }, a.len())
        }
        Value::String(s) if s.chars().count() > 80 => {
            format!("{:?}… ({} bytes)", s.chars().take(80).collect::<String>(), s.len())
        }
        other => other.to_string(),
    }
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

pub fn run(args: &InspectArgs) -> Result<()> {
    let mut o = std::io::stdout().lock();
    let f = GgufFile::open(model_path(args.model.as_ref(), &args.hub)?)?;
    writeln!(
        o,
        "{}: GGUF v{}, {}, {} tensors, {} metadata keys",
        f.path.display(),
        f.version,
        human(f.file_len()),
        f.tensors.len(),
        f.metadata.len()
    )?;
    writeln!(o, "\nmetadata:")?;
    for (k, v) in &f.metadata {
        writeln!(o, "  {k} = {}", short(v))?;
    }
    writeln!(o, "\nmodel:")?;
    let runnable = ModelConfig::from_gguf(&f)
        .and_then(|c| c.validate_tensors(&f).map(|_| c))
        .and_then(|c| Tokenizer::from_gguf(&f).map(|_| c));
    match runnable {
        Ok(c) => {
            writeln!(
                o,
                "  architecture {} ({}), {} layers, embedding {}, FFN {}",
                c.arch.name(),
                c.name,
                c.n_layer,
                c.n_embd,
                c.n_ff
            )?;
            writeln!(
                o,
                "  heads {} (KV {}), head dim {}, RoPE {:?} over {} dims, base {}, scale {}",
                c.n_head, c.n_kv_head, c.head_dim, c.rope_mode, c.n_rot, c.rope_base, c.rope_freq_scale
            )?;
            writeln!(
                o,
                "  vocab {}, trained context {}, RMS eps {:e}, tied embeddings: {}",
                c.n_vocab, c.n_ctx_train, c.rms_eps, c.tied_embeddings
            )?;
            writeln!(o, "  kiln can run this model")?;
        }
        Err(e) => writeln!(o, "  kiln cannot run this model: {e}")?,
    }
    let mut mix: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for t in &f.tensors {
        let e = mix.entry(t.type_name()).or_default();
        e.0 += 1;
        e.1 += t.bytes;
        e.2 += t.n_elements();
    }
    let total: u64 = f.tensors.iter().map(|t| t.bytes).sum();
    let params: u64 = f.tensors.iter().map(|t| t.n_elements()).sum();
    writeln!(o, "\nformats ({:.1}M parameters, {}):", params as f64 / 1e6, human(total))?;
    for (name, (n, bytes, elems)) in &mix {
        let bpw = if *elems > 0 { *bytes as f64 * 8.0 / *elems as f64 } else { 0.0 };
        writeln!(o, "  {name:<12} {n:>5} tensors  {:>12}  {bpw:.2} bits/weight", human(*bytes))?;
    }
    writeln!(o, "\ntensors:")?;
    let shown = if args.all { f.tensors.len() } else { f.tensors.len().min(40) };
    for t in &f.tensors[..shown] {
        writeln!(o, "  {:<32} {:<10} {:?}  {} bytes at {}", t.name, t.type_name(), t.dims, t.bytes, t.offset)?;
    }
    if shown < f.tensors.len() {
        writeln!(o, "  … {} more (--all to list them)", f.tensors.len() - shown)?;
    }
    Ok(())
}
