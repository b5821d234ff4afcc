//! `kubetun service export|unexport|list`: the MCS API's ServiceExport without writing YAML,
//! and what a cluster exports and imports (`-o json|yaml` for scripts), with the reason an
//! export is not offered.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt as _};
use kubetun_crds::contract::services::SERVICE_NAME_LABEL;
use kubetun_crds::mcs::v1beta1::{ServiceExport, ServiceImport};
use serde::Serialize;
use serde_json::json;

use super::output::{OutputArgs, render};
use super::{Error, local_api_error as api_error, render_table};
use crate::cluster_args::ClusterArgs;

/// Field manager of the CLI's ServiceExports.
const FIELD_MANAGER: &str = "kubetun-cli";

/// `kubetun service`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ServiceCommand,
}

/// The `service` subcommands.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Offer a Service to every linked cluster (creates its ServiceExport).
    Export(TargetArgs),
    /// Stop offering it (deletes the ServiceExport; the imports go once no cluster exports it).
    Unexport(TargetArgs),
    /// The ServiceExports and ServiceImports of a namespace (or all).
    List(ListArgs),
    /// Why an exported Service is or is not visible in another cluster, hop by hop.
    Diagnose(Box<super::service_diagnose::DiagnoseServiceArgs>),
}

/// `service export` and `service unexport`.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// The Service's name.
    pub name: String,
    /// The Service's namespace.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `service list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this namespace (default: all).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One row of `service list -o json|yaml` (field names are stable).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRow {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Exported from this cluster (a ServiceExport exists).
    pub exported: bool,
    /// The export's state: `Exported`, `Conflict: …`, `Invalid: …`, `Pending`; empty when
    /// not exported.
    pub export_state: String,
    /// Imported here (a ServiceImport exists): ClusterSetIP or Headless.
    pub import_type: Option<String>,
    /// The ClusterSetIP(s).
    pub ips: Vec<String>,
    /// The exporting clusters.
    pub clusters: Vec<String>,
    /// Ready endpoints across the imported EndpointSlices.
    pub ready_endpoints: usize,
}

/// Runs a `service` subcommand.
pub async fn run(args: ServiceArgs) -> Result<(), Error> {
    match args.command {
        ServiceCommand::Export(target) => export(&target).await,
        ServiceCommand::Unexport(target) => unexport(&target).await,
        ServiceCommand::Diagnose(args) => super::service_diagnose::run(*args).await,
        ServiceCommand::List(list) => {
            let rows = rows(&list.cluster.client().await?, list.namespace.as_deref()).await?;
            match render(list.output.format, &rows)? {
                Some(text) => print!("{text}"),
                None if rows.is_empty() => println!("no exported or imported Services"),
                None => print!("{}", table(&rows)),
            }
            Ok(())
        }
    }
}

async fn export(target: &TargetArgs) -> Result<(), Error> {
    let client = target.cluster.client().await?;
    let what = format!("{}/{}", target.namespace, target.name);
    let service = Api::<Service>::namespaced(client.clone(), &target.namespace)
        .get_opt(&target.name)
        .await
        .map_err(api_error(format!("read Service {what}")))?;
    match service.and_then(|s| s.spec).and_then(|s| s.type_) {
        None => {
            return Err(Error::Usage(format!(
                "Service {what} does not exist: create it first"
            )));
        }
        Some(kind) if kind == "ExternalName" => {
            return Err(Error::Usage(format!(
                "Service {what} is of type ExternalName, which cannot be exported"
            )));
        }
        Some(_) => {}
    }
    let object = json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1",
        "kind": "ServiceExport",
        "metadata": { "name": target.name, "namespace": target.namespace },
    });
    Api::<ServiceExport>::namespaced(client, &target.namespace)
        .patch(
            &target.name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&object),
        )
        .await
        .map_err(api_error(format!("apply ServiceExport {what}")))?;
    println!("exported {what} to the linked clusters (kubetun service list shows its state)");
    Ok(())
}

