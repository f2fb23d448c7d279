//! `kiln synth`: write a synthetic model as a GGUF file (llama.cpp loads it too).

use std::path::PathBuf;

use crate::synth::{build, parse_spec};
use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// PRESET:FORMAT, e.g. tinyllama-1.1b:q4_k_m (presets: tinyllama-1.1b, llama-7b,
    /// qwen3-0.6b, tiny-test; formats: q4_k_m, q5_k_m, q6_k, q8_0, f16).
    #[arg(long)]
    pub preset: String,
    /// Output file.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

pub fn run(args: &SynthArgs) -> Result<()> {
    let (preset, ft) = parse_spec(&args.preset)?;
    let w = build(&preset, ft)?;
    let file = std::fs::File::create(&args.output)
        .map_err(|e| KilnError::File { path: args.output.clone(), message: e.to_string() })?;
    let mut out = std::io::BufWriter::new(file);
    w.write(&mut out).map_err(|e| KilnError::File { path: args.output.clone(), message: e.to_string() })?;
    eprintln!("wrote {} ({}:{})", args.output.display(), preset.name, ft.name());
    Ok(())
}
