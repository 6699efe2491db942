//! [`MetricsSettings`]: what the variables of `settings.rs` ask for.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use te_sys::env::{Env, Setting};

use crate::MetricsError;
use crate::settings::{
    ENABLED, HTTP_HOST, HTTP_PORT, REPORT_INTERVAL, TE_METRIC, TE_METRIC_INTERVAL,
};

/// What the variables ask for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSettings {
    /// The HTTP endpoint's address, when it is asked for.
    pub http: Option<SocketAddr>,
    /// How often the summary is logged, when it is.
    pub report_every: Option<Duration>,
    /// The log line is the classic engine's (`MC_TE_METRIC`: throughput and latency
    /// distribution over the interval) rather than TENT's summary of totals.
    pub classic_report: bool,
}

fn refused(s: &Setting, e: te_sys::Error) -> MetricsError {
    MetricsError::Setting {
        name: s.name,
        value: String::new(),
        reason: e.to_string(),
    }
}

impl MetricsSettings {
    /// Whether requests are to be counted at all.
    pub fn counting(&self) -> bool {
        self.http.is_some() || self.report_every.is_some()
    }

    /// Reads the variables through `lookup`.
    ///
    /// # Errors
    /// [`MetricsError::Setting`] naming the first unusable value.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, MetricsError> {
        let env = Env::new(&lookup);
        let mut out = MetricsSettings::default();
        if env.flag(&ENABLED).map_err(|e| refused(&ENABLED, e))? == Some(true) {
            let host: IpAddr = match env.text(&HTTP_HOST) {
                Some(v) => v.trim().parse().map_err(|_| MetricsError::Setting {
                    name: HTTP_HOST.name,
                    value: v.clone(),
                    reason: "not an IP address".into(),
                })?,
                None => IpAddr::V4(Ipv4Addr::LOCALHOST),
            };
            let port = env
                .number_or_initial(&HTTP_PORT)
                .map_err(|e| refused(&HTTP_PORT, e))?;
            out.http = Some(SocketAddr::new(host, port));
            let every = env
                .number_or_initial(&REPORT_INTERVAL)
                .map_err(|e| refused(&REPORT_INTERVAL, e))?;
            out.report_every = (every > 0).then(|| Duration::from_secs(every));
        }
        if env.flag(&TE_METRIC).map_err(|e| refused(&TE_METRIC, e))? == Some(true) {
            let every = env
                .number_or_initial(&TE_METRIC_INTERVAL)
                .map_err(|e| refused(&TE_METRIC_INTERVAL, e))?;
            out.report_every = Some(Duration::from_secs(every));
            out.classic_report = true;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<MetricsSettings, MetricsError> {
        MetricsSettings::from_lookup(te_sys::env::table(pairs))
    }

    #[test]
    fn off_unless_asked_and_loopback_unless_told() {
        assert!(!read(&[]).unwrap().counting());
        assert!(
            !read(&[("TENT_METRICS_HTTP_PORT", "9200")])
                .unwrap()
                .counting()
        );
        let on = read(&[("TENT_METRICS_ENABLED", "true")]).unwrap();
        assert_eq!(on.http, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(on.report_every, Some(Duration::from_secs(30)));
        let told = read(&[
            ("TENT_METRICS_ENABLED", "1"),
            ("TENT_METRICS_HTTP_HOST", "0.0.0.0"),
            ("TENT_METRICS_HTTP_PORT", "0"),
            ("TENT_METRICS_REPORT_INTERVAL", "0"),
        ])
        .unwrap();
        assert_eq!(told.http, Some("0.0.0.0:0".parse().unwrap()));
        assert_eq!(told.report_every, None);
        let classic = read(&[
            ("MC_TE_METRIC", "1"),
            ("MC_TE_METRIC_INTERVAL_SECONDS", "2"),
        ])
        .unwrap();
        assert_eq!(
            (classic.http, classic.report_every),
            (None, Some(Duration::from_secs(2)))
        );
    }

    #[test]
    fn a_value_it_cannot_honour_is_an_error_naming_it() {
        for (name, value) in [
            ("TENT_METRICS_ENABLED", "maybe"),
            ("TENT_METRICS_HTTP_HOST", "localhost:80"),
            ("TENT_METRICS_HTTP_PORT", "70000"),
            ("TENT_METRICS_REPORT_INTERVAL", "-1"),
            ("MC_TE_METRIC_INTERVAL_SECONDS", "0"),
        ] {
            let mut pairs = vec![("TENT_METRICS_ENABLED", "1"), ("MC_TE_METRIC", "1")];
            pairs.retain(|(n, _)| *n != name);
            pairs.push((name, value));
            let e = read(&pairs).unwrap_err().to_string();
            assert!(e.contains(name), "{name}={value}: {e}");
        }
    }
}
