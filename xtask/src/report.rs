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
    /// Mooncake's own figure for the same case and flags in the same run
    /// (`transfer_engine_bench` from its PyPI wheel), where the wheel has the case.
    pub mooncake: Option<f64>,
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

/// Whether this run recorded a row of `bench`.
pub(crate) fn has_rows(bench: &str) -> bool {
    let rows = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    rows.iter().any(|r| r.bench == bench)
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
                "mooncake": r.mooncake,
                "te_over_mooncake": r.mooncake.map(|m| r.te / m),
                "goal": r.goal, "met": r.met,
            })
        })
        .collect();
    serde_json::to_string_pretty(
        &serde_json::json!({"machine": machine(), "records": rows, "notes": notes()}),
    )
    .unwrap_or_default()
}

/// Loads the records and notes of an earlier run's `report.json` (to draw its report again).
pub(crate) fn load(path: &Path) -> Result<(), String> {
    let (rows, texts) = read(path)?;
    rows.into_iter().for_each(record);
    texts.into_iter().for_each(note);
    Ok(())
}

/// The records and notes of the `report.json` at `path`.
fn read(path: &Path) -> Result<(Vec<Record>, Vec<String>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let text_of =
        |r: &serde_json::Value, k: &str| r.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let num = |r: &serde_json::Value, k: &str| r.get(k).and_then(serde_json::Value::as_f64);
    let mut rows = Vec::new();
    for r in v["records"].as_array().ok_or("report.json: no records")? {
        let series = match (
            text_of(r, "series"),
            r.get("block_size").and_then(|b| b.as_u64()),
        ) {
            (Some(name), Some(block)) => Some((name, block)),
            _ => None,
        };
        rows.push(Record {
            bench: leak(&text_of(r, "bench").ok_or("report.json: a record has no bench")?),
            case: text_of(r, "case").unwrap_or_default(),
            series,
            te: num(r, "te").ok_or("report.json: a record has no te figure")?,
            unit: leak(&text_of(r, "unit").unwrap_or_default()),
            reference: text_of(r, "reference").zip(num(r, "reference_value")),
            mooncake: num(r, "mooncake"),
            goal: text_of(r, "goal"),
            met: r.get("met").and_then(serde_json::Value::as_bool),
        });
    }
    let texts = v["notes"].as_array().into_iter().flatten();
    let texts = texts
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    Ok((rows, texts))
}

/// The published report's records and notes (`docs/bench/report.json`) with those of the
/// benches `rerun` replaced by this run's, each bench's rows where its old rows were (a bench
/// new to the report at the end); a note belongs to the bench it starts with (`tcp: ...`).
pub(crate) fn merge_into_published(published: &Path, rerun: &[&str]) -> Result<(), String> {
    let (old_rows, old_notes) = read(published)?;
    let mut rows = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    *rows = merged(old_rows, std::mem::take(&mut *rows), rerun);
    let mut notes = NOTES.lock().unwrap_or_else(|e| e.into_inner());
    *notes = merged_notes(old_notes, std::mem::take(&mut *notes), rerun);
    Ok(())
}

/// The note that names the benches whose rows are newer than the last full run's.
const RERUN_ALONE: &str = "rows newer than the rest (re-run alone by `cargo xtask bench update`): ";

/// `old` notes without those of the benches in `rerun`, then `fresh` (this run's), then which
/// benches were re-run alone (these and the ones an earlier update named).
fn merged_notes(old: Vec<String>, fresh: Vec<String>, rerun: &[&str]) -> Vec<String> {
    let of_rerun = |n: &String| rerun.iter().any(|b| n.starts_with(&format!("{b}:")));
    let mut alone: Vec<String> = old
        .iter()
        .filter_map(|n| n.strip_prefix(RERUN_ALONE))
        .flat_map(|list| list.trim_end_matches('.').split(", "))
        .filter(|b| !rerun.contains(b))
        .map(str::to_string)
        .collect();
    alone.extend(rerun.iter().map(|b| b.to_string()));
    let kept = old
        .into_iter()
        .filter(|n| !of_rerun(n) && !n.starts_with(RERUN_ALONE));
    let said = format!("{RERUN_ALONE}{}.", alone.join(", "));
    kept.chain(fresh).chain([said]).collect()
}

