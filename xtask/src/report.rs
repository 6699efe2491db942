//! The benchmark report: every figure a bench prints is also recorded here; `cargo xtask bench`
//! writes them as raw JSON, a Markdown table (with the machine it ran on) and SVG charts of
//! throughput against block size (te against each reference), and puts the table into the
//! README's Performance section.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One figure.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// The bench (`tcp`, `local`, ...).
    pub bench: &'static str,
    /// The row's name.
    pub case: String,
    /// For charts: the series (`write`) and the block size in bytes.
    pub series: Option<(String, u64)>,
    /// te's figure.
    pub te: f64,
    /// Its unit (`GB/s`, `us`, `slices/s`).
    pub unit: &'static str,
    /// The reference's name and figure, in the same unit, from the same run.
    pub reference: Option<(String, f64)>,
    /// The goal, as text.
    pub goal: Option<String>,
    /// Whether the goal was met.
    pub met: Option<bool>,
}

static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

/// Keeps a figure for the report.
pub(crate) fn record(r: Record) {
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).push(r);
}

fn records() -> Vec<Record> {
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The machine, in one line.
pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or("?".into(), |kb| format!("{} GiB", kb >> 20));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), {mem} memory, Linux {kernel}")
}

fn json(records: &[Record]) -> String {
    let rows: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            serde_json::json!({
                "bench": r.bench, "case": r.case,
                "series": r.series.as_ref().map(|s| s.0.clone()),
                "block_size": r.series.as_ref().map(|s| s.1),
                "te": r.te, "unit": r.unit,
                "reference": r.reference.as_ref().map(|x| x.0.clone()),
                "reference_value": r.reference.as_ref().map(|x| x.1),
                "ratio": r.reference.as_ref().map(|x| r.te / x.1),
                "goal": r.goal, "met": r.met,
            })
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({"machine": machine(), "records": rows}))
        .unwrap_or_default()
}

fn figure(v: f64, unit: &str) -> String {
    match unit {
        "slices/s" => format!("{:.2} M{unit}", v / 1e6),
        "us" => format!("{v:.1} {unit}"),
        "MB/s" => format!("{v:.1} {unit}"),
        _ => format!("{v:.2} {unit}"),
    }
}

/// The Markdown table, grouped by bench.
pub(crate) fn markdown(records: &[Record], charts: &[(String, String)]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "Measured on {}.", machine());
    let _ = writeln!(
        md,
        "Every te figure is next to its reference from the same run; throughput counts bytes whose task completed (the data is in the target's memory or file), including submit, slicing, transfer and completion; latencies are whole batches, from allocate to free.\n"
    );
    md.push_str("| bench | case | te | reference | ratio | goal | verdict |\n|---|---|---|---|---|---|---|\n");
    for r in records {
        let (reference, ratio) = match &r.reference {
            Some((name, v)) => (
                format!("{} {name}", figure(*v, r.unit)),
                format!("{:.0}%", r.te / v * 100.0),
            ),
            None => ("-".into(), "-".into()),
        };
        let verdict = match r.met {
            Some(true) => "met",
            Some(false) => "**below goal**",
            None => "info",
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {reference} | {ratio} | {} | {verdict} |",
            r.bench,
            r.case,
            figure(r.te, r.unit),
            r.goal.as_deref().unwrap_or("-"),
        );
    }
    for (title, file) in charts {
        let _ = writeln!(md, "\n![{title}]({file})");
    }
    md
}

