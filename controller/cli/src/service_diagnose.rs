//! `kubetun service diagnose NAME -n NS --kubeconfig EXPORTER --importer-kubeconfig IMPORTER`:
//! why an exported Service is (not) visible in another cluster, hop by hop, in the order the
//! export travels: the Service, its ServiceExport, the offer (ExportedService), the link, the
//! importer's credential (and whether it can read the offer), the namespace, the import, the
//! endpoints; and whether the offer's consumers (the ServiceExport's
//! `net.kubetun.io/consumers` annotation) name the importer. The checks are a pure function
//! of what was read ([`ServiceFacts`]).

use clap::Args;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::services::{
    CONSUMERS_ANNOTATION, CREDENTIAL_KEY, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL,
};
use kubetun_crds::mcs::v1beta1::{ServiceExport, ServiceImport};
use kubetun_crds::{ExportedService, TunnelEndpoint};

use super::diagnose::{Check, Outcome, Report, render};
use super::output::{self, OutputArgs};
use super::{Error, KubeconfigSource};
use crate::cluster_args::ClusterArgs;
use kubetun_controller::connector::credential_name;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;

/// `service diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseServiceArgs {
    /// The Service's name.
    pub name: String,
    /// The Service's namespace.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// The exporting cluster (`--kubeconfig`, `--context`).
    #[command(flatten)]
    pub exporter: ClusterArgs,
    /// Kubeconfig of the cluster where the Service should be visible.
    #[arg(long, value_name = "FILE")]
    pub importer_kubeconfig: Option<std::path::PathBuf>,
    /// Context of the importer's kubeconfig.
    #[arg(long)]
    pub importer_context: Option<String>,
    /// Namespace kubetun runs in (both clusters).
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    pub kubetun_namespace: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A condition as read: `(type, status, reason, message)`.
pub type ConditionFact = (String, String, String, String);
/// An import as read: its ClusterSetIPs and exporting clusters.
pub type ImportFact = (Vec<String>, Vec<String>);

/// What the diagnosis read from both clusters (`Err`: why it could not be read).
#[derive(Debug, Clone)]
pub struct ServiceFacts {
    /// `namespace/name`.
    pub service: String,
    /// The exporter's cluster id.
    pub exporter_id: Result<String, String>,
    /// The importer's cluster id.
    pub importer_id: Result<String, String>,
    /// The Service's type in the exporter (`None`: no such Service).
    pub service_type: Result<Option<String>, String>,
    /// The ServiceExport's conditions `(type, status, reason, message)` (`None`: none).
    pub export: Result<Option<Vec<ConditionFact>>, String>,
    /// The offer's endpoint count (`None`: not offered).
    pub offered_endpoints: Result<Option<usize>, String>,
    /// The clusters the offer may be imported by (its `consumers`, from the ServiceExport's
    /// [`CONSUMERS_ANNOTATION`]); `None`: every linked cluster, or not offered.
    pub consumers: Option<Vec<String>>,
    /// Whether the importer has a TunnelEndpoint of the exporter.
    pub linked: Result<bool, String>,
    /// Whether the importer holds the exporter's credential Secret.
    pub credential: Result<bool, String>,
    /// What reading the offer with that credential gave (`Ok(found)`, `Err(why)`).
    pub credential_reads: Option<Result<bool, String>>,
    /// Whether the namespace exists in the importer.
    pub namespace_exists: Result<bool, String>,
    /// The import's ClusterSetIPs and exporting clusters (`None`: no import).
    pub import: Result<Option<ImportFact>, String>,
    /// Endpoints from the exporter in the importer's slices: `(all, ready)`.
    pub imported_endpoints: Result<(usize, usize), String>,
}

impl ServiceFacts {
    /// Nothing read yet about `service` (`namespace/name`): every fact says so.
    pub fn unread(service: String) -> Self {
        let no = || "not read: the cluster did not answer".to_owned();
        Self {
            service,
            exporter_id: Err(no()),
            importer_id: Err(no()),
            service_type: Err(no()),
            export: Err(no()),
            offered_endpoints: Err(no()),
            consumers: None,
            linked: Err(no()),
            credential: Err(no()),
            credential_reads: None,
            namespace_exists: Err(no()),
            import: Err(no()),
            imported_endpoints: Err(no()),
        }
    }
}

