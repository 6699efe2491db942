//! A [`Snapshot`] in the forms operators read: Prometheus text (through the `prometheus`
//! crate's encoder; TENT's series names, te's own as `te_*`), JSON (`/metrics/json`) and
//! TENT's one-line summary (`/metrics/summary`, the periodic log). Pure: no I/O.

use crate::counters::{HistogramSnapshot, Operation, Series, Snapshot};
use prometheus::proto::{self, MetricFamily, MetricType};

/// One member of a family: its labels and its value.
enum Value<'a> {
    Count(u64),
    Gauge(f64),
    Buckets(&'a HistogramSnapshot),
    /// A histogram of microseconds shown in seconds (te's own series use base units).
    Seconds(&'a HistogramSnapshot),
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
        Value::Gauge(v) => {
            let mut g = proto::Gauge::default();
            g.set_value(v);
            m.set_gauge(g);
        }
        Value::Buckets(h) | Value::Seconds(h) => {
            let per = match value {
                Value::Seconds(_) => 1e6,
                _ => 1.0,
            };
            let mut out = proto::Histogram::default();
            out.set_sample_count(h.count());
            out.set_sample_sum(h.sum as f64 / per);
            out.set_bucket(
                (h.bounds.iter().zip(&h.cumulative))
                    .map(|(bound, at)| {
                        let mut b = proto::Bucket::default();
                        b.set_upper_bound(*bound as f64 / per);
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
                .filter(|x| x.requests > 0)
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
    let attempt_counters: [Counted; 2] = [
        (
            "attempts",
            "physical transport attempts ended (a failed-over request makes one per transport)",
            |x| x.attempts,
        ),
        (
            "attempt_failures",
            "physical transport attempts that failed",
            |x| x.attempt_failures,
        ),
    ];
    let transport_op = |x: &Series| {
        [
            ("transport", x.transport.name()),
            ("operation", x.op.name()),
        ]
    };
    for (what, help, value) in attempt_counters {
        let members = (s.series.iter())
            .filter(|x| x.attempts > 0)
            .map(|x| member(&transport_op(x), Value::Count(value(x))))
            .collect();
        family(
            &mut out,
            format!("tent_transport_{what}_total"),
            help.into(),
            MetricType::COUNTER,
            members,
        );
    }
    let attempt_latency = (s.series.iter())
        .filter(|x| x.attempts > 0)
        .map(|x| member(&transport_op(x), Value::Buckets(&x.attempt_latency_us)))
        .collect();
    family(
        &mut out,
        "tent_transport_attempt_latency_us".into(),
        "latency of each physical transport attempt, microseconds".into(),
        MetricType::HISTOGRAM,
        attempt_latency,
    );
    let stages = [
        ("queue_wait", "queue wait"),
        ("dispatch", "dispatch"),
        ("transport", "transport execution"),
    ];
    for (at, (name, help)) in stages.into_iter().enumerate() {
        let by_transport = per_transport(&s.series, |x| &x.stages[at]);
        let members = (by_transport.iter())
            .map(|(t, h)| member(&[("transport", t.name())], Value::Buckets(h)))
            .collect();
        family(
            &mut out,
            format!("tent_stage_{name}_us"),
            format!("causal chain of completed requests: {help} latency, microseconds"),
            MetricType::HISTOGRAM,
            members,
        );
    }
    let infeasible = (s.deadline_infeasible.iter())
        .map(|(t, n)| member(&[("transport", t.name())], Value::Count(*n)))
        .collect();
    family(
        &mut out,
        "tent_deadline_infeasible_total".into(),
        "requests submitted with their deadline already past".into(),
        MetricType::COUNTER,
        infeasible,
    );
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
    let open = (s.connections.iter())
        .map(|c| member(&[("protocol", c.protocol)], Value::Gauge(c.open as f64)))
        .collect();
    family(
        &mut out,
        "te_connections".into(),
        "connections te's servers of this process hold, by protocol (te-control, te-tcp-data, te-tcp-mooncake, te-metrics)".into(),
        MetricType::GAUGE,
        open,
    );
    let refused = (s.connections.iter())
        .map(|c| member(&[("protocol", c.protocol)], Value::Count(c.refused)))
        .collect();
    family(
        &mut out,
        "te_connections_refused_total".into(),
        "connections turned away over a cap (all connections, or one address's), by protocol"
            .into(),
        MetricType::COUNTER,
        refused,
    );
    family(
        &mut out,
        "te_batches_allocated".into(),
        "batches allocated and not freed yet, in the engines counted".into(),
        MetricType::GAUGE,
        vec![member(&[], Value::Gauge(s.batches as f64))],
    );
    let tasks = match s.task_latency_us.count() {
        0 => Vec::new(),
        _ => vec![member(&[], Value::Seconds(&s.task_latency_us))],
    };
    family(
        &mut out,
        "te_task_latency_seconds".into(),
        "latency of every completed request over the classic engine's buckets (MC_TE_METRIC's), seconds".into(),
        MetricType::HISTOGRAM,
        tasks,
    );
    out
}

/// One histogram per transport: its operations' summed, those with no observation left out.
fn per_transport(
    series: &[Series],
    histogram: impl Fn(&Series) -> &HistogramSnapshot,
) -> Vec<(crate::counters::TransportLabel, HistogramSnapshot)> {
    let mut out: Vec<(crate::counters::TransportLabel, HistogramSnapshot)> = Vec::new();
    for x in series.iter().filter(|x| histogram(x).count() > 0) {
        match out.iter_mut().find(|(t, _)| *t == x.transport) {
            Some((_, h)) => h.add(histogram(x)),
            None => out.push((x.transport, histogram(x).clone())),
        }
    }
    out
}

/// Families built one by one, for a server with series of its own (te-metadata's), shown in
/// Prometheus's text format through the same encoder.
#[derive(Default)]
pub struct Exposition(Vec<MetricFamily>);

impl Exposition {
    /// A counter family: one member per (labels, value); none shown when there is none.
    pub fn counter(&mut self, name: &str, help: &str, members: &[(&[(&str, &str)], u64)]) {
        let members = (members.iter())
            .map(|(labels, n)| member(labels, Value::Count(*n)))
            .collect();
        family(
            &mut self.0,
            name.into(),
            help.into(),
            MetricType::COUNTER,
            members,
        );
    }

    /// A gauge of one value.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        let mut m = proto::Metric::default();
        let mut g = proto::Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
        family(
            &mut self.0,
            name.into(),
            help.into(),
            MetricType::GAUGE,
            vec![m],
        );
    }

    /// A histogram of microseconds, shown in seconds; none shown before its first value.
    pub fn histogram_seconds(&mut self, name: &str, help: &str, h: &HistogramSnapshot) {
        let members = match h.count() {
            0 => Vec::new(),
            _ => vec![member(&[], Value::Seconds(h))],
        };
        family(
            &mut self.0,
            name.into(),
            help.into(),
            MetricType::HISTOGRAM,
            members,
        );
    }

    /// The families in Prometheus's text format (0.0.4).
    pub fn text(&self) -> String {
        // Well formed by construction: the encoder has nothing to refuse.
        prometheus::TextEncoder::new()
            .encode_to_string(&self.0)
            .unwrap_or_default()
    }
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
                "attempts": x.attempts,
                "attempt_failures": x.attempt_failures,
                "attempt_latency_us": histogram(&x.attempt_latency_us),
                "stage_queue_wait_us": histogram(&x.stages[0]),
                "stage_dispatch_us": histogram(&x.stages[1]),
                "stage_transport_us": histogram(&x.stages[2]),
            })
        })
        .collect();
    out.insert("series".into(), series.into());
    let failovers: Vec<serde_json::Value> = (snapshot.failovers.iter())
        .map(|(from, to, n)| serde_json::json!({"from": from.name(), "to": to.name(), "count": n}))
        .collect();
    out.insert("failovers".into(), failovers.into());
    let infeasible: serde_json::Map<String, serde_json::Value> =
        (snapshot.deadline_infeasible.iter())
            .map(|(t, n)| (t.name().to_string(), (*n).into()))
            .collect();
    out.insert("deadline_infeasible".into(), infeasible.into());
    out.insert("rail_pauses".into(), snapshot.rail_pauses.into());
    out.insert("batches_allocated".into(), snapshot.batches.into());
    let connections: Vec<serde_json::Value> = (snapshot.connections.iter())
        .map(|c| serde_json::json!({"protocol": c.protocol, "open": c.open, "refused": c.refused}))
        .collect();
    out.insert("connections".into(), connections.into());
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

/// The classic engine's periodic line (Mooncake's `MC_TE_METRIC` report): throughput over the
/// last `interval_secs` from the `bytes` moved in it, and the share of the requests ended in it
/// per latency bucket (`latency`: that interval's counts); none when nothing happened.
pub fn classic_report(
    interval_secs: u64,
    bytes: u64,
    latency: &HistogramSnapshot,
) -> Option<String> {
    let count = latency.count();
    if bytes == 0 && count == 0 {
        return None;
    }
    let mut line = format!("[Metrics] Transfer Engine Stats (over last {interval_secs}s):");
    if bytes > 0 {
        let mb_s = bytes as f64 / (interval_secs.max(1) as f64 * 1024.0 * 1024.0);
        line += &format!(" Throughput: {mb_s:.2} MB/s");
    }
    if count == 0 {
        return Some(line);
    }
    line += &format!(" | Latency Distribution (count={count}): ");
    let mut below = 0;
    let mut parts = Vec::new();
    for (i, at) in latency.cumulative.iter().enumerate() {
        let n = at - below;
        below = *at;
        let share = n as f64 * 100.0 / count as f64;
        if n == 0 || share < 0.1 {
            continue;
        }
        let range = match latency.bounds.get(i) {
            Some(upper) => {
                let lower = i.checked_sub(1).map_or(0, |j| latency.bounds[j]);
                format!("{lower}-{upper}μs")
            }
            None => format!(">{}μs", latency.bounds.last().copied().unwrap_or(0)),
        };
        parts.push(format!("{range}:{share:.1}%"));
    }
    Some(line + &parts.join(", "))
}

#[cfg(test)]
mod tests;
