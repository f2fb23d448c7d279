//! `kiln tokenize`: print the token ids of a text (works on vocabulary-only GGUF files).

use std::io::Write;
use std::path::PathBuf;

use crate::cli::pull::{model_path, HubArgs};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use crate::Result;

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// GGUF file with a vocabulary.
    #[arg(short = 'm', long = "model", required_unless_present = "hf_repo", conflicts_with = "hf_repo")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// Text to tokenize.
    pub text: String,
    /// Leave the BOS token out.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Also print each token's text.
    #[arg(long)]
    pub pieces: bool,
}

pub fn run(args: &TokenizeArgs) -> Result<()> {
    let file = GgufFile::open(model_path(args.model.as_ref(), &args.hub)?)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&args.text, tok.add_bos_default() && !args.no_bos)?;
    let mut o = std::io::stdout().lock();
    if args.pieces {
        for id in &ids {
            writeln!(o, "{id:>8} {:?}", tok.token_str(*id).unwrap_or(""))?;
        }
    } else {
        let s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        writeln!(o, "{}", s.join(" "))?;
    }
    Ok(())
}