/// `old` with the rows of each bench in `rerun` replaced by `fresh`'s rows of that bench.
fn merged(old: Vec<Record>, fresh: Vec<Record>, rerun: &[&str]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut placed: Vec<&str> = Vec::new();
    for r in old {
        if !rerun.contains(&r.bench) {
            out.push(r);
        } else if !placed.contains(&r.bench) {
            placed.push(r.bench);
            out.extend(fresh.iter().filter(|f| f.bench == r.bench).cloned());
        }
    }
    let new_benches = fresh.iter().filter(|f| !placed.contains(&f.bench));
    out.extend(new_benches.cloned());
    out
}

fn figure(v: f64, unit: &str) -> String {
    match unit {
        "slices/s" => format!("{:.2} M{unit}", v / 1e6),
        "us" => format!("{v:.1} {unit}"),
        "switches" => format!("{v:.0} {unit}"),
        "MB/s" => format!("{v:.1} {unit}"),
        _ => format!("{v:.2} {unit}"),
    }
}

/// Notes the report carries (a reference that could not run, and why).
static NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps a note for the report (printed under the table).
pub(crate) fn note(text: String) {
    NOTES.lock().unwrap_or_else(|e| e.into_inner()).push(text);
}

fn notes() -> Vec<String> {
    NOTES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The Markdown table, grouped by bench.
pub(crate) fn markdown(
    records: &[Record],
    charts: &[(String, String)],
    notes: &[String],
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "Measured on {}.", machine());
    let _ = writeln!(
        md,
        "Every te figure is next to its reference from the same run; throughput counts bytes whose task completed (the data is in the target's memory or file), including submit, slicing, transfer and completion; latencies are whole batches, from allocate to free. The Mooncake column is Mooncake's own `transfer_engine_bench` (its PyPI wheel, classic engine) on the same flags in the same run, wherever the wheel has the case.\n"
    );
    table(&mut md, records.iter());
    for n in notes {
        let _ = writeln!(md, "\nNote: {n}");
    }
    for (title, file) in charts {
        let _ = writeln!(md, "\n![{title}]({file})");
    }
    md
}

/// The cases the README shows (bench, case), in this order; the rest are in
/// docs/benchmarks.md.
const HEADLINES: [(&str, &str); 6] = [
    ("tcp", "write 1 MiB, batch 128"),
    ("tcp", "read 1 MiB, batch 128"),
    ("tcp", "write 4 KiB, batch 128"),
    ("tcp", "read 4 KiB, batch 128"),
    ("local", "shm write 4 MiB x16"),
    ("rdma", "WRITE 64 KiB, Soft-RoCE in qemu"),
];

/// The README's few rows: [`HEADLINES`] among `records`, and where the rest are.
pub(crate) fn headline(records: &[Record]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Measured on {}, each te figure next to its reference from the same run.\n",
        machine()
    );
    let rows = HEADLINES.iter().filter_map(|(bench, case)| {
        records
            .iter()
            .find(|r| r.bench == *bench && r.case == *case)
    });
    table(&mut md, rows);
    let _ = writeln!(
        md,
        "\nEvery case, its reference, goal and chart: [docs/benchmarks.md](docs/benchmarks.md#the-last-report)."
    );
    md
}

/// The report's table of `records`.
fn table<'a>(md: &mut String, records: impl Iterator<Item = &'a Record>) {
    md.push_str("| bench | case | te | reference | ratio | Mooncake | te / Mooncake | goal | verdict |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in records {
        let (reference, ratio) = match &r.reference {
            Some((name, v)) => (
                format!("{} {name}", figure(*v, r.unit)),
                format!("{:.0}%", r.te / v * 100.0),
            ),
            None => ("-".into(), "-".into()),
        };
        let (mooncake, versus) = match r.mooncake {
            Some(m) => (figure(m, r.unit), format!("{:.2}×", r.te / m)),
            None => ("-".into(), "-".into()),
        };
        let verdict = match r.met {
            Some(true) => "met",
            Some(false) => "**below goal**",
            None => "info",
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {reference} | {ratio} | {mooncake} | {versus} | {} | {verdict} |",
            r.bench,
            r.case,
            figure(r.te, r.unit),
            r.goal.as_deref().unwrap_or("-"),
        );
    }
}

