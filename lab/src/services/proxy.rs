//! The lab's stand-in for kube-proxy (the lab runs no kubelet, so no kube-proxy): every port of
//! a ClusterIP Service becomes a DNAT in the node's namespace that picks one ready endpoint at
//! random per connection, as kube-proxy's nftables mode does (a `numgen` verdict map into one
//! chain per endpoint); a port without endpoints is rejected. [`follow`] is `kubetun-lab
//! kube-proxy`: it watches a cluster's derived Services and kubetun's EndpointSlices and
//! re-renders on every change, so what the controllers import is what pods reach.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt as _;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kubetun_crds::contract::services::{
    DERIVED_FOR_LABEL, KUBE_SERVICE_NAME_LABEL, MANAGED_BY, MANAGED_BY_LABEL,
};

use crate::error::LabError;
use kubetun_testenv::netns;

/// The nftables table the proxy owns in each node namespace.
pub const TABLE: &str = "kubetun_lab_proxy";

/// One port of a Service as the proxy programs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProxiedPort {
    /// The ClusterIP.
    pub ip: Ipv4Addr,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// The Service port.
    pub port: u16,
    /// The ready endpoints (address and target port).
    pub endpoints: Vec<SocketAddrV4>,
}

/// A Service port: its name, protocol and number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    pub name: Option<String>,
    pub protocol: String,
    pub port: i32,
}

/// The ports of the Service at `ip` with `ports`, each with the ready IPv4 endpoints of
/// `slices` that serve it (the slice port of the same name and protocol gives the target
/// port). SCTP and out-of-range ports are left out.
pub fn proxied(ip: Ipv4Addr, ports: &[PortSpec], slices: &[&EndpointSlice]) -> Vec<ProxiedPort> {
    let mut proxied = Vec::new();
    for spec in ports {
        let protocol = match spec.protocol.as_str() {
            "TCP" => "tcp",
            "UDP" => "udp",
            _ => continue,
        };
        let Ok(port) = u16::try_from(spec.port) else {
            continue;
        };
        let mut endpoints = Vec::new();
        for slice in slices.iter().filter(|s| s.address_type == "IPv4") {
            let target = slice.ports.iter().flatten().find(|p| {
                p.name.as_deref().filter(|n| !n.is_empty()) == spec.name.as_deref()
                    && p.protocol.as_deref().unwrap_or("TCP") == spec.protocol
            });
            let Some(target) = target.and_then(|p| u16::try_from(p.port?).ok()) else {
                continue;
            };
            let ready = slice
                .endpoints
                .iter()
                .flatten()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true));
            for endpoint in ready {
                endpoints.extend(
                    endpoint
                        .addresses
                        .iter()
                        .filter_map(|a| a.parse::<Ipv4Addr>().ok())
                        .map(|a| SocketAddrV4::new(a, target)),
                );
            }
        }
        endpoints.sort();
        endpoints.dedup();
        proxied.push(ProxiedPort {
            ip,
            protocol,
            port,
            endpoints,
        });
    }
    proxied
}

/// The ports of a Service object (none without an IPv4 ClusterIP).
pub fn of_service(service: &Service, slices: &[&EndpointSlice]) -> Vec<ProxiedPort> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    let Some(ip) = spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok()) else {
        return Vec::new();
    };
    let ports: Vec<PortSpec> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| PortSpec {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
            port: p.port,
        })
        .collect();
    proxied(ip, &ports, slices)
}

