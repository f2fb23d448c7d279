//! llama.cpp's spelling of flags. llama.cpp (and llama-bench) use multi-letter short flags
//! (`-ngl 99`, `-fa on`, `-ub 256`, `-hf REPO`), which clap would read as a one-letter flag
//! with the rest as its value (`-ngl` = `-n gl`). Before clap sees the command line, each such
//! token is rewritten to its long form; the table also names the llama.cpp flags kiln knows but
//! does not support, so their error says why instead of only "unexpected argument".

use std::ffi::OsString;

use clap::CommandFactory;

use crate::cli::Cli;

/// llama.cpp's multi-letter short flags and the long flag each one means (in llama.cpp, and
/// in kiln where kiln has it).
const SHORT_TO_LONG: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-fa", "--flash-attn"),
    ("-sys", "--system-prompt"),
    ("-ub", "--ubatch-size"),
    ("-tb", "--threads-batch"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hft", "--hf-token"),
    ("-pg", "--pg"),
    // Known to kiln, not supported (see UNSUPPORTED).
    ("-nkvo", "--no-kv-offload"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-cnv", "--conversation"),
    ("-no-cnv", "--no-conversation"),
    ("-if", "--interactive-first"),
    ("-mli", "--multiline-input"),
    ("-dev", "--device"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-np", "--parallel"),
    ("-cb", "--cont-batching"),
    ("-nocb", "--no-cont-batching"),
    ("-ot", "--override-tensor"),
    ("-cmoe", "--cpu-moe"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-mu", "--model-url"),
    ("-co", "--color"),
    ("-sp", "--special"),
    ("-st", "--single-turn"),
    ("-mmp", "--mmap"),
    ("-embd", "--embeddings"),
    ("-oe", "--output-err"),
    ("-lv", "--verbosity"),
    ("-dt", "--defrag-thold"),
];

/// llama.cpp flags kiln does not have, and what to do instead.
const UNSUPPORTED: &[(&[&str], &str)] = &[
    (&["--no-kv-offload"], "kiln keeps the KV cache on the GPU"),
    (&["--cache-type-k", "--cache-type-v"], "kiln has one KV cache type for K and V: use --kv-type f16|f32"),
    (
        &[
            "--conversation",
            "--no-conversation",
            "-i",
            "--interactive",
            "--interactive-first",
            "--multiline-input",
            "--single-turn",
        ],
        "kiln run completes one prompt; for a conversation use `kiln chat`",
    ),
    (
        &["--device", "--split-mode", "--tensor-split", "--main-gpu"],
        "kiln runs on one adapter: choose it with --gpu INDEX|NAME (`kiln info` lists them)",
    ),
    (
        &["--parallel", "--cont-batching", "--no-cont-batching"],
        "kiln run and chat generate one sequence; `kiln serve --parallel N` serves N at a time",
    ),
    (&["--override-tensor", "--cpu-moe", "--n-cpu-moe"], "kiln keeps every tensor on the GPU"),
    (&["--model-url"], "use -m FILE, or -hf REPO[:QUANT] to download from Hugging Face"),
    (&["--color"], "kiln prints the generated text uncolored"),
    (&["--special"], "kiln never prints special tokens"),
    (
        &["--mmap", "--mlock", "--numa"],
        "kiln maps the model file only while it uploads it (--no-mmap reads it instead)",
    ),
    (&["--embeddings"], "kiln generates text; it has no embedding output"),
    (&["--output-err"], "use -o for the one output format"),
    (&["--verbosity"], "use -v (info) or -vv (debug)"),
    (&["--defrag-thold"], "kiln's KV cache is one contiguous region per sequence"),
    (&["--lora", "--lora-scaled", "--control-vector"], "kiln has no adapters"),
    (&["--grammar", "--grammar-file", "--json-schema", "-j"], "kiln has no constrained sampling"),
    (
        &[
            "--mirostat",
            "--mirostat-lr",
            "--mirostat-ent",
            "--typical",
            "--presence-penalty",
            "--frequency-penalty",
            "--dry-multiplier",
            "--xtc-probability",
            "--xtc-threshold",
            "--samplers",
            "--sampling-seq",
            "--top-nsigma",
            "--dynatemp-range",
            "--logit-bias",
        ],
        "kiln's samplers are --temp, --top-k, --top-p, --min-p and --repeat-penalty",
    ),
    (&["--keep", "--no-context-shift"], "kiln keeps the last half of a full context (BOS first)"),
    (
        &["--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"],
        "kiln uses the RoPE settings in the model file",
    ),
    (
        &["--jinja", "--chat-template-file"],
        "kiln renders the model's own chat template; --chat-template picks a built-in",
    ),
    (&["--prio", "--poll", "--cpu-mask", "--cpu-range", "--cpu-strict"], "kiln's work runs on the GPU"),
    (&["--in-prefix", "--in-suffix", "--prompt-cache"], "not available in kiln"),
];

/// Rewrites llama.cpp's multi-letter short flags (`-ngl 99`) to their long forms. Values are
/// never rewritten: a token that follows a flag taking a value (`-p -fa`) is left as it is,
/// and so is everything after `--`.
pub fn normalize(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let root = Cli::command();
    let mut args = args.into_iter();
    let mut out: Vec<OsString> = args.next().into_iter().collect();
    let mut sub: Option<&clap::Command> = None;
    let mut value_next = false;
    for arg in args.by_ref() {
        if value_next {
            value_next = false;
            out.push(arg);
            continue;
        }
        let Some(s) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            out.push(arg);
            break;
        }
        let s = SHORT_TO_LONG.iter().find(|(short, _)| *short == s).map_or(s, |(_, long)| *long);
        if !s.starts_with('-') {
            if sub.is_none() {
                sub = root.find_subcommand(s);
            }
        } else if !s.contains('=') {
            let cmd = sub.unwrap_or(&root);
            value_next = takes_value(cmd, s) || (sub.is_some() && takes_value(&root, s));
        }
        out.push(OsString::from(s));
    }
    out.extend(args);
    out
}

/// Whether `flag` (`-x` or `--name`, no `=value`) is an option of `cmd` whose value is the
/// next token.
fn takes_value(cmd: &clap::Command, flag: &str) -> bool {
    let arg = if let Some(long) = flag.strip_prefix("--") {
        cmd.get_arguments()
            .find(|a| a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long)))
    } else {
        let mut chars = flag.chars().skip(1);
        match (chars.next(), chars.next()) {
            (Some(c), None) => cmd
                .get_arguments()
                .find(|a| a.get_short() == Some(c) || a.get_all_short_aliases().is_some_and(|al| al.contains(&c))),
            _ => None,
        }
    };
    arg.is_some_and(|a| {
        // An optional value (`-fa [on|off|auto]`) is taken only when one follows; treat it as
        // a flag here, so the next token is still looked at.
        a.get_action().takes_values() && a.get_num_args().is_none_or(|n| n.min_values() > 0)
    })
}

