//! Every key Mooncake's TENT reads from its configuration (and te's own), what te does with it,
//! and the check of a parsed file against them: a value of the wrong type or out of range is
//! refused naming its key; a key TENT reads that te has no use for is reported (the caller
//! warns once); a key neither reads is reported too (a typo, or a newer TENT's key). Pure: no
//! I/O, no logging.

use std::collections::BTreeMap;

use serde_json::Value;

/// What a key's value must be.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Bool,
    /// An integer in `min..=max`.
    Int(i64, i64),
    /// A port: an integer, or a string of digits (TENT reads both), in 0..=65535.
    Port,
    Str,
    StrList,
    /// An object of scalars (`env`).
    Map,
    /// Policy rules: an array of objects, each checked against [`RULE_KEYS`].
    Rules,
    /// Anything (a subtree te does not read).
    Any,
}

/// What te does with a key.
#[derive(Clone, Copy, Debug)]
enum Use {
    /// te reads it from the file (its field of [`super::TentFile`]).
    Read,
    /// te reads it as the classic variable it maps onto.
    Env(&'static str),
    /// te reads it as `MC_SLICE_TIMEOUT`: nanoseconds, rounded up to seconds.
    NanosAsSeconds(&'static str),
    /// TENT reads it; te has no use for it, for this reason.
    Ignored(&'static str),
}

use Kind::*;
use Use::*;

const NIC_SCHEDULER: &str =
    "TENT's NIC scheduler tunable; te spreads slices over rails by their health";
const VERBS_DEFAULT: &str = "te's RDMA transport keeps its own value for this verbs attribute";
const NO_TRANSPORT: &str = "te has no such transport";
const MAX: i64 = i64::MAX;

/// Every key of the file, by its path.
#[rustfmt::skip]
const KEYS: &[(&str, Kind, Use)] = &[
    ("local_segment_name", Str, Read),
    ("metadata_type", Str, Read),
    ("metadata_servers", Str, Read),
    ("rpc_server_hostname", Str, Read),
    ("rpc_server_port", Port, Read),
    ("rpc_server_threads", Int(1, 1024), Ignored("te's control server sizes its own threads (MC_TE_CONTROL_THREADS)")),
    ("log_level", Str, Env("MC_LOG_LEVEL")),
    ("verbose", Bool, Ignored("te's verbosity is log_level (MC_LOG_LEVEL)")),
    ("max_failover_attempts", Int(0, 16), Read),
    ("enable_auto_failover_on_poll", Bool, Read),
    ("enable_auto_failover", Bool, Read),
    ("enable_progress_worker", Bool, Ignored("te's TENT runtime always runs one progress thread")),
    ("enable_runtime_queue", Bool, Ignored("te's runtime queue is always on; max_inflight_tasks bounds it")),
    ("runtime_queue", Any, Ignored("te's runtime queue has no tunables but max_inflight_tasks")),
    ("use_legacy_transport_selection", Bool, Ignored("te has one selector: policy rules, then capability order")),
    ("qos", Any, Ignored("te has no QoS classes")),
    ("merge_requests", Bool, Env("MC_TE_MERGE_REQUESTS")),
    ("max_inflight_tasks", Int(1, 1 << 24), Read),
    ("metrics.enabled", Bool, Read),
    ("metrics.http_port", Port, Read),
    ("metrics.http_host", Str, Read),
    ("metrics.http_server_threads", Int(1, 1024), Ignored("te's metrics endpoint answers on one thread (a scrape every few seconds needs no more)")),
    ("metrics.report_interval_seconds", Int(0, 86_400), Read),
    ("topology.rdma_whitelist", StrList, Read),
    ("topology.rdma_blacklist", StrList, Env("MC_TE_FILTERS_EXCLUDE")),
    ("topology.custom_json_path", Str, Env("MC_CUSTOM_TOPO_JSON")),
    ("topology.priority_matrix", Any, Ignored("give te a topology file with topology.custom_json_path")),
    ("policy", Rules, Read),
    ("staging.enable", Bool, Read),
    ("staging.chunk_size", Int(4096, 1 << 30), Read),
    ("env", Map, Read),
    // RDMA.
    ("transports.rdma.enable", Bool, Read),
    ("transports.rdma.devices", StrList, Read),
    ("transports.rdma.num_lanes", Int(1, 255), Read),
    ("transports.rdma.max_timeout_ns", Int(1, MAX), NanosAsSeconds("MC_SLICE_TIMEOUT")),
    ("transports.rdma.shared_quota_shm_path", Str, Ignored("te shares no NIC quota between processes")),
    ("transports.rdma.bind_address", Str, Ignored("te binds to its segment's address (MC_TCP_BIND_ADDRESS)")),
    ("transports.rdma.pci_relaxed_ordering", Any, Ignored("te's RDMA transport asks for relaxed ordering wherever the device has it")),
    ("transports.rdma.disable_gpu_direct_rdma", Bool, Ignored("te's RDMA transport registers host memory only")),
    ("transports.rdma.log_slice_affinity", Bool, Ignored("te logs by MC_LOG_LEVEL")),
    ("transports.rdma.bandwidth_learning_rate", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.deadline_bw_arbitration", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.default_bandwidth_gbps", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.enable_priority_filtering", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.enable_smart_scheduling", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.ewma_max_bandwidth_multiplier", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.ewma_min_bandwidth_multiplier", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.gdr_cooldown_secs", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.gdr_error_threshold", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.local_rotation_interval_us", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.max_bandwidth_gbps", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.min_bandwidth_gbps", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.numa_penalties", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.priority_promotion_per_entry", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.priority_promotion_timeout_us", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.score_epsilon", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.score_jitter_range", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.slot_rotation_interval_ms", Any, Ignored(NIC_SCHEDULER)),
    ("transports.rdma.device.port", Int(1, 255), Env("MC_IB_PORT")),
    ("transports.rdma.device.gid_index", Int(0, 255), Env("MC_GID_INDEX")),
    ("transports.rdma.device.num_cq_list", Int(1, 256), Env("MC_NUM_CQ_PER_CTX")),
    ("transports.rdma.device.num_comp_channels", Int(1, 1024), Ignored("te's RDMA workers poll their own completion queues")),
    ("transports.rdma.device.max_cqe", Int(1, MAX), Ignored("te sizes completion queues from endpoint.max_qp_wr")),
    ("transports.rdma.endpoint.endpoint_store_cap", Int(1, 65535), Env("MC_MAX_EP_PER_CTX")),
    ("transports.rdma.endpoint.qp_mul_factor", Int(1, 255), Env("MC_NUM_QP_PER_EP")),
    ("transports.rdma.endpoint.max_qp_wr", Int(1, 65536), Env("MC_MAX_WR")),
    ("transports.rdma.endpoint.path_mtu", Int(256, 4096), Env("MC_MTU")),
    ("transports.rdma.endpoint.traffic_class", Int(0, 255), Env("MC_IB_TC")),
    ("transports.rdma.endpoint.service_level", Int(0, 15), Env("MC_IB_SL")),
    ("transports.rdma.endpoint.send_timeout", Int(1, 31), Env("MC_IB_TIMEOUT")),
    ("transports.rdma.endpoint.max_sge", Int(1, 1024), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.max_inline_bytes", Int(0, MAX), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.pkey_index", Int(0, 65535), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.hop_limit", Int(0, 255), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.flow_label", Int(0, MAX), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.src_path_bits", Int(0, 255), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.static_rate", Int(0, 255), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.rq_psn", Int(0, MAX), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.sq_psn", Int(0, MAX), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.max_dest_rd_atomic", Int(0, 255), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.max_rd_atomic", Int(0, 255), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.min_rnr_timer", Int(0, 31), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.send_retry_count", Int(0, 7), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.send_rnr_count", Int(0, 7), Ignored(VERBS_DEFAULT)),
    ("transports.rdma.endpoint.qp_pools", Any, Ignored("te has one pool of queue pairs per endpoint")),
    ("transports.rdma.workers.num_workers", Int(1, 8), Env("MC_WORKERS_PER_CTX")),
    ("transports.rdma.workers.block_size", Int(4096, 1 << 30), Env("MC_SLICE_SIZE")),
    ("transports.rdma.workers.max_retry_count", Int(1, 127), Env("MC_RETRY_CNT")),
    ("transports.rdma.workers.grace_period_ns", Int(0, MAX), Ignored("te's workers sleep on their completion channel")),
    ("transports.rdma.workers.rail_topo_path", Str, Ignored("te reads NIC placement from its topology (topology.custom_json_path)")),
    // TCP.
    ("transports.tcp.enable", Bool, Read),
    ("transports.tcp.max_retry_count", Int(0, MAX), Ignored("te retries slices on every transport by MC_RETRY_CNT")),
    ("transports.tcp.retry_base_delay_ms", Int(0, MAX), Ignored("te retries a failed slice on another rail at once")),
    ("transports.tcp.retry_max_delay_ms", Int(0, MAX), Ignored("te retries a failed slice on another rail at once")),
    ("transports.tcp.max_concurrent_tasks", Int(1, MAX), Ignored("te's TCP lanes carry any number of tasks (MC_TCP_LANES_PER_PEER)")),
    // Shared memory, files, GPUs.
    ("transports.shm.enable", Bool, Read),
    ("transports.shm.cxl_mount_path", Str, Read),
    ("transports.io_uring.enable", Bool, Read),
    ("transports.uring.enable", Bool, Read),
    ("transports.gds.enable", Bool, Ignored("te's TENT runtime runs no gds transport")),
    ("transports.gds.io_batch_depth", Int(1, MAX), Ignored("te's TENT runtime runs no gds transport")),
    ("transports.nvlink.enable", Bool, Read),
    ("transports.nvlink.async_memcpy_threshold", Int(0, MAX), Ignored("te-nvlink copies on its own stream")),
    ("transports.nvlink.handle_type", Any, Ignored("te-nvlink picks IPC or fabric handles (MC_FORCE_MNNVL)")),
    ("transports.nvlink.host_register", Any, Ignored("te-nvlink does not register host memory with CUDA")),
    ("transports.mnnvl.enable", Bool, Read),
    ("transports.ub", Any, Ignored(NO_TRANSPORT)),
    ("transports.ascend_direct", Any, Ignored(NO_TRANSPORT)),
    ("transports.mpcomm", Any, Ignored(NO_TRANSPORT)),
    ("transports.sunrise_link", Any, Ignored(NO_TRANSPORT)),
    ("transports.tpu", Any, Ignored(NO_TRANSPORT)),
];

/// The keys of one policy rule.
#[rustfmt::skip]
const RULE_KEYS: &[(&str, Kind, Use)] = &[
    ("name", Str, Read),
    ("segment_type", Str, Read),
    ("same_machine", Bool, Read),
    ("local_memory", Str, Read),
    ("remote_memory", Str, Read),
    ("min_size", Int(0, MAX), Read),
    ("max_size", Int(0, MAX), Read),
    ("priority", Any, Read),
    ("intent", Any, Read),
    ("intent_type", Any, Read),
    ("transports", StrList, Read),
    ("devices", StrList, Ignored("te picks NICs by topology; a rule cannot pin them")),
    ("service_level", Int(0, 15), Ignored("no effect in TENT either")),
    ("traffic_class", Int(0, 255), Ignored("no effect in TENT either")),
    ("qp_pool", Str, Ignored("te has one pool of queue pairs per endpoint")),
];

/// What [`audit`] found in a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// Keys TENT reads and te does not use, with why.
    pub ignored: Vec<(String, &'static str)>,
    /// Keys neither TENT nor te reads.
    pub unknown: Vec<String>,
    /// Classic variables the file sets: name → (value, the key it came from).
    pub mapped: BTreeMap<String, (String, String)>,
}

/// Checks `root` (a parsed file, flat keys already nested) against the keys TENT and te read.
///
/// # Errors
/// The first value of the wrong type or out of range, with its key.
pub fn audit(root: &Value) -> Result<Audit, String> {
    let mut found = Audit::default();
    let Value::Object(top) = root else {
        return Err("the configuration must be a JSON object".into());
    };
    walk(top, "", KEYS, &mut found)?;
    Ok(found)
}

fn walk(
    map: &serde_json::Map<String, Value>,
    prefix: &str,
    keys: &[(&str, Kind, Use)],
    found: &mut Audit,
) -> Result<(), String> {
    for (name, value) in map {
        let path = match prefix {
            "" => name.clone(),
            p => format!("{p}.{name}"),
        };
        if let Some((_, kind, how)) = keys.iter().find(|(k, _, _)| *k == path) {
            check(&path, *kind, value, found)?;
            match how {
                Read => {}
                Ignored(why) => found.ignored.push((path, why)),
                Env(var) => {
                    found.mapped.insert(var.to_string(), (text(value), path));
                }
                NanosAsSeconds(var) => {
                    let ns = value.as_i64().unwrap_or(1).max(1) as u64;
                    let secs = ns.div_ceil(1_000_000_000).to_string();
                    found.mapped.insert(var.to_string(), (secs, path));
                }
            }
        } else if keys
            .iter()
            .any(|(k, _, _)| k.starts_with(&format!("{path}.")))
        {
            match value {
                Value::Object(inner) => walk(inner, &path, keys, found)?,
                // TENT reads a missing subtree's keys as their defaults.
                Value::Null => {}
                other => return Err(format!("{path}: expected an object, got {other}")),
            }
        } else {
            found.unknown.push(path);
        }
    }
    Ok(())
}

/// A scalar or list as the classic variable's text (lists comma-separated).
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn check(path: &str, kind: Kind, value: &Value, found: &mut Audit) -> Result<(), String> {
    let bad = |want: &str| Err(format!("{path}: expected {want}, got {value}"));
    match (kind, value) {
        (Any, _) | (Bool, Value::Bool(_)) | (Str, Value::String(_)) => Ok(()),
        (Int(lo, hi), Value::Number(n)) => match n.as_i64() {
            Some(v) if (lo..=hi).contains(&v) => Ok(()),
            _ => bad(&format!("an integer in {lo}..={hi}")),
        },
        (Port, Value::Number(n)) if n.as_u64().is_some_and(|p| p <= 65535) => Ok(()),
        (Port, Value::String(s)) if s.parse::<u16>().is_ok() => Ok(()),
        (StrList, Value::Array(items)) if items.iter().all(Value::is_string) => Ok(()),
        (Map, Value::Object(m)) if m.values().all(|v| !v.is_object() && !v.is_array()) => Ok(()),
        (Rules, Value::Array(rules)) => {
            for (i, rule) in rules.iter().enumerate() {
                let Value::Object(rule) = rule else {
                    return Err(format!("{path}[{i}]: expected an object, got {rule}"));
                };
                let mut inner = Audit::default();
                walk(rule, "", RULE_KEYS, &mut inner).map_err(|e| format!("{path}[{i}].{e}"))?;
                let at = |k: String| format!("{path}[{i}].{k}");
                found
                    .ignored
                    .extend(inner.ignored.into_iter().map(|(k, why)| (at(k), why)));
                found.unknown.extend(inner.unknown.into_iter().map(at));
            }
            Ok(())
        }
        (Bool, _) => bad("true or false"),
        (Int(lo, hi), _) => bad(&format!("an integer in {lo}..={hi}")),
        (Port, _) => bad("a port (0..=65535)"),
        (Str, _) => bad("a string"),
        (StrList, _) => bad("a list of strings"),
        (Map, _) => bad("an object of plain values"),
        (Rules, _) => bad("a list of policy rules"),
    }
}

/// Moves top-level keys written as paths (`"transports/rdma/enable": true`, which TENT reads
/// too) into their nested place; a nested key of the same path wins, as in TENT.
pub fn nest_flat_keys(root: &mut Value) {
    let Value::Object(top) = root else {
        return;
    };
    let flat: Vec<String> = top.keys().filter(|k| k.contains('/')).cloned().collect();
    for key in flat {
        let Some(value) = top.remove(&key) else {
            continue;
        };
        let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
        let Some((last, parents)) = parts.split_last() else {
            continue;
        };
        // The object the key goes in, made on the way; none when a parent is not an object
        // (the nested value wins).
        let mut at = Some(&mut *top);
        for p in parents {
            at = at.and_then(|map| {
                match map
                    .entry(p.to_string())
                    .or_insert_with(|| Value::Object(Default::default()))
                {
                    Value::Object(inner) => Some(inner),
                    _ => None,
                }
            });
        }
        if let Some(map) = at {
            map.entry(last.to_string()).or_insert(value);
        }
    }
}

/// A value given as text (`tent_set_config`, the `TENT_*` variables) as TENT infers it:
/// `true`/`false` in any case are booleans, an integer is a number, JSON is parsed, anything
/// else is a string.
pub fn infer(text: &str) -> Value {
    let t = text.trim();
    if t.eq_ignore_ascii_case("true") {
        return Value::Bool(true);
    }
    if t.eq_ignore_ascii_case("false") {
        return Value::Bool(false);
    }
    if let Ok(n) = t.parse::<i64>() {
        return Value::from(n);
    }
    match t.starts_with(['{', '[', '"']) {
        true => serde_json::from_str(t).unwrap_or_else(|_| Value::String(text.to_string())),
        false => Value::String(text.to_string()),
    }
}

/// The `TENT_*` variables TENT reads, and what their values must be (all ignored by te).
pub const TENT_VARIABLES: &[(&str, &str)] = &[
    ("TENT_METRICS_ENABLED", "metrics.enabled"),
    ("TENT_METRICS_HTTP_PORT", "metrics.http_port"),
    ("TENT_METRICS_HTTP_HOST", "metrics.http_host"),
    (
        "TENT_METRICS_HTTP_SERVER_THREADS",
        "metrics.http_server_threads",
    ),
    (
        "TENT_METRICS_REPORT_INTERVAL",
        "metrics.report_interval_seconds",
    ),
    (crate::settings::TENT_RPC_THREADS.name, "rpc_server_threads"),
];

/// Checks the `TENT_*` variables `lookup` gives as their keys: the ones set, each with why te
/// ignores it.
///
/// # Errors
/// A malformed value, naming the variable.
pub fn audit_variables(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, &'static str)>, String> {
    let mut ignored = Vec::new();
    for (var, path) in TENT_VARIABLES {
        let Some(v) = lookup(var) else { continue };
        let (_, kind, how) = KEYS
            .iter()
            .find(|(k, _, _)| k == path)
            .expect("every variable maps onto a key");
        // A switch given as a variable may be 0 or 1, as te reads it.
        let value = match (kind, v.trim()) {
            (Bool, "0") => Value::Bool(false),
            (Bool, "1") => Value::Bool(true),
            _ => infer(&v),
        };
        check(var, *kind, &value, &mut Audit::default())?;
        if let Ignored(why) = how {
            ignored.push((var.to_string(), *why));
        }
    }
    Ok(ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_written_once_and_variables_map_onto_keys() {
        let mut seen = std::collections::HashSet::new();
        for (path, _, _) in KEYS {
            assert!(seen.insert(*path), "{path} twice");
        }
        for (_, path) in TENT_VARIABLES {
            assert!(seen.contains(path), "{path}");
        }
    }

    #[test]
    fn wrong_types_and_ranges_name_their_key() {
        for (json, key) in [
            (r#"{"rpc_server_port": 70000}"#, "rpc_server_port"),
            (r#"{"rpc_server_port": "http"}"#, "rpc_server_port"),
            (
                r#"{"enable_auto_failover_on_poll": "yes"}"#,
                "enable_auto_failover_on_poll",
            ),
            (
                r#"{"transports": {"rdma": {"endpoint": {"path_mtu": 9000}}}}"#,
                "path_mtu",
            ),
            (r#"{"transports": {"rdma": {"num_lanes": 0}}}"#, "num_lanes"),
            (
                r#"{"transports": {"rdma": {"device": []}}}"#,
                "transports.rdma.device",
            ),
            (
                r#"{"topology": {"rdma_whitelist": "mlx5_0"}}"#,
                "rdma_whitelist",
            ),
            (r#"{"metrics": {"http_port": -1}}"#, "metrics.http_port"),
            (r#"{"policy": [{"min_size": "big"}]}"#, "policy[0].min_size"),
            (r#"{"policy": [7]}"#, "policy[0]"),
            (r#"{"env": {"MC_SLICE_SIZE": {"a": 1}}}"#, "env"),
        ] {
            let err = audit(&serde_json::from_str(json).unwrap()).unwrap_err();
            assert!(err.contains(key), "{json}: {err}");
        }
    }

    #[test]
    fn keys_are_sorted_into_applied_ignored_and_unknown() {
        let mut root: Value = serde_json::from_str(
            r#"{"log_level": "warning", "enable_progress_worker": false,
                "metrics": {"enabled": true, "http_server_threads": 4},
                "topology": {"rdma_whitelist": ["mlx5_0", "mlx5_2"]},
                "transports": {"rdma": {"max_timeout_ns": 1500000000,
                                        "workers": {"wrokers": 1}},
                               "ub": {"enable": false, "worker_count": 4},
                               "nosuch": {"enable": true}},
                "policy": [{"name": "p", "devices": ["mlx5_0"], "transports": ["rdma"],
                            "colour": "red"}],
                "transports/rdma/device/gid_index": 3}"#,
        )
        .unwrap();
        nest_flat_keys(&mut root);
        let a = audit(&root).unwrap();
        let ignored: Vec<&str> = a.ignored.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            ignored,
            [
                "enable_progress_worker",
                "metrics.http_server_threads",
                "policy[0].devices",
                "transports.ub"
            ]
        );
        assert_eq!(
            a.unknown,
            [
                "policy[0].colour",
                "transports.nosuch",
                "transports.rdma.workers.wrokers"
            ]
        );
        let mapped = |v: &str| a.mapped.get(v).map(|(value, _)| value.as_str());
        assert_eq!(mapped("MC_LOG_LEVEL"), Some("warning"));
        assert_eq!(
            mapped("MC_TE_FILTERS"),
            None,
            "RDMA's devices, not every NIC's"
        );
        assert_eq!(mapped("MC_TE_FILTERS_EXCLUDE"), None);
        assert_eq!(
            mapped("MC_SLICE_TIMEOUT"),
            Some("2"),
            "ns rounded up to seconds"
        );
        assert_eq!(mapped("MC_GID_INDEX"), Some("3"), "a flat key nested");
        assert_eq!(
            a.mapped["MC_GID_INDEX"].1,
            "transports.rdma.device.gid_index"
        );
    }

    #[test]
    fn text_values_are_inferred_as_tent_infers_them() {
        assert_eq!(infer("TRUE"), Value::Bool(true));
        assert_eq!(infer("false"), Value::Bool(false));
        assert_eq!(infer("4096"), Value::from(4096));
        assert_eq!(infer("mlx5_0"), Value::from("mlx5_0"));
        assert_eq!(infer(r#"["a","b"]"#), serde_json::json!(["a", "b"]));
        assert_eq!(infer("[oops"), Value::from("[oops"));
    }

    #[test]
    fn tent_variables_are_checked_and_reported() {
        let env = |n: &str| match n {
            "TENT_METRICS_ENABLED" => Some("True".to_string()),
            "TENT_METRICS_HTTP_PORT" => Some("9100".to_string()),
            "TENT_METRICS_HTTP_SERVER_THREADS" => Some("4".to_string()),
            "TENT_METRICS_REPORT_INTERVAL" => Some("0".to_string()),
            _ => None,
        };
        let ignored = audit_variables(env).unwrap();
        let names: Vec<&str> = ignored.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["TENT_METRICS_HTTP_SERVER_THREADS"]);
        assert!(
            audit_variables(|n: &str| (n == "TENT_METRICS_ENABLED").then(|| "1".into())).is_ok()
        );
        let bad = |n: &str| (n == "TENT_METRICS_HTTP_PORT").then(|| "ninety".to_string());
        assert!(
            audit_variables(bad)
                .unwrap_err()
                .contains("TENT_METRICS_HTTP_PORT")
        );
    }
}