/// The whole table, replacing the previous one in one transaction. What reaches the service
/// range without being DNATed (a port without endpoints, an address no Service has) is
/// rejected at once, with a TCP reset for TCP: a client that raced the rules retries at
/// once instead of waiting for its connect timeout (an ICMP error is rate-limited).
pub fn ruleset(ports: &[ProxiedPort], service_range: Ipv4Net) -> String {
    let mut jumps = String::new();
    let mut rejects = String::new();
    let mut chains = String::new();
    for (index, port) in ports.iter().enumerate() {
        let matches = format!("ip daddr {} {} dport {}", port.ip, port.protocol, port.port);
        if port.endpoints.is_empty() {
            let reject = match port.protocol {
                "tcp" => "reject with tcp reset",
                _ => "reject",
            };
            let _ = writeln!(rejects, "\t\t{matches} {reject}");
            continue;
        }
        let _ = writeln!(jumps, "\t\t{matches} jump svc{index}");
        let map: Vec<String> = (0..port.endpoints.len())
            .map(|e| format!("{e} : jump svc{index}ep{e}"))
            .collect();
        let _ = writeln!(
            chains,
            "\tchain svc{index} {{\n\t\tnumgen random mod {} vmap {{ {} }}\n\t}}",
            port.endpoints.len(),
            map.join(", ")
        );
        for (e, endpoint) in port.endpoints.iter().enumerate() {
            let _ = writeln!(
                chains,
                "\tchain svc{index}ep{e} {{\n\t\tmeta l4proto {} dnat to {endpoint}\n\t}}",
                port.protocol
            );
        }
    }
    let _ = writeln!(
        rejects,
        "\t\tip daddr {service_range} meta l4proto tcp reject with tcp reset\n\t\tip daddr {service_range} reject"
    );
    let nat = |hook: &str| {
        format!(
            "\tchain {hook} {{\n\t\ttype nat hook {hook} priority -100; policy accept;\n{jumps}\t}}\n"
        )
    };
    let filter = |hook: &str| {
        format!(
            "\tchain reject_{hook} {{\n\t\ttype filter hook {hook} priority filter; policy accept;\n{rejects}\t}}\n"
        )
    };
    format!(
        "table ip {TABLE}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n{}{}{}{}{chains}}}\n",
        nat("prerouting"),
        nat("output"),
        filter("forward"),
        filter("output"),
    )
}

