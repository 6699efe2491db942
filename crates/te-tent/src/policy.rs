//! Choosing transports per request: policy rules from the configuration (first match wins, or
//! the rule a request names), else the default policy (the fastest capable transport first:
//! SHM on the same host, RDMA across hosts where installed, TCP otherwise, uring for files);
//! and, when no transport can make a move, a staging plan through host memory. Pure: the
//! installed transports and their capabilities are passed in.

use serde::Deserialize;
use te_core::transport::Capabilities;

use crate::capability::{MemoryKind, Move, Scope, can};

/// A request's priority (TENT's `PRIO_HIGH` 0, `MEDIUM` 1, `LOW` 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Posted first.
    #[default]
    High,
    /// After high.
    Medium,
    /// Last.
    Low,
}

impl Priority {
    /// Queue index (0 is posted first).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why the bytes move (TENT's `IntentType`); policies may match on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Intent {
    /// Not said.
    #[default]
    #[serde(alias = "intent_unspec")]
    Unspec,
    /// A read someone waits for.
    ForegroundGet,
    /// A read ahead of need.
    BackgroundPrefetch,
    /// Moving data between tiers.
    Migration,
    /// Saving state.
    Checkpoint,
    /// Loading model weights.
    WeightLoading,
    /// The runtime's own staging hops.
    StagingInternal,
}

/// One policy rule: what it matches, and the transports it gives, in order. TENT's own rules
/// read as written for it: one `priority` (`"high"`, `"0"`, `0`, ...) or a list, one
/// `intent_type` or a list of `intent`s, TENT's transport names (`io_uring`); the keys te does
/// not use (`devices`, `qp_pool`, ...) are reported by the configuration's key check.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Rule {
    /// Name a request can ask for (`policy_name`).
    pub name: Option<String>,
    /// `memory` or `file`.
    pub segment_type: Option<String>,
    /// Intents matched (any when absent).
    #[serde(alias = "intent_type", deserialize_with = "intents")]
    pub intent: Option<Vec<Intent>>,
    /// Priorities matched (any when absent).
    #[serde(deserialize_with = "priorities")]
    pub priority: Option<Vec<Priority>>,
    /// Whether the target is on this host.
    pub same_machine: Option<bool>,
    /// Local memory kind: `cpu`, `cuda` or `*`.
    pub local_memory: Option<String>,
    /// Target memory kind: `cpu`, `cuda`, `file` or `*`.
    pub remote_memory: Option<String>,
    /// Smallest request matched, in bytes.
    pub min_size: Option<u64>,
    /// Largest request matched, in bytes.
    pub max_size: Option<u64>,
    /// Transports to use, first choice first (TENT's names are read as te's: `io_uring` is
    /// `uring`, `mnnvl` is `nvlink`).
    #[serde(deserialize_with = "transport_names")]
    pub transports: Vec<String>,
}

/// One value or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A priority as TENT writes it in a rule: a name (any case) or its number, as text or not.
#[derive(Deserialize)]
#[serde(untagged)]
enum PriorityText {
    Number(u64),
    Text(String),
}

