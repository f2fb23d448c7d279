//! `kiln doctor`: does kiln compute correctly on this GPU? Every kernel variant the planner
//! picks on the adapter runs on small ragged shapes against its CPU reference, first with
//! every capability kiln uses there, then with the portable fallbacks forced
//! (`KILN_DISABLE=all`) for the kernels that change; greedy decoding of a tiny model must be
//! deterministic and agree with the fallbacks; and the probe measures the device's peaks.
//! The result is a report that `kiln report` merges beside bench results.
//!
//! The runners (`matmul`, `ops`), inputs (`data`) and comparisons (`compare`) are the test
//! suite's too; `checks` holds the doctor's own choice of cases.

pub mod checker;
pub mod checks;
pub mod compare;
pub mod data;
pub mod decode;
pub mod matmul;
pub mod ops;
pub mod variants;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bench::{utc_now, AdapterRecord};
use crate::config::Disabled;
use crate::error::Result;
use crate::gpu::{ContextOptions, GpuContext};
use crate::profile::Peak;

pub use checker::{CaseRecord, Checker};

/// What `kiln report` looks for to tell a doctor report from bench records.
pub const REPORT_KIND: &str = "kiln-doctor";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    /// Nothing to run on this adapter (the planner never picks the kernel here).
    Skip,
}

/// One check's result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckRecord {
    pub name: String,
    /// The kernels it ran: "native" (every capability kiln uses on the adapter), "fallback"
    /// (`KILN_DISABLE=all`), or both.
    pub caps: String,
    pub status: Status,
    /// Kernel variants run.
    pub kernels: u32,
    /// The largest error of its comparisons.
    pub max_abs_err: Option<f64>,
    /// The largest error as a share of its tolerance (1: at the limit).
    pub tolerance_used: Option<f64>,
    pub secs: f64,
    /// The first failure, why it was skipped, or what it measured.
    pub detail: String,
    pub cases: Vec<CaseRecord>,
}

/// Everything `kiln doctor` found on one adapter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DoctorReport {
    /// `REPORT_KIND`.
    pub kind: String,
    pub kiln_version: String,
    pub git_commit: String,
    pub date: String,
    /// The adapter, with the features kiln used on it.
    pub adapter: AdapterRecord,
    /// The features left with the fallbacks forced (None: no fallback pass, the adapter
    /// already runs the portable kernels).
    pub fallback_features: Option<Vec<String>>,
    pub passed: bool,
    pub checks: Vec<CheckRecord>,
    /// The probe's measurements (None without timestamp queries).
    pub peak: Option<Peak>,
    pub secs: f64,
    /// Set when a test made references wrong on purpose (`KILN_DOCTOR_PERTURB`).
    #[serde(default)]
    pub perturbed: Option<String>,
}

impl DoctorReport {
    pub fn failed(&self) -> impl Iterator<Item = &CheckRecord> {
        self.checks.iter().filter(|c| c.status == Status::Fail)
    }
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// Which checks to run, and how.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// Run only the checks whose name contains one of these (case-insensitive); all when empty.
    pub only: Vec<String>,
    /// Make the references of the checks whose name contains this wrong: a test that the
    /// doctor fails when a kernel disagrees with its reference.
    pub perturb: Option<String>,
    /// Every GEMV width with every weight format (by default each format runs one column,
    /// the most and one width between, and the formats together every width).
    pub every_width: bool,
}

fn contains(name: &str, pattern: &str) -> bool {
    name.to_ascii_lowercase().contains(&pattern.to_ascii_lowercase())
}

impl DoctorOptions {
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| contains(name, p))
    }
    fn perturbs(&self, name: &str) -> bool {
        self.perturb.as_deref().is_some_and(|p| contains(name, p))
    }
}

/// The same adapter as `native` with every fallback forced, where that changes what kiln
/// runs (None: it already runs the portable kernels).
pub fn open_fallback(native: &GpuContext, opts: &ContextOptions) -> Result<Option<Arc<GpuContext>>> {
    let c = &native.caps;
    if !(c.subgroups || c.f16 || c.coopmat || c.int8_dot) {
        return Ok(None);
    }
    let opts = ContextOptions {
        disable: Disabled::ALL,
        backend: Some(native.info.backend),
        gpu: opts.gpu.clone().or_else(|| Some(native.info.name.clone())),
        ..opts.clone()
    };
    GpuContext::new(&opts).map(Some)
}

