//! Figures and their printing: Mooncake's final line and report units (percentiles are
//! [`crate::latency`]'s).

/// Bytes per unit for `--report_unit` (bit units count bytes ×8).
pub fn unit_scale(unit: &str) -> Option<f64> {
    Some(match unit {
        "GB" => 1e9,
        "GiB" => (1u64 << 30) as f64,
        "Gb" => 1e9 / 8.0,
        "MB" => 1e6,
        "MiB" => (1u64 << 20) as f64,
        "Mb" => 1e6 / 8.0,
        "KB" => 1e3,
        "KiB" => 1024.0,
        "Kb" => 1e3 / 8.0,
        _ => return None,
    })
}

/// Mooncake's `Test completed: duration D, batch count N, throughput X GB/s` line.
pub fn completed_line(
    duration: f64,
    batches: u64,
    bytes_per_sec: f64,
    unit: &str,
    precision: usize,
) -> String {
    let rate = bytes_per_sec / unit_scale(unit).unwrap_or(1e9);
    format!(
        "Test completed: duration {duration:.2}, batch count {batches}, throughput {rate:.precision$} {unit}/s"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_matches_mooncake() {
        assert_eq!(
            completed_line(10.0, 1234, 3.2e9, "GB", 2),
            "Test completed: duration 10.00, batch count 1234, throughput 3.20 GB/s"
        );
        assert_eq!(
            completed_line(1.0, 1, 1e9, "Gb", 1),
            "Test completed: duration 1.00, batch count 1, throughput 8.0 Gb/s"
        );
    }
}
