//! `kubetun diagnose`: walks every hop of a link between two clusters, in the order traffic
//! and configuration depend on each other, and names the first broken one with what to do.
//!
//! Per cluster: the API and kubetun's cluster info; our NetworkConfig to the peer and whether
//! the peer processed it; the peer's NetworkConfig and whether we processed it; the
//! TunnelEndpoint; the gateway having applied it (`Applied`); the tunnel's state and the age
//! of its last handshake; the ACL (`allowedPrefixes`) and the route agent. With both clusters:
//! the peer's key and endpoint as we use them against what the peer announces, both ends'
//! remap tables (what each side says the other sees must match), and the MTU. The checks are
//! pure functions of what was read ([`Side`]), so tests break hops by editing objects.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams};
use kubetun_crds::{CidrMapping, ConnectionState, NetworkConfig, TunnelEndpoint};
use serde::Serialize;

use super::output::{self, OutputArgs};
use super::{Error, KubeconfigSource};
use crate::cluster_info::{ClusterInfo, DEFAULT_NAMESPACE};
use crate::conditions;
use crate::connector::ClusterHandle;

/// A handshake older than this means the session is gone: WireGuard re-handshakes every two
/// minutes while packets flow, and the controller keeps a persistent keepalive.
pub const STALE_HANDSHAKE_SECS: i64 = 180;

/// The route agent's DaemonSet (`deploy/agent/`).
pub const AGENT_DAEMONSET: &str = "kubetun-route-agent";

/// `kubetun diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// Kubeconfig of the local cluster [default: $KUBECONFIG or ~/.kube/config].
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Context in the local kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace kubetun runs in on the local cluster.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Kubeconfig of the peer cluster; without it only the local side of every link is
    /// checked.
    #[arg(long)]
    pub remote_kubeconfig: Option<std::path::PathBuf>,
    /// Context in the remote kubeconfig.
    #[arg(long)]
    pub remote_context: Option<String>,
    /// Namespace kubetun runs in on the remote cluster.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    pub remote_namespace: String,
    /// Only the link to this peer cluster id (without --remote-kubeconfig).
    #[arg(long)]
    pub peer: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What one cluster's API returned.
#[derive(Debug, Clone)]
pub struct Side {
    /// `local` or `remote`.
    pub label: String,
    /// The cluster info, or why it could not be read.
    pub info: Result<ClusterInfo, String>,
    /// The NetworkConfigs in kubetun's namespace.
    pub configs: Vec<NetworkConfig>,
    /// The TunnelEndpoints in kubetun's namespace.
    pub tunnels: Vec<TunnelEndpoint>,
    /// The route agent's DaemonSet: `None` when not installed, else (desired, ready).
    pub agent: Option<(i32, i32)>,
}

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
    /// `allowed-ips`, `route-agent`, `peer-key`, `peer-endpoint`, `remap`, `mtu`).
    pub hop: String,
    /// The outcome.
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
    fn new(checks: Vec<Check>) -> Self {
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

struct Checks {
    out: Vec<Check>,
}

impl Checks {
    fn push(
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

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions::find(conditions, type_)
}

fn describe_condition(c: Option<&Condition>) -> String {
    c.map_or_else(
        || "no condition yet".to_owned(),
        |c| {
            if c.message.is_empty() {
                format!("{} ({})", c.status, c.reason)
            } else {
                format!("{} ({}: {})", c.status, c.reason, c.message)
            }
        },
    )
}

fn rfc3339_age(text: &str, now_unix: i64) -> Option<i64> {
    let then: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(now_unix - then.as_second())
}

/// The peers `side` has links with (by NetworkConfig or TunnelEndpoint).
fn peers_of(side: &Side, own: &str) -> Vec<String> {
    let mut peers: Vec<String> = side
        .tunnels
        .iter()
        .map(|te| te.spec.cluster.id.clone())
        .chain(side.configs.iter().filter_map(|c| {
            if c.spec.source_cluster.id == own {
                Some(c.spec.destination_cluster.id.clone())
            } else if c.spec.destination_cluster.id == own {
                Some(c.spec.source_cluster.id.clone())
            } else {
                None
            }
        }))
        .collect();
    peers.sort();
    peers.dedup();
    peers
}

fn tunnel_of<'a>(side: &'a Side, peer: &str) -> Option<&'a TunnelEndpoint> {
    side.tunnels.iter().find(|te| te.spec.cluster.id == peer)
}