/// The line added to clap's "unexpected argument" error for a llama.cpp flag kiln knows but
/// does not support.
pub fn unsupported_note(flag: &str) -> Option<String> {
    let name = flag.split('=').next().unwrap_or(flag);
    let (_, why) = UNSUPPORTED.iter().find(|(names, _)| names.contains(&name))?;
    let short = SHORT_TO_LONG.iter().find(|(_, long)| *long == name).map(|(s, _)| format!("{s}/"));
    Some(format!("note: {}{name} is a llama.cpp flag that kiln does not support: {why}", short.unwrap_or_default()))
}

/// llama.cpp's `-fa` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashAttn {
    On,
    Off,
    Auto,
}

/// `on|off|auto`, and llama-bench's `1|0` (and true/false).
pub fn parse_flash_attn(s: &str) -> Result<FlashAttn, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "1" | "true" | "enabled" => Ok(FlashAttn::On),
        "off" | "0" | "false" | "disabled" => Ok(FlashAttn::Off),
        "auto" | "-1" => Ok(FlashAttn::Auto),
        _ => Err(format!("{s:?} is not on, off or auto")),
    }
}

/// llama.cpp's `-ngl` values: a layer count, `auto` or `all`.
pub fn parse_gpu_layers(s: &str) -> Result<String, String> {
    let l = s.to_ascii_lowercase();
    if l == "auto" || l == "all" || l.parse::<i64>().is_ok() {
        Ok(l)
    } else {
        Err(format!("{s:?} is not a layer count, auto or all"))
    }
}

/// Where `--help` lists these flags.
const LLAMA_HEADING: &str = "llama.cpp flags (what each does in kiln)";

/// What kiln says about `-fa`, in the help of every command that takes it.
const FLASH_ATTN_HELP: &str = "kiln's attention kernels are the same either way";

