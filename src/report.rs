//! `kiln report`: merges `kiln bench -o json` files from several machines into one markdown
//! table and SVG charts (tokens/s per GPU and model; stacked per-stage time per token), with
//! `kiln doctor` reports beside them (which GPUs compute correctly, and what failed where).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::bench::{AdapterRecord, BenchRecord};
use crate::doctor::{DoctorReport, Status};
use crate::error::{KilnError, Result};

/// What `kiln report` merges: bench records and `kiln doctor` reports.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub bench: Vec<BenchRecord>,
    pub doctor: Vec<DoctorReport>,
}

/// Reads bench records (a JSON array as `kiln bench -o json` writes, one record, or one
/// record per line as `-o jsonl`) and `kiln doctor` reports.
pub fn load_inputs(paths: &[PathBuf]) -> Result<Inputs> {
    let mut out = Inputs::default();
    for p in paths {
        let text =
            std::fs::read_to_string(p).map_err(|e| KilnError::File { path: p.clone(), message: e.to_string() })?;
        let bad = |e: serde_json::Error| KilnError::File {
            path: p.clone(),
            message: format!(
                "not a kiln bench or doctor JSON file ({e}); write one with `kiln bench -o json` or `kiln doctor`"
            ),
        };
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) if v.is_array() => out.bench.extend(serde_json::from_value::<Vec<BenchRecord>>(v).map_err(bad)?),
            Ok(v) if v.get("kind").and_then(|k| k.as_str()) == Some(crate::doctor::REPORT_KIND) => {
                out.doctor.push(serde_json::from_value::<DoctorReport>(v).map_err(bad)?)
            }
            Ok(v) => out.bench.push(serde_json::from_value::<BenchRecord>(v).map_err(bad)?),
            // `kiln bench -o jsonl`: one record per line.
            Err(e) => {
                let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                if lines.len() < 2 {
                    return Err(bad(e));
                }
                for l in lines {
                    out.bench.push(serde_json::from_str::<BenchRecord>(l).map_err(bad)?);
                }
            }
        }
    }
    if out.bench.is_empty() && out.doctor.is_empty() {
        return Err(KilnError::invalid("report", "the files hold no benchmark records or doctor reports"));
    }
    Ok(out)
}

/// Reads bench records only (`load_inputs` without doctor reports).
pub fn load(paths: &[PathBuf]) -> Result<Vec<BenchRecord>> {
    let bench = load_inputs(paths)?.bench;
    if bench.is_empty() {
        return Err(KilnError::invalid("report", "the files hold no benchmark records"));
    }
    Ok(bench)
}

/// "NVIDIA H200 (Vulkan)"
fn gpu_label(r: &BenchRecord) -> String {
    adapter_label(&r.adapter)
}

fn adapter_label(a: &AdapterRecord) -> String {
    format!("{} ({})", a.name, a.backend)
}

/// "tinyllama-1.1b:q4_k_m" from "tinyllama-1.1b:q4_k_m (synthetic)".
fn model_label(r: &BenchRecord) -> String {
    r.model.synthetic.clone().unwrap_or_else(|| r.model.name.clone())
}

/// "1270.3 MiB (636.0 + 44.0 + 590.3)", or "-" for records from before kiln recorded it.
fn memory_label(r: &BenchRecord) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    match r.gpu_memory {
        Some(m) if m.f16_copies > 0 => format!(
            "{:.1} MiB ({:.1} + {:.1} + {:.1} + {:.1} f16 copies)",
            mib(m.total()),
            mib(m.weights),
            mib(m.kv_cache),
            mib(m.activations),
            mib(m.f16_copies)
        ),
        Some(m) => format!(
            "{:.1} MiB ({:.1} + {:.1} + {:.1})",
            mib(m.total()),
            mib(m.weights),
            mib(m.kv_cache),
            mib(m.activations)
        ),
        None => "-".into(),
    }
}

/// The merged tables, as markdown: bench results, then doctor reports.
pub fn markdown(inputs: &Inputs, charts: &[String]) -> String {
    if inputs.bench.is_empty() {
        return format!("# kiln doctor report\n{}", doctor_section(&inputs.doctor));
    }
    let mut o = String::from("# kiln benchmark report\n\n");
    o.push_str(&bench_section(&inputs.bench, charts));
    o.push_str(&doctor_section(&inputs.doctor));
    o
}