/// The hops, in order, and the first broken one.
pub fn diagnose(f: &ServiceFacts) -> Report {
    let mut checks = Vec::new();
    let mut push = |cluster: &str, hop: &str, outcome: Outcome, detail: String, fix: &str| {
        checks.push(Check {
            cluster: cluster.to_owned(),
            peer: String::new(),
            hop: hop.to_owned(),
            outcome,
            detail,
            fix: fix.to_owned(),
        });
    };
    let broken = Outcome::Broken;
    let svc = &f.service;
    let exporter = f
        .exporter_id
        .clone()
        .unwrap_or_else(|_| "the exporter".into());
    let importer = f
        .importer_id
        .clone()
        .unwrap_or_else(|_| "the importer".into());
    for (cluster, id) in [("exporter", &f.exporter_id), ("importer", &f.importer_id)] {
        match id {
            Ok(id) => push(cluster, "api", Outcome::Ok, format!("cluster {id}"), ""),
            Err(e) => push(
                cluster,
                "api",
                broken,
                e.clone(),
                "check the kubeconfig and that kubetun is installed (kubetun install)",
            ),
        }
    }
    match &f.service_type {
        Ok(Some(t)) if t == "ExternalName" => push(
            "exporter",
            "service",
            broken,
            format!("Service {svc} is of type ExternalName"),
            "ExternalName Services cannot be exported; export a Service with endpoints",
        ),
        Ok(Some(t)) => push(
            "exporter",
            "service",
            Outcome::Ok,
            format!("Service {svc} ({t})"),
            "",
        ),
        Ok(None) => push(
            "exporter",
            "service",
            broken,
            format!("no Service {svc} in {exporter}"),
            "create the Service in the exporting cluster",
        ),
        Err(e) => push("exporter", "service", broken, e.clone(), ""),
    }
    match &f.export {
        Ok(None) => push(
            "exporter",
            "export",
            broken,
            format!("no ServiceExport {svc}"),
            &format!(
                "kubetun service export {} -n {}",
                name_of(svc),
                namespace_of(svc)
            ),
        ),
        Ok(Some(conditions)) => {
            let find = |t: &str| conditions.iter().find(|c| c.0 == t);
            match (find("Valid"), find("Conflict")) {
                (Some(v), _) if v.1 == "False" => push(
                    "exporter",
                    "export",
                    broken,
                    format!("Valid=False ({}): {}", v.2, v.3),
                    "fix the Service as the message says",
                ),
                (None, _) => push(
                    "exporter",
                    "export",
                    broken,
                    "the ServiceExport has no conditions: no kubetun-controller handled it".into(),
                    "check that kubetun-controller runs in the exporter and serves the MCS API (kubectl get crd serviceexports.multicluster.x-k8s.io)",
                ),
                (_, Some(c)) if c.1 == "True" => push(
                    "exporter",
                    "export",
                    Outcome::Warning,
                    format!("Conflict ({}): {}", c.2, c.3),
                    "align the Service's definition across the exporting clusters",
                ),
                _ => push(
                    "exporter",
                    "export",
                    Outcome::Ok,
                    "Valid, exported".into(),
                    "",
                ),
            }
        }
        Err(e) => push("exporter", "export", broken, e.clone(), ""),
    }
    match &f.offered_endpoints {
        Ok(Some(0)) => push(
            "exporter",
            "offered",
            Outcome::Warning,
            "offered with no endpoints".into(),
            "the Service selects no ready pods in the exporter",
        ),
        Ok(Some(n)) => push(
            "exporter",
            "offered",
            Outcome::Ok,
            format!("ExportedService offered with {n} endpoint(s)"),
            "",
        ),
        Ok(None) => push(
            "exporter",
            "offered",
            broken,
            "no ExportedService: the export is not offered".into(),
            "check kubetun-controller's log in the exporter",
        ),
        Err(e) => push("exporter", "offered", broken, e.clone(), ""),
    }
    if let Ok(Some(_)) = &f.offered_endpoints {
        match &f.consumers {
            None => push(
                "exporter",
                "consumers",
                Outcome::Ok,
                format!("offered to every linked cluster (no {CONSUMERS_ANNOTATION})"),
                "",
            ),
            Some(named) if named.contains(&importer) => push(
                "exporter",
                "consumers",
                Outcome::Ok,
                format!("offered to {} ({CONSUMERS_ANNOTATION})", named.join(",")),
                "",
            ),
            Some(named) => {
                let mut with = named.clone();
                with.push(importer.clone());
                push(
                    "exporter",
                    "consumers",
                    broken,
                    format!(
                        "not exported to {importer}: {CONSUMERS_ANNOTATION} names {} only, so \
                         {importer} gets no ServiceImport and no DNS answer, and {exporter}'s \
                         gateway drops its packets to the endpoints",
                        if named.is_empty() {
                            "no cluster".to_owned()
                        } else {
                            named.join(",")
                        }
                    ),
                    &format!(
                        "kubectl annotate serviceexport {} -n {} {CONSUMERS_ANNOTATION}={} \
                         --overwrite (in {exporter})",
                        name_of(svc),
                        namespace_of(svc),
                        with.join(",")
                    ),
                );
            }
        }
    }
    match &f.linked {
        Ok(true) => push(
            "importer",
            "link",
            Outcome::Ok,
            format!("TunnelEndpoint {exporter} present"),
            "",
        ),
        Ok(false) => push(
            "importer",
            "link",
            broken,
            format!("{importer} is not linked to {exporter}"),
            "link them: kubetun network connect (or kubetun shortcut create from the hub)",
        ),
        Err(e) => push("importer", "link", broken, e.clone(), ""),
    }
    match &f.credential {
        Ok(true) => push(
            "importer",
            "credential",
            Outcome::Ok,
            format!("Secret {} present", credential_name(&exporter)),
            "",
        ),
        Ok(false) => push(
            "importer",
            "credential",
            broken,
            format!(
                "no Secret {}: {importer} cannot read {exporter}'s exports",
                credential_name(&exporter)
            ),
            "run kubetun network connect (or the shortcut) again with both kubeconfigs: it writes the credential",
        ),
        Err(e) => push("importer", "credential", broken, e.clone(), ""),
    }
    match &f.credential_reads {
        Some(Ok(true)) => push(
            "importer",
            "credential-reads",
            Outcome::Ok,
            "the credential reads the offer".into(),
            "",
        ),
        Some(Ok(false)) => push(
            "importer",
            "credential-reads",
            broken,
            "the credential reads the exporter's ExportedServices but not this one".into(),
            "the credential may name another kubetun namespace; run kubetun network connect again",
        ),
        Some(Err(e)) => push(
            "importer",
            "credential-reads",
            broken,
            format!("the credential cannot read the offer: {e}"),
            "the token may be revoked or expired, or the API server unreachable from here: run kubetun network connect again",
        ),
        None => {}
    }
    match &f.namespace_exists {
        Ok(true) => push(
            "importer",
            "namespace",
            Outcome::Ok,
            format!("namespace {} exists", namespace_of(svc)),
            "",
        ),
        Ok(false) => push(
            "importer",
            "namespace",
            broken,
            format!(
                "no namespace {} in {importer}: imports follow namespace sameness",
                namespace_of(svc)
            ),
            &format!(
                "kubectl create namespace {} in the importer",
                namespace_of(svc)
            ),
        ),
        Err(e) => push("importer", "namespace", broken, e.clone(), ""),
    }
    match &f.import {
        Ok(Some((ips, clusters))) if clusters.contains(&exporter) => push(
            "importer",
            "import",
            Outcome::Ok,
            format!(
                "ServiceImport {svc}, ClusterSetIP {}, from {}",
                ips.join(","),
                clusters.join(",")
            ),
            "",
        ),
        Ok(Some((_, clusters))) => push(
            "importer",
            "import",
            broken,
            format!(
                "ServiceImport {svc} lists {} but not {exporter}",
                clusters.join(",")
            ),
            "a type conflict keeps an exporter's endpoints out; see the export's Conflict condition",
        ),
        Ok(None) => push(
            "importer",
            "import",
            broken,
            format!("no ServiceImport {svc}"),
            "check kubetun-controller's log in the importer (kubetun service list shows its imports)",
        ),
        Err(e) => push("importer", "import", broken, e.clone(), ""),
    }
    match &f.imported_endpoints {
        Ok((0, _)) => push(
            "importer",
            "endpoints",
            Outcome::Warning,
            format!("no endpoints from {exporter}"),
            "the exporter's endpoints may lie outside the CIDRs it announces (kubetun_controller_service_dropped_endpoints_total)",
        ),
        Ok((all, ready)) => push(
            "importer",
            "endpoints",
            Outcome::Ok,
            format!("{all} endpoint(s) from {exporter}, {ready} ready"),
            "",
        ),
        Err(e) => push("importer", "endpoints", broken, e.clone(), ""),
    }
    let first_broken = checks.iter().position(|c| c.outcome == Outcome::Broken);
    Report {
        checks,
        first_broken,
    }
}

