//! `kiln doctor`: checks every kernel kiln would run on this GPU against its CPU reference,
//! one line per check, and writes the findings as JSON for a bug report or `kiln report`.

use std::io::Write;
use std::path::PathBuf;

use crate::bench::AdapterRecord;
use crate::cli::GpuArgs;
use crate::doctor::{self, CheckRecord, DoctorOptions, DoctorReport, Status};
use crate::gpu::GpuContext;
use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Where to write the JSON report (default: kiln-doctor-<adapter>-<backend>.json here).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Run only the checks whose name contains this text (repeatable), e.g. --only gemv.
    #[arg(long, value_name = "TEXT")]
    pub only: Vec<String>,
    /// Run every GEMV width (1-8 activation columns) with every weight format; by default
    /// each format runs 1, the most and one width between, the formats together all of them.
    #[arg(long)]
    pub every_width: bool,
}

fn sci(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1e}")).unwrap_or_else(|| "NaN".into())
}

/// One line per check: status, kernels, largest error and its share of the tolerance, time;
/// what failed or why it was skipped after it.
pub fn check_line(r: &CheckRecord) -> String {
    let status = match r.status {
        Status::Pass => "pass",
        Status::Fail => "FAIL",
        Status::Skip => "skip",
    };
    let head = format!("{status}  {:<16}  {:<34}", r.caps, r.name);
    if r.status == Status::Skip {
        return format!("{head}  {}", r.detail);
    }
    let kernels = match r.kernels {
        0 => String::from("           "),
        1 => String::from("  1 kernel "),
        n => format!("{n:>3} kernels"),
    };
    let err = match (r.max_abs_err, r.tolerance_used) {
        _ if r.cases.is_empty() => r.detail.clone(),
        (e, Some(t)) if t <= 9.99 => format!("max |Δ| {:<8} {:>4.0}% of tolerance", sci(e), t * 100.0),
        (e, Some(t)) => format!("max |Δ| {:<8} {t:.1e} x tolerance", sci(e)),
        (e, None) => format!("max |Δ| {}", sci(e)),
    };
    let mut line = format!("{head}  {kernels}  {err}  {:.2} s", r.secs);
    if r.status == Status::Fail && !r.cases.is_empty() {
        line.push_str(&format!("  {}", r.detail));
    }
    line
}

fn features_line(label: &str, features: &[String]) -> String {
    let f = if features.is_empty() { "none".to_string() } else { features.join(", ") };
    format!("  {label}: {f}")
}

pub fn run(args: &DoctorArgs) -> Result<()> {
    let opts = args.gpu.options()?;
    let native = GpuContext::new(&opts)?;
    let fallback = doctor::open_fallback(&native, &opts)?;
    let mut out = std::io::stdout().lock();
    let i = &native.info;
    writeln!(out, "kiln doctor on {} ({} {})", native.describe(), i.driver, i.driver_info)?;
    writeln!(out, "{}", features_line("native", &AdapterRecord::of(&native).features))?;
    match &fallback {
        Some(f) => writeln!(out, "{}", features_line("fallback (KILN_DISABLE=all)", &AdapterRecord::of(f).features))?,
        None => writeln!(out, "  fallback: none needed, the adapter already runs the portable kernels")?,
    }
    let perturb = crate::config::doctor_perturb_from_env();
    if let Some(p) = &perturb {
        eprintln!("kiln: KILN_DOCTOR_PERTURB={p}: the references of the checks named like it are wrong on purpose");
    }
    let verbose = tracing::enabled!(tracing::Level::INFO);
    let dopts = DoctorOptions { only: args.only.clone(), perturb, every_width: args.every_width };
    let mut io: Result<()> = Ok(());
    let report = doctor::run(&native, fallback.as_ref(), &dopts, &mut |r| {
        let mut w = || -> Result<()> {
            writeln!(out, "{}", check_line(r))?;
            if verbose {
                for c in &r.cases {
                    writeln!(out, "      {} {}: {}", if c.passed { "ok  " } else { "FAIL" }, c.what, c.detail)?;
                }
            }
            out.flush()?;
            Ok(())
        };
        if io.is_ok() {
            io = w();
        }
    });
    io?;
    if let Some(p) = &dopts.perturb {
        if !report.checks.iter().any(|c| c.name.to_ascii_lowercase().contains(&p.to_ascii_lowercase())) {
            eprintln!("kiln: KILN_DOCTOR_PERTURB={p} names no check that ran");
        }
    }
    if report.checks.is_empty() {
        return Err(KilnError::invalid("--only", format!("no check is named like {:?}", args.only)));
    }
    let path = args.output.clone().unwrap_or_else(|| PathBuf::from(doctor::default_file_name(&native)));
    write_report(&report, &path)?;
    writeln!(out, "{}", summary(&report))?;
    eprintln!("kiln: wrote {}", path.display());
    if !report.passed {
        let failed: Vec<String> = report.failed().map(|c| format!("{}: {}", c.caps, c.name)).collect();
        return Err(KilnError::ChecksFailed {
            count: failed.len(),
            adapter: native.describe(),
            failed: failed.join(", "),
            report: path,
        });
    }
    Ok(())
}

fn summary(r: &DoctorReport) -> String {
    let failed: Vec<String> = r.failed().map(|c| format!("{}: {}", c.caps, c.name)).collect();
    let failed =
        if failed.is_empty() { "0 failed".into() } else { format!("{} failed: {}", failed.len(), failed.join(", ")) };
    format!(
        "{} checks: {} passed, {failed}, {} skipped, in {:.1} s",
        r.checks.len(),
        r.count(Status::Pass),
        r.count(Status::Skip),
        r.secs
    )
}

fn write_report(r: &DoctorReport, path: &PathBuf) -> Result<()> {
    let json = serde_json::to_string_pretty(r).map_err(|e| KilnError::invalid("doctor report", e.to_string()))?;
    std::fs::write(path, json + "\n").map_err(|e| KilnError::File { path: path.clone(), message: e.to_string() })
}