/// The largest of a value over a check's cases (None where a failed case has none: NaN).
fn largest(cases: &[CaseRecord], f: fn(&CaseRecord) -> Option<f64>) -> Option<f64> {
    let mut m = None;
    for c in cases {
        match f(c) {
            Some(v) => m = Some(m.map_or(v, |x: f64| x.max(v))),
            None if !c.passed => return None,
            None => {}
        }
    }
    m
}

/// A check's comparisons as its record.
fn record(name: &str, caps: &str, ck: Checker, result: std::thread::Result<Result<()>>, secs: f64) -> CheckRecord {
    let failed = ck.cases.iter().find(|c| !c.passed);
    let error = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("error: {e}")),
        Err(panic) => Some(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    };
    let status = if error.is_some() || failed.is_some() || ck.cases.is_empty() { Status::Fail } else { Status::Pass };
    let detail = match (&error, failed) {
        (Some(e), _) => e.clone(),
        (None, Some(f)) => format!("{}: {}", f.what, f.detail),
        (None, None) if ck.cases.is_empty() => "nothing was compared".into(),
        (None, None) => String::new(),
    };
    CheckRecord {
        name: name.into(),
        caps: caps.into(),
        status,
        kernels: ck.kernels,
        max_abs_err: largest(&ck.cases, |c| c.max_abs_err),
        tolerance_used: largest(&ck.cases, |c| c.tolerance_used),
        secs,
        detail,
        cases: ck.cases,
    }
}

/// Runs `body` as one check (a panic in it fails the check, not the doctor).
fn run_check(
    name: &str,
    caps: &str,
    ctx: &GpuContext,
    opts: &DoctorOptions,
    body: impl FnOnce(&mut Checker) -> Result<()>,
) -> CheckRecord {
    let t = Instant::now();
    let mut ck = Checker::new(ctx, opts.perturbs(name));
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| body(&mut ck)));
    record(name, caps, ck, result, t.elapsed().as_secs_f64())
}

fn skipped(name: &str, caps: &str, why: String) -> CheckRecord {
    CheckRecord {
        name: name.into(),
        caps: caps.into(),
        status: Status::Skip,
        kernels: 0,
        max_abs_err: None,
        tolerance_used: None,
        secs: 0.0,
        detail: why,
        cases: Vec::new(),
    }
}

/// How many checks run at once. On a GPU most of a check's time is the driver compiling its
/// pipelines on the CPU (an H200 run spent 59 s of CPU in 60 s of wall time), one core per
/// check, so they run on several threads; CPU adapters run them one at a time, their
/// kernels already using every core.
fn parallelism(ctx: &GpuContext) -> usize {
    // KILN_DOCTOR_THREADS: this many instead (the tests run threads on CPU adapters too).
    if let Some(n) = std::env::var("KILN_DOCTOR_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        return n.max(1);
    }
    if ctx.caps.cpu_adapter {
        return 1;
    }
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 8)
}