/// The bench table, stage tables and profiles, and the charts.
fn bench_section(records: &[BenchRecord], charts: &[String]) -> String {
    let mut rs: Vec<&BenchRecord> = records.iter().collect();
    rs.sort_by(|a, b| (model_label(a), &a.test, gpu_label(a)).cmp(&(model_label(b), &b.test, gpu_label(b))));
    let mut o = String::new();
    o.push_str(
        "| model | test | GPU | vendor | driver | t/s | GPU memory (weights + KV + activations) | kiln | date |\n",
    );
    o.push_str("| --- | ---: | --- | --- | --- | ---: | ---: | --- | --- |\n");
    for r in &rs {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} {} | {:.2} ± {:.2} | {} | {} ({}) | {} |\n",
            model_label(r),
            r.test,
            gpu_label(r),
            r.adapter.vendor,
            r.adapter.driver,
            r.adapter.driver_info,
            r.avg_ts,
            r.stddev_ts,
            memory_label(r),
            r.kiln_version,
            r.git_commit,
            r.date
        ));
    }
    // Per-stage time per token, where the records carry a profile.
    let profiled: Vec<&&BenchRecord> = rs.iter().filter(|r| r.profile.is_some()).collect();
    if !profiled.is_empty() {
        o.push_str("\n## Time per token by stage (µs)\n\n");
        let stages = stage_names(profiled.iter().map(|r| **r));
        o.push_str("| model | test | GPU |");
        for s in &stages {
            o.push_str(&format!(" {s} |"));
        }
        o.push_str(" total |\n| --- | ---: | --- |");
        o.push_str(&" ---: |".repeat(stages.len() + 1));
        o.push('\n');
        for r in profiled {
            let per = stage_us_per_token(r);
            o.push_str(&format!("| {} | {} | {} |", model_label(r), r.test, gpu_label(r)));
            for s in &stages {
                match per.get(s) {
                    Some(v) => o.push_str(&format!(" {v:.1} |")),
                    None => o.push_str(" - |"),
                }
            }
            o.push_str(&format!(" {:.1} |\n", per.values().sum::<f64>()));
        }
    }
    // Each profile in full, against the peaks measured on its machine.
    let full: Vec<&&BenchRecord> = rs.iter().filter(|r| r.profile.is_some()).collect();
    if !full.is_empty() {
        o.push_str("\n## Stage profiles\n");
        for r in full {
            if let Some(p) = &r.profile {
                if let Some(pk) = &r.peak {
                    o.push_str(&format!(
                        "\n{} peaks: read {:.1} GB/s, f32 FMA {:.1} GFLOP/s{}, dependent dispatch {:.2} µs ({:.2} µs with a timestamp)\n",
                        gpu_label(r),
                        pk.read_gbs,
                        pk.gflops,
                        if pk.mma_gflops > 0.0 {
                            format!(", f16 matrix multiply-add {:.1} GFLOP/s", pk.mma_gflops)
                        } else {
                            String::new()
                        },
                        pk.dispatch_us,
                        pk.timed_dispatch_us
                    ));
                }
                o.push_str(&p.table(&format!("{} {} on {}", model_label(r), r.test, gpu_label(r)), r.peak.as_ref()));
                if let Some(pts) = r.profiled_ts {
                    o.push_str(&format!(
                        "\nWith timestamps {pts:.2} t/s, without {:.2} t/s (the profile's times include the difference).\n",
                        r.avg_ts
                    ));
                }
            }
        }
    }
    if !charts.is_empty() {
        o.push('\n');
        for c in charts {
            o.push_str(&format!("![{c}]({c})\n"));
        }
    }
    o
}