/// Loads `ruleset` with `nft -f -` inside namespace `ns`.
pub fn apply(ns: &str, ruleset: &str) -> Result<(), String> {
    let mut child = netns::command_in(ns, "nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(ruleset.as_bytes())
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `kubetun-lab kube-proxy`: follows the derived Services (labelled
/// `net.kubetun.io/service-import`) and kubetun's EndpointSlices of the cluster `client`
/// talks to, and keeps the rules of every namespace in `namespaces` in step (the cluster's
/// service range is `service_range`). Runs until killed; a failed write is retried on the
/// next change.
pub async fn follow(
    client: kube::Client,
    service_range: Ipv4Net,
    namespaces: &[String],
) -> Result<(), LabError> {
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let service_events = reflector(
        services_writer,
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default().labels(DERIVED_FOR_LABEL),
        ),
    )
    .default_backoff()
    .map(|_| ());
    let slice_events = reflector(
        slices_writer,
        watcher(
            Api::<EndpointSlice>::all(client),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
        ),
    )
    .default_backoff()
    .map(|_| ());
    let mut events = std::pin::pin!(futures::stream::select(service_events, slice_events));
    let mut applied: Option<String> = None;
    while events.next().await.is_some() {
        // Let the rest of a burst (a Service and its slices) arrive first.
        tokio::time::sleep(Duration::from_millis(10)).await;
        while let Some(Some(())) = futures::FutureExt::now_or_never(events.next()) {}
        let mut by_service: BTreeMap<(String, String), Vec<std::sync::Arc<EndpointSlice>>> =
            BTreeMap::new();
        for slice in slices.state() {
            let owner = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(KUBE_SERVICE_NAME_LABEL));
            if let (Some(namespace), Some(owner)) = (&slice.metadata.namespace, owner) {
                by_service
                    .entry((namespace.clone(), owner.clone()))
                    .or_default()
                    .push(slice.clone());
            }
        }
        let mut ports = Vec::new();
        for service in services.state() {
            let key = (
                service.metadata.namespace.clone().unwrap_or_default(),
                service.metadata.name.clone().unwrap_or_default(),
            );
            let slices: Vec<&EndpointSlice> = by_service
                .get(&key)
                .into_iter()
                .flatten()
                .map(|s| &**s)
                .collect();
            ports.extend(of_service(&service, &slices));
        }
        ports.sort();
        let rules = ruleset(&ports, service_range);
        if applied.as_ref() == Some(&rules) {
            continue;
        }
        let mut failed = false;
        for ns in namespaces {
            if let Err(message) = apply(ns, &rules) {
                eprintln!("kube-proxy: {message}");
                failed = true;
            }
        }
        if !failed {
            eprintln!("kube-proxy: {} Service ports programmed", ports.len());
            applied = Some(rules);
        }
    }
    Err(LabError::Internal("the watches ended".to_owned()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    use super::*;

    fn slice(addresses: &[(&str, bool)], port: i32) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(port),
                ..EndpointPort::default()
            }]),
            endpoints: Some(
                addresses
                    .iter()
                    .map(|(a, ready)| Endpoint {
                        addresses: vec![(*a).into()],
                        conditions: Some(EndpointConditions {
                            ready: Some(*ready),
                            ..EndpointConditions::default()
                        }),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
            ..EndpointSlice::default()
        }
    }

    fn range() -> Ipv4Net {
        "10.96.0.0/12".parse().unwrap()
    }

    fn http() -> Vec<PortSpec> {
        vec![PortSpec {
            name: Some("http".into()),
            protocol: "TCP".into(),
            port: 80,
        }]
    }

    #[test]
    fn ready_endpoints_of_every_slice_serve_the_port_by_name() {
        let ip = Ipv4Addr::new(10, 96, 0, 100);
        let (a, b) = (
            slice(&[("10.71.0.11", true), ("10.71.0.12", false)], 8080),
            slice(&[("10.72.0.11", true)], 8081),
        );
        let ports = proxied(ip, &http(), &[&a, &b]);
        assert_eq!(
            ports,
            vec![ProxiedPort {
                ip,
                protocol: "tcp",
                port: 80,
                endpoints: vec![
                    "10.71.0.11:8080".parse().unwrap(),
                    "10.72.0.11:8081".parse().unwrap()
                ],
            }]
        );
        let rules = ruleset(&ports, range());
        assert!(
            rules.contains("ip daddr 10.96.0.100 tcp dport 80 jump svc0"),
            "{rules}"
        );
        assert!(rules.contains("numgen random mod 2 vmap { 0 : jump svc0ep0, 1 : jump svc0ep1 }"));
        assert!(rules.contains("dnat to 10.72.0.11:8081"));
        assert!(!rules.contains("tcp dport 80 reject"));
        assert!(rules.contains("ip daddr 10.96.0.0/12 meta l4proto tcp reject with tcp reset"));
    }

    #[test]
    fn a_port_without_endpoints_is_rejected_and_a_nameless_one_matches_nothing_named() {
        let ip = Ipv4Addr::new(10, 96, 0, 100);
        let nameless = [PortSpec {
            name: None,
            protocol: "TCP".into(),
            port: 80,
        }];
        let ports = proxied(ip, &nameless, &[&slice(&[("10.71.0.11", true)], 8080)]);
        assert!(ports[0].endpoints.is_empty());
        let rules = ruleset(&ports, range());
        assert!(rules.contains("ip daddr 10.96.0.100 tcp dport 80 reject with tcp reset"));
        assert!(!rules.contains("jump svc0"));
    }

    #[test]
    fn the_rules_load_into_nftables() {
        if !netns::require_root("the_rules_load_into_nftables") {
            return;
        }
        let ns = netns::Netns::new("kt-proxy-rules").expect("namespace");
        let ports = proxied(
            Ipv4Addr::new(10, 96, 0, 100),
            &http(),
            &[&slice(&[("10.71.0.11", true), ("10.72.0.11", true)], 8080)],
        );
        for rules in [
            ruleset(&ports, range()),
            ruleset(&ports, range()),
            ruleset(&[], range()),
        ] {
            apply(ns.name(), &rules).expect("loads, also over itself");
        }
    }
}
