//! Lab clusters with real control planes (`kubetun-lab up --apiserver`): per cluster a real
//! kube-apiserver with etcd ([`kubetun_testenv`]; its service CIDR is kubeadm's
//! 10.96.0.0/12 unless that overlaps the cluster's ranges, see
//! [`super::install::service_cidr`]), the Node objects its kubelets would have registered
//! (created by the lab, which runs no kubelet), kubetun installed with `kubetun install` as
//! a user installs it (the pod CIDR and node subnets detected from those Nodes, the service
//! CIDR from the API server; see [`super::install`]), and a `kubetun-controller` process
//! configured from the ConfigMap install wrote, running as the `kubetun-controller`
//! ServiceAccount (a TokenRequest token, so `deploy/rbac.yaml` as installed is what it may
//! do) against the cluster's gateway. The gateway Deployment and route-agent DaemonSet that
//! install applies never run (no kubelet); the lab runs the gateway and controller itself.
//! Clusters are linked with the `kubetun` CLI as a user links them, the shortcuts through
//! the hub's ShortcutConnection operator, and the TunnelEndpoints the controllers wrote are
//! what the lab's checks read.
//!
//! The same pieces serve the end-to-end tests on real API servers, which add faults (kill
//! -9 of a controller, an API-server restart) to a running lab.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Client, ResourceExt as _};
use kubetun_crds::{TunnelEndpoint, TunnelEndpointSpec};
use kubetun_testenv::{Assets, Lifetime, TestCluster};
use serde::{Deserialize, Serialize};

use super::state::ClusterState;
use super::{LabError, install, say};

/// Namespace of every kubetun object, as in `deploy/`.
pub const NAMESPACE: &str = "kubetun-system";
/// The controller's ServiceAccount in `deploy/rbac.yaml`.
pub const SERVICE_ACCOUNT: &str = "kubetun-controller";
/// Field manager of the manifests [`apply_manifests`] applies.
const FIELD_MANAGER: &str = "kubetun-lab";
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a CLI step (connect, shortcut) may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(90);

/// What the lab keeps about one cluster's control plane (in the state file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneState {
    /// The API server's directory (data, certificates, logs, admin kubeconfig).
    pub dir: PathBuf,
    /// The admin's kubeconfig, what `kubectl` and the CLI use.
    pub kubeconfig: PathBuf,
    /// The controller's kubeconfig (its ServiceAccount's token).
    pub controller_kubeconfig: PathBuf,
    /// The controller's log.
    pub controller_log: PathBuf,
    /// The controller's PID once started.
    #[serde(default)]
    pub controller_pid: Option<u32>,
    /// The controller's arguments, so a test can restart it the same way: the installed
    /// ConfigMap's settings as flags and the lab's own (`install::controller_args`).
    pub controller_args: Vec<String>,
    /// Where the controller serves `clusterset.local` DNS (the cluster the lab's Service is
    /// fetched from; the others serve none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_addr: Option<std::net::SocketAddrV4>,
    /// The PID of the cluster's `kubetun-lab kube-proxy`, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_pid: Option<u32>,
}