/// Font size of every label in the charts.
const FONT: f64 = 12.0;

/// A generous width of `text` at `size` px in a sans-serif font (wider than any common
/// glyph run), so text laid out by it never leaves the picture.
pub(crate) fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.62
}

/// A line chart (SVG) answering one question: te against one reference, at each block size.
/// `series`: (label, points (block bytes, value)), x on a log2 scale. Every label is inside the
/// picture: the legend sits under the axis, in as many rows as its entries need, and the
/// canvas widens for a long title.
pub(crate) fn svg(title: &str, unit: &str, series: &[(String, Vec<(u64, f64)>)]) -> String {
    let (left, right, top, axis_gap) = (72.0, 24.0, 40.0, 48.0);
    let w = 720f64.max(text_width(title, 14.0) + 2.0 * 12.0);
    let plot_h = 260.0;
    // Legend entries: a line sample (30 px), a gap, the label; rows wrap at the plot width.
    let mut rows: Vec<Vec<(usize, f64)>> = vec![Vec::new()];
    let mut row_w = 0.0;
    for (i, (label, _)) in series.iter().enumerate() {
        let item = 36.0 + text_width(label, FONT) + 18.0;
        if row_w + item > w - left - right && !rows.last().is_some_and(Vec::is_empty) {
            rows.push(Vec::new());
            row_w = 0.0;
        }
        rows.last_mut().expect("a row").push((i, left + row_w));
        row_w += item;
    }
    let bottom = axis_gap + 20.0 * rows.len() as f64 + 12.0;
    let h = top + plot_h + bottom;
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
    // Points keep 16 px from the plot's sides, so end labels stay centred under them.
    let px = |x: f64| left + 16.0 + (x - xmin) / span * (w - left - right - 32.0);
    let axis_y = top + plot_h;
    let py = |y: f64| axis_y - y / ymax * plot_h;
    let colours = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
        "#7f7f7f", "#bcbd22",
    ];
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="{FONT}"><rect width="100%" height="100%" fill="white"/><text x="12" y="24" font-size="14">{}</text>"##,
        escape(title)
    );
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}" stroke="black"/>"##,
        w - right,
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
            b if b >= 1 << 30 => format!("{}G", b >> 30),
            b if b >= 1 << 20 => format!("{}M", b >> 20),
            b if b >= 1 << 10 => format!("{}K", b >> 10),
            b => format!("{b}"),
        };
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle">{label}</text>"##,
            px((b as f64).log2()),
            axis_y + 16.0
        );
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">block size (bytes)</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"##,
        (left + w - right) / 2.0,
        axis_y + 34.0,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        escape(unit)
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
    }
    for (row, entries) in rows.iter().enumerate() {
        let ly = axis_y + axis_gap + 20.0 * row as f64;
        for &(i, x) in entries {
            let c = colours[i % colours.len()];
            let dash = if series[i].0.starts_with("te") {
                ""
            } else {
                r#" stroke-dasharray="5,4""#
            };
            let _ = write!(
                s,
                r##"<line x1="{x}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"##,
                x + 30.0,
                x + 36.0,
                ly + 4.0,
                escape(&series[i].0)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One chart per bench and reference with block-size series: te's line and the reference's
/// for each series (operation), so each chart answers one question. Mooncake's figures are a
/// reference of their own.
fn charts(records: &[Record]) -> Vec<(String, String, String)> {
    let mut questions: Vec<(&str, String)> = Vec::new();
    for r in records.iter().filter(|r| r.series.is_some()) {
        let mut names: Vec<String> = r.reference.iter().map(|x| x.0.clone()).collect();
        if r.mooncake.is_some() {
            names.push(MOONCAKE.to_string());
        }
        for name in names {
            if !questions.iter().any(|(b, n)| *b == r.bench && *n == name) {
                questions.push((r.bench, name));
            }
        }
    }
    let mut out = Vec::new();
    for (bench, reference) in questions {
        let mut series: Vec<(String, Vec<(u64, f64)>)> = Vec::new();
        let mut unit = "";
        for r in records.iter().filter(|r| r.bench == bench) {
            let Some((name, block)) = &r.series else {
                continue;
            };
            let theirs = match (&r.reference, r.mooncake) {
                _ if reference == MOONCAKE => r.mooncake,
                (Some((n, v)), _) if *n == reference => Some(*v),
                _ => None,
            };
            let Some(theirs) = theirs else {
                continue;
            };
            unit = r.unit;
            let mut add = |label: String, v: f64| match series.iter_mut().find(|s| s.0 == label) {
                Some(s) if s.1.iter().any(|p| p.0 == *block) => {}
                Some(s) => s.1.push((*block, v)),
                None => series.push((label, vec![(*block, v)])),
            };
            add(format!("te {name}"), r.te);
            add(format!("{reference} {name}"), theirs);
        }
        // A reference measured once for the whole bench (iperf3's stream: one figure for
        // every case) is one line, not one per operation drawn on top of each other.
        let theirs: Vec<usize> = (0..series.len())
            .filter(|&i| !series[i].0.starts_with("te "))
            .collect();
        let mut values = theirs.iter().flat_map(|&i| series[i].1.iter().map(|p| p.1));
        let first = values.next();
        let same = first.is_some_and(|f| values.all(|v| v == f));
        if theirs.len() > 1 && same {
            let mut points: Vec<(u64, f64)> = theirs
                .iter()
                .flat_map(|&i| series[i].1.iter().copied())
                .collect();
            points.sort_by_key(|p| p.0);
            points.dedup_by_key(|p| p.0);
            for &i in theirs[1..].iter().rev() {
                series.remove(i);
            }
            series[theirs[0]] = (reference.clone(), points);
        }
        if series.iter().any(|s| s.1.len() >= 2) {
            let title = format!("{bench}: te against {reference}, by block size");
            let slug: String = reference
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_lowercase()
                    } else {
                        '-'
                    }
                })
                .collect();
            // One dash for each run of other characters: "iperf3 1 stream (reno)" is
            // iperf3-1-stream-reno.
            let slug = slug
                .split('-')
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join("-");
            let file = format!("{bench}-{slug}.svg");
            out.push((title.clone(), file, svg(&title, unit, &series)));
        }
    }
    out
}

