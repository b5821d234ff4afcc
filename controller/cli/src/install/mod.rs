//! `kubetun install` and `kubetun uninstall`: from a kubeconfig to a running kubetun and back.
//! Install reads the cluster's ranges and endpoint (`detect`), fills them into the objects of
//! `deploy/` (`manifests`, embedded in the binary, composed as kustomize does) and applies
//! those by server-side apply, or prints them (`--dry-run`). Re-running it upgrades in place;
//! it touches nothing but the manifests' objects (no key Secret, no link). Uninstall removes
//! the manifests' objects and every kubetun object and Secret of the cluster (`apply`).

mod apply;
pub mod detect;
pub mod flags;
pub mod isolation;
pub mod manifests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kubetun_crds::Isolation;
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use serde_json::Value;

use super::{Error, KubeconfigSource, local_api_error as api_error, parse_duration};
use flags::{Cidrs, NodeSelector, Settings, parse_cidrs, parse_node_selector};
use manifests::{Components, DEFAULT_IMAGE};

/// `kubetun install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Kubeconfig of the cluster (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Stable unique id of this cluster (default: the installed one; required on a first
    /// install).
    #[arg(long)]
    pub cluster_id: Option<String>,
    /// Human readable name (default: the id).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// This cluster is the hub: its controller runs the ShortcutConnection operator
    /// (`--hub=false` turns it off).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub hub: Option<bool>,
    /// Add deploy/hub (net.ipv4.ip_forward=1 in the gateway pod, for transit shortcuts; the
    /// kubelets must allow that sysctl).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub hub_forwarding: Option<bool>,
    /// Replicated gateways: add the components deploy/ha and deploy/agent/ha.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub ha: Option<bool>,
    /// The cluster's default isolation of its links (a link can set its own with `kubetun
    /// network connect --isolation`): `exported`, a peer reaches only the endpoints of the
    /// Services exported to it and the replies to connections this cluster opened; `open`,
    /// every pod and external address, as before. Default: the installed value; `exported`
    /// on a new install; `open` on a cluster installed before the setting existed.
    #[arg(long, value_name = "open|exported", value_parser = isolation::parse_isolation)]
    pub isolation: Option<Isolation>,
    /// Labels a node must have to run the gateway pod(s): the pod template's nodeSelector,
    /// e.g. kubetun.io/gateway=true (the route agents stay on every node; "" clears it).
    #[arg(long, value_name = "KEY=VALUE[,KEY=VALUE...]", value_parser = parse_node_selector)]
    pub gateway_node_selector: Option<NodeSelector>,
    /// Address peers reach the gateway at (default: the gateway Service's load balancer,
    /// else its NodePort on the gateway pod's node).
    #[arg(long)]
    pub endpoint_address: Option<String>,
    /// UDP port peers reach the gateway at (with --endpoint-address; default 51820).
    #[arg(long)]
    pub endpoint_port: Option<u16>,
    /// Pod CIDRs, comma-separated (default: covering the Nodes' spec.podCIDRs).
    #[arg(long, value_parser = parse_cidrs)]
    pub pod_cidr: Option<Cidrs>,
    /// Service CIDRs (default: the ServiceCIDR objects, else inferred from the kubernetes
    /// Service).
    #[arg(long, value_parser = parse_cidrs)]
    pub service_cidr: Option<Cidrs>,
    /// External CIDRs reachable through this cluster (default: none).
    #[arg(long, value_parser = parse_cidrs)]
    pub external_cidr: Option<Cidrs>,
    /// Further ranges IPAM must never hand out, added to the detected node subnets.
    #[arg(long, value_parser = parse_cidrs)]
    pub reserved: Option<Cidrs>,
    /// The image of the gateway, controller and route agent containers (default:
    /// ghcr.io/kubetun/kubetun:latest).
    #[arg(long)]
    pub image: Option<String>,
    /// Wait until the gateway Deployment and the route agent DaemonSet are Ready
    /// (`--wait=false` does not).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub wait: bool,
    /// Upper bound of --wait (e.g. 90s, 5m).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print the manifests instead of applying them (GitOps). Flags not given are taken from
    /// the last install, as on a real install.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format of --dry-run.
    #[arg(long, short = 'o', value_parser = ["yaml"], default_value = "yaml")]
    pub output: String,
}

/// `kubetun uninstall`.
#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// Kubeconfig of the cluster (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Uninstall even while links exist (their peers keep this cluster's NetworkConfigs
    /// until they disconnect).
    #[arg(long)]
    pub force: bool,
    /// How long to wait for the deleted objects to be gone.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
}