/// The hops of `side`'s link to `peer`, in order.
fn link_checks(checks: &mut Checks, side: &Side, own: &str, peer: &str, now_unix: i64) {
    let c = side.label.as_str();
    let outgoing = side
        .configs
        .iter()
        .find(|cfg| cfg.spec.source_cluster.id == own && cfg.spec.destination_cluster.id == peer);
    let incoming = side
        .configs
        .iter()
        .find(|cfg| cfg.spec.source_cluster.id == peer && cfg.spec.destination_cluster.id == own);
    let connect = "run `kubetun network connect` with both kubeconfigs (or check the hub's ShortcutConnection)";
    match outgoing {
        None => checks.push(
            c,
            peer,
            "outgoing-config",
            Outcome::Broken,
            format!("no NetworkConfig from {own} to {peer}"),
            connect,
        ),
        Some(cfg) => {
            checks.push(
                c,
                peer,
                "outgoing-config",
                Outcome::Ok,
                format!(
                    "NetworkConfig {} announces {own} to {peer}",
                    cfg.metadata.name.clone().unwrap_or_default()
                ),
                "",
            );
            let processed = cfg.status.as_ref().is_some_and(|s| s.processed);
            if processed {
                checks.push(
                    c,
                    peer,
                    "processed-by-peer",
                    Outcome::Ok,
                    format!("{peer} processed it (its views are mirrored back)"),
                    "",
                );
            } else {
                checks.push(c, peer, "processed-by-peer", Outcome::Broken,
                    format!("{peer} has not processed our NetworkConfig (no views mirrored back)"),
                    "check that the peer holds the matching NetworkConfig and its controller runs (`kubetun network status` on the peer, kubetun-controller logs there); re-run `kubetun network connect`");
            }
        }
    }
    match incoming {
        None => checks.push(
            c,
            peer,
            "incoming-config",
            Outcome::Broken,
            format!("no NetworkConfig from {peer} in this cluster"),
            connect,
        ),
        Some(cfg) => {
            let status = cfg.status.clone().unwrap_or_default();
            let cond = condition(&status.conditions, conditions::PROCESSED);
            if status.processed && cond.is_none_or(|c| c.status == "True") {
                checks.push(
                    c,
                    peer,
                    "incoming-config",
                    Outcome::Ok,
                    format!("{peer}'s NetworkConfig processed (views assigned)"),
                    "",
                );
            } else {
                checks.push(c, peer, "incoming-config", Outcome::Broken,
                    format!("{peer}'s NetworkConfig not processed: {}", describe_condition(cond)),
                    "fix what the condition names (overlapping or invalid CIDRs, an exhausted pool, a wrong destination); the controller retries by itself");
            }
        }
    }
    let Some(te) = tunnel_of(side, peer) else {
        checks.push(c, peer, "tunnel-endpoint", Outcome::Broken,
            format!("no TunnelEndpoint for {peer}"),
            "the controller builds it once both NetworkConfigs are processed: check kubetun-controller logs");
        return;
    };
    checks.push(
        c,
        peer,
        "tunnel-endpoint",
        Outcome::Ok,
        format!(
            "TunnelEndpoint {} to {}",
            te.metadata.name.clone().unwrap_or_default(),
            te.spec.endpoint
        ),
        "",
    );
    let status = te.status.clone().unwrap_or_default();
    let applied = condition(&status.conditions, conditions::APPLIED);
    if applied.is_some_and(|a| a.status == "True") {
        checks.push(
            c,
            peer,
            "gateway-applied",
            Outcome::Ok,
            "the gateway runs the state with this peer".to_owned(),
            "",
        );
    } else {
        checks.push(c, peer, "gateway-applied", Outcome::Broken,
            format!("the gateway has not applied it: {}", describe_condition(applied)),
            "check the gateway container (`kubectl -n kubetun-system logs deploy/kubetun-gateway -c gateway`), its /readyz, and the controller's logs for rejected Applies");
    }
    match &status.connection {
        Some(conn) if conn.status == ConnectionState::Connected => {
            checks.push(c, peer, "tunnel", Outcome::Ok,
                format!("Connected{}", conn.latency.as_ref().map(|l| format!(", latency {l}")).unwrap_or_default()), "");
        }
        Some(conn) => {
            let fix = if conn.status == ConnectionState::Connecting {
                "no handshake yet: check that UDP reaches the peer's endpoint from this cluster's gateway (LoadBalancer/NodePort, firewalls) and that the peer's gateway is ready"
            } else {
                "the peer stopped answering: check the peer's gateway pod and the UDP path between the endpoints"
            };
            checks.push(c, peer, "tunnel", Outcome::Broken,
                format!("{}{}", conn.status, if conn.message.is_empty() { String::new() } else { format!(": {}", conn.message) }),
                fix);
        }
        None => checks.push(c, peer, "tunnel", Outcome::Broken,
            "no report from the gateway".to_owned(),
            "the controller mirrors the gateway's peer status here: check that it reaches the gateway's control socket"),
    }
    if let Some(conn) = &status.connection {
        match conn.last_handshake.as_deref().map(|h| (h, rfc3339_age(h, now_unix))) {
            Some((_, Some(age))) if age <= STALE_HANDSHAKE_SECS => {
                checks.push(c, peer, "handshake", Outcome::Ok, format!("last handshake {age} s ago"), "");
            }
            Some((h, Some(age))) => checks.push(c, peer, "handshake", Outcome::Broken,
                format!("last handshake {age} s ago ({h}), older than {STALE_HANDSHAKE_SECS} s"),
                "the session expired: check the UDP path and the peer's gateway; a rotated key needs `kubetun network connect` again"),
            Some((h, None)) => checks.push(c, peer, "handshake", Outcome::Warning,
                format!("cannot read the handshake time {h:?}"), ""),
            None => checks.push(c, peer, "handshake", Outcome::Broken,
                "never".to_owned(), "no handshake ever completed: see the tunnel hop"),
        }
    }
    match &te.spec.allowed_prefixes {
        None => checks.push(c, peer, "allowed-ips", Outcome::Ok, "no Network ACL: every peer prefix passes".to_owned(), ""),
        Some(allowed) if allowed.is_empty() => checks.push(c, peer, "allowed-ips", Outcome::Broken,
            "the Network ACL allows nothing from this peer (fail closed)".to_owned(),
            "a Network peering with this cluster is missing or not ready: `kubectl get networks -A` and their conditions"),
        Some(allowed) => checks.push(c, peer, "allowed-ips", Outcome::Ok, format!("Network ACL allows {}", allowed.join(", ")), ""),
    }
}