fn namespace_of(service: &str) -> &str {
    service.split('/').next().unwrap_or_default()
}

fn name_of(service: &str) -> &str {
    service.split('/').nth(1).unwrap_or_default()
}

/// Reads the facts from both clusters.
async fn collect(args: &DiagnoseServiceArgs) -> ServiceFacts {
    let (ns, name, kubetun) = (&args.namespace, &args.name, &args.kubetun_namespace);
    let show = |e: kube::Error| kubetun_controller::connector::error_chain(&e);
    let mut f = ServiceFacts::unread(format!("{ns}/{name}"));
    let exporter = KubeconfigSource {
        path: args.exporter.kubeconfig.clone(),
        context: args.exporter.context.clone(),
    };
    let importer = KubeconfigSource {
        path: args.importer_kubeconfig.clone(),
        context: args.importer_context.clone(),
    };
    let (exporter, importer) = (
        exporter.client("exporter").await,
        importer.client("importer").await,
    );
    let id = |client: kube::Client| async move {
        ClusterInfo::load(&client, kubetun)
            .await
            .map(|i| i.cluster.id)
            .map_err(|e| e.to_string())
    };
    match &exporter {
        Ok(client) => {
            f.exporter_id = id(client.clone()).await;
            f.service_type = Api::<Service>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map(|s| {
                    s.map(|s| {
                        s.spec
                            .and_then(|s| s.type_)
                            .unwrap_or_else(|| "ClusterIP".into())
                    })
                })
                .map_err(show);
            f.export = Api::<ServiceExport>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map(|e| {
                    e.map(|e| {
                        e.status
                            .unwrap_or_default()
                            .conditions
                            .into_iter()
                            .map(|c| (c.type_, c.status, c.reason, c.message))
                            .collect()
                    })
                })
                .map_err(show);
            let offer = Api::<ExportedService>::namespaced(client.clone(), kubetun)
                .get_opt(&format!("{ns}.{name}"))
                .await
                .map_err(show);
            f.consumers = offer
                .as_ref()
                .ok()
                .and_then(|o| o.as_ref()?.spec.consumers.clone());
            f.offered_endpoints =
                offer.map(|o| o.map(|o| o.spec.slices.iter().map(|s| s.endpoints.len()).sum()));
        }
        Err(e) => f.exporter_id = Err(e.to_string()),
    }
    let Ok(importer) = importer else {
        f.importer_id = Err(importer.err().map(|e| e.to_string()).unwrap_or_default());
        return f;
    };
    f.importer_id = id(importer.clone()).await;
    let exporter_id = f.exporter_id.clone().unwrap_or_default();
    f.linked = Api::<TunnelEndpoint>::namespaced(importer.clone(), kubetun)
        .get_opt(&exporter_id)
        .await
        .map(|t| t.is_some())
        .map_err(show);
    let secret = Api::<Secret>::namespaced(importer.clone(), kubetun)
        .get_opt(&credential_name(&exporter_id))
        .await;
    f.credential = secret
        .as_ref()
        .map(Option::is_some)
        .map_err(|e| e.to_string());
    if let Ok(Some(secret)) = secret {
        f.credential_reads = Some(read_with(&secret, &format!("{ns}.{name}")).await);
    }
    f.namespace_exists = Api::<Namespace>::all(importer.clone())
        .get_opt(ns)
        .await
        .map(|n| n.is_some())
        .map_err(show);
    f.import = Api::<ServiceImport>::namespaced(importer.clone(), ns)
        .get_opt(name)
        .await
        .map(|i| {
            i.map(|i| {
                (
                    i.spec.ips,
                    i.status
                        .unwrap_or_default()
                        .clusters
                        .into_iter()
                        .map(|c| c.cluster)
                        .collect(),
                )
            })
        })
        .map_err(show);
    let selector = format!("{SERVICE_NAME_LABEL}={name},{SOURCE_CLUSTER_LABEL}={exporter_id}");
    f.imported_endpoints = Api::<EndpointSlice>::namespaced(importer, ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| {
            let endpoints: Vec<_> = l
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .collect();
            let ready = endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .count();
            (endpoints.len(), ready)
        })
        .map_err(show);
    f
}