fn source(kubeconfig: &Option<PathBuf>, context: &Option<String>) -> KubeconfigSource {
    KubeconfigSource {
        path: kubeconfig.clone(),
        context: context.clone(),
    }
}

/// Runs `kubetun install`.
pub async fn run_install(args: InstallArgs) -> Result<(), Error> {
    let started = Instant::now();
    let client = source(&args.kubeconfig, &args.context)
        .client("local")
        .await?;
    // Detection goes to stderr with --dry-run, so that stdout is the YAML alone.
    let say = |line: String| {
        if args.dry_run {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };

    // What is installed already: the cluster id stays, flags not given are the recorded ones.
    let installed = Api::<ConfigMap>::namespaced(client.clone(), DEFAULT_NAMESPACE)
        .get_opt(manifests::CONFIG_MAP)
        .await
        .map_err(api_error("read the installed configuration"))?;
    let reinstall = installed.is_some();
    let installed = installed.unwrap_or_default();
    let recorded = Settings::from_json(
        installed
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(flags::SETTINGS_ANNOTATION)),
    );
    let (settings, kept) = args.given().or_recorded(&recorded);
    if !kept.is_empty() {
        say(format!(
            "kept from the last install: {} (pass them to change them)",
            kept.join(", ")
        ));
    }
    let installed = installed.data.unwrap_or_default();
    let ha = settings.ha.unwrap_or(false);
    let image = settings
        .image
        .clone()
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned());
    let components = Components {
        ha,
        hub_forwarding: settings.hub_forwarding.unwrap_or(false),
    };
    let mut objects = manifests::render(components).map_err(|e| Error::Usage(e.to_string()))?;
    let gateway_nodes = settings.gateway_node_selector.clone().unwrap_or_default().0;
    manifests::place_gateway(&mut objects, &gateway_nodes);
    // The MCS API's CRDs: kubetun's own, unless the cluster serves them already.
    let foreign = apply::foreign_mcs_crds(&client).await?;
    if !foreign.is_empty() {
        say(format!(
            "using the Multi-Cluster Services API CRDs the cluster has ({}); not replacing them",
            foreign.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
        objects.retain(|o| !apply::is_foreign(o, &foreign));
    }
    let cidrs = |c: &Option<Cidrs>| c.as_ref().map(|c| c.0.clone()).unwrap_or_default();

    let detected = detect::detect(
        &client,
        &cidrs(&settings.pod_cidr),
        &cidrs(&settings.service_cidr),
    )
    .await
    .map_err(api_error("read the cluster's Nodes and Services"))?;
    for fact in &detected.facts {
        say(format!("detected {fact}"));
    }
    if !gateway_nodes.is_empty() {
        let nodes = detect::gateway_nodes(&client, &gateway_nodes, gateway_replicas(&objects))
            .await
            .map_err(api_error("read the cluster's Nodes"))?;
        say(format!("detected {nodes}"));
    }
    if detected.pod_cidrs.is_empty() {
        return Err(Error::Usage(
            "no pod CIDR: no Node has spec.podCIDRs; pass --pod-cidr".into(),
        ));
    }
    if detected.service_cidrs.is_empty() {
        return Err(Error::Usage(
            "no service CIDR detected; pass --service-cidr".into(),
        ));
    }
    detect::check_overlaps(&[
        ("pod CIDR", &detected.pod_cidrs),
        ("service CIDR", &detected.service_cidrs),
        ("node subnet", &detected.node_subnets),
    ])
    .map_err(|e| Error::Usage(format!("cannot install: {e}")))?;

    let cluster_id = match (&args.cluster_id, installed.get("KUBETUN_CLUSTER_ID")) {
        (Some(id), Some(old)) if id != old => {
            return Err(Error::Usage(format!(
                "this cluster is installed with cluster id {old:?}; changing it to {id:?} would \
                 break its links: uninstall first"
            )));
        }
        (Some(id), _) => id.clone(),
        (None, Some(old)) => {
            say(format!("cluster id: {old} (the installed one)"));
            old.clone()
        }
        (None, None) => {
            // As subctl does: the kubeconfig context's cluster name, made a DNS label.
            let named = source(&args.kubeconfig, &args.context).context_cluster();
            match named.as_deref().and_then(cluster_id_from) {
                Some(id) => {
                    say(format!(
                        "cluster id: {id} (from the kubeconfig context's cluster {:?}; it is kept \
                         by every later install: pass --cluster-id on the first one to choose \
                         another)",
                        named.unwrap_or_default()
                    ));
                    id
                }
                None => {
                    return Err(Error::Usage(
                        "pass --cluster-id (a stable unique name for this cluster, e.g. rome): \
                         the kubeconfig's context names no cluster to take it from"
                            .into(),
                    ));
                }
            }
        }
    };

    let (default_isolation, why) =
        isolation::choose(args.isolation, reinstall.then_some(&installed)).map_err(Error::Usage)?;
    say(why);

    // The endpoint.
    let endpoint = if ha {
        say("endpoint: each replica's node address (status.hostIP, --ha)".into());
        None
    } else if let Some(address) = &settings.endpoint_address {
        let port = settings.endpoint_port.unwrap_or(51820);
        say(format!("endpoint: {address}:{port} (--endpoint-address)"));
        Some(detect::GatewayEndpoint {
            address: address.clone(),
            port,
            why: "--endpoint-address".into(),
            node_port: false,
        })
    } else {
        let found = match gateway_endpoint(&client, &gateway_nodes).await? {
            Some(found) => Some(found),
            None if !args.dry_run => {
                // A first install: the Service first, to read its address or NodePort.
                let service: Vec<Value> = objects
                    .iter()
                    .filter(|o| {
                        let (_, kind, _, name) = manifests::identity(o);
                        kind == "Namespace" || (kind == "Service" && name == manifests::GATEWAY)
                    })
                    .cloned()
                    .collect();
                apply::apply_all(&client, &service, |_| {}).await?;
                gateway_endpoint(&client, &gateway_nodes).await?
            }
            None => None,
        };
        let Some(found) = found else {
            return Err(Error::Usage(
                "no endpoint address: Service kubetun-gateway has no load balancer address and no \
                 NodePort on a node with an address; pass --endpoint-address"
                    .into(),
            ));
        };
        say(format!(
            "detected endpoint: {}:{} ({})",
            found.address, found.port, found.why
        ));
        Some(found)
    };

    let mut reserved = detected.node_subnets.clone();
    reserved.extend(cidrs(&settings.reserved));
    let mut data = BTreeMap::from([
        ("KUBETUN_CLUSTER_ID".to_owned(), cluster_id.clone()),
        (
            "KUBETUN_CLUSTER_NAME".to_owned(),
            settings
                .cluster_name
                .clone()
                .unwrap_or_else(|| cluster_id.clone()),
        ),
        (
            "KUBETUN_POD_CIDR".to_owned(),
            detect::join(&detected.pod_cidrs),
        ),
        (
            "KUBETUN_SERVICE_CIDR".to_owned(),
            detect::join(&detected.service_cidrs),
        ),
        (
            "KUBETUN_EXTERNAL_CIDR".to_owned(),
            detect::join(&cidrs(&settings.external_cidr)),
        ),
        ("KUBETUN_RESERVED".to_owned(), detect::join(&reserved)),
        (
            "KUBETUN_HUB".to_owned(),
            settings.hub.unwrap_or(false).to_string(),
        ),
        (
            isolation::ISOLATION_KEY.to_owned(),
            default_isolation.to_string(),
        ),
    ]);
    if let Some(found) = &endpoint {
        set_endpoint(&mut data, found);
    }
    manifests::configure(&mut objects, &data, &image, &settings.to_json());

    if args.dry_run {
        let yaml = manifests::to_yaml(&objects).map_err(|e| Error::Usage(e.to_string()))?;
        print!("{yaml}");
        return Ok(());
    }
    apply::apply_all(&client, &objects, |line| println!("{line}")).await?;
    apply::prune(&client, &objects, |line| println!("{line}")).await?;
    println!(
        "installed kubetun ({} objects, image {}) in {:.1}s",
        objects.len(),
        image,
        started.elapsed().as_secs_f64()
    );
    if args.wait {
        apply::wait_ready(&client, args.timeout).await?;
        // A NodePort endpoint was a guess made before the gateway pod ran (or before the
        // load balancer had an address): look again now that it is Ready.
        let mut published = endpoint;
        let mut updates = 0;
        while let Some(old) = published.as_ref().filter(|e| e.node_port) {
            let Some(found) = gateway_endpoint(&client, &gateway_nodes).await? else {
                break;
            };
            if (&found.address, found.port) == (&old.address, old.port) {
                break;
            }
            if updates == MAX_ENDPOINT_UPDATES {
                println!(
                    "warning: the endpoint moved again, to {}:{} ({}); the published one stays \
                     {}:{}: pin the gateway pod to one node with --gateway-node-selector, or pass \
                     --endpoint-address",
                    found.address, found.port, found.why, old.address, old.port
                );
                break;
            }
            updates += 1;
            println!(
                "detected endpoint, now that the gateway is Ready: {}:{} ({}); updating \
                 ConfigMap {}",
                found.address,
                found.port,
                found.why,
                manifests::CONFIG_MAP
            );
            set_endpoint(&mut data, &found);
            // The config hash changes with it, which restarts the gateway pod on the new
            // configuration (the controller reads it only at start).
            manifests::configure(&mut objects, &data, &image, &settings.to_json());
            let changed: Vec<Value> = objects
                .iter()
                .filter(|o| {
                    let (_, kind, _, name) = manifests::identity(o);
                    (kind == "ConfigMap" && name == manifests::CONFIG_MAP)
                        || (kind == "Deployment" && name == manifests::GATEWAY)
                })
                .cloned()
                .collect();
            apply::apply_all(&client, &changed, |line| println!("{line}")).await?;
            apply::wait_ready(&client, args.timeout).await?;
            published = Some(found);
        }
    }
    Ok(())
}

/// How often `--wait` republishes a NodePort endpoint that moved (each restarts the gateway
/// pod, which may land on yet another node).
const MAX_ENDPOINT_UPDATES: usize = 2;

/// The endpoint's entries of the controller's ConfigMap.
fn set_endpoint(data: &mut BTreeMap<String, String>, endpoint: &detect::GatewayEndpoint) {
    data.insert("KUBETUN_ENDPOINT_ADDRESS".into(), endpoint.address.clone());
    data.insert("KUBETUN_ENDPOINT_PORT".into(), endpoint.port.to_string());
}

/// The replicas of the gateway Deployment (2 with `--ha`).
fn gateway_replicas(objects: &[Value]) -> usize {
    objects
        .iter()
        .find(|o| {
            let (_, kind, _, name) = manifests::identity(o);
            kind == "Deployment" && name == manifests::GATEWAY
        })
        .and_then(|o| o.pointer("/spec/replicas"))
        .and_then(Value::as_u64)
        .map_or(1, |r| usize::try_from(r).unwrap_or(usize::MAX))
}

impl InstallArgs {
    /// The settings flags given on this command line.
    fn given(&self) -> Settings {
        Settings {
            cluster_name: self.cluster_name.clone(),
            hub: self.hub,
            hub_forwarding: self.hub_forwarding,
            ha: self.ha,
            endpoint_address: self.endpoint_address.clone(),
            endpoint_port: self.endpoint_port,
            pod_cidr: self.pod_cidr.clone(),
            service_cidr: self.service_cidr.clone(),
            external_cidr: self.external_cidr.clone(),
            reserved: self.reserved.clone(),
            image: self.image.clone(),
            gateway_node_selector: self.gateway_node_selector.clone(),
        }
    }
}

/// Runs `kubetun uninstall`.
pub async fn run_uninstall(args: UninstallArgs) -> Result<(), Error> {
    let client = source(&args.kubeconfig, &args.context)
        .client("local")
        .await?;
    apply::uninstall(&client, args.force, args.timeout).await
}

/// A cluster id (an RFC 1123 label: lower-case letters, digits and `-`, at most 63, starting
/// and ending alphanumeric) made from a kubeconfig's cluster name, `None` when nothing is left.
fn cluster_id_from(name: &str) -> Option<String> {
    let mut id = String::new();
    for c in name.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            id.push(c);
        } else if !id.ends_with('-') {
            id.push('-');
        }
    }
    let id: String = id.trim_matches('-').chars().take(63).collect();
    let id = id.trim_end_matches('-').to_owned();
    (!id.is_empty()).then_some(id)
}