fn mappings(pod: &[CidrMapping], external: &[CidrMapping]) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = pod
        .iter()
        .chain(external)
        .map(|m| (m.real.clone(), m.view.clone()))
        .collect();
    all.sort();
    all
}

fn show(mappings: &[(String, String)]) -> String {
    if mappings.is_empty() {
        return "nothing".to_owned();
    }
    mappings
        .iter()
        .map(|(real, view)| format!("{real}→{view}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks between both ends of one link.
fn pair_checks(
    checks: &mut Checks,
    local: &Side,
    local_info: &ClusterInfo,
    remote: &Side,
    remote_info: &ClusterInfo,
) {
    let (l, r) = (&local_info.cluster.id, &remote_info.cluster.id);
    let (Some(lte), Some(rte)) = (tunnel_of(local, r), tunnel_of(remote, l)) else {
        return;
    };
    for (side, te, other) in [(local, lte, remote_info), (remote, rte, local_info)] {
        if te.spec.public_key == other.public_key {
            checks.push(
                &side.label,
                &other.cluster.id,
                "peer-key",
                Outcome::Ok,
                "the peer's current public key".to_owned(),
                "",
            );
        } else {
            checks.push(
                &side.label,
                &other.cluster.id,
                "peer-key",
                Outcome::Broken,
                format!(
                    "{} uses an old public key of {} (the gateway key was rotated)",
                    side.label, other.cluster.id
                ),
                "re-run `kubetun network connect` so both sides exchange the current keys",
            );
        }
        if te.spec.endpoint == other.endpoint {
            checks.push(
                &side.label,
                &other.cluster.id,
                "peer-endpoint",
                Outcome::Ok,
                format!("{}", te.spec.endpoint),
                "",
            );
        } else {
            checks.push(&side.label, &other.cluster.id, "peer-endpoint", Outcome::Warning,
                format!("{} dials {}, {} announces {}", side.label, te.spec.endpoint, other.cluster.id, other.endpoint),
                "fine with an endpoint override (NAT, port forwarding); otherwise re-run `kubetun network connect`");
        }
    }
    // What local says the remote's CIDRs look like to it must be what the remote says local
    // sees of them, and the other way round.
    for (a, ate, b, bte) in [(local, lte, remote, rte), (remote, rte, local, lte)] {
        let a_sees = mappings(&ate.spec.remote_pod_cidrs, &ate.spec.remote_external_cidrs);
        let b_thinks = mappings(&bte.spec.local_pod_cidrs, &bte.spec.local_external_cidrs);
        let peer = &bte.spec.cluster.id;
        if a_sees == b_thinks {
            checks.push(
                &a.label,
                &ate.spec.cluster.id,
                "remap",
                Outcome::Ok,
                format!("{} sees {}'s CIDRs as {}", a.label, b.label, show(&a_sees)),
                "",
            );
        } else {
            checks.push(&a.label, &ate.spec.cluster.id, "remap", Outcome::Broken,
                format!("{} maps {}'s CIDRs {}, but {} (cluster {peer}) expects {}", a.label, b.label, show(&a_sees), b.label, show(&b_thinks)),
                "the remap tables disagree: re-run `kubetun network connect` to exchange the views again");
        }
    }
    let mtu = |te: &TunnelEndpoint, info: &ClusterInfo| te.spec.mtu.unwrap_or(info.mtu);
    let (lm, rm) = (mtu(lte, local_info), mtu(rte, remote_info));
    if lm == rm {
        checks.push(
            "both",
            "",
            "mtu",
            Outcome::Ok,
            format!("{lm} on both ends"),
            "",
        );
    } else {
        checks.push(
            "both",
            "",
            "mtu",
            Outcome::Broken,
            format!("local {lm}, remote {rm}: large packets are lost one way"),
            "set the same KUBETUN_MTU on both clusters (or `kubetun network connect --mtu`)",
        );
    }
}

fn agent_check(checks: &mut Checks, side: &Side) {
    match side.agent {
        None => checks.push(&side.label, "", "route-agent", Outcome::Warning,
            format!("no {AGENT_DAEMONSET} DaemonSet: only pods on the gateway's node reach the peers"),
            "install it on multi-node clusters: `kubectl apply -k deploy/agent/`"),
        Some((desired, ready)) if ready >= desired => checks.push(&side.label, "", "route-agent", Outcome::Ok,
            format!("{ready}/{desired} nodes ready"), ""),
        Some((desired, ready)) => checks.push(&side.label, "", "route-agent", Outcome::Broken,
            format!("{ready}/{desired} nodes ready: pods on the others cannot reach the peers"),
            "`kubectl -n kubetun-system get pods -l app.kubernetes.io/component=route-agent` and their logs"),
    }
}

fn api_check(checks: &mut Checks, side: &Side) -> Option<ClusterInfo> {
    match &side.info {
        Ok(info) => {
            checks.push(
                &side.label,
                "",
                "api",
                Outcome::Ok,
                format!("cluster {} reachable, kubetun installed", info.cluster.id),
                "",
            );
            Some(info.clone())
        }
        Err(reason) => {
            checks.push(&side.label, "", "api", Outcome::Broken, reason.clone(),
                "check the kubeconfig and context; install kubetun with `kubectl apply -k deploy/` (the controller writes the cluster info on start)");
            None
        }
    }
}

/// Diagnoses `local`'s links (only `peer` when given), or with `remote` the one link between
/// both clusters from both ends. `now_unix` is the current time in Unix seconds.
pub fn diagnose(local: &Side, remote: Option<&Side>, peer: Option<&str>, now_unix: i64) -> Report {
    let mut checks = Checks { out: Vec::new() };
    let local_info = api_check(&mut checks, local);
    let remote_info = remote.map(|r| (r, api_check(&mut checks, r)));
    let Some(local_info) = local_info else {
        return Report::new(checks.out);
    };
    let own = local_info.cluster.id.clone();
    match remote_info {
        Some((_, None)) => {}
        Some((remote, Some(remote_info))) => {
            let other = remote_info.cluster.id.clone();
            link_checks(&mut checks, local, &own, &other, now_unix);
            link_checks(&mut checks, remote, &other, &own, now_unix);
            pair_checks(&mut checks, local, &local_info, remote, &remote_info);
            agent_check(&mut checks, local);
            agent_check(&mut checks, remote);
        }
        None => {
            let peers: Vec<String> = peers_of(local, &own)
                .into_iter()
                .filter(|p| peer.is_none_or(|wanted| wanted == p))
                .collect();
            if peers.is_empty() {
                checks.push(
                    &local.label,
                    peer.unwrap_or_default(),
                    "outgoing-config",
                    Outcome::Broken,
                    format!(
                        "cluster {own} has no links{}",
                        peer.map(|p| format!(" to {p}")).unwrap_or_default()
                    ),
                    "run `kubetun network connect --kubeconfig <this> --remote-kubeconfig <peer>`",
                );
            }
            for p in &peers {
                link_checks(&mut checks, local, &own, p, now_unix);
            }
            agent_check(&mut checks, local);
        }
    }
    Report::new(checks.out)
}

/// Reads what the checks need from one cluster.
pub async fn collect(handle: &ClusterHandle) -> Side {
    let info = handle
        .load_info()
        .await
        .map_err(|e| crate::connector::error_chain(&e));
    let configs: Api<NetworkConfig> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let tunnels: Api<TunnelEndpoint> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let daemonsets: Api<DaemonSet> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let lp = ListParams::default();
    let agent = daemonsets
        .get_opt(AGENT_DAEMONSET)
        .await
        .ok()
        .flatten()
        .map(|ds| {
            let status = ds.status.unwrap_or_default();
            (status.desired_number_scheduled, status.number_ready)
        });
    Side {
        label: handle.label.clone(),
        info,
        configs: configs.list(&lp).await.map(|l| l.items).unwrap_or_default(),
        tunnels: tunnels.list(&lp).await.map(|l| l.items).unwrap_or_default(),
        agent,
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

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Runs `kubetun diagnose`; fails (exit status 1) when a hop is broken.
pub async fn run(args: DiagnoseArgs) -> Result<(), Error> {
    let local_source = KubeconfigSource {
        path: args.kubeconfig.clone(),
        context: args.context.clone(),
    };
    let local = match local_source.client("local").await {
        Ok(client) => collect(&ClusterHandle::new("local", client, &args.namespace)).await,
        Err(e) => unreachable_side("local", &e),
    };
    let remote = match &args.remote_kubeconfig {
        None => None,
        Some(path) => {
            let source = KubeconfigSource {
                path: Some(path.clone()),
                context: args.remote_context.clone(),
            };
            Some(match source.client("remote").await {
                Ok(client) => {
                    collect(&ClusterHandle::new(
                        "remote",
                        client,
                        &args.remote_namespace,
                    ))
                    .await
                }
                Err(e) => unreachable_side("remote", &e),
            })
        }
    };
    let report = diagnose(&local, remote.as_ref(), args.peer.as_deref(), now_unix());
    match output::render(args.output.format, &report)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&report)),
    }
    match report.broken() {
        Some(check) => Err(Error::Broken(format!("({}) {}", check.cluster, check.hop))),
        None => Ok(()),
    }
}

fn unreachable_side(label: &str, error: &Error) -> Side {
    Side {
        label: label.to_owned(),
        info: Err(error.to_string()),
        configs: Vec::new(),
        tunnels: Vec::new(),
        agent: None,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubetun_crds::{
        ClusterRef, ConnectionStatus, Endpoint, NetworkConfigSpec, NetworkConfigStatus,
        TunnelEndpointSpec, TunnelEndpointStatus,
    };

    use super::*;

    /// 2026-11-25T00:00:00Z.
    const NOW: i64 = 1_795_564_800;

    fn cref(id: &str) -> ClusterRef {
        ClusterRef {
            id: id.into(),
            name: id.into(),
        }
    }

    fn info(id: &str, pod: &str, port: u16) -> ClusterInfo {
        ClusterInfo {
            cluster: cref(id),
            pod_cidrs: vec![pod.parse().unwrap()],
            external_cidrs: vec!["10.70.0.0/16".parse().unwrap()],
            service_cidrs: Vec::new(),
            endpoint: Endpoint {
                address: "192.0.2.1".into(),
                port,
            },
            public_key: format!("{id}-key"),
            mtu: 1420,
        }
    }

    fn mapping(real: &str, view: &str) -> CidrMapping {
        CidrMapping {
            real: real.into(),
            view: view.into(),
        }
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn config(from: &ClusterInfo, to: &ClusterInfo, processed: bool) -> NetworkConfig {
        let mut cfg = NetworkConfig::new(
            &format!("{}-{}", from.cluster.id, to.cluster.id),
            NetworkConfigSpec {
                source_cluster: from.cluster.clone(),
                destination_cluster: to.cluster.clone(),
                endpoint: from.endpoint.clone(),
                public_key: from.public_key.clone(),
                ..NetworkConfigSpec::default()
            },
        );
        cfg.status = Some(NetworkConfigStatus {
            processed,
            conditions: vec![condition(conditions::PROCESSED, "True", "Processed")],
            ..NetworkConfigStatus::default()
        });
        cfg
    }

    /// `own`'s TunnelEndpoint to `peer`; `own` sees the peer's external CIDR as `view`, and
    /// the peer sees ours as `ours_seen_as`.
    fn tunnel(
        own: &ClusterInfo,
        peer: &ClusterInfo,
        view: &str,
        ours_seen_as: &str,
    ) -> TunnelEndpoint {
        let mut te = TunnelEndpoint::new(
            &peer.cluster.id,
            TunnelEndpointSpec {
                cluster: peer.cluster.clone(),
                local_pod_cidrs: vec![mapping(
                    &own.pod_cidrs[0].to_string(),
                    &own.pod_cidrs[0].to_string(),
                )],
                local_external_cidrs: vec![mapping("10.70.0.0/16", ours_seen_as)],
                remote_pod_cidrs: vec![mapping(
                    &peer.pod_cidrs[0].to_string(),
                    &peer.pod_cidrs[0].to_string(),
                )],
                remote_external_cidrs: vec![mapping("10.70.0.0/16", view)],
                endpoint: peer.endpoint.clone(),
                public_key: peer.public_key.clone(),
                mtu: Some(1420),
                allowed_prefixes: None,
            },
        );
        te.status = Some(TunnelEndpointStatus {
            connection: Some(ConnectionStatus {
                status: ConnectionState::Connected,
                latency: Some("1.0ms".into()),
                last_handshake: Some("2026-11-24T23:59:00Z".into()),
                ..ConnectionStatus::default()
            }),
            conditions: vec![condition(conditions::APPLIED, "True", "Applied")],
            ..TunnelEndpointStatus::default()
        });
        te
    }

    /// Europe and Rome, linked and healthy: each remaps the other's 10.70.0.0/16.
    fn healthy() -> (Side, Side) {
        let europe = info("europe", "10.200.0.0/16", 51820);
        let rome = info("rome", "10.202.0.0/16", 51821);
        let local = Side {
            label: "local".into(),
            info: Ok(europe.clone()),
            configs: vec![config(&europe, &rome, true), config(&rome, &europe, true)],
            tunnels: vec![tunnel(&europe, &rome, "10.71.0.0/16", "10.72.0.0/16")],
            agent: Some((3, 3)),
        };
        let remote = Side {
            label: "remote".into(),
            info: Ok(rome.clone()),
            configs: vec![config(&rome, &europe, true), config(&europe, &rome, true)],
            tunnels: vec![tunnel(&rome, &europe, "10.72.0.0/16", "10.71.0.0/16")],
            agent: Some((2, 2)),
        };
        (local, remote)
    }

    fn broken_hop(local: &Side, remote: Option<&Side>) -> Option<(String, String)> {
        diagnose(local, remote, None, NOW)
            .broken()
            .map(|c| (c.cluster.clone(), c.hop.clone()))
    }

    fn hop(cluster: &str, hop: &str) -> Option<(String, String)> {
        Some((cluster.into(), hop.into()))
    }

    #[test]
    fn a_healthy_link_passes_every_hop_from_both_ends() {
        let (local, remote) = healthy();
        let report = diagnose(&local, Some(&remote), None, NOW);
        assert_eq!(report.broken(), None, "{}", render(&report));
        let hops: Vec<&str> = report.checks.iter().map(|c| c.hop.as_str()).collect();
        for expected in [
            "api",
            "outgoing-config",
            "processed-by-peer",
            "incoming-config",
            "tunnel-endpoint",
            "gateway-applied",
            "tunnel",
            "handshake",
            "allowed-ips",
            "peer-key",
            "peer-endpoint",
            "remap",
            "mtu",
            "route-agent",
        ] {
            assert!(hops.contains(&expected), "{expected} not checked: {hops:?}");
        }
        assert!(render(&report).ends_with("Every hop works.\n"));
        // Only the local side: its links, no pair checks.
        let alone = diagnose(&local, None, None, NOW);
        assert_eq!(alone.broken(), None, "{}", render(&alone));
        assert!(!alone.checks.iter().any(|c| c.hop == "remap"));
    }

    #[test]
    fn an_unreachable_cluster_is_the_first_broken_hop() {
        let (local, mut remote) = healthy();
        remote.info = Err("(remote) cannot load the kubeconfig: connection refused".into());
        assert_eq!(broken_hop(&local, Some(&remote)), hop("remote", "api"));
        let report = diagnose(&local, Some(&remote), None, NOW);
        assert!(
            render(&report).contains("What to do: check the kubeconfig"),
            "{}",
            render(&report)
        );
    }

    #[test]
    fn missing_and_unprocessed_network_configs_are_named() {
        let (mut local, remote) = healthy();
        local
            .configs
            .retain(|c| c.spec.source_cluster.id != "europe");
        assert_eq!(
            broken_hop(&local, Some(&remote)),
            hop("local", "outgoing-config")
        );

        let (local, mut remote) = healthy();
        for cfg in &mut remote.configs {
            if cfg.spec.source_cluster.id == "rome" {
                cfg.status.as_mut().unwrap().processed = false;
            }
        }
        assert_eq!(
            broken_hop(&local, Some(&remote)),
            hop("remote", "processed-by-peer")
        );

        let (mut local, remote) = healthy();
        for cfg in &mut local.configs {
            if cfg.spec.source_cluster.id == "rome" {
                let status = cfg.status.as_mut().unwrap();
                status.processed = false;
                status.conditions =
                    vec![condition(conditions::PROCESSED, "False", "PoolExhausted")];
            }
        }
        let report = diagnose(&local, Some(&remote), None, NOW);
        let broken = report.broken().unwrap();
        assert_eq!(
            (broken.cluster.as_str(), broken.hop.as_str()),
            ("local", "incoming-config")
        );
        assert!(broken.detail.contains("PoolExhausted"), "{}", broken.detail);
    }

    #[test]
    fn gateway_tunnel_and_handshake_failures_are_named() {
        let (mut local, remote) = healthy();
        local.tunnels.clear();
        assert_eq!(
            broken_hop(&local, Some(&remote)),
            hop("local", "tunnel-endpoint")
        );

        let (mut local, remote) = healthy();
        local.tunnels[0].status.as_mut().unwrap().conditions = vec![condition(
            conditions::APPLIED,
            "False",
            "GatewayUnavailable",
        )];
        assert_eq!(
            broken_hop(&local, Some(&remote)),
            hop("local", "gateway-applied")
        );

        let (local, mut remote) = healthy();
        let conn = remote.tunnels[0]
            .status
            .as_mut()
            .unwrap()
            .connection
            .as_mut()
            .unwrap();
        conn.status = ConnectionState::Connecting;
        let report = diagnose(&local, Some(&remote), None, NOW);
        let broken = report.broken().unwrap();
        assert_eq!(
            (broken.cluster.as_str(), broken.hop.as_str()),
            ("remote", "tunnel")
        );
        assert!(broken.fix.contains("UDP"), "{}", broken.fix);

        let (mut local, remote) = healthy();
        let conn = local.tunnels[0]
            .status
            .as_mut()
            .unwrap()
            .connection
            .as_mut()
            .unwrap();
        conn.last_handshake = Some("2026-11-24T23:50:00Z".into());
        let report = diagnose(&local, Some(&remote), None, NOW);
        let broken = report.broken().unwrap();
        assert_eq!(
            (broken.cluster.as_str(), broken.hop.as_str()),
            ("local", "handshake")
        );
        assert!(broken.detail.contains("600 s ago"), "{}", broken.detail);
    }

    #[test]
    fn acl_remap_key_mtu_and_agent_problems_are_named() {
        let (mut local, remote) = healthy();
        local.tunnels[0].spec.allowed_prefixes = Some(Vec::new());
        assert_eq!(
            broken_hop(&local, Some(&remote)),
            hop("local", "allowed-ips")
        );

        // Rome believes Europe sees its 10.70.0.0/16 as 10.73.0.0/16; Europe uses 10.71.
        let (local, mut remote) = healthy();
        remote.tunnels[0].spec.local_external_cidrs = vec![mapping("10.70.0.0/16", "10.73.0.0/16")];
        let report = diagnose(&local, Some(&remote), None, NOW);
        let broken = report.broken().unwrap();
        assert_eq!(
            (broken.cluster.as_str(), broken.hop.as_str()),
            ("local", "remap")
        );
        assert!(
            broken.detail.contains("10.70.0.0/16→10.71.0.0/16"),
            "{}",
            broken.detail
        );
        assert!(
            broken.detail.contains("10.70.0.0/16→10.73.0.0/16"),
            "{}",
            broken.detail
        );

        let (mut local, remote) = healthy();
        local.tunnels[0].spec.public_key = "old-rome-key".into();
        assert_eq!(broken_hop(&local, Some(&remote)), hop("local", "peer-key"));

        let (local, mut remote) = healthy();
        remote.tunnels[0].spec.mtu = Some(1380);
        assert_eq!(broken_hop(&local, Some(&remote)), hop("both", "mtu"));

        let (local, mut remote) = healthy();
        remote.agent = Some((3, 1));
        assert_eq!(
            broken_hop(&local, Some(&remote)),
            hop("remote", "route-agent")
        );
        let (mut local, remote) = healthy();
        local.agent = None;
        let report = diagnose(&local, Some(&remote), None, NOW);
        assert_eq!(report.broken(), None);
        assert!(
            report
                .checks
                .iter()
                .any(|c| c.hop == "route-agent" && c.outcome == Outcome::Warning)
        );
    }

    #[test]
    fn the_report_renders_as_json_with_stable_fields() {
        let (mut local, remote) = healthy();
        local.tunnels.clear();
        let report = diagnose(&local, Some(&remote), None, NOW);
        let text = output::render(output::Format::Json, &report)
            .unwrap()
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let first = value["firstBroken"].as_u64().unwrap() as usize;
        let check = &value["checks"][first];
        assert_eq!(check["hop"], "tunnel-endpoint");
        assert_eq!(check["cluster"], "local");
        assert_eq!(check["peer"], "rome");
        assert_eq!(check["outcome"], "Broken");
        assert!(check["fix"].as_str().unwrap().contains("controller"));
    }
}
