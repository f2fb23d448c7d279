//! `-hf REPO[:QUANT]` on the model-taking commands, and `kiln pull`: the command-line side of
//! [`crate::hub`] (flags, the download's progress bar, what is said about the choice made).

use std::io::Write;
use std::path::PathBuf;

use crate::hub::{fetch, HubOptions, ModelRef, Progress, Refresh};
use crate::Result;

/// Where `--help` lists these flags.
const HUB_HEADING: &str = "Models from Hugging Face";

/// llama.cpp's flags for models on Hugging Face.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HubArgs {
    /// Model from a Hugging Face repository, OWNER/NAME[:QUANT] (quant case-insensitive,
    /// default Q4_K_M), downloaded once into KILN_CACHE (HF_ENDPOINT, HF_TOKEN apply).
    #[arg(help_heading = HUB_HEADING, long = "hf-repo", value_name = "REPO[:QUANT]")]
    pub hf_repo: Option<String>,
    /// The file to take from the -hf repository (instead of choosing by quant).
    #[arg(help_heading = HUB_HEADING, long = "hf-file", value_name = "FILE", requires = "hf_repo")]
    pub hf_file: Option<String>,
    /// Hugging Face access token (default: HF_TOKEN).
    #[arg(help_heading = HUB_HEADING, long = "hf-token", value_name = "TOKEN")]
    pub hf_token: Option<String>,
}

impl HubArgs {
    /// The local file of the -hf model (downloading it if the cache lacks it), or None
    /// without -hf.
    pub fn model_file(&self) -> Result<Option<PathBuf>> {
        match &self.hf_repo {
            None => Ok(None),
            Some(spec) => resolve(spec, self, Refresh::IfMissing).map(Some),
        }
    }
}

/// The model file of a command that takes `-m FILE` or `-hf REPO[:QUANT]`.
pub fn model_path(file: Option<&PathBuf>, hub: &HubArgs) -> Result<PathBuf> {
    match (file, hub.model_file()?) {
        (_, Some(p)) => Ok(p),
        (Some(f), None) => Ok(f.clone()),
        (None, None) => Err(crate::KilnError::invalid("model", "no model given: use -m FILE or -hf REPO[:QUANT]")),
    }
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// OWNER/NAME[:QUANT], e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0 (default quant Q4_K_M).
    #[arg(value_name = "REPO[:QUANT]")]
    pub repo: String,
    /// The file to take from the repository (instead of choosing by quant).
    #[arg(long = "hf-file", value_name = "FILE")]
    pub hf_file: Option<String>,
    /// Hugging Face access token (default: HF_TOKEN).
    #[arg(long = "hf-token", value_name = "TOKEN")]
    pub hf_token: Option<String>,
}

/// `kiln pull`: asks the hub which file REPO[:QUANT] is now, downloads it unless the cache has
/// it, and prints its path.
pub fn run(args: &PullArgs) -> Result<()> {
    let hub =
        HubArgs { hf_repo: Some(args.repo.clone()), hf_file: args.hf_file.clone(), hf_token: args.hf_token.clone() };
    let path = resolve(&args.repo, &hub, Refresh::Always)?;
    writeln!(std::io::stdout().lock(), "{}", path.display())?;
    Ok(())
}

fn resolve(spec: &str, args: &HubArgs, refresh: Refresh) -> Result<PathBuf> {
    let r = ModelRef::parse(spec)?;
    let mut opts = HubOptions::from_env()?;
    if args.hf_token.is_some() {
        opts.token = args.hf_token.clone();
    }
    let bar = indicatif::ProgressBar::hidden();
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "downloading {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut on_progress = |p: Progress| match p {
        Progress::Start { file, total, done } => {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_length(total);
            bar.set_position(done);
            bar.reset_eta();
            bar.set_message(file.to_string());
            if done > 0 {
                bar.suspend(|| eprintln!("kiln: resuming {file} at {done} of {total} bytes"));
            }
        }
        Progress::Bytes(n) => bar.set_position(n),
        Progress::Retry { error } => bar.suspend(|| eprintln!("kiln: download interrupted ({error}); resuming")),
        Progress::Finish => bar.finish_and_clear(),
    };
    let got = fetch(&r, args.hf_file.as_deref(), &opts, refresh, &mut on_progress);
    bar.finish_and_clear();
    let got = got?;
    if got.fallback {
        eprintln!(
            "kiln: {} has no {} file; using {} (choose with -hf {}:QUANT)",
            r.repo,
            crate::hub::DEFAULT_QUANT,
            got.file.path,
            r.repo
        );
    }
    tracing::info!(
        "{}: {} ({} bytes){}",
        spec,
        got.path.display(),
        got.file.size,
        if got.cached { ", from the cache" } else { "" }
    );
    Ok(got.path)
}