/// The reference name Mooncake's figures chart under.
pub(crate) const MOONCAKE: &str = "Mooncake";

/// Removes the charts (`*.svg`) in `dir`, so a chart no longer drawn does not linger.
///
/// # Errors
/// `dir` cannot be listed.
pub(crate) fn remove_charts(dir: &Path) -> Result<(), String> {
    for old in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        if old.path().extension().is_some_and(|x| x == "svg") {
            let _ = std::fs::remove_file(old.path());
        }
    }
    Ok(())
}

/// Writes `report.json`, `report.md` and the charts into `dir`; returns the Markdown and the
/// README's headline of it.
pub(crate) fn write(dir: &Path) -> Result<(String, String), String> {
    let records = records();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Charts of an earlier run whose names changed would be published with this run's.
    remove_charts(dir)?;
    let charts = charts(&records);
    for (_, file, svg) in &charts {
        std::fs::write(dir.join(file), svg).map_err(|e| e.to_string())?;
    }
    let links: Vec<(String, String)> = charts
        .iter()
        .map(|(t, f, _)| (t.clone(), f.clone()))
        .collect();
    let md = markdown(&records, &links, &notes());
    std::fs::write(dir.join("report.md"), &md).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("report.json"), json(&records)).map_err(|e| e.to_string())?;
    Ok((md, headline(&records)))
}

/// Puts `headline` into the README's Performance section and the whole report `md` into
/// docs/benchmarks.md's, its charts linked from `docs/bench`.
pub(crate) fn publish_docs(
    readme: &Path,
    benchmarks: &Path,
    md: &str,
    headline: &str,
) -> Result<(), String> {
    const END: &str = "<!-- performance:end -->";
    const README: &str = "<!-- performance:start (written by cargo xtask bench) -->";
    const REPORT: &str = "<!-- report:start (written by cargo xtask bench) -->";
    replace_between(readme, README, END, headline)?;
    replace_between(benchmarks, REPORT, END, &md.replace("](", "](bench/"))
}

/// Replaces what lies between `start` and `end` in the file at `path` with `body`.
fn replace_between(path: &Path, start: &str, end: &str, body: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (Some(a), Some(b)) = (text.find(start), text.find(end)) else {
        return Err(format!("{}: no {start} ... {end} markers", path.display()));
    };
    let new = format!("{}{start}\n{body}\n{}", &text[..a], &text[b..]);
    std::fs::write(path, new).map_err(|e| e.to_string())
}