/// Where peers reach the gateway as the cluster says now ([`detect::endpoint`] for kubetun's
/// gateway Service).
async fn gateway_endpoint(
    client: &kube::Client,
    gateway_nodes: &std::collections::BTreeMap<String, String>,
) -> Result<Option<detect::GatewayEndpoint>, Error> {
    detect::endpoint(client, DEFAULT_NAMESPACE, manifests::GATEWAY, gateway_nodes)
        .await
        .map_err(api_error("read Service kubetun-gateway"))
}

#[cfg(test)]
mod cluster_id_tests {
    use super::cluster_id_from;

    #[test]
    fn a_kubeconfig_cluster_name_becomes_a_dns_label() {
        assert_eq!(cluster_id_from("rome").as_deref(), Some("rome"));
        assert_eq!(
            cluster_id_from("kind-Rome_1").as_deref(),
            Some("kind-rome-1")
        );
        assert_eq!(
            cluster_id_from("arn:aws:eks:eu-west-1:123:cluster/prod").as_deref(),
            Some("arn-aws-eks-eu-west-1-123-cluster-prod")
        );
        assert_eq!(cluster_id_from("__").as_deref(), None);
        let long = cluster_id_from(&"a-".repeat(60)).unwrap();
        assert!(long.len() <= 63 && !long.ends_with('-'), "{long}");
    }
}