/// A line chart (SVG) of `series`: (label, points (block bytes, value)), x on a log2 scale.
pub(crate) fn svg(title: &str, unit: &str, series: &[(String, Vec<(u64, f64)>)]) -> String {
    let (w, h, left, bottom, top, right) = (640.0, 360.0, 64.0, 40.0, 36.0, 170.0);
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(b, _)| (*b as f64).log2()))
        .collect();
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, v)| *v))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    let span = (xmax - xmin).max(1.0);
    let px = |x: f64| left + (x - xmin) / span * (w - left - right);
    let py = |y: f64| h - bottom - y / ymax * (h - bottom - top);
    let colours = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    ];
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{left}" y="20" font-size="14">{title}</text>"##
    );
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"##,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for i in 0..=4 {
        let v = ymax * f64::from(i) / 4.0;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{v:.2}</text><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#ddd"/>"##,
            left - 6.0,
            py(v) + 4.0,
            py(v),
            w - right,
            py(v)
        );
    }
    let mut ticks: Vec<u64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(b, _)| *b))
        .collect();
    ticks.sort_unstable();
    ticks.dedup();
    for b in ticks {
        let label = match b {
            b if b >= 1 << 20 => format!("{}M", b >> 20),
            b if b >= 1 << 10 => format!("{}K", b >> 10),
            b => format!("{b}"),
        };
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle">{label}</text>"##,
            px((b as f64).log2()),
            h - bottom + 16.0
        );
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">block size (bytes)</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">{unit}</text>"##,
        (left + w - right) / 2.0,
        h - 6.0,
        h / 2.0,
        h / 2.0
    );
    for (i, (label, points)) in series.iter().enumerate() {
        let c = colours[i % colours.len()];
        let mut pts: Vec<(f64, f64)> = points
            .iter()
            .map(|(b, v)| (px((*b as f64).log2()), py(*v)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let dash = if label.starts_with("te") {
            ""
        } else {
            r#" stroke-dasharray="5,4""#
        };
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{}"/>"##,
            path.join(" ")
        );
        for (x, y) in &pts {
            let _ = write!(s, r##"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{c}"/>"##);
        }
        let ly = top + 16.0 * i as f64;
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{}">{label}</text>"##,
            w - right + 10.0,
            w - right + 30.0,
            w - right + 36.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Charts of every bench with block-size series: te and its reference per series.
fn charts(records: &[Record]) -> Vec<(String, String, String)> {
    let mut benches: Vec<&str> = records.iter().map(|r| r.bench).collect();
    benches.dedup();
    let mut out = Vec::new();
    for bench in benches {
        let mut series: Vec<(String, Vec<(u64, f64)>)> = Vec::new();
        let mut unit = "";
        for r in records.iter().filter(|r| r.bench == bench) {
            let Some((name, block)) = &r.series else {
                continue;
            };
            unit = r.unit;
            let mut add = |label: String, v: f64| match series.iter_mut().find(|s| s.0 == label) {
                // One point per block: a te figure compared with two references is one point.
                Some(s) if s.1.iter().any(|p| p.0 == *block) => {}
                Some(s) => s.1.push((*block, v)),
                None => series.push((label, vec![(*block, v)])),
            };
            add(format!("te {name}"), r.te);
            if let Some((rname, v)) = &r.reference {
                add(format!("{rname} ({name})"), *v);
            }
        }
        if series.iter().any(|s| s.1.len() >= 2) {
            let title = format!("{bench}: throughput against block size");
            let file = format!("{bench}.svg");
            out.push((title.clone(), file, svg(&title, unit, &series)));
        }
    }
    out
}

/// Writes `report.json`, `report.md` and the charts into `dir`; returns the Markdown.
pub(crate) fn write(dir: &Path) -> Result<String, String> {
    let records = records();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let charts = charts(&records);
    for (_, file, svg) in &charts {
        std::fs::write(dir.join(file), svg).map_err(|e| e.to_string())?;
    }
    let links: Vec<(String, String)> = charts
        .iter()
        .map(|(t, f, _)| (t.clone(), f.clone()))
        .collect();
    let md = markdown(&records, &links);
    std::fs::write(dir.join("report.md"), &md).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("report.json"), json(&records)).map_err(|e| e.to_string())?;
    Ok(md)
}

/// Puts `md` into the README between the Performance markers, charts linked from `docs/bench`.
pub(crate) fn update_readme(readme: &Path, md: &str) -> Result<(), String> {
    const START: &str = "<!-- performance:start (written by cargo xtask bench) -->";
    const END: &str = "<!-- performance:end -->";
    let text = std::fs::read_to_string(readme).map_err(|e| e.to_string())?;
    let (Some(a), Some(b)) = (text.find(START), text.find(END)) else {
        return Err(format!("{}: no Performance markers", readme.display()));
    };
    let body = md.replace("](", "](docs/bench/");
    let new = format!("{}{START}\n{body}\n{}", &text[..a], &text[b..]);
    std::fs::write(readme, new).map_err(|e| e.to_string())
}

/// Where the report goes.
pub(crate) fn dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    PathBuf::from(target).join("bench-report")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_and_charts_come_from_the_records() {
        let r = |case: &str, block, te, reference| Record {
            bench: "tcp",
            case: case.into(),
            series: Some(("write".into(), block)),
            te,
            unit: "GB/s",
            reference: Some(("iperf3".into(), reference)),
            goal: Some(">= 60%".into()),
            met: Some(te / reference >= 0.6),
        };
        let records = vec![
            r("write 64 KiB", 65536, 1.5, 2.0),
            r("write 1 MiB", 1 << 20, 1.0, 2.0),
        ];
        let md = markdown(&records, &[]);
        assert!(
            md.contains(
                "| tcp | write 64 KiB | 1.50 GB/s | 2.00 GB/s iperf3 | 75% | >= 60% | met |"
            ),
            "{md}"
        );
        assert!(md.contains("**below goal**"));
        let c = charts(&records);
        assert_eq!(c.len(), 1);
        assert!(
            c[0].2.starts_with("<svg")
                && c[0].2.contains("te write")
                && c[0].2.contains("iperf3 (write)")
        );
        assert!(c[0].2.contains("64K") && c[0].2.contains("1M"));
    }
}