/// Starts an API server per cluster (in parallel), then per cluster registers its Nodes,
/// installs kubetun with `kubetun install` and starts the controller with the installed
/// settings (`hubs` are installed with `--hub`; the controller of `dns_server` serves DNS on a
/// veth to its gateway namespace); install's output goes to `out`. `state` is saved by the
/// caller after every cluster so `down` finds every PID.
#[allow(clippy::too_many_arguments)]
pub fn start(
    runtime: &tokio::runtime::Runtime,
    clusters: &mut [ClusterState],
    underlay: Ipv4Net,
    hubs: &[String],
    dns_server: Option<&str>,
    state_dir: &Path,
    out: &mut dyn Write,
    mut save: impl FnMut(&[ClusterState]) -> Result<(), LabError>,
) -> Result<(), LabError> {
    let assets = Assets::find().map_err(|e| LabError::Host(e.to_string()))?;
    let mut starts = Vec::new();
    for cluster in clusters.iter() {
        let service_cidr = install::service_cidr(cluster, underlay).ok_or_else(|| {
            LabError::Usage(format!(
                "{}: no /12 of 10.0.0.0/8 nor 172.16.0.0/12 is free of its ranges for the API \
                 server's service CIDR",
                cluster.name
            ))
        })?;
        let assets = assets.clone();
        let id = cluster.id.clone();
        let dir = state_dir.join("apiserver").join(&cluster.id);
        starts.push(runtime.spawn(async move {
            let service_cidr = service_cidr.to_string();
            let cluster =
                TestCluster::start_in(&assets, &id, &dir, Lifetime::Detached, &service_cidr).await;
            cluster.map(|c| {
                let kubeconfig = c.kubeconfig_path();
                c.detach();
                (dir, kubeconfig)
            })
        }));
    }
    for (cluster, start) in clusters.iter_mut().zip(starts) {
        let (dir, kubeconfig) = runtime
            .block_on(start)
            .map_err(|e| LabError::Internal(e.to_string()))?
            .map_err(|e| LabError::Host(format!("API server of {}: {e}", cluster.name)))?;
        cluster.control_plane = Some(ControlPlaneState {
            // Both written by `install`: the ServiceAccount exists and the ConfigMap holds
            // the controller's settings once kubetun is installed.
            controller_kubeconfig: PathBuf::new(),
            controller_args: Vec::new(),
            controller_log: state_dir.join(format!("{}-controller.log", cluster.id)),
            controller_pid: None,
            dns_addr: None,
            proxy_pid: None,
            dir,
            kubeconfig,
        });
    }
    save(clusters)?;
    for index in 0..clusters.len() {
        let cluster = &clusters[index];
        let hub = hubs.iter().any(|h| h.eq_ignore_ascii_case(&cluster.name));
        let (mut args, controller_kubeconfig) =
            install(runtime, cluster, underlay, hub, state_dir, out)?;
        let dns_addr = if dns_server.is_some_and(|name| name.eq_ignore_ascii_case(&cluster.name)) {
            let addr = super::services::attach_dns(cluster)?;
            for arg in args.iter_mut().filter(|a| a.starts_with("--dns-addr=")) {
                *arg = format!("--dns-addr={addr}");
            }
            Some(addr)
        } else {
            None
        };
        let plane = clusters[index].control_plane.as_mut().expect("set above");
        plane.dns_addr = dns_addr;
        plane.controller_args = args;
        plane.controller_kubeconfig = controller_kubeconfig;
        plane.controller_pid = Some(start_controller(plane)?);
        save(clusters)?;
    }
    for cluster in clusters.iter() {
        runtime.block_on(wait_published(cluster))?;
    }
    Ok(())
}

/// Installs kubetun into a cluster as a user would: registers the Nodes its kubelets would
/// have, runs `kubetun install` (its output into `<state dir>/<id>-install.log`, the
/// detected facts and the time it took into `out`) and waits until the kubetun resources
/// answer. Returns the controller's arguments, from the installed ConfigMap, and a
/// kubeconfig acting as the controller's ServiceAccount (a TokenRequest token).
fn install(
    runtime: &tokio::runtime::Runtime,
    cluster: &ClusterState,
    underlay: Ipv4Net,
    hub: bool,
    state_dir: &Path,
    out: &mut dyn Write,
) -> Result<(Vec<String>, PathBuf), LabError> {
    let name = &cluster.name;
    let plane = plane(cluster)?;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        LabError::Host(format!("API server of {name}: {what}: {e}"))
    };
    let client = runtime
        .block_on(kubetun_testenv::client_for(&plane.kubeconfig))
        .map_err(|e| fail("client", &e))?;
    runtime
        .block_on(install::register_nodes(&client, cluster))
        .map_err(|e| fail("registering the Nodes", &e))?;
    let installed = install::run_install(&install::install_args(
        cluster,
        &plane.kubeconfig,
        hub,
        underlay,
    ))?;
    let log = state_dir.join(format!("{}-install.log", cluster.id));
    std::fs::write(&log, installed.output.join("\n") + "\n").map_err(|error| LabError::Io {
        path: log.clone(),
        error,
    })?;
    // The facts install detected and its summary; the applied objects are in the log.
    for line in installed
        .output
        .iter()
        .filter(|l| !l.starts_with("applied "))
    {
        say(out, &format!("    {name}: {line}"));
    }
    say(
        out,
        &format!(
            "  installed {name} with kubetun install in {:.1}s ({})",
            installed.took.as_secs_f64(),
            log.display()
        ),
    );
    runtime.block_on(async {
        wait_crds_served(&client)
            .await
            .map_err(|e| fail("CRDs", &e))?;
        let config = install::installed_config(&client)
            .await
            .map_err(|e| fail("the installed ConfigMap", &e))?;
        let args = install::controller_args(&config, cluster)?;
        let kubeconfig = TestCluster::attach(&plane.dir)
            .map_err(|e| fail("cluster", &e))?
            .service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)
            .await
            .map_err(|e| fail("ServiceAccount token", &e))?;
        Ok((args, kubeconfig))
    })
}

