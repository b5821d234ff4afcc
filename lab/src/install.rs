//! Installing a lab cluster as a user installs a real one: the Nodes its kubelets would have
//! registered (the lab runs no kubelet, so the lab creates them), then `kubetun install`
//! against the admin kubeconfig, which detects the pod CIDR and the node subnets from those
//! Nodes and the service CIDR from the API server. The controller the lab runs as a host
//! process takes its settings from the ConfigMap install wrote, as the Deployment's
//! `envFrom` gives them to the controller container, plus the few things a host process
//! needs differently ([`controller_args`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kubetun_cli::install::{detect, manifests};

use crate::control_plane::{NAMESPACE, kubetun};
use crate::error::LabError;
use crate::plan::KEEPALIVE_SECONDS;
use crate::state::ClusterState;

/// Field manager of the Nodes the lab registers.
const FIELD_MANAGER: &str = "kubetun-lab";

/// A Node of a lab cluster as its kubelet would register it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabNode {
    pub name: String,
    /// `spec.podCIDRs` (what the node IPAM of kube-controller-manager assigns).
    pub pod_cidr: Ipv4Net,
    /// The `InternalIP` in `status.addresses`.
    pub address: Ipv4Addr,
}

/// The Nodes of a cluster: one per node of a multi-node cluster (its slice of the pod CIDR,
/// its address on the cluster's L2); one for a single gateway namespace (named after it, the
/// whole pod CIDR, the gateway's underlay address).
pub fn lab_nodes(cluster: &ClusterState) -> Vec<LabNode> {
    if cluster.is_multi_node() {
        return cluster
            .nodes
            .iter()
            .map(|n| LabNode {
                name: n.name.clone(),
                pod_cidr: n.pod_cidr,
                address: n.address,
            })
            .collect();
    }
    vec![LabNode {
        name: cluster.namespace.clone(),
        pod_cidr: cluster.pod_cidr,
        address: cluster.underlay_address,
    }]
}

/// Creates (or updates) the cluster's Nodes through the admin client (the addresses are in
/// the status subresource, patched separately), and waits up to 30 s for Service
/// default/kubernetes.
pub async fn register_nodes(
    client: &kube::Client,
    cluster: &ClusterState,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in lab_nodes(cluster) {
        let cidr = node.pod_cidr.to_string();
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {"kubernetes.io/hostname": node.name},
            },
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        });
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        nodes
            .patch(&node.name, &apply, &Patch::Apply(&object))
            .await?;
        // A merge patch replaces the list as a whole (the addresses' merge key, `type`, is
        // not unique in general, which server-side apply refuses).
        let status = serde_json::json!({"status": {"addresses": [
            {"type": "InternalIP", "address": node.address.to_string()},
            {"type": "Hostname", "address": node.name},
        ]}});
        nodes
            .patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
    }
    // The API server makes Service default/kubernetes shortly after it starts (a real
    // cluster has it); install infers the service range from its ClusterIP.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    while services.get_opt("kubernetes").await?.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The arguments of `kubetun install` for a lab cluster: its identity and endpoint (the lab's
/// gateway listens on the underlay, reached directly rather than through a Service), `--hub`
/// on a hub, its external CIDR if it has one, no wait (no kubelet runs the pods). The pod
/// CIDR, the service CIDR and the node subnets are left to detection.
pub fn install_args(
    cluster: &ClusterState,
    kubeconfig: &Path,
    hub: bool,
    underlay: Ipv4Net,
) -> Vec<String> {
    let mut args = vec![
        "install".to_owned(),
        "--kubeconfig".to_owned(),
        kubeconfig.to_string_lossy().into_owned(),
        "--cluster-id".to_owned(),
        cluster.id.clone(),
        "--cluster-name".to_owned(),
        cluster.name.clone(),
        "--endpoint-address".to_owned(),
        cluster.underlay_address.to_string(),
        "--endpoint-port".to_owned(),
        cluster.listen_port.to_string(),
        "--wait=false".to_owned(),
        // Open links, as before isolation existed: the lab checks every pod and external
        // endpoint against every other, and its isolation phase sets each link to `exported`.
        "--isolation".to_owned(),
        "open".to_owned(),
    ];
    if hub {
        args.push("--hub".to_owned());
    }
    if let Some(external) = cluster.external_cidr {
        args.extend(["--external-cidr".to_owned(), external.to_string()]);
    }
    if let Some(underlay) = unreserved_underlay(cluster, underlay) {
        args.extend(["--reserved".to_owned(), underlay.to_string()]);
    }
    args
}