/// llama.cpp flags that run, chat, eval and perplexity accept, so a llama.cpp command line
/// works unchanged. What each does in kiln is in its help.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LlamaArgs {
    /// Layers to put on the GPU (llama.cpp's -ngl: a number, auto or all). Accepted; kiln
    /// keeps every layer on the GPU whatever the number (-v says so).
    #[arg(help_heading = LLAMA_HEADING, long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N", allow_hyphen_values = true, value_parser = parse_gpu_layers)]
    pub n_gpu_layers: Option<String>,
    /// CPU threads (llama.cpp's -t). kiln computes on the GPU; on a CPU adapter (Mesa's
    /// lavapipe or llvmpipe) this is the adapter's thread count (LP_NUM_THREADS).
    #[arg(help_heading = LLAMA_HEADING, short = 't', long = "threads", value_name = "N")]
    pub threads: Option<u32>,
    /// Threads for prompt processing (llama.cpp's -tb): as -t, where -t is not given.
    #[arg(help_heading = LLAMA_HEADING, long = "threads-batch", value_name = "N")]
    pub threads_batch: Option<u32>,
    /// Flash attention, on|off|auto (llama.cpp's -fa). Accepted; kiln's attention is the
    /// same either way: decode splits the context across workgroups (flash-decoding),
    /// prefill computes the scores of one ubatch at a time.
    #[arg(help_heading = LLAMA_HEADING, long = "flash-attn", value_name = "on|off|auto", num_args = 0..=1, default_missing_value = "on", value_parser = parse_flash_attn)]
    pub flash_attn: Option<FlashAttn>,
    /// Read the model file into memory instead of memory-mapping it (llama.cpp's --no-mmap).
    #[arg(help_heading = LLAMA_HEADING, long = "no-mmap")]
    pub no_mmap: bool,
}

impl LlamaArgs {
    /// Applies what these flags do in kiln (before any GPU is opened), and says under -v
    /// what they do not change.
    pub fn apply(&self) {
        if let Some(n) = self.threads.or(self.threads_batch).filter(|&n| n > 0) {
            // Mesa's software drivers read it when the device is created.
            std::env::set_var("LP_NUM_THREADS", n.to_string());
        }
        if let Some(n) = &self.n_gpu_layers {
            tracing::info!("-ngl {n}: kiln keeps every layer on the GPU");
        }
        if let Some(fa) = self.flash_attn {
            tracing::info!("-fa {fa:?}: {FLASH_ATTN_HELP}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(args: &[&str]) -> Vec<String> {
        normalize(args.iter().map(OsString::from)).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn multi_letter_short_flags_become_long() {
        assert_eq!(
            norm(&["kiln", "run", "-m", "m.gguf", "-ngl", "99", "-fa", "on", "-ub", "64", "-p", "hi"]),
            [
                "kiln",
                "run",
                "-m",
                "m.gguf",
                "--n-gpu-layers",
                "99",
                "--flash-attn",
                "on",
                "--ubatch-size",
                "64",
                "-p",
                "hi"
            ]
        );
        assert_eq!(
            norm(&["kiln", "-v", "chat", "-hf", "a/b:Q8_0", "-sys", "x"])[3..],
            ["--hf-repo", "a/b:Q8_0", "--system-prompt", "x"]
        );
    }

    #[test]
    fn values_and_everything_after_the_separator_stay() {
        // -p takes a value: "-fa" is the prompt. -n takes negative numbers.
        assert_eq!(
            norm(&["kiln", "run", "-p", "-fa", "-n", "-1", "-sys"])[2..],
            ["-p", "-fa", "-n", "-1", "--system-prompt"]
        );
        assert_eq!(norm(&["kiln", "run", "--prompt", "-ngl", "--", "-ngl"])[2..], ["--prompt", "-ngl", "--", "-ngl"]);
        assert_eq!(norm(&["kiln", "run", "--prompt=-ngl", "-ngl"])[2..], ["--prompt=-ngl", "--n-gpu-layers"]);
        // An optional value: `-fa -p x` is -fa without one, then -p.
        assert_eq!(norm(&["kiln", "run", "-fa", "-p", "-ngl"])[2..], ["--flash-attn", "-p", "-ngl"]);
    }

    #[test]
    fn unsupported_flags_say_why() {
        let n = unsupported_note("--no-kv-offload").unwrap();
        assert!(n.contains("-nkvo/--no-kv-offload") && n.contains("llama.cpp"), "{n}");
        assert!(unsupported_note("--color=always").unwrap().contains("uncolored"));
        assert!(unsupported_note("--frobnicate").is_none());
    }
}
