//! [`diagnose`]: runs the checks over what was read, per cluster (the API, the route agent),
//! per link (`link.rs`) and, with both clusters, between both ends of the link.

use kubetun_crds::{CidrMapping, TunnelEndpoint};

use super::expect::AGENT_DAEMONSET;
use super::isolation::gateway_checks;
use super::link::link_checks;
use super::report::{Checks, Outcome, Report};
use super::side::{Side, peers_of, tunnel_of};
use kubetun_controller::plumbing::cluster_info::ClusterInfo;

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
            gateway_checks(&mut checks, local);
            gateway_checks(&mut checks, remote);
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
            gateway_checks(&mut checks, local);
        }
    }
    Report::new(checks.out)
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
