//! `kiln report`: one markdown table and SVG charts from bench JSON files of several machines,
//! and the `kiln doctor` reports beside them.

use std::path::PathBuf;

use crate::Result;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// JSON files written by `kiln bench -o json` (or jsonl) and `kiln doctor`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Folder for report.md, tokens_per_second.svg and stages_per_token.svg.
    #[arg(short = 'o', long = "out-dir", default_value = "kiln-report")]
    pub out_dir: PathBuf,
}

pub fn run(args: &ReportArgs) -> Result<()> {
    let inputs = crate::report::load_inputs(&args.files)?;
    let md = crate::report::write_report(&inputs, &args.out_dir)?;
    print!("{md}");
    eprintln!("kiln: wrote {} (report.md and charts)", args.out_dir.display());
    Ok(())
}