/// Reads ExportedService `name` with the credential in `secret` (never shown).
async fn read_with(secret: &Secret, name: &str) -> Result<bool, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(CREDENTIAL_KEY))
        .ok_or("the Secret has no kubeconfig")?;
    let client = kubetun_controller::plumbing::kubeconfig::peer_client(&bytes.0).await?;
    Api::<ExportedService>::default_namespaced(client)
        .get_opt(name)
        .await
        .map(|o| o.is_some())
        .map_err(|e| kubetun_controller::connector::error_chain(&e))
}

/// Runs `kubetun service diagnose`; fails (exit status 1) when a hop is broken.
pub async fn run(args: DiagnoseServiceArgs) -> Result<(), Error> {
    let report = diagnose(&collect(&args).await);
    match output::render(args.output.format, &report)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&report)),
    }
    match report.broken() {
        Some(check) => Err(Error::Broken(format!("({}) {}", check.cluster, check.hop))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn working() -> ServiceFacts {
        ServiceFacts {
            service: "shop/web".into(),
            exporter_id: Ok("milan".into()),
            importer_id: Ok("rome".into()),
            service_type: Ok(Some("ClusterIP".into())),
            export: Ok(Some(vec![
                ("Valid".into(), "True".into(), "Valid".into(), String::new()),
                (
                    "Conflict".into(),
                    "False".into(),
                    "NoConflicts".into(),
                    String::new(),
                ),
            ])),
            offered_endpoints: Ok(Some(2)),
            consumers: None,
            linked: Ok(true),
            credential: Ok(true),
            credential_reads: Some(Ok(true)),
            namespace_exists: Ok(true),
            import: Ok(Some((vec!["10.96.0.9".into()], vec!["milan".into()]))),
            imported_endpoints: Ok((2, 2)),
        }
    }

    fn first_broken(facts: &ServiceFacts) -> Option<String> {
        diagnose(facts).broken().map(|c| c.hop.clone())
    }

    #[test]
    fn each_missing_piece_is_named_in_the_order_the_export_travels() {
        assert_eq!(first_broken(&working()), None);
        let mut f = working();
        f.credential_reads = Some(Err("401 Unauthorized".into()));
        f.import = Ok(None);
        assert_eq!(first_broken(&f).as_deref(), Some("credential-reads"));
        let mut f = working();
        f.export = Ok(None);
        f.offered_endpoints = Ok(None);
        let report = diagnose(&f);
        assert_eq!(report.broken().map(|c| c.hop.as_str()), Some("export"));
        assert!(
            report
                .broken()
                .unwrap()
                .fix
                .contains("kubetun service export web -n shop")
        );
        let mut f = working();
        f.import = Ok(Some((vec![], vec!["paris".into()])));
        assert_eq!(first_broken(&f).as_deref(), Some("import"));
        let mut f = working();
        f.service_type = Ok(Some("ExternalName".into()));
        assert_eq!(first_broken(&f).as_deref(), Some("service"));
        // A conflict is worth a look, not broken.
        let mut f = working();
        f.export = Ok(Some(vec![
            ("Valid".into(), "True".into(), "Valid".into(), String::new()),
            (
                "Conflict".into(),
                "True".into(),
                "PortConflict".into(),
                "port".into(),
            ),
        ]));
        let report = diagnose(&f);
        assert_eq!(report.broken(), None);
        assert!(report.checks.iter().any(|c| c.outcome == Outcome::Warning));
    }

    #[test]
    fn an_importer_the_consumers_do_not_name_is_told_so() {
        let mut f = working();
        f.consumers = Some(vec!["paris".into(), "berlin".into()]);
        let report = diagnose(&f);
        let broken = report.broken().unwrap();
        assert_eq!(broken.hop, "consumers");
        assert!(
            broken.detail.starts_with(
                "not exported to rome: net.kubetun.io/consumers names paris,berlin only"
            ),
            "{}",
            broken.detail
        );
        assert!(
            broken.detail.contains("no ServiceImport"),
            "{}",
            broken.detail
        );
        assert_eq!(
            broken.fix,
            "kubectl annotate serviceexport web -n shop \
             net.kubetun.io/consumers=paris,berlin,rome --overwrite (in milan)"
        );

        // Named: fine, and said.
        f.consumers = Some(vec!["rome".into()]);
        let report = diagnose(&f);
        assert_eq!(report.broken(), None);
        let hop = report.checks.iter().find(|c| c.hop == "consumers").unwrap();
        assert_eq!(hop.detail, "offered to rome (net.kubetun.io/consumers)");

        // No annotation: every linked cluster.
        f.consumers = None;
        let report = diagnose(&f);
        let hop = report.checks.iter().find(|c| c.hop == "consumers").unwrap();
        assert!(hop.detail.starts_with("offered to every linked cluster"));

        // Not offered: no consumers hop, the offer is what is missing.
        f.offered_endpoints = Ok(None);
        f.consumers = Some(vec!["paris".into()]);
        let report = diagnose(&f);
        assert_eq!(report.broken().map(|c| c.hop.as_str()), Some("offered"));
        assert!(!report.checks.iter().any(|c| c.hop == "consumers"));
    }
}
