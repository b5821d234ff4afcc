//! One cluster's real control plane as the lab drives it once it runs: kubetun's manifests
//! applied and its CRDs served, the `kubetun-controller` process started and stopped, the
//! `kubetun` CLI run against it (connect, shortcut), the TunnelEndpoints the controller wrote.
//! Starting the API servers and installing kubetun is [`crate::apiserver`]'s.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Client, ResourceExt as _};
use kubetun_crds::{TunnelEndpoint, TunnelEndpointSpec};
use serde::Deserialize;

use crate::error::LabError;
use crate::state::{ClusterState, ControlPlaneState};

/// Namespace of every kubetun object, as in `deploy/`.
pub const NAMESPACE: &str = "kubetun-system";
/// The controller's ServiceAccount in `deploy/rbac.yaml`.
pub const SERVICE_ACCOUNT: &str = "kubetun-controller";
/// Field manager of the manifests [`apply_manifests`] applies.
const FIELD_MANAGER: &str = "kubetun-lab";
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a CLI step (connect, shortcut) may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(90);

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
    let binary = crate::options::program("kubetun-controller")?;
    let (log, log_err) = crate::fabric::open_log(&plane.controller_log)?;
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

/// Runs the `kubetun` CLI as a user would; its output on failure is the error.
pub fn kubetun(args: &[&str]) -> Result<String, LabError> {
    let binary = crate::options::program("kubetun")?;
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
pub fn connect(a: &ClusterState, b: &ClusterState, flags: &[&str]) -> Result<String, LabError> {
    let (pa, pb) = (plane(a)?, plane(b)?);
    let (ka, kb) = (
        pa.kubeconfig.to_string_lossy(),
        pb.kubeconfig.to_string_lossy(),
    );
    let mut args = vec![
        "network",
        "connect",
        "--kubeconfig",
        &ka,
        "--remote-kubeconfig",
        &kb,
        "--wait",
        "--timeout",
        "60s",
    ];
    args.extend(flags);
    kubetun(&args)
}

/// `kubetun shortcut create` on the hub between two leaves, waiting until it is connected.
pub fn shortcut(
    hub: &ClusterState,
    left: &ClusterState,
    right: &ClusterState,
    flags: &[&str],
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
    args.extend(flags);
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

/// Stops a `kubetun-lab kube-proxy` by PID (only if that PID still runs one).
pub fn stop_proxy(pid: u32) {
    stop_program(
        pid,
        "kubetun-lab",
        Some("kube-proxy"),
        nix::sys::signal::Signal::SIGKILL,
    );
}