/// Where the report goes.
pub(crate) fn dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    PathBuf::from(target).join("bench-report")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bench: &'static str, case: &str) -> Record {
        Record {
            bench,
            case: case.into(),
            series: None,
            te: 1.0,
            unit: "GB/s",
            reference: None,
            mooncake: None,
            goal: None,
            met: None,
        }
    }

    #[test]
    fn figures_survive_a_round_trip_through_report_json() {
        // serde_json's default reader gave this back one unit off (2.095, which a redraw
        // printed as 2.10 instead of 2.09); xtask reads floats exactly (float_roundtrip).
        let v = 2.0949999999999998_f64;
        let back: f64 = serde_json::from_str(&serde_json::json!(v).to_string()).unwrap();
        assert_eq!(back.to_bits(), v.to_bits());
    }

    #[test]
    fn a_rerun_benchs_notes_replace_its_old_ones_and_the_update_is_said() {
        let old = vec!["tcp: old".to_string(), "local: kept".to_string()];
        let first = merged_notes(old, vec!["tcp: new".into()], &["tcp"]);
        assert_eq!(
            first,
            ["local: kept", "tcp: new", &format!("{RERUN_ALONE}tcp.")]
        );
        let second = merged_notes(first, vec![], &["local", "tcp"]);
        assert_eq!(second, [format!("{RERUN_ALONE}local, tcp.")]);
        let third = merged_notes(second, vec![], &["capi"]);
        assert_eq!(third, [format!("{RERUN_ALONE}local, tcp, capi.")]);
    }

    #[test]
    fn a_rerun_bench_replaces_its_rows_in_place_and_leaves_the_others() {
        let old = vec![
            row("engine", "e"),
            row("tcp", "old 1"),
            row("tcp", "old 2"),
            row("local", "l"),
            row("capi", "gone"),
        ];
        let fresh = vec![row("capi", "c"), row("tcp", "new"), row("tent", "t")];
        let cases: Vec<String> = merged(old, fresh, &["tcp", "capi", "tent"])
            .into_iter()
            .map(|r| format!("{}/{}", r.bench, r.case))
            .collect();
        assert_eq!(
            cases,
            ["engine/e", "tcp/new", "local/l", "capi/c", "tent/t"],
            "tcp's two old rows became its one new row where they were; tent, new, goes last"
        );
    }

    fn attr(tag: &str, name: &str) -> Option<String> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[at..].split('"').next()?.to_string())
    }

    /// Every `<text>` of `svg` as (x0, y0, x1, y1) by the same generous width estimate, and
    /// the canvas size.
    fn text_boxes(svg: &str) -> (f64, f64, Vec<(String, [f64; 4])>) {
        let head = &svg[..svg.find('>').unwrap()];
        let num = |t: &str, n: &str| attr(t, n).unwrap().parse::<f64>().unwrap();
        let (w, h) = (num(head, "width"), num(head, "height"));
        let mut boxes = Vec::new();
        for part in svg.split("<text").skip(1) {
            let (tag, rest) = part.split_once('>').unwrap();
            let text = rest.split("</text>").next().unwrap();
            let text = text
                .replace("&amp;", "&")
                .replace("&lt;", "<")
                .replace("&gt;", ">");
            let size = attr(tag, "font-size").map_or(FONT, |v| v.parse().unwrap());
            let (x, y) = (num(tag, "x"), num(tag, "y"));
            let width = text_width(&text, size);
            let (x0, x1) = match attr(tag, "text-anchor").as_deref() {
                Some("end") => (x - width, x),
                Some("middle") => (x - width / 2.0, x + width / 2.0),
                _ => (x, x + width),
            };
            let b = match attr(tag, "transform") {
                // rotate(-90 cx cy): the run goes up the page, centred on y.
                Some(t) if t.starts_with("rotate(-90") => [
                    x - size,
                    y - (x1 - x0) / 2.0,
                    x + 0.3 * size,
                    y + (x1 - x0) / 2.0,
                ],
                _ => [x0, y - size, x1, y + 0.3 * size],
            };
            boxes.push((text, b));
        }
        (w, h, boxes)
    }

    fn assert_fits(svg: &str) {
        let (w, h, boxes) = text_boxes(svg);
        assert!(!boxes.is_empty());
        for (text, [x0, y0, x1, y1]) in boxes {
            assert!(
                x0 >= 0.0 && y0 >= 0.0 && x1 <= w && y1 <= h,
                "{text:?} at ({x0:.0},{y0:.0})-({x1:.0},{y1:.0}) leaves the {w}x{h} canvas"
            );
        }
    }

    fn record(case: &str, series: &str, block: u64, te: f64, reference: f64) -> Record {
        Record {
            bench: "tcp",
            case: case.into(),
            series: Some((series.into(), block)),
            te,
            unit: "GB/s",
            reference: Some(("iperf3 (reno)".into(), reference)),
            mooncake: Some(te / 3.0),
            goal: Some(">= 60%".into()),
            met: Some(te / reference >= 0.6),
        }
    }

    #[test]
    fn tables_and_charts_come_from_the_records() {
        let records = vec![
            record("write 64 KiB", "write", 65536, 1.5, 2.0),
            record("write 1 MiB", "write", 1 << 20, 1.0, 2.0),
            record("read 64 KiB", "read", 65536, 1.2, 2.0),
        ];
        let md = markdown(&records, &[], &["the wheel is missing".into()]);
        assert!(
            md.contains(
                "| tcp | write 64 KiB | 1.50 GB/s | 2.00 GB/s iperf3 (reno) | 75% | 0.50 GB/s | 3.00× | >= 60% | met |"
            ),
            "{md}"
        );
        assert!(md.contains("**below goal**"));
        assert!(md.contains("Note: the wheel is missing"));
        // The README's headline: only the headline cases, and where the rest are.
        let headline_case = record("write 1 MiB, batch 128", "write", 1 << 20, 4.0, 4.5);
        let with = [records.clone(), vec![headline_case]].concat();
        let h = headline(&with);
        assert!(
            h.contains("| tcp | write 1 MiB, batch 128 | 4.00 GB/s"),
            "{h}"
        );
        assert!(!h.contains("write 64 KiB") && !h.contains("Note:"), "{h}");
        assert!(h.contains("(docs/benchmarks.md#the-last-report)"), "{h}");
        let c = charts(&records);
        // One question per chart: te against iperf3, te against Mooncake.
        assert_eq!(
            c.len(),
            2,
            "{:?}",
            c.iter().map(|x| &x.0).collect::<Vec<_>>()
        );
        // The file is named for the reference, one dash between words.
        assert_eq!(c[0].1, "tcp-iperf3-reno.svg");
        // iperf3's figure is the same for every case: one line, named for itself.
        assert!(c[0].2.contains("te write") && c[0].2.contains(">iperf3 (reno)<"));
        assert!(!c[0].2.contains("Mooncake write"));
        assert_eq!(c[1].1, "tcp-mooncake.svg");
        assert!(c[1].2.contains("Mooncake write") && !c[1].2.contains("iperf3"));
        assert!(c[0].2.contains("64K") && c[0].2.contains("1M"));
        for (_, _, svg) in &c {
            assert_fits(svg);
        }
    }

    #[test]
    fn every_label_fits_the_canvas_however_long_or_many() {
        let long = "a reference with a rather long name, and more words (write, gaps)";
        let series: Vec<(String, Vec<(u64, f64)>)> = (0..9)
            .map(|i| {
                let label = match i % 3 {
                    0 => format!("te write {i}"),
                    1 => format!("{long} {i}"),
                    _ => format!("x{i}"),
                };
                (label, vec![(4096, 0.5 * f64::from(i)), (1 << 30, 123.456)])
            })
            .collect();
        let title = "a title that goes on for a long while, longer than the usual canvas is wide, on purpose";
        let svg = svg(title, "GB/s & more", &series);
        assert_fits(&svg);
        // The checker catches text that leaves the canvas.
        let outside = svg.replace("<text x=\"12\" y=\"24\"", "<text x=\"-40\" y=\"24\"");
        let (w, h, boxes) = text_boxes(&outside);
        assert!(
            boxes
                .iter()
                .any(|(_, b)| b[0] < 0.0 || b[2] > w || b[3] > h)
        );
    }
}
