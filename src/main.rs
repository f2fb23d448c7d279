use clap::Parser;

use kiln::cli::{self, Cli};

fn main() {
    let cli = Cli::parse();
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info,wgpu_core=warn,wgpu_hal=warn,naga=warn",
        _ => "debug,wgpu_core=info,wgpu_hal=info,naga=info",
    };
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt()
        .with_env_filter(env)
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = cli::run(cli) {
        if e.is_broken_pipe() {
            return;
        }
        eprintln!("kiln: {e}");
        std::process::exit(e.exit_code());
    }
}
