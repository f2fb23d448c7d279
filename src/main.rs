use clap::Parser;

use kiln::cli::{self, Cli};

fn main() {
    // Without a session runtime dir, libwayland (probed by Mesa's Vulkan and EGL drivers on
    // headless machines) prints an error line per probe; point it somewhere harmless.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let cli = Cli::parse();
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info,wgpu_core=warn,wgpu_hal=warn,naga=warn",
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