async fn unexport(target: &TargetArgs) -> Result<(), Error> {
    let client = target.cluster.client().await?;
    let what = format!("{}/{}", target.namespace, target.name);
    match Api::<ServiceExport>::namespaced(client, &target.namespace)
        .delete(&target.name, &DeleteParams::default())
        .await
    {
        Ok(_) => {
            println!("unexported {what}");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::Usage(format!(
            "{what} is not exported (no ServiceExport)"
        ))),
        Err(e) => Err(api_error(format!("delete ServiceExport {what}"))(e)),
    }
}

/// Every exported or imported Service, sorted by namespace and name.
async fn rows(client: &Client, namespace: Option<&str>) -> Result<Vec<ServiceRow>, Error> {
    let (exports, imports, slices) = match namespace {
        Some(ns) => (
            Api::<ServiceExport>::namespaced(client.clone(), ns),
            Api::<ServiceImport>::namespaced(client.clone(), ns),
            Api::<EndpointSlice>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let all = ListParams::default();
    let exports = exports
        .list(&all)
        .await
        .map_err(api_error("list ServiceExports"))?;
    let imports = imports
        .list(&all)
        .await
        .map_err(api_error("list ServiceImports"))?;
    let slices = slices
        .list(&ListParams::default().labels(SERVICE_NAME_LABEL))
        .await
        .map_err(api_error("list EndpointSlices"))?;
    // One row per Service, sorted by namespace and name.
    let mut rows: BTreeMap<(String, String), ServiceRow> = BTreeMap::new();
    for export in &exports {
        let r = row(
            &mut rows,
            export.namespace().unwrap_or_default(),
            export.name_any(),
        );
        r.exported = true;
        r.export_state = export_state(export);
    }
    for import in &imports {
        let r = row(
            &mut rows,
            import.namespace().unwrap_or_default(),
            import.name_any(),
        );
        r.import_type = Some(import.spec.type_.to_string());
        r.ips = import.spec.ips.clone();
        r.clusters = import
            .status
            .iter()
            .flat_map(|s| s.clusters.iter().map(|c| c.cluster.clone()))
            .collect();
    }
    for slice in &slices {
        let Some(name) = slice.labels().get(SERVICE_NAME_LABEL) else {
            continue;
        };
        if let Some(r) = rows.get_mut(&(slice.namespace().unwrap_or_default(), name.clone())) {
            r.ready_endpoints += slice
                .endpoints
                .iter()
                .flatten()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .count();
        }
    }
    Ok(rows.into_values().collect())
}

/// The row of `namespace/name`, empty until filled.
fn row(
    rows: &mut BTreeMap<(String, String), ServiceRow>,
    namespace: String,
    name: String,
) -> &mut ServiceRow {
    rows.entry((namespace.clone(), name.clone()))
        .or_insert_with(|| ServiceRow {
            namespace,
            name,
            exported: false,
            export_state: String::new(),
            import_type: None,
            ips: Vec::new(),
            clusters: Vec::new(),
            ready_endpoints: 0,
        })
}

/// `Exported`, `Conflict: …`, `Invalid: …` or `Pending` from the export's conditions.
fn export_state(export: &ServiceExport) -> String {
    let conditions = export
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    if let Some(valid) = find("Valid").filter(|c| c.status == "False") {
        return format!("Invalid: {}", valid.message);
    }
    if let Some(conflict) = find("Conflict").filter(|c| c.status == "True") {
        return format!("Conflict: {}", conflict.message);
    }
    match find("Ready") {
        Some(ready) if ready.status == "True" => "Exported".to_owned(),
        _ => "Pending (no kubetun-controller has seen it yet)".to_owned(),
    }
}

fn table(rows: &[ServiceRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.name.clone(),
                if r.exported {
                    r.export_state.clone()
                } else {
                    "-".to_owned()
                },
                r.import_type.clone().unwrap_or_else(|| "-".to_owned()),
                if r.ips.is_empty() {
                    "-".to_owned()
                } else {
                    r.ips.join(",")
                },
                r.clusters.join(","),
                r.ready_endpoints.to_string(),
            ]
        })
        .collect();
    render_table(
        &[
            "NAMESPACE",
            "SERVICE",
            "EXPORT",
            "IMPORT",
            "CLUSTERSET-IP",
            "CLUSTERS",
            "READY",
        ],
        &cells,
    )
}
