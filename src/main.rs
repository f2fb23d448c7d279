use clap::Parser;

use kiln::cli::{self, llama_flags, Cli};

fn main() {
    // Without a session runtime dir, libwayland (probed by Mesa's Vulkan and EGL drivers on
    // headless machines) prints an error line per probe; point it somewhere harmless.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let cli = match Cli::try_parse_from(llama_flags::normalize(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => exit_on_flag_error(e),
    };
    // wgpu, its hardware layer and naga log through the `log` crate: what they say while
    // kiln probes adapters (a GL driver that cannot compile a compute shader logs several
    // ERROR records before kiln reports the adapter unusable in one line) is for -vv only.
    let filter = match cli.verbose {
        0 => "warn,wgpu=off,wgpu_core=off,wgpu_hal=off,naga=off",
        1 => "info,wgpu=off,wgpu_core=off,wgpu_hal=off,naga=off",
        _ => "debug,wgpu_core=info,wgpu_hal=info,naga=info",
    };
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt().with_env_filter(env).with_writer(std::io::stderr).init();
    if let Err(e) = cli::run(cli) {
        if e.is_broken_pipe() {
            return;
        }
        eprintln!("kiln: {e}");
        std::process::exit(e.exit_code());
    }
}

/// clap's message (help and version go to stdout with exit 0), plus a line for a llama.cpp
/// flag that kiln knows and does not support.
fn exit_on_flag_error(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        e.exit();
    }
    let _ = e.print();
    if let Some(ContextValue::String(flag)) = e.get(ContextKind::InvalidArg) {
        if let Some(note) = llama_flags::unsupported_note(flag) {
            eprintln!("{note}");
        }
    }
    std::process::exit(2);
}