fn priorities<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Priority>>, D::Error> {
    let given = Option::<OneOrMany<PriorityText>>::deserialize(d)?;
    given
        .map(|g| {
            g.into_vec()
                .into_iter()
                .map(|p| match p {
                    PriorityText::Number(0) => Ok(Priority::High),
                    PriorityText::Number(1) => Ok(Priority::Medium),
                    PriorityText::Number(2) => Ok(Priority::Low),
                    PriorityText::Text(t) => match t.trim().to_ascii_lowercase().as_str() {
                        "high" | "0" => Ok(Priority::High),
                        "medium" | "1" => Ok(Priority::Medium),
                        "low" | "2" => Ok(Priority::Low),
                        _ => Err(format!("priority {t:?}: high, medium or low (0, 1, 2)")),
                    },
                    PriorityText::Number(n) => Err(format!("priority {n}: 0, 1 or 2")),
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .transpose()
        .map_err(serde::de::Error::custom)
}

fn intents<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Intent>>, D::Error> {
    Ok(Option::<OneOrMany<Intent>>::deserialize(d)?.map(OneOrMany::into_vec))
}

/// TENT's transport names that are te's under another name.
pub(crate) fn te_transport_name(name: &str) -> &str {
    match name {
        "io_uring" => "uring",
        "mnnvl" => "nvlink",
        other => other,
    }
}

fn transport_names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Vec::<String>::deserialize(d)?
        .into_iter()
        .filter(|n| n != "unspec")
        .map(|n| te_transport_name(&n).to_string())
        .collect())
}

impl Rule {
    /// Checks the rule makes sense.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.transports.is_empty() || self.transports.len() > 16 {
            return Err("a rule needs 1..=16 transports".into());
        }
        if let Some(t) = &self.segment_type {
            if t != "memory" && t != "file" {
                return Err(format!("segment_type {t:?} is not memory or file"));
            }
        }
        for kind in [&self.local_memory, &self.remote_memory]
            .into_iter()
            .flatten()
        {
            if !["cpu", "cuda", "file", "*"].contains(&kind.as_str()) {
                return Err(format!("memory kind {kind:?} is not cpu, cuda, file or *"));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_size, self.max_size) {
            if lo > hi {
                return Err(format!("min_size {lo} > max_size {hi}"));
            }
        }
        Ok(())
    }

    fn matches(&self, r: &RequestFacts) -> bool {
        let kind_ok = |want: &Option<String>, kind: MemoryKind| {
            want.as_deref().is_none_or(|w| w == "*" || w == kind.name())
        };
        let segment_type = match r.movement.to {
            MemoryKind::File => "file",
            _ => "memory",
        };
        self.segment_type
            .as_deref()
            .is_none_or(|t| t == segment_type)
            && self.intent.as_ref().is_none_or(|l| l.contains(&r.intent))
            && self
                .priority
                .as_ref()
                .is_none_or(|l| l.contains(&r.priority))
            && self
                .same_machine
                .is_none_or(|s| s == (r.movement.scope != Scope::CrossHost))
            && kind_ok(&self.local_memory, r.movement.from)
            && kind_ok(&self.remote_memory, r.movement.to)
            && self.min_size.is_none_or(|m| r.length >= m)
            && self.max_size.is_none_or(|m| r.length <= m)
    }
}

/// What a policy looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    /// The move asked for.
    pub movement: Move,
    /// Its priority.
    pub priority: Priority,
    /// Its intent.
    pub intent: Intent,
    /// Bytes.
    pub length: u64,
    /// A rule asked for by name (used whatever its conditions say).
    pub policy_name: Option<String>,
    /// A transport asked for first.
    pub hint: Option<String>,
}

/// How a request will move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Straight to the target through these transports, first choice first (the rest are the
    /// failover order).
    Direct(Vec<&'static str>),
    /// Through a host staging buffer: `local` moves between the request's memory and the
    /// staging buffer, `remote` between the staging buffer and the target.
    Staged {
        /// Transports for the local hop.
        local: Vec<&'static str>,
        /// Transports for the hop to the target.
        remote: Vec<&'static str>,
    },
}

/// How fast a transport usually is for what it can do: lower ranks first.
fn rank(name: &str) -> usize {
    const ORDER: [&str; 9] = [
        "cxl", "shm", "nvlink", "rdma", "gds", "uring", "bufio", "tcp", "sim",
    ];
    ORDER.iter().position(|n| *n == name).unwrap_or(ORDER.len())
}