/// Runs `work` on every job, `threads` at a time, starting those `first` says before the
/// others (the long ones: the run ends with a long job alone on one thread otherwise), and
/// hands the results to `report` in the jobs' order as soon as each one and those before it
/// are done.
fn run_parallel<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    first: impl Fn(&J) -> bool,
    work: impl Fn(&J) -> R + Sync,
    mut report: impl FnMut(R),
) {
    if threads <= 1 {
        jobs.iter().for_each(|j| report(work(j)));
        return;
    }
    let order: Vec<usize> =
        (0..jobs.len()).filter(|&i| first(&jobs[i])).chain((0..jobs.len()).filter(|&i| !first(&jobs[i]))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, R)>();
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len()) {
            let tx = tx.clone();
            let (next, work, order) = (&next, &work, &order);
            s.spawn(move || {
                while let Some(&i) = order.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    if tx.send((i, work(&jobs[i]))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut pending: std::collections::BTreeMap<usize, R> = std::collections::BTreeMap::new();
        let mut due = 0;
        for (i, r) in rx {
            pending.insert(i, r);
            while let Some(r) = pending.remove(&due) {
                report(r);
                due += 1;
            }
        }
    });
}

/// Runs every check on `native` (and `fallback`, the same adapter with every fallback forced),
/// handing each record to `on_check` as it finishes.
pub fn run(
    native: &Arc<GpuContext>,
    fallback: Option<&Arc<GpuContext>>,
    opts: &DoctorOptions,
    on_check: &mut dyn FnMut(&CheckRecord),
) -> DoctorReport {
    let t = Instant::now();
    let mut checks = Vec::new();
    let mut done = |r: CheckRecord, checks: &mut Vec<CheckRecord>| {
        on_check(&r);
        checks.push(r);
    };
    // Every check of both passes and the decoding check in one pool of threads, reported in
    // this order: the native pass, the fallback pass, then decoding.
    enum Job<'a> {
        Kernel(&'static str, &'a Arc<GpuContext>, checks::Check),
        Decoding(String),
    }
    let mut jobs: Vec<Job> = Vec::new();
    let passes = std::iter::once(("native", native)).chain(fallback.map(|f| ("fallback", f)));
    for (caps, ctx) in passes {
        jobs.extend(
            checks::kernel_checks(&ctx.caps, opts.every_width)
                .into_iter()
                .filter(|c| opts.wants(&c.name) && (caps == "native" || c.uses.differ(&native.caps, &ctx.caps)))
                .filter(|c| c.body.is_ok() || caps == "native")
                .map(|c| Job::Kernel(caps, ctx, c)),
        );
    }
    let name = format!("greedy decoding {}", decode::MODEL);
    if opts.wants(&name) {
        jobs.push(Job::Decoding(name));
    }
    let long = |j: &Job| match j {
        Job::Kernel(_, _, c) => c.name.starts_with("fused"),
        Job::Decoding(_) => true,
    };
    run_parallel(
        &jobs,
        parallelism(native),
        long,
        |j| match j {
            Job::Kernel(caps, ctx, c) => match &c.body {
                Ok(body) => run_check(&c.name, caps, ctx, opts, body),
                Err(why) => skipped(&c.name, caps, why.clone()),
            },
            Job::Decoding(name) => {
                let caps = if fallback.is_some() { "native, fallback" } else { "native" };
                run_check(name, caps, native, opts, |ck| decode::greedy_decoding(ck, native, fallback))
            }
        },
        |r| done(r, &mut checks),
    );
    let mut peak = None;
    if opts.wants("probe") {
        let r = probe(native, &mut peak);
        done(r, &mut checks);
    }
    let passed = !checks.iter().any(|c| c.status == Status::Fail);
    DoctorReport {
        kind: REPORT_KIND.into(),
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("KILN_GIT_COMMIT").into(),
        date: utc_now(),
        adapter: AdapterRecord::of(native),
        fallback_features: fallback.map(|f| AdapterRecord::of(f).features),
        passed,
        checks,
        peak,
        secs: t.elapsed().as_secs_f64(),
        perturbed: opts.perturb.clone(),
    }
}

/// The probe's peaks, as a record (measured, not compared).
fn probe(ctx: &GpuContext, peak: &mut Option<Peak>) -> CheckRecord {
    if !ctx.caps.timestamps {
        return skipped("probe", "native", "no timestamp queries on this adapter".into());
    }
    let t = Instant::now();
    let mut r = skipped("probe", "native", String::new());
    match std::panic::catch_unwind(AssertUnwindSafe(|| crate::kernels::probe::run(ctx))) {
        Ok(Ok(p)) => {
            *peak = Some(p.peak);
            r.status = Status::Pass;
            r.kernels = 3;
            r.detail = format!(
                "read {:.1} GB/s, f32 FMA {:.1} GFLOP/s, dependent dispatch {:.2} µs",
                p.peak.read_gbs, p.peak.gflops, p.peak.dispatch_us
            );
        }
        Ok(Err(e)) => (r.status, r.detail) = (Status::Fail, format!("error: {e}")),
        Err(_) => (r.status, r.detail) = (Status::Fail, "the probe panicked".into()),
    }
    r.secs = t.elapsed().as_secs_f64();
    r
}

/// The default report file: `kiln-doctor-<adapter>-<backend>.json`.
pub fn default_file_name(ctx: &GpuContext) -> String {
    let slug: String = format!("{}-{:?}", ctx.info.name, ctx.info.backend)
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let slug = slug.split('-').filter(|s| !s.is_empty()).collect::<Vec<_>>().join("-");
    format!("kiln-doctor-{slug}.json")
}

#[cfg(test)]
mod tests {
    use super::run_parallel;

    #[test]
    fn parallel_checks_report_every_result_in_order() {
        for threads in [1, 2, 5, 64] {
            let jobs: Vec<u64> = (0..40).collect();
            let mut got = Vec::new();
            run_parallel(
                &jobs,
                threads,
                |&j| j % 7 == 3,
                |&j| {
                    // Later jobs finish first, so order has to be restored.
                    std::thread::sleep(std::time::Duration::from_micros(40 * (40 - j)));
                    j * j
                },
                |r| got.push(r),
            );
            assert_eq!(got, jobs.iter().map(|j| j * j).collect::<Vec<_>>(), "{threads} threads");
        }
    }
}