/// Server-side applies every document of a multi-document YAML, like
/// `kubectl apply --server-side -f`.
pub async fn apply_manifests(client: &Client, yaml: &str) -> Result<(), BoxError> {
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(document)?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_yaml::from_value(value)?;
        let types = object.types.clone().unwrap_or_default();
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (resource, capabilities) = discovery::pinned_kind(client, &gvk).await?;
        let api: Api<DynamicObject> = match (capabilities.scope, object.namespace()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resource),
            (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await?;
    }
    Ok(())
}

/// A CRD is Established well before its resource answers (a 404, then `429` while the
/// storage initialises): wait until every custom resource can be listed (kubetun's, and
/// those of the Multi-Cluster Services API that `kubetun install` adds; the lab's API
/// servers hold no others).
pub async fn wait_crds_served(client: &Client) -> Result<(), kube::Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    for crd in crds.list(&ListParams::default()).await? {
        let version = crd.spec.versions.first().map(|v| v.name.clone());
        let gvk = kube::api::GroupVersionKind::gvk(
            &crd.spec.group,
            version.as_deref().unwrap_or("v1alpha1"),
            &crd.spec.names.kind,
        );
        loop {
            let attempt = async {
                let (resource, _) = discovery::pinned_kind(client, &gvk).await?;
                Api::<DynamicObject>::all_with(client.clone(), &resource)
                    .list(&ListParams::default().limit(1))
                    .await
            };
            match attempt.await {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    Ok(())
}

/// Starts the controller process of a cluster (detached from the lab's process group, so it
/// outlives `kubetun-lab up`); returns its PID.
pub fn start_controller(plane: &ControlPlaneState) -> Result<u32, LabError> {
    let binary = crate::netns::sibling_binary("kubetun-controller");
    let (log, log_err) = super::fabric::open_log(&plane.controller_log)?;
    use std::os::unix::process::CommandExt as _;
    let child = Command::new(&binary)
        .args(&plane.controller_args)
        .arg("--kubeconfig")
        .arg(&plane.controller_kubeconfig)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .spawn()
        .map_err(|error| LabError::Io {
            path: binary.clone(),
            error,
        })?;
    Ok(child.id())
}

/// Stops a controller by PID (only if the PID still runs `kubetun-controller`).
pub fn stop_controller(pid: u32, signal: nix::sys::signal::Signal) -> bool {
    stop_program(pid, "kubetun-controller", None, signal)
}

/// Signals `pid` and waits up to 10 s for it to end, only if it still runs `program` (its
/// `argv[0]` ends so) with `subcommand` as `argv[1]` when given: a PID from a state file may have
/// been reused.
pub fn stop_program(
    pid: u32,
    program: &str,
    subcommand: Option<&str>,
    signal: nix::sys::signal::Signal,
) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut argv = cmdline.split(|b| *b == 0);
    let runs_it = argv
        .next()
        .is_some_and(|argv0| argv0.ends_with(program.as_bytes()))
        && subcommand.is_none_or(|sub| argv.next() == Some(sub.as_bytes()));
    if !runs_it {
        return false;
    }
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let pid = nix::unistd::Pid::from_raw(raw);
    if nix::sys::signal::kill(pid, signal).is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && std::path::Path::new(&format!("/proc/{raw}")).exists() {
        // Reap it when it is our child (tests); otherwise init does.
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Stops a cluster's controller and API server (for `down`).
pub fn stop(plane: &ControlPlaneState) {
    if let Some(pid) = plane.controller_pid {
        stop_controller(pid, nix::sys::signal::Signal::SIGTERM);
    }
    if let Some(pid) = plane.proxy_pid {
        super::services::stop_proxy(pid);
    }
    kubetun_testenv::stop_dir(&plane.dir);
}

/// Waits until the controller published the cluster's info (its ConfigMap), which the
/// connector reads.
async fn wait_published(cluster: &ClusterState) -> Result<(), LabError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let plane = cluster.control_plane.as_ref().expect("started");
    let client = kubetun_testenv::client_for(&plane.kubeconfig)
        .await
        .map_err(|e| LabError::Host(e.to_string()))?;
    let maps: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(_)) = maps
            .get_opt(kubetun_crds::contract::cluster_info::CONFIG_MAP_NAME)
            .await
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LabError::Gateway {
                cluster: cluster.name.clone(),
                message: format!(
                    "the controller did not publish the cluster info within 30 s; its log {} ends with:\n{}",
                    plane.controller_log.display(),
                    super::fabric::log_tail(&plane.controller_log, 10)
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the `kubetun` CLI as a user would; its output on failure is the error.
pub fn kubetun(args: &[&str]) -> Result<String, LabError> {
    let binary = crate::netns::sibling_binary("kubetun");
    let mut child = Command::new(&binary)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| LabError::Io {
            path: binary.clone(),
            error,
        })?;
    let deadline = Instant::now() + CLI_TIMEOUT;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|error| LabError::Io {
        path: binary,
        error,
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Gateway {
            cluster: "kubetun CLI".into(),
            message: format!(
                "`kubetun {}` failed ({}):\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

/// `kubetun network connect` between two lab clusters, waiting until both directions are
/// connected.
pub fn connect(a: &ClusterState, b: &ClusterState) -> Result<String, LabError> {
    let (pa, pb) = (plane(a)?, plane(b)?);
    kubetun(&[
        "network",
        "connect",
        "--kubeconfig",
        &pa.kubeconfig.to_string_lossy(),
        "--remote-kubeconfig",
        &pb.kubeconfig.to_string_lossy(),
        "--wait",
        "--timeout",
        "60s",
    ])
}

/// `kubetun shortcut create` on the hub between two leaves, waiting until it is connected.
pub fn shortcut(
    hub: &ClusterState,
    left: &ClusterState,
    right: &ClusterState,
    flag: Option<&str>,
) -> Result<String, LabError> {
    let (ph, pl, pr) = (plane(hub)?, plane(left)?, plane(right)?);
    let name = format!("{}-{}", left.id, right.id);
    let (hub_k, left_k, right_k) = (
        ph.kubeconfig.to_string_lossy(),
        pl.kubeconfig.to_string_lossy(),
        pr.kubeconfig.to_string_lossy(),
    );
    let mut args = vec![
        "shortcut",
        "create",
        &name,
        "--kubeconfig",
        &hub_k,
        "--left-name",
        &left.id,
        "--left-kubeconfig",
        &left_k,
        "--right-name",
        &right.id,
        "--right-kubeconfig",
        &right_k,
        "--wait",
        "--timeout",
        "60s",
    ];
    args.extend(flag);
    kubetun(&args)
}

pub(crate) fn plane(cluster: &ClusterState) -> Result<&ControlPlaneState, LabError> {
    cluster.control_plane.as_ref().ok_or_else(|| {
        LabError::Usage(format!(
            "{} has no API server (the lab was not started with --apiserver)",
            cluster.name
        ))
    })
}

/// The TunnelEndpoints the controller of `cluster` maintains (what the lab's checks use).
pub async fn tunnel_endpoints(cluster: &ClusterState) -> Result<Vec<TunnelEndpointSpec>, LabError> {
    let plane = plane(cluster)?;
    let client = kubetun_testenv::client_for(&plane.kubeconfig)
        .await
        .map_err(|e| LabError::Host(e.to_string()))?;
    let api: Api<TunnelEndpoint> = Api::namespaced(client, NAMESPACE);
    let mut list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| LabError::Host(format!("{}: listing TunnelEndpoints: {e}", cluster.name)))?
        .items;
    list.sort_by_key(|te| te.spec.cluster.id.clone());
    Ok(list.into_iter().map(|te| te.spec).collect())
}
