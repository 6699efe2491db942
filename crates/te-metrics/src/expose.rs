//! A [`Snapshot`] in the forms operators read: Prometheus text (through the `prometheus`
//! crate's encoder; TENT's series names, te's own as `te_*`), JSON (`/metrics/json`) and
//! TENT's one-line summary (`/metrics/summary`, the periodic log). Pure: no I/O.

use crate::counters::{HistogramSnapshot, Operation, Series, Snapshot};
use prometheus::proto::{self, MetricFamily, MetricType};

/// One member of a family: its labels and its value.
enum Value<'a> {
    Count(u64),
    Buckets(&'a HistogramSnapshot),
}

fn member(labels: &[(&str, &str)], value: Value<'_>) -> proto::Metric {
    let mut m = proto::Metric::default();
    m.set_label(
        labels
            .iter()
            .map(|(k, v)| {
                let mut l = proto::LabelPair::default();
                l.set_name((*k).to_string());
                l.set_value((*v).to_string());
                l
            })
            .collect(),
    );
    match value {
        Value::Count(n) => {
            let mut c = proto::Counter::default();
            c.set_value(n as f64);
            m.set_counter(c);
        }
        Value::Buckets(h) => {
            let mut out = proto::Histogram::default();
            out.set_sample_count(h.count());
            out.set_sample_sum(h.sum as f64);
            out.set_bucket(
                (h.bounds.iter().zip(&h.cumulative))
                    .map(|(bound, at)| {
                        let mut b = proto::Bucket::default();
                        b.set_upper_bound(*bound as f64);
                        b.set_cumulative_count(*at);
                        b
                    })
                    .collect(),
            );
            m.set_histogram(out);
        }
    }
    m
}

/// The family `name` with `help`, or none when it has no member (as TENT leaves series out
/// until they are observed).
fn family(
    out: &mut Vec<MetricFamily>,
    name: String,
    help: String,
    kind: MetricType,
    members: Vec<proto::Metric>,
) {
    if members.is_empty() {
        return;
    }
    let mut f = MetricFamily::default();
    f.set_name(name);
    f.set_help(help);
    f.set_field_type(kind);
    f.set_metric(members);
    out.push(f);
}

fn by_op(series: &[Series], op: Operation) -> impl Iterator<Item = &Series> {
    series.iter().filter(move |s| s.op == op)
}

/// A counter of each series: its name's middle word, its help, and how it is read.
type Counted = (&'static str, &'static str, fn(&Series) -> u64);
/// A histogram of each series: its name's tail, its help, and which one it is.
type Measured = (
    &'static str,
    &'static str,
    fn(&Series) -> &HistogramSnapshot,
);

/// The snapshot's metric families: TENT's names, labels and meanings, then te's own.
fn families(s: &Snapshot) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    let transport = |x: &Series| [("transport", x.transport.name())];
    for op in Operation::ALL {
        let n = op.name();
        let counters: [Counted; 3] = [
            ("bytes", "bytes of completed requests", |x| x.bytes),
            (
                "requests",
                "requests ended, completed or failed, by their final transport",
                |x| x.requests,
            ),
            (
                "failures",
                "failed requests (no bytes counted)",
                Series::failed,
            ),
        ];
        for (what, help, value) in counters {
            let members = by_op(&s.series, op)
                .map(|x| member(&transport(x), Value::Count(value(x))))
                .collect();
            family(
                &mut out,
                format!("tent_{n}_{what}_total"),
                format!("{n} {help}"),
                MetricType::COUNTER,
                members,
            );
        }
        let histograms: [Measured; 2] = [
            (
                "latency_us",
                "latency of completed requests, microseconds",
                |x| &x.latency_us,
            ),
            ("size_bytes", "size of completed requests, bytes", |x| {
                &x.size
            }),
        ];
        for (what, help, histogram) in histograms {
            let members = by_op(&s.series, op)
                .filter(|x| histogram(x).count() > 0)
                .map(|x| member(&transport(x), Value::Buckets(histogram(x))))
                .collect();
            family(
                &mut out,
                format!("tent_{n}_{what}"),
                format!("{n} {help}"),
                MetricType::HISTOGRAM,
                members,
            );
        }
    }
    let failovers = (s.failovers.iter())
        .map(|(from, to, n)| {
            member(
                &[("from", from.name()), ("to", to.name())],
                Value::Count(*n),
            )
        })
        .collect();
    family(
        &mut out,
        "tent_transport_failover_total".into(),
        "requests moved from one transport to another".into(),
        MetricType::COUNTER,
        failovers,
    );
    let kinds = (s.series.iter())
        .flat_map(|x| {
            x.failures.iter().map(move |(kind, n)| {
                let labels = [
                    ("transport", x.transport.name()),
                    ("operation", x.op.name()),
                    ("kind", kind.name()),
                ];
                member(&labels, Value::Count(*n))
            })
        })
        .collect();
    family(
        &mut out,
        "te_request_failures_total".into(),
        "failed requests by transport, operation and kind (refused, path, timeout, canceled, other)".into(),
        MetricType::COUNTER,
        kinds,
    );
    let retries = (s.series.iter())
        .filter(|x| x.retries > 0)
        .map(|x| {
            let labels = [
                ("transport", x.transport.name()),
                ("operation", x.op.name()),
            ];
            member(&labels, Value::Count(x.retries))
        })
        .collect();
    family(
        &mut out,
        "te_slice_retries_total".into(),
        "slices posted again after a path failure (on their next rail)".into(),
        MetricType::COUNTER,
        retries,
    );
    let pauses = match s.rail_pauses {
        0 => Vec::new(),
        n => vec![member(&[], Value::Count(n))],
    };
    family(
        &mut out,
        "te_rail_pauses_total".into(),
        "rails paused after repeated errors".into(),
        MetricType::COUNTER,
        pauses,
    );
    out
}