/// One row per `kiln doctor` report (does kiln compute correctly on that GPU?), then every
/// failed check with its first wrong value.
pub fn doctor_section(reports: &[DoctorReport]) -> String {
    if reports.is_empty() {
        return String::new();
    }
    let mut o = String::from("\n## kiln doctor\n\n");
    o.push_str("| GPU | vendor | driver | features | result | checks | peaks: read GB/s, f32 GFLOP/s, dispatch µs | kiln | date |\n");
    o.push_str("| --- | --- | --- | --- | --- | ---: | --- | --- | --- |\n");
    for r in reports {
        let a = &r.adapter;
        let result = if r.passed { "pass".to_string() } else { format!("**{} failed**", r.count(Status::Fail)) };
        let peaks = r
            .peak
            .map(|p| format!("{:.1}, {:.1}, {:.2}", p.read_gbs, p.gflops, p.dispatch_us))
            .unwrap_or_else(|| "-".into());
        o.push_str(&format!(
            "| {} | {} | {} {} | {} | {result} | {} pass, {} skip | {peaks} | {} ({}) | {} |\n",
            adapter_label(a),
            a.vendor,
            a.driver,
            a.driver_info,
            a.features.join(", "),
            r.count(Status::Pass),
            r.count(Status::Skip),
            r.kiln_version,
            r.git_commit,
            r.date
        ));
    }
    let failed: Vec<(&DoctorReport, &crate::doctor::CheckRecord)> =
        reports.iter().flat_map(|r| r.failed().map(move |c| (r, c))).collect();
    if !failed.is_empty() {
        o.push_str("\n### Failed checks\n\n| GPU | check | kernels run | max abs error | first failure |\n| --- | --- | --- | ---: | --- |\n");
        for (r, c) in failed {
            let err = c.max_abs_err.map(|e| format!("{e:.2e}")).unwrap_or_else(|| "NaN".into());
            let detail = c.detail.replace('|', "\\|");
            o.push_str(&format!("| {} | {} | {} | {err} | {detail} |\n", adapter_label(&r.adapter), c.name, c.caps));
        }
    }
    o
}

/// Stage names in the order they first appear.
fn stage_names<'a>(rs: impl Iterator<Item = &'a BenchRecord>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in rs {
        for s in r.profile.iter().flat_map(|p| &p.stages) {
            if !names.contains(&s.stage) {
                names.push(s.stage.clone());
            }
        }
    }
    names.sort_by_key(|n| crate::profile::Stage::order_of(n));
    names
}

fn stage_us_per_token(r: &BenchRecord) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    if let Some(p) = &r.profile {
        let tokens = p.tokens.max(1) as f64;
        for s in &p.stages {
            m.insert(s.stage.clone(), s.total_ms * 1e3 / tokens);
        }
    }
    m
}

fn plot_err(e: impl std::fmt::Display) -> KilnError {
    KilnError::invalid("report", format!("cannot draw a chart: {e}"))
}

