//! The command line: argument parsing, terminal output, exit codes.

pub mod bench;
pub mod bench_serve;
pub mod chat;
pub mod doctor;
pub mod eval;
pub mod info;
pub mod inspect;
pub mod llama_flags;
pub mod load;
pub mod perplexity;
pub mod pull;
pub mod report;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;

use clap::{Parser, Subcommand};

use crate::gpu::{parse_backend, ContextOptions};
use crate::{KilnError, Result};

#[derive(Parser, Debug)]
#[command(name = "kiln", version, about = "Portable GPU inference for Llama-family GGUF models")]
pub struct Cli {
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Adapter selection flags shared by every command that uses the GPU.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GpuArgs {
    /// Adapter to use: an index from `kiln info` or a substring of its name.
    #[arg(long)]
    pub gpu: Option<String>,
    /// Backend to use: vulkan, metal, dx12 or gl.
    #[arg(long)]
    pub backend: Option<String>,
}

impl GpuArgs {
    pub fn options(&self) -> Result<ContextOptions> {
        let mut opts = ContextOptions::from_env()?;
        opts.gpu = self.gpu.clone();
        opts.backend = match &self.backend {
            Some(b) => Some(parse_backend(b).ok_or_else(|| {
                KilnError::invalid("--backend", format!("unknown backend {b:?} (expected vulkan, metal, dx12 or gl)"))
            })?),
            None => None,
        };
        Ok(opts)
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Benchmark prompt processing and generation speed (llama-bench's flags and tables).
    Bench(bench::BenchArgs),
    /// Check every kernel kiln runs on this GPU against its CPU reference; write a JSON report.
    Doctor(doctor::DoctorArgs),
    /// List GPU adapters, their features and limits, and which one kiln would use.
    Info(info::InfoArgs),
    /// Show a GGUF file's metadata, architecture, tensors and format mix.
    Inspect(inspect::InspectArgs),
    /// Teacher-forced evaluation of token ids: logits, mean NLL and perplexity.
    Eval(eval::EvalArgs),
    /// Write a synthetic model (real shapes and format mix, random weights) as GGUF.
    Synth(synth::SynthArgs),
    /// Complete a prompt, streaming the text.
    Run(run::RunArgs),
    /// Print the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Chat with a model interactively.
    Chat(chat::ChatArgs),
    /// Perplexity of a text file, as llama-perplexity computes it (-c: the chunk size, default 512).
    Perplexity(perplexity::PerplexityArgs),
    /// Merge bench JSON files from several machines into a markdown table and SVG charts (and
    /// kiln doctor reports into a table beside them).
    Report(report::ReportArgs),
    /// Serve the model over HTTP with OpenAI's API (chat and text completions, streaming).
    Serve(serve::ServeArgs),
    /// Load-test an OpenAI-compatible server: N streaming requests at a time; output tokens/s,
    /// time to first token and inter-token latency (as vLLM's serving benchmark).
    BenchServe(bench_serve::BenchServeArgs),
    /// Download a GGUF model from a Hugging Face repository into the cache (REPO[:QUANT]).
    Pull(pull::PullArgs),
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench(a) => bench::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::Info(a) => info::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Eval(a) => eval::run(&a),
        Command::Synth(a) => synth::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Tokenize(a) => tokenize::run(&a),
        Command::Chat(a) => chat::run(&a),
        Command::Perplexity(a) => perplexity::run(&a),
        Command::Report(a) => report::run(&a),
        Command::Pull(a) => pull::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::BenchServe(a) => bench_serve::run(&a),
    }
}
