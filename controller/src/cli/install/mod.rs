//! `kubetun install` and `kubetun uninstall`: from a kubeconfig to a running kubetun and back.
//! Install reads the cluster's ranges and endpoint (`detect`), fills them into the objects of
//! `deploy/` (`manifests`, embedded in the binary, composed as kustomize does) and applies
//! those by server-side apply, or prints them (`--dry-run`). Re-running it upgrades in place;
//! it touches nothing but the manifests' objects (no key Secret, no link). Uninstall removes
//! the manifests' objects and every kubetun object and Secret of the cluster (`apply`).

mod apply;
pub mod detect;
pub mod manifests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::Value;

use super::{Error, KubeconfigSource, parse_duration};
use crate::cluster_info::DEFAULT_NAMESPACE;
use manifests::{Components, DEFAULT_IMAGE};

/// Field manager of everything `kubetun install` applies.
pub const FIELD_MANAGER: &str = "kubetun";

/// `kubetun install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Kubeconfig of the cluster (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Stable unique id of this cluster (default: the installed one; required on a first install).
    #[arg(long)]
    pub cluster_id: Option<String>,
    /// Human readable name (default: the id).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// This cluster is the hub: its controller runs the ShortcutConnection operator.
    #[arg(long)]
    pub hub: bool,
    /// Add deploy/hub (net.ipv4.ip_forward=1 in the gateway pod, for transit shortcuts; the
    /// kubelets must allow that sysctl).
    #[arg(long)]
    pub hub_forwarding: bool,
    /// Replicated gateways: add the components deploy/ha and deploy/agent/ha.
    #[arg(long)]
    pub ha: bool,
    /// Address peers reach the gateway at (default: the gateway Service's load balancer,
    /// else its NodePort on a node).
    #[arg(long)]
    pub endpoint_address: Option<String>,
    /// UDP port peers reach the gateway at (with --endpoint-address; default 51820).
    #[arg(long)]
    pub endpoint_port: Option<u16>,
    /// Pod CIDRs (default: covering the Nodes' spec.podCIDRs).
    #[arg(long, value_delimiter = ',')]
    pub pod_cidr: Vec<IpNet>,
    /// Service CIDRs (default: the ServiceCIDR objects, else inferred from the kubernetes Service).
    #[arg(long, value_delimiter = ',')]
    pub service_cidr: Vec<IpNet>,
    /// External CIDRs reachable through this cluster (default: none).
    #[arg(long, value_delimiter = ',')]
    pub external_cidr: Vec<IpNet>,
    /// Further ranges IPAM must never hand out, added to the detected node subnets.
    #[arg(long, value_delimiter = ',')]
    pub reserved: Vec<IpNet>,
    /// The image of the gateway, controller and route agent containers.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Wait until the gateway Deployment and the route agent DaemonSet are Ready
    /// (`--wait=false` does not).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub wait: bool,
    /// Upper bound of --wait (e.g. 90s, 5m).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print the manifests instead of applying them (GitOps).
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

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |error| Error::Api {
        cluster: "local".into(),
        action,
        error: Box::new(error),
    }
}

/// Runs `kubetun install`.
pub async fn run_install(args: InstallArgs) -> Result<(), Error> {
    let started = Instant::now();
    let client = source(&args.kubeconfig, &args.context)
        .client("local")
        .await?;
    let components = Components {
        ha: args.ha,
        hub_forwarding: args.hub_forwarding,
    };
    let mut objects = manifests::render(components).map_err(|e| Error::Usage(e.to_string()))?;
    // Detection goes to stderr with --dry-run, so that stdout is the YAML alone.
    let say = |line: String| {
        if args.dry_run {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };

    let detected = detect::detect(&client, &args.pod_cidr, &args.service_cidr)
        .await
        .map_err(api_error("read the cluster's Nodes and Services"))?;
    for fact in &detected.facts {
        say(format!("detected {fact}"));
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

    // What is installed already: the cluster id stays.
    let installed = Api::<ConfigMap>::namespaced(client.clone(), DEFAULT_NAMESPACE)
        .get_opt(manifests::CONFIG_MAP)
        .await
        .map_err(api_error("read the installed configuration"))?
        .and_then(|c| c.data)
        .unwrap_or_default();
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
            return Err(Error::Usage(
                "pass --cluster-id (a stable unique name for this cluster, e.g. rome)".into(),
            ));
        }
    };

    // The endpoint.
    let endpoint = if args.ha {
        say("endpoint: each replica's node address (status.hostIP, --ha)".into());
        None
    } else if let Some(address) = &args.endpoint_address {
        let port = args.endpoint_port.unwrap_or(51820);
        say(format!("endpoint: {address}:{port} (--endpoint-address)"));
        Some((address.clone(), port))
    } else {
        let found = match detect::endpoint(&client, DEFAULT_NAMESPACE, manifests::GATEWAY)
            .await
            .map_err(api_error("read Service kubetun-gateway"))?
        {
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
                detect::endpoint(&client, DEFAULT_NAMESPACE, manifests::GATEWAY)
                    .await
                    .map_err(api_error("read Service kubetun-gateway"))?
            }
            None => None,
        };
        let Some((address, port, why)) = found else {
            return Err(Error::Usage(
                "no endpoint address: Service kubetun-gateway has no load balancer address and no \
                 NodePort on a node with an address; pass --endpoint-address"
                    .into(),
            ));
        };
        say(format!("detected endpoint: {address}:{port} ({why})"));
        Some((address, port))
    };

    let mut reserved = detected.node_subnets.clone();
    reserved.extend(args.reserved.iter().copied());
    let mut settings = BTreeMap::from([
        ("KUBETUN_CLUSTER_ID".to_owned(), cluster_id.clone()),
        (
            "KUBETUN_CLUSTER_NAME".to_owned(),
            args.cluster_name
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
            detect::join(&args.external_cidr),
        ),
        ("KUBETUN_RESERVED".to_owned(), detect::join(&reserved)),
        ("KUBETUN_HUB".to_owned(), args.hub.to_string()),
    ]);
    if let Some((address, port)) = endpoint {
        settings.insert("KUBETUN_ENDPOINT_ADDRESS".into(), address);
        settings.insert("KUBETUN_ENDPOINT_PORT".into(), port.to_string());
    }
    manifests::configure(&mut objects, &settings, &args.image);

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
        args.image,
        started.elapsed().as_secs_f64()
    );
    if args.wait {
        apply::wait_ready(&client, args.timeout).await?;
    }
    Ok(())
}

/// Runs `kubetun uninstall`.
pub async fn run_uninstall(args: UninstallArgs) -> Result<(), Error> {
    let client = source(&args.kubeconfig, &args.context)
        .client("local")
        .await?;
    apply::uninstall(&client, args.force, args.timeout).await
}