/// IPAM must never hand out the underlay the gateways reach each other over: a view there
/// would route a peer's endpoint into the tunnel. Install reserves the subnets it assumes
/// around the Nodes' InternalIPs, which hold the underlay when the gateway's address is its
/// Node's and the underlay is no wider than that subnet. Otherwise (a multi-node cluster,
/// whose endpoint moves between its nodes like a load-balancer address, or a wider
/// underlay) the underlay is passed with `--reserved`, as a user passes a load-balancer
/// range.
fn unreserved_underlay(cluster: &ClusterState, underlay: Ipv4Net) -> Option<IpNet> {
    let addresses: Vec<IpAddr> = lab_nodes(cluster)
        .iter()
        .map(|n| IpAddr::V4(n.address))
        .collect();
    let underlay = IpNet::V4(underlay);
    let covered = detect::node_subnets(&addresses)
        .iter()
        .any(|subnet| subnet.contains(&underlay));
    (!covered).then_some(underlay)
}

/// The service CIDR of a lab cluster's API server: kubeadm's default, 10.96.0.0/12, unless
/// that overlaps one of the cluster's own ranges (its pod or external CIDR, the underlay, the
/// node network), then the next /12 of 10.0.0.0/8 that does not, else 172.16.0.0/12. As on a
/// real cluster the service range must not overlap the pod range (`kubetun install` refuses
/// that); the topologies with pod CIDR 10.100.0.0/16 get 10.112.0.0/12. `None` when every
/// candidate overlaps.
pub fn service_cidr(cluster: &ClusterState, underlay: Ipv4Net) -> Option<Ipv4Net> {
    let mut taken: Vec<Ipv4Net> = vec![cluster.pod_cidr, underlay];
    taken.extend(cluster.external_cidr);
    if cluster.is_multi_node() {
        taken.push(crate::topology::NODE_NETWORK);
    }
    let first: u8 = 96; // 10.96.0.0/12
    (0..16u8)
        .map(|i| Ipv4Addr::new(10, first.wrapping_add(i << 4), 0, 0))
        .chain([Ipv4Addr::new(172, 16, 0, 0)])
        .map(|network| Ipv4Net::new(network, 12).expect("a /12"))
        .find(|candidate| {
            !taken
                .iter()
                .any(|t| candidate.contains(&t.network()) || t.contains(&candidate.network()))
        })
}

/// What `kubetun install` printed, and how long it took to return.
#[derive(Debug, Clone)]
pub struct Installed {
    pub output: Vec<String>,
    pub took: Duration,
}

/// Runs the `kubetun` binary next to this program with `args`.
pub fn run_install(args: &[String]) -> Result<Installed, LabError> {
    let started = Instant::now();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = kubetun(&args)?;
    Ok(Installed {
        took: started.elapsed(),
        output: stdout.lines().map(str::to_owned).collect(),
    })
}

/// The data of the ConfigMap `kubetun install` wrote (`kubetun-controller-config`).
pub async fn installed_config(
    client: &kube::Client,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    Ok(maps
        .get(manifests::CONFIG_MAP)
        .await?
        .data
        .unwrap_or_default())
}