/// Grouped bars of tokens/s: one panel per test, bars per model grouped, a color per GPU.
pub fn chart_tokens_per_second(records: &[BenchRecord], path: &Path) -> Result<()> {
    let tests: Vec<String> = {
        let mut t: Vec<String> = records.iter().map(|r| r.test.clone()).collect();
        t.sort();
        t.dedup();
        t
    };
    let gpus: Vec<String> = {
        let mut g: Vec<String> = records.iter().map(gpu_label).collect();
        g.sort();
        g.dedup();
        g
    };
    let panel_h = 320u32;
    let root = SVGBackend::new(path, (960, panel_h * tests.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((tests.len(), 1));
    for (test, area) in tests.iter().zip(panels.iter()) {
        let rs: Vec<&BenchRecord> = records.iter().filter(|r| &r.test == test).collect();
        let mut models: Vec<String> = rs.iter().map(|r| model_label(r)).collect();
        models.sort();
        models.dedup();
        let slots = (models.len() * (gpus.len() + 1)) as u32;
        // A log scale: a CPU adapter and a datacenter GPU differ by a thousand times.
        let max = rs.iter().map(|r| r.avg_ts).fold(0.0, f64::max).max(1e-3) * 2.0;
        let min = rs.iter().map(|r| r.avg_ts).filter(|&v| v > 0.0).fold(f64::MAX, f64::min).min(max / 4.0) / 2.0;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{test}: tokens per second (log scale)"), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0u32..slots).into_segmented(), (min..max).log_scale())
            .map_err(plot_err)?;
        let group = gpus.len() + 1;
        let names = models.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots as usize)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if (*i as usize) % group == (gpus.len().saturating_sub(1)) / 2 => {
                    names.get(*i as usize / group).cloned().unwrap_or_default()
                }
                _ => String::new(),
            })
            .y_desc("t/s")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(plot_err)?;
        for (gi, gpu) in gpus.iter().enumerate() {
            let color = Palette99::pick(gi).to_rgba();
            let bars: Vec<Rectangle<(SegmentValue<u32>, f64)>> = rs
                .iter()
                .filter(|r| &gpu_label(r) == gpu)
                .filter_map(|r| {
                    let mi = models.iter().position(|m| *m == model_label(r))?;
                    let x = (mi * group + gi) as u32;
                    let mut bar = Rectangle::new(
                        [(SegmentValue::Exact(x), min), (SegmentValue::Exact(x + 1), r.avg_ts.max(min))],
                        color.filled(),
                    );
                    bar.set_margin(0, 0, 2, 2);
                    Some(bar)
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(plot_err)?
                .label(gpu.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Stacked bars of µs per token by stage, one bar per profiled (model, test); a panel per
/// GPU with its own scale, and one legend beside them.
pub fn chart_stages(records: &[BenchRecord], path: &Path) -> Result<bool> {
    let rs: Vec<&BenchRecord> = records.iter().filter(|r| r.profile.as_ref().is_some_and(|p| p.steps > 0)).collect();
    if rs.is_empty() {
        return Ok(false);
    }
    let stages = stage_names(rs.iter().copied());
    let mut gpus: Vec<String> = rs.iter().map(|r| gpu_label(r)).collect();
    gpus.sort();
    gpus.dedup();
    let panel_h = |n: usize| 90 + 45 * n as u32;
    let heights: Vec<u32> = gpus.iter().map(|g| panel_h(rs.iter().filter(|r| &gpu_label(r) == g).count())).collect();
    let total_h = heights.iter().sum::<u32>().max(60 + 22 * stages.len() as u32);
    let root = SVGBackend::new(path, (1200, total_h)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (plots, legend) = root.split_horizontally(960);
    let mut rest = plots;
    for (gpu, h) in gpus.iter().zip(&heights) {
        let (area, below) = rest.split_vertically(*h);
        rest = below;
        let mine: Vec<&BenchRecord> = rs.iter().copied().filter(|r| &gpu_label(r) == gpu).collect();
        let per: Vec<BTreeMap<String, f64>> = mine.iter().map(|r| stage_us_per_token(r)).collect();
        let max = per.iter().map(|m| m.values().sum::<f64>()).fold(0.0, f64::max).max(1e-9) * 1.05;
        let labels: Vec<String> = mine.iter().map(|r| format!("{} {}", model_label(r), r.test)).collect();
        let n = mine.len() as u32;
        let mut chart = ChartBuilder::on(&area)
            .caption(format!("{gpu}: GPU time per token by stage"), ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(35)
            .y_label_area_size(230)
            .build_cartesian_2d(0f64..max, (0u32..n).into_segmented())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n as usize)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc("µs per token")
            .draw()
            .map_err(plot_err)?;
        for (si, stage) in stages.iter().enumerate() {
            let color = Palette99::pick(si).to_rgba();
            let bars: Vec<Rectangle<(f64, SegmentValue<u32>)>> = per
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let v = *m.get(stage)?;
                    // Stages before this one, in execution order.
                    let start: f64 = stages[..si].iter().filter_map(|s| m.get(s)).sum();
                    let mut bar = Rectangle::new(
                        [(start, SegmentValue::Exact(i as u32)), (start + v, SegmentValue::Exact(i as u32 + 1))],
                        color.filled(),
                    );
                    bar.set_margin(5, 5, 0, 0);
                    Some(bar)
                })
                .collect();
            chart.draw_series(bars).map_err(plot_err)?;
        }
    }
    // The legend: one swatch per stage, in execution order.
    for (si, stage) in stages.iter().enumerate() {
        let color = Palette99::pick(si).to_rgba();
        let y = 40 + 22 * si as i32;
        legend.draw(&Rectangle::new([(10, y), (24, y + 14)], color.filled())).map_err(plot_err)?;
        legend.draw(&Text::new(stage.clone(), (32, y), ("sans-serif", 14))).map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(true)
}

/// Writes report.md and the charts (where there are bench records) into `dir`; returns the
/// markdown.
pub fn write_report(inputs: &Inputs, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir).map_err(|e| KilnError::File { path: dir.to_path_buf(), message: e.to_string() })?;
    let mut charts = Vec::new();
    let records = &inputs.bench;
    if !records.is_empty() {
        charts.push("tokens_per_second.svg".to_string());
        chart_tokens_per_second(records, &dir.join(&charts[0]))?;
        if chart_stages(records, &dir.join("stages_per_token.svg"))? {
            charts.push("stages_per_token.svg".into());
        }
    }
    let md = markdown(inputs, &charts);
    let path = dir.join("report.md");
    std::fs::write(&path, &md).map_err(|e| KilnError::File { path, message: e.to_string() })?;
    Ok(md)
}