/// The snapshot in Prometheus's text format (0.0.4).
pub fn prometheus_text(snapshot: &Snapshot) -> String {
    // The families are well formed by construction: the encoder has nothing to refuse.
    prometheus::TextEncoder::new()
        .encode_to_string(&families(snapshot))
        .unwrap_or_default()
}

/// The snapshot as JSON: TENT's totals by name, then every series.
pub fn json(snapshot: &Snapshot) -> serde_json::Value {
    let total =
        |op: Operation, f: fn(&Series) -> u64| -> u64 { by_op(&snapshot.series, op).map(f).sum() };
    let mut out = serde_json::Map::new();
    for op in Operation::ALL {
        let n = op.name();
        out.insert(
            format!("tent_{n}_bytes_total"),
            total(op, |x| x.bytes).into(),
        );
        out.insert(
            format!("tent_{n}_requests_total"),
            total(op, |x| x.requests).into(),
        );
        out.insert(
            format!("tent_{n}_failures_total"),
            total(op, Series::failed).into(),
        );
    }
    let histogram = |h: &HistogramSnapshot| serde_json::json!({"bounds": h.bounds, "cumulative": h.cumulative, "sum": h.sum, "count": h.count()});
    let series: Vec<serde_json::Value> = (snapshot.series.iter())
        .map(|x| {
            let failures: serde_json::Map<String, serde_json::Value> = x
                .failures
                .iter()
                .map(|(k, n)| (k.name().to_string(), (*n).into()))
                .collect();
            serde_json::json!({
                "transport": x.transport.name(),
                "operation": x.op.name(),
                "requests": x.requests,
                "bytes": x.bytes,
                "failures": failures,
                "retries": x.retries,
                "latency_us": histogram(&x.latency_us),
                "size_bytes": histogram(&x.size),
            })
        })
        .collect();
    out.insert("series".into(), series.into());
    let failovers: Vec<serde_json::Value> = (snapshot.failovers.iter())
        .map(|(from, to, n)| serde_json::json!({"from": from.name(), "to": to.name(), "count": n}))
        .collect();
    out.insert("failovers".into(), failovers.into());
    out.insert("rail_pauses".into(), snapshot.rail_pauses.into());
    serde_json::Value::Object(out)
}

/// `bytes` as TENT's summary writes them (`1.00 MB`).
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// TENT's one-line summary: `Read: 1.00 MB (100 reqs, 2 fails) | Write: …`.
pub fn summary(snapshot: &Snapshot) -> String {
    let part = |op: Operation, label: &str| {
        let of = by_op(&snapshot.series, op);
        let (bytes, reqs, fails) = of.fold((0, 0, 0), |(b, r, f), x| {
            (b + x.bytes, r + x.requests, f + x.failed())
        });
        format!("{label}: {} ({reqs} reqs, {fails} fails)", size(bytes))
    };
    format!(
        "{} | {}",
        part(Operation::Read, "Read"),
        part(Operation::Write, "Write")
    )
}

#[cfg(test)]
mod tests;