/// The controller's flags: every `KUBETUN_*` setting of the installed ConfigMap as its flag
/// (each variable is the `env` of the flag of that name, which is how the Deployment's
/// `envFrom` configures the controller container), then what a host process in the lab
/// needs differently from that container.
///
/// A setting that is `"true"` becomes the bare switch and `"false"` none (the switches take
/// no value); an empty one is left out, which the controller reads as the empty variable.
pub fn controller_args(
    config: &BTreeMap<String, String>,
    cluster: &ClusterState,
) -> Result<Vec<String>, LabError> {
    let mut settings = config.clone();
    // The lab's gateway runs with `--grpc-socket` in the lab's state directory; in the pod
    // the controller derives the socket from KUBETUN_GATEWAY_INTERFACE, the gateway
    // container's interface, which the lab's gateway does not use.
    settings.insert(
        "KUBETUN_GATEWAY_SOCKET".into(),
        cluster.grpc_socket.display().to_string(),
    );
    // Keepalives keep the lab's links established while it sits idle between commands, as
    // the in-process lab's plan does (the ConfigMap leaves the default, 25 s).
    settings.insert(
        "KUBETUN_PERSISTENT_KEEPALIVE".into(),
        KEEPALIVE_SECONDS.to_string(),
    );
    // The topology's MTU and port, what the lab's gateway was started with, when they are
    // not what the ConfigMap says (its 1420 and 51820 are deploy/'s defaults).
    for (key, value) in [
        ("KUBETUN_MTU", cluster.mtu.to_string()),
        ("KUBETUN_LISTEN_PORT", cluster.listen_port.to_string()),
    ] {
        if settings.get(key) != Some(&value) {
            settings.insert(key.into(), value);
        }
    }
    // Every lab controller runs in the host's network namespace, where a pod has its own:
    // the clusterset.local DNS server's address (0.0.0.0:5353 in the ConfigMap) would be
    // taken by the first controller only, so the lab serves no DNS.
    if settings.contains_key("KUBETUN_DNS_ADDR") {
        settings.insert("KUBETUN_DNS_ADDR".into(), "0".into());
    }
    // Not taken from the Deployment's own `env`: KUBETUN_NAMESPACE (the pod's namespace,
    // kubetun-system, which is the controller's default) and KUBETUN_METRICS_ADDR (for the
    // same reason as the DNS address; the default serves nothing).
    let mut args = Vec::new();
    for (key, value) in &settings {
        let Some(name) = key.strip_prefix("KUBETUN_") else {
            return Err(LabError::Internal(format!(
                "ConfigMap {} holds {key}, which is no KUBETUN_ setting",
                manifests::CONFIG_MAP
            )));
        };
        let flag = format!("--{}", name.to_ascii_lowercase().replace('_', "-"));
        match value.as_str() {
            "" | "false" => {}
            "true" => args.push(flag),
            value => args.push(format!("{flag}={value}")),
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NodeState;

    fn cluster() -> ClusterState {
        let text = serde_json::json!({
            "name": "Rome", "id": "rome", "namespace": "t1-rome-gw", "interface": "t1-kt-rome",
            "grpcSocket": "/run/x/t1-kt-rome.grpc.sock",
            "uapiSocket": "/var/run/wireguard/t1-kt-rome.sock", "log": "/run/x/t1-kt-rome.log",
            "underlayAddress": "198.18.0.2", "listenPort": 51820,
            "podCidr": "10.202.0.0/16", "externalCidr": "10.70.0.0/16",
            "pods": [], "externals": [], "mtu": 1420,
        });
        serde_json::from_value(text).expect("a cluster state")
    }

    #[test]
    fn a_single_gateway_cluster_is_one_node_at_its_underlay_address() {
        let rome = cluster();
        assert_eq!(
            lab_nodes(&rome),
            vec![LabNode {
                name: "t1-rome-gw".into(),
                pod_cidr: "10.202.0.0/16".parse().unwrap(),
                address: "198.18.0.2".parse().unwrap(),
            }]
        );
        let underlay = "198.18.0.0/24".parse().unwrap();
        let args = install_args(&rome, Path::new("/k"), false, underlay);
        assert!(!args.contains(&"--reserved".to_owned()), "{args:?}");
        assert!(!args.contains(&"--pod-cidr".to_owned()), "{args:?}");
        assert!(!args.contains(&"--hub".to_owned()), "{args:?}");
        let wide = "198.18.0.0/16".parse().unwrap();
        let args = install_args(&rome, Path::new("/k"), true, wide);
        assert!(args.ends_with(&["--reserved".into(), "198.18.0.0/16".into()]));
        assert!(args.contains(&"--hub".to_owned()), "{args:?}");
    }

    #[test]
    fn a_multi_node_cluster_has_a_node_per_slice_and_reserves_the_underlay() {
        let mut paris = cluster();
        paris.nodes = (0..2u8)
            .map(|i| NodeState {
                name: format!("node{}", i + 1),
                namespace: format!("t1-paris-node{}", i + 1),
                address: Ipv4Addr::new(100, 64, 0, 11 + i),
                pod_cidr: Ipv4Net::new(Ipv4Addr::new(10, 202, 128 * i, 0), 17).unwrap(),
                pods: Vec::new(),
            })
            .collect();
        let nodes = lab_nodes(&paris);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].pod_cidr.to_string(), "10.202.128.0/17");
        assert_eq!(nodes[1].address.to_string(), "100.64.0.12");
        let args = install_args(
            &paris,
            Path::new("/k"),
            false,
            "198.18.0.0/24".parse().unwrap(),
        );
        assert!(args.ends_with(&["--reserved".into(), "198.18.0.0/24".into()]));
    }

    #[test]
    fn the_service_range_avoids_the_cluster_ranges() {
        let mut rome = cluster();
        let underlay = "198.18.0.0/24".parse().unwrap();
        let range = |c: &ClusterState| service_cidr(c, underlay).map(|n| n.to_string());
        assert_eq!(range(&rome).as_deref(), Some("10.96.0.0/12"));
        rome.pod_cidr = "10.100.0.0/16".parse().unwrap();
        assert_eq!(range(&rome).as_deref(), Some("10.112.0.0/12"));
        rome.pod_cidr = "10.0.0.0/8".parse().unwrap();
        assert_eq!(range(&rome).as_deref(), Some("172.16.0.0/12"));
        rome.external_cidr = Some("172.16.0.0/16".parse().unwrap());
        assert_eq!(range(&rome), None);
    }

    #[test]
    fn the_configmap_becomes_flags_with_the_lab_differences() {
        let mut rome = cluster();
        let config: BTreeMap<String, String> = [
            ("KUBETUN_CLUSTER_ID", "rome"),
            ("KUBETUN_POD_CIDR", "10.202.0.0/16"),
            ("KUBETUN_SERVICE_CIDR", "10.96.0.0/12"),
            ("KUBETUN_TUNNEL_ADDRESS", ""),
            ("KUBETUN_HUB", "false"),
            ("KUBETUN_MANAGE_ROUTES", "true"),
            ("KUBETUN_MTU", "1420"),
            ("KUBETUN_LISTEN_PORT", "51820"),
            ("KUBETUN_DNS_ADDR", "0.0.0.0:5353"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let args = controller_args(&config, &rome).unwrap();
        assert_eq!(
            args,
            [
                "--cluster-id=rome",
                "--dns-addr=0",
                "--gateway-socket=/run/x/t1-kt-rome.grpc.sock",
                "--listen-port=51820",
                "--manage-routes",
                "--mtu=1420",
                "--persistent-keepalive=10",
                "--pod-cidr=10.202.0.0/16",
                "--service-cidr=10.96.0.0/12",
            ]
        );
        rome.mtu = 1380;
        let args = controller_args(&config, &rome).unwrap();
        assert!(args.contains(&"--mtu=1380".to_owned()), "{args:?}");
        let mut foreign = config.clone();
        foreign.insert("OTHER".into(), "x".into());
        assert!(controller_args(&foreign, &rome).is_err());
    }
}
