//! Lab clusters with real control planes (`kubetun-lab up --apiserver`): per cluster a real
//! kube-apiserver with etcd ([`kubetun_testenv`]; its service CIDR is kubeadm's
//! 10.96.0.0/12 unless that overlaps the cluster's ranges, see
//! [`crate::install::service_cidr`]), the Node objects its kubelets would have registered
//! (created by the lab, which runs no kubelet), kubetun installed with `kubetun install` as
//! a user installs it (the pod CIDR and node subnets detected from those Nodes, the service
//! CIDR from the API server; see [`crate::install`]), and a `kubetun-controller` process
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
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use kube::api::Api;
use kubetun_testenv::{Assets, Lifetime, TestCluster};

use crate::control_plane::{
    NAMESPACE, SERVICE_ACCOUNT, plane, start_controller, stop_controller, wait_crds_served,
};
use crate::error::LabError;
use crate::install;
use crate::output::say;
use crate::state::{ClusterState, ControlPlaneState};

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
    // Every start is awaited and every started one recorded before an error is returned, so
    // `down` finds them all (returning at the first failed start left the others running).
    let mut first_error = None;
    for (cluster, start) in clusters.iter_mut().zip(starts) {
        let started = runtime
            .block_on(start)
            .map_err(|e| LabError::Internal(e.to_string()))
            .and_then(|started| {
                started.map_err(|e| LabError::Host(format!("API server of {}: {e}", cluster.name)))
            });
        let (dir, kubeconfig) = match started {
            Ok(started) => started,
            Err(error) => {
                first_error.get_or_insert(error);
                continue;
            }
        };
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
    if let Some(error) = first_error {
        return Err(error);
    }
    for index in 0..clusters.len() {
        let cluster = &clusters[index];
        let hub = hubs.iter().any(|h| h.eq_ignore_ascii_case(&cluster.name));
        let (mut args, controller_kubeconfig) =
            install(runtime, cluster, underlay, hub, state_dir, out)?;
        let dns_addr = if dns_server.is_some_and(|name| name.eq_ignore_ascii_case(&cluster.name)) {
            let addr = crate::dns_link::attach_dns(cluster)?;
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

/// Stops a cluster's controller and API server (for `down`).
pub fn stop(plane: &ControlPlaneState) {
    if let Some(pid) = plane.controller_pid {
        stop_controller(pid, nix::sys::signal::Signal::SIGTERM);
    }
    if let Some(pid) = plane.proxy_pid {
        crate::control_plane::stop_proxy(pid);
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
                    crate::fabric::log_tail(&plane.controller_log, 10)
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
