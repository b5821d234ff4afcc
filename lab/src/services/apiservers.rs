//! Services in a lab with real control planes. The backend Service and its EndpointSlice are
//! objects in the exporters' API servers, exported with `kubetun service export` and imported by
//! the real controllers. The client's controller runs on the host, so it serves DNS on a veth
//! joining the host to the client's gateway namespace ([`crate::dns_link::attach_dns`]); pods reach it at the
//! installed `kubetun-dns` Service's ClusterIP through a DNAT there (the Service has no
//! endpoints: no kubelet runs the controller's pod), and `kubetun-lab kube-proxy` programs the
//! derived Services.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kubetun_crds::contract::services::CONSUMERS_ANNOTATION;
use kubetun_crds::mcs::v1beta1::ServiceExport;
use serde::Serialize;

use super::{objects, proxy};
use crate::control_plane;
use crate::dns_link::NAMESPACE_END;
use crate::error::LabError;
use crate::service_demo::ServiceDemo;
use crate::state::ClusterState;

/// The lab's table for the DNS path in the client's gateway namespace.
const DNS_TABLE: &str = "kubetun_lab_dns";
/// Field manager of what the lab writes.
const FIELD_MANAGER: &str = "kubetun-lab";

async fn apply<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map(drop)
}

async fn client(cluster: &ClusterState) -> Result<kube::Client, LabError> {
    let plane = control_plane::plane(cluster)?;
    kubetun_testenv::client_for(&plane.kubeconfig)
        .await
        .map_err(|e| LabError::Host(format!("{}: {e}", cluster.name)))
}

fn kube_error(cluster: &ClusterState, what: &str) -> impl Fn(kube::Error) -> LabError {
    let name = cluster.name.clone();
    let what = what.to_owned();
    move |e| LabError::Host(format!("API server of {name}: {what}: {e}"))
}

/// Creates the demo's namespace in every cluster of `clusters`, and in each of `exporters`
/// the Service (its EndpointSlice comes with [`set_backend`]).
pub async fn create_objects(
    demo: &ServiceDemo,
    clusters: &[&ClusterState],
    exporters: &[&ClusterState],
) -> Result<(), LabError> {
    for cluster in clusters {
        let api = Api::<Namespace>::all(client(cluster).await?);
        apply(&api, &objects::namespace(demo))
            .await
            .map_err(kube_error(cluster, "namespace"))?;
    }
    for exporter in exporters {
        let api = Api::<Service>::namespaced(client(exporter).await?, &demo.namespace);
        apply(&api, &objects::backend_service(demo))
            .await
            .map_err(kube_error(exporter, "Service"))?;
    }
    Ok(())
}

/// Writes (`present`) or deletes the EndpointSlice naming `exporter`'s backend.
pub async fn set_backend(
    demo: &ServiceDemo,
    exporter: &ClusterState,
    present: bool,
) -> Result<(), LabError> {
    let api = Api::<EndpointSlice>::namespaced(client(exporter).await?, &demo.namespace);
    if present {
        let slice = objects::backend_slice(demo, objects::backend_address(exporter)?);
        apply(&api, &slice)
            .await
            .map_err(kube_error(exporter, "EndpointSlice"))
    } else {
        match api
            .delete(&objects::slice_name(demo), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(kube_error(exporter, "EndpointSlice")(e)),
        }
    }
}

/// `kubetun service export|unexport` in `cluster`, as a user runs it.
pub fn export(demo: &ServiceDemo, cluster: &ClusterState, export: bool) -> Result<(), LabError> {
    let plane = control_plane::plane(cluster)?;
    let verb = if export { "export" } else { "unexport" };
    control_plane::kubetun(&[
        "service",
        verb,
        &demo.name,
        "-n",
        &demo.namespace,
        "--kubeconfig",
        &plane.kubeconfig.to_string_lossy(),
    ])
    .map(drop)
}

/// Sets (or with `None` removes) the consumers annotation of `exporter`'s ServiceExport, as
/// `kubectl annotate serviceexport` does.
pub async fn set_consumers(
    demo: &ServiceDemo,
    exporter: &ClusterState,
    consumers: Option<&[String]>,
) -> Result<(), LabError> {
    let api = Api::<ServiceExport>::namespaced(client(exporter).await?, &demo.namespace);
    let value = consumers.map(|c| c.join(","));
    let patch = serde_json::json!({
        "metadata": {"annotations": {CONSUMERS_ANNOTATION: value}}
    });
    api.patch(&demo.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(kube_error(exporter, "ServiceExport annotation"))
}

/// The client's DNS path: the installed `kubetun-dns` Service's ClusterIP, DNATed in the
/// gateway namespace to the controller on the host end of the veth (and masqueraded, so the
/// host answers on the link). Returns the ClusterIP, the pods' nameserver.
pub async fn route_dns(client_cluster: &ClusterState) -> Result<Ipv4Addr, LabError> {
    let plane = control_plane::plane(client_cluster)?;
    let dns = plane.dns_addr.ok_or_else(|| {
        LabError::Internal(format!(
            "{}'s controller serves no DNS",
            client_cluster.name
        ))
    })?;
    let api = Api::<Service>::namespaced(client(client_cluster).await?, control_plane::NAMESPACE);
    let service = api
        .get("kubetun-dns")
        .await
        .map_err(kube_error(client_cluster, "Service kubetun-dns"))?;
    let cluster_ip: Ipv4Addr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| LabError::Host("Service kubetun-dns has no IPv4 ClusterIP".to_owned()))?;
    let rules = format!(
        "table ip {DNS_TABLE}\ndelete table ip {DNS_TABLE}\ntable ip {DNS_TABLE} {{\n\
         \tchain prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tip daddr {cluster_ip} udp dport 53 dnat to {dns}\n\
         \t\tip daddr {cluster_ip} tcp dport 53 dnat to {dns}\n\t}}\n\
         \tchain postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\toifname \"{NAMESPACE_END}\" masquerade\n\t}}\n}}\n"
    );
    proxy::apply(&client_cluster.namespace, &rules).map_err(LabError::Host)?;
    Ok(cluster_ip)
}

/// Starts `kubetun-lab kube-proxy` for `cluster` (detached, it outlives `up`; `down` stops
/// it by PID); returns its PID.
pub fn start_proxy(
    cluster: &ClusterState,
    service_range: Ipv4Net,
    state_dir: &Path,
) -> Result<u32, LabError> {
    use std::os::unix::process::CommandExt as _;
    let plane = control_plane::plane(cluster)?;
    let binary = crate::options::program("kubetun-lab")?;
    let log = state_dir.join(format!("{}-kube-proxy.log", cluster.id));
    let (stdout, stderr) = crate::fabric::open_log(&log)?;
    let child = Command::new(&binary)
        .args(["kube-proxy", "--kubeconfig"])
        .arg(&plane.kubeconfig)
        .args(["--netns", &cluster.namespace])
        .args(["--service-cidr", &service_range.to_string()])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map_err(|error| LabError::Io {
            path: binary,
            error,
        })?;
    Ok(child.id())
}
