//! The diagnosis: each hop's [`Check`], the [`Report`] naming the first broken one, and its
//! rendering for people.

use serde::Serialize;

/// The result of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// Works.
    Ok,
    /// Works, but worth a look.
    Warning,
    /// Broken: traffic cannot flow past this hop.
    Broken,
}

/// One hop checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// The cluster the hop belongs to (`local`, `remote`, or `both`).
    pub cluster: String,
    /// The peer cluster id the hop is about (empty for per-cluster hops).
    pub peer: String,
    /// Short name of the hop (stable: `api`, `outgoing-config`, `processed-by-peer`,
    /// `incoming-config`, `tunnel-endpoint`, `gateway-applied`, `tunnel`, `handshake`,
    /// `allowed-ips`, `isolation`, `admission`, `route-agent`, `flow-table`,
    /// `gateway-status`, `peer-key`, `peer-endpoint`, `remap`, `mtu`).
    pub hop: String,
    pub outcome: Outcome,
    /// What was found.
    pub detail: String,
    /// What to do (empty when nothing).
    pub fix: String,
}

/// Every check, and the first broken one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// In dependency order.
    pub checks: Vec<Check>,
    /// Index into `checks` of the first broken hop.
    pub first_broken: Option<usize>,
}

impl Report {
    pub(super) fn new(checks: Vec<Check>) -> Self {
        let first_broken = checks.iter().position(|c| c.outcome == Outcome::Broken);
        Self {
            checks,
            first_broken,
        }
    }

    /// The first broken hop.
    pub fn broken(&self) -> Option<&Check> {
        self.first_broken.map(|i| &self.checks[i])
    }
}

pub(super) struct Checks {
    pub(super) out: Vec<Check>,
}

impl Checks {
    pub(super) fn push(
        &mut self,
        cluster: &str,
        peer: &str,
        hop: &str,
        outcome: Outcome,
        detail: String,
        fix: &str,
    ) {
        self.out.push(Check {
            cluster: cluster.to_owned(),
            peer: peer.to_owned(),
            hop: hop.to_owned(),
            outcome,
            detail,
            fix: fix.to_owned(),
        });
    }
}

/// Renders the report for people: one line per hop, then the verdict.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for check in &report.checks {
        let mark = match check.outcome {
            Outcome::Ok => "✓",
            Outcome::Warning => "!",
            Outcome::Broken => "✗",
        };
        let peer = if check.peer.is_empty() {
            String::new()
        } else {
            format!(" → {}", check.peer)
        };
        out.push_str(&format!(
            "{mark} ({}{peer}) {}: {}\n",
            check.cluster, check.hop, check.detail
        ));
    }
    match report.broken() {
        Some(check) => out.push_str(&format!(
            "\nFirst broken hop: ({}) {}: {}\nWhat to do: {}\n",
            check.cluster, check.hop, check.detail, check.fix
        )),
        None => out.push_str("\nEvery hop works.\n"),
    }
    out
}