/// The capable transports for `m`, in default order.
fn capable(m: Move, installed: &[(&'static str, Capabilities)]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = installed
        .iter()
        .filter(|(_, c)| can(*c, m))
        .map(|(n, _)| *n)
        .collect();
    out.sort_by_key(|n| rank(n));
    out
}

/// The plan for a request with `facts` among `installed` transports under `rules`.
///
/// # Errors
/// A description when no transport (nor staging) can make the move, or a named rule is missing.
pub fn select(
    facts: &RequestFacts,
    rules: &[Rule],
    installed: &[(&'static str, Capabilities)],
    staging: bool,
) -> Result<Plan, String> {
    let capable_now = capable(facts.movement, installed);
    // A hint names a transport to use: one that is not installed, or cannot make the move, is
    // the caller's error (TENT refuses a hint for a transport it has not enabled).
    if let Some(hint) = &facts.hint {
        if !capable_now.contains(&hint.as_str()) {
            let m = facts.movement;
            return Err(match installed.iter().any(|(n, _)| n == hint) {
                true => format!(
                    "transport_hint {hint} cannot move {} memory to {} memory ({:?})",
                    m.from.name(),
                    m.to.name(),
                    m.scope
                ),
                false => format!(
                    "transport_hint {hint} is not installed (installed: {})",
                    installed
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    if capable_now.is_empty() {
        return stage(facts.movement, installed, staging);
    }
    let rule = match &facts.policy_name {
        Some(name) => Some(
            rules
                .iter()
                .find(|r| r.name.as_deref() == Some(name))
                .ok_or_else(|| format!("no policy named {name:?}"))?,
        ),
        None => rules.iter().find(|r| r.matches(facts)),
    };
    // The rule's transports (those capable), then the other capable ones as fallbacks.
    let mut order: Vec<&'static str> = Vec::new();
    if let Some(n) = facts
        .hint
        .as_ref()
        .and_then(|h| capable_now.iter().find(|n| *n == h))
    {
        order.push(n);
    }
    if let Some(rule) = rule {
        for t in &rule.transports {
            if let Some(n) = capable_now.iter().find(|n| *n == t) {
                if !order.contains(n) {
                    order.push(n);
                }
            }
        }
    }
    for n in capable_now {
        if !order.contains(&n) {
            order.push(n);
        }
    }
    Ok(Plan::Direct(order))
}

/// A staging plan for a move no transport makes: GPU memory hops through host memory of this
/// process first (and back, for a read).
fn stage(
    m: Move,
    installed: &[(&'static str, Capabilities)],
    staging: bool,
) -> Result<Plan, String> {
    let none = || {
        format!(
            "no installed transport moves {} memory to {} memory ({:?})",
            m.from.name(),
            m.to.name(),
            m.scope
        )
    };
    if !staging || m.from == MemoryKind::Dram {
        return Err(none());
    }
    let local = capable(
        Move::new(m.from, MemoryKind::Dram, Scope::SameProcess),
        installed,
    );
    let remote = capable(Move::new(MemoryKind::Dram, m.to, m.scope), installed);
    match local.is_empty() || remote.is_empty() {
        true => Err(format!(
            "{}, and staging through host memory cannot either",
            none()
        )),
        false => Ok(Plan::Staged { local, remote }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemoryKind::{Dram, File, Gpu};
    use Scope::{CrossHost, SameHost};

    const TCP: Capabilities = Capabilities::DRAM_REMOTE_HOST;

    fn installed() -> Vec<(&'static str, Capabilities)> {
        vec![
            ("tcp", TCP | Capabilities::DRAM_SAME_HOST),
            ("shm", Capabilities::DRAM_SAME_HOST),
            ("rdma", TCP | Capabilities::DRAM_SAME_HOST),
            ("uring", Capabilities::DRAM_FILE),
            ("bufio", Capabilities::DRAM_FILE),
        ]
    }

    fn facts(from: MemoryKind, to: MemoryKind, scope: Scope) -> RequestFacts {
        RequestFacts {
            movement: Move::new(from, to, scope),
            priority: Priority::High,
            intent: Intent::Unspec,
            length: 1 << 20,
            policy_name: None,
            hint: None,
        }
    }

    #[test]
    fn the_default_policy_picks_the_fastest_capable_transport() {
        let i = installed();
        let pick = |f: &RequestFacts| select(f, &[], &i, true).unwrap();
        assert_eq!(
            pick(&facts(Dram, Dram, SameHost)),
            Plan::Direct(vec!["shm", "rdma", "tcp"])
        );
        assert_eq!(
            pick(&facts(Dram, Dram, CrossHost)),
            Plan::Direct(vec!["rdma", "tcp"])
        );
        assert_eq!(
            pick(&facts(Dram, File, Scope::SameProcess)),
            Plan::Direct(vec!["uring", "bufio"])
        );
        let tcp_only = [("tcp", TCP)];
        assert_eq!(
            select(&facts(Dram, Dram, CrossHost), &[], &tcp_only, true).unwrap(),
            Plan::Direct(vec!["tcp"])
        );
    }

    #[test]
    fn rules_hints_and_names_reorder_and_the_rest_stay_as_fallbacks() {
        let i = installed();
        let rules = vec![
            Rule {
                // Matches file requests only; by name, any request.
                name: Some("bulk".into()),
                segment_type: Some("file".into()),
                transports: vec!["tcp".into()],
                ..Rule::default()
            },
            Rule {
                priority: Some(vec![Priority::Low]),
                same_machine: Some(false),
                transports: vec!["tcp".into(), "nonexistent".into()],
                ..Rule::default()
            },
            Rule {
                min_size: Some(1 << 30),
                transports: vec!["shm".into()],
                ..Rule::default()
            },
        ];
        let mut f = facts(Dram, Dram, CrossHost);
        assert_eq!(
            select(&f, &rules, &i, true).unwrap(),
            Plan::Direct(vec!["rdma", "tcp"]),
            "no rule matches a high-priority 1 MiB request"
        );
        f.priority = Priority::Low;
        assert_eq!(
            select(&f, &rules, &i, true).unwrap(),
            Plan::Direct(vec!["tcp", "rdma"]),
            "the low-priority rule puts tcp first; rdma stays as the fallback"
        );
        f.priority = Priority::High;
        f.length = 2 << 30;
        assert_eq!(
            select(&f, &rules, &i, true).unwrap(),
            Plan::Direct(vec!["rdma", "tcp"]),
            "shm cannot reach another host: the rule's choice is skipped"
        );
        f.hint = Some("tcp".into());
        assert_eq!(
            select(&f, &rules, &i, true).unwrap(),
            Plan::Direct(vec!["tcp", "rdma"])
        );
        f.hint = Some("shm".into());
        let err = select(&f, &rules, &i, true).unwrap_err();
        assert!(err.contains("transport_hint shm cannot move"), "{err}");
        f.hint = Some("nvlink".into());
        let err = select(&f, &rules, &i, true).unwrap_err();
        assert!(
            err.contains("transport_hint nvlink is not installed"),
            "{err}"
        );
        let mut named = facts(Dram, Dram, SameHost);
        named.policy_name = Some("bulk".into());
        assert_eq!(
            select(&named, &rules, &i, true).unwrap(),
            Plan::Direct(vec!["tcp", "shm", "rdma"])
        );
        named.policy_name = Some("missing".into());
        assert!(
            select(&named, &rules, &i, true)
                .unwrap_err()
                .contains("missing")
        );
    }

    #[test]
    fn gpu_memory_without_a_gpu_transport_stages_through_host_memory() {
        let mut i = installed();
        let f = facts(Gpu, Dram, CrossHost);
        let err = select(&f, &[], &i, true).unwrap_err();
        assert!(err.contains("cannot either"), "{err}");
        i.push(("copy", Capabilities::GPU_LOCAL));
        assert_eq!(
            select(&f, &[], &i, true).unwrap(),
            Plan::Staged {
                local: vec!["copy"],
                remote: vec!["rdma", "tcp"]
            }
        );
        assert!(select(&f, &[], &i, false).is_err(), "staging disabled");
        i.push(("gdr", Capabilities::GPU_REMOTE_HOST));
        assert_eq!(
            select(&f, &[], &i, true).unwrap(),
            Plan::Direct(vec!["gdr"]),
            "a direct transport beats staging"
        );
        let bad = Rule {
            transports: vec![],
            ..Rule::default()
        };
        assert!(bad.validate().is_err());
    }
}
