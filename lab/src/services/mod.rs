//! The services demo of `up` (a topology's `service:`). Each exporting cluster serves the
//! Service from an HTTP server on its first external endpoint (the seed's Milan and Paris:
//! 10.70.0.11 in both); the Service is exported and fetched with curl from the client's first
//! pod by its `clusterset.local` name, through the pod's resolver and the ClusterSetIP. The
//! checks: export → resolvable and reachable (several rounds, timed), every exporter answering
//! (through the shortcut and through the hub), one exporter's endpoints removed (the others
//! still answer, and only they), and unexport (the name stops resolving).
//!
//! With real control planes everything goes through the API servers, the `kubetun` CLI and
//! the controllers (`apiservers.rs`); without, the lab computes what the controllers would,
//! with their own pure services core (`inprocess.rs`). Either way the ClusterSetIP is reached
//! through the kube-proxy stand-in ([`proxy`]) and the name through `clusterset.local` DNS.

pub mod proxy;
pub mod standins;

mod apiservers;
mod inprocess;
mod isolation;
mod objects;
mod policies;
mod timing;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;

use crate::checks::{Check, reach_address};
use crate::error::LabError;
use crate::install;
use crate::linking::RunningLab;
use crate::output::{report_check, say};
use crate::service_demo::{ServiceDemo, TARGET_PORT};
use crate::state::ClusterState;
use inprocess::InProcess;
use kubetun_crds::Isolation;
use kubetun_testenv::netns;
use timing::{CONVERGE, summary, wait_until};

/// The phase of every services check.
const PHASE: &str = "services";
/// The phase of the checks of exported-only links.
const ISOLATION_PHASE: &str = "isolation";
/// Export/unexport rounds timed.
const ROUNDS: usize = 5;
/// Fetches that must all come from the remaining exporters once one lost its endpoints.
const STEADY_FETCHES: usize = 8;
/// The device the client's service range is routed to, and its veth peer.
const SERVICE_LINK: &str = "svc0";
const SERVICE_LINK_PEER: &str = "svc1";

/// Who carries out exports and endpoint changes.
enum Driver {
    /// The lab, with the controller's pure core.
    InProcess(InProcess),
    /// The `kubetun` CLI, the API servers and the controllers.
    ApiServers,
}

/// What a fetch by name from the client pod gave.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fetched {
    /// An answer from exporter `.0` (an index into the lab's clusters) with body `.1`.
    From(usize, String),
    /// The name did not resolve (curl's exit status 6).
    Unresolved,
    /// Anything else, in curl's words.
    Failed(String),
}

/// The demo while it runs.
struct Steps<'l, 'a> {
    lab: &'l mut RunningLab<'a>,
    demo: ServiceDemo,
    client: usize,
    exporters: Vec<usize>,
    driver: Driver,
}

/// Runs the demo of the topology's `service:` (nothing without one), adding its checks.
pub(super) fn run(lab: &mut RunningLab<'_>, out: &mut dyn Write) -> Result<(), LabError> {
    let Some(demo) = lab.topology.service.clone() else {
        return Ok(());
    };
    let index = |name: &str| {
        lab.topology
            .cluster_index(name)
            .ok_or_else(|| LabError::Internal(format!("no cluster {name}")))
    };
    let client = index(&demo.client)?;
    let exporters = demo
        .exporters
        .iter()
        .map(|e| index(e))
        .collect::<Result<Vec<_>, _>>()?;
    let state_dir = lab.options.state_dir.clone();
    say(
        out,
        &format!(
            "  services: {} exported by {}, fetched from {}",
            demo.host(),
            demo.exporters.join(" and "),
            lab.state.clusters[client].pods[0].namespace
        ),
    );
    for &exporter in &exporters {
        let cluster = &lab.state.clusters[exporter];
        let listen = SocketAddr::from((Ipv4Addr::UNSPECIFIED, TARGET_PORT));
        let label = backend_label(&demo, cluster);
        start_standin(
            &cluster.externals[0].namespace,
            &[
                "http-serve",
                "--listen",
                &listen.to_string(),
                "--label",
                &label,
            ],
            &state_dir.join(format!("{}-backend.log", cluster.id)),
        )?;
    }
    let service_range =
        install::service_cidr(&lab.state.clusters[client], lab.topology.underlay)
            .ok_or_else(|| LabError::Usage(format!("{}: no free service range", demo.client)))?;
    route_service_range(&lab.state.clusters[client].namespace, service_range)?;
    let (nameserver, driver) = if lab.options.apiserver {
        through_apiservers(lab, &demo, client, &exporters, service_range)?
    } else {
        in_process(lab, client, service_range)?
    };
    write_resolver(&lab.state.clusters[client].pods[0].namespace, nameserver)?;
    let mut steps = Steps {
        lab,
        demo,
        client,
        exporters,
        driver,
    };
    steps.timed_rounds(out)?;
    steps.every_exporter_answers(out)?;
    steps.without_first_exporters_endpoints(out)?;
    steps.exported_only(out)?;
    steps.unexported(out)
}

/// Objects in the API servers, the client's DNS path and its kube-proxy stand-in.
fn through_apiservers(
    lab: &mut RunningLab<'_>,
    demo: &ServiceDemo,
    client: usize,
    exporters: &[usize],
    service_range: Ipv4Net,
) -> Result<(Ipv4Addr, Driver), LabError> {
    let clusters = &lab.state.clusters;
    let involved: Vec<&ClusterState> = std::iter::once(client)
        .chain(exporters.iter().copied())
        .map(|i| &clusters[i])
        .collect();
    lab.runtime
        .block_on(apiservers::create_objects(demo, &involved, &involved[1..]))?;
    for exporter in &involved[1..] {
        lab.runtime
            .block_on(apiservers::set_backend(demo, exporter, true))?;
    }
    let nameserver = lab
        .runtime
        .block_on(apiservers::route_dns(&clusters[client]))?;
    let pid = apiservers::start_proxy(&clusters[client], service_range, &lab.options.state_dir)?;
    if let Some(plane) = lab.state.clusters[client].control_plane.as_mut() {
        plane.proxy_pid = Some(pid);
    }
    lab.state.save(&lab.options.state_dir)?;
    Ok((nameserver, Driver::ApiServers))
}

/// The DNS stand-in in the client's gateway namespace, serving a table the lab writes.
fn in_process(
    lab: &RunningLab<'_>,
    client: usize,
    service_range: Ipv4Net,
) -> Result<(Ipv4Addr, Driver), LabError> {
    let cluster = &lab.state.clusters[client];
    let nameserver = lab.topology.clusters[client].gateway_pod_address();
    let table_file = lab
        .options
        .state_dir
        .join(format!("{}-dns.json", cluster.id));
    let driver = InProcess::new(service_range, table_file.clone());
    driver.publish(cluster)?;
    let listen = SocketAddr::from((nameserver, 53)).to_string();
    let table = table_file.to_string_lossy();
    start_standin(
        &cluster.namespace,
        &["serve-dns", "--listen", &listen, "--table", &table],
        &lab.options
            .state_dir
            .join(format!("{}-dns.log", cluster.id)),
    )?;
    Ok((nameserver, Driver::InProcess(driver)))
}

impl Steps<'_, '_> {
    fn cluster(&self, index: usize) -> &ClusterState {
        &self.lab.state.clusters[index]
    }

    fn check(&mut self, out: &mut dyn Write, description: String, outcome: Result<String, String>) {
        let check = Check::new(PHASE, description, outcome);
        report_check(out, &check);
        self.lab.checks.push(check);
    }

    /// Exports (or unexports) the Service in `exporters`.
    fn export(&mut self, exporters: &[usize], export: bool) -> Result<(), LabError> {
        for &index in exporters {
            let cluster = &self.lab.state.clusters[index];
            match &mut self.driver {
                Driver::ApiServers => apiservers::export(&self.demo, cluster, export)?,
                Driver::InProcess(driver) if export => driver.export(&self.demo, cluster, true)?,
                Driver::InProcess(driver) => driver.unexport(cluster),
            }
        }
        self.publish()
    }

    /// Gives `exporter`'s Service its backend as endpoint, or no endpoints.
    fn set_backend(&mut self, exporter: usize, present: bool) -> Result<(), LabError> {
        let cluster = &self.lab.state.clusters[exporter];
        match &mut self.driver {
            Driver::ApiServers => self
                .lab
                .runtime
                .block_on(apiservers::set_backend(&self.demo, cluster, present))?,
            Driver::InProcess(driver) => driver.export(&self.demo, cluster, present)?,
        }
        self.publish()
    }

    /// In-process, the lab is the controllers: it publishes after every change, and gives
    /// every exporter's gateway what its offer admits.
    fn publish(&mut self) -> Result<(), LabError> {
        let Driver::InProcess(driver) = &self.driver else {
            return Ok(());
        };
        driver.publish(self.cluster(self.client))?;
        for &exporter in &self.exporters.clone() {
            let exports = match &self.driver {
                Driver::InProcess(driver) => {
                    driver.exports_of(self.cluster(exporter), &self.lab.state.clusters)
                }
                Driver::ApiServers => Default::default(),
            };
            if self.lab.exports[exporter] != exports {
                self.lab.exports[exporter] = exports;
                self.lab.apply(exporter, &mut std::io::sink())?;
            }
        }
        Ok(())
    }

    /// Sets the consumers annotation of `exporter`'s ServiceExport (`None`: removed).
    fn set_consumers(
        &mut self,
        exporter: usize,
        consumers: Option<Vec<String>>,
    ) -> Result<(), LabError> {
        let cluster = &self.lab.state.clusters[exporter];
        match &mut self.driver {
            Driver::ApiServers => self.lab.runtime.block_on(apiservers::set_consumers(
                &self.demo,
                cluster,
                consumers.as_deref(),
            ))?,
            Driver::InProcess(driver) => driver.set_consumers(cluster, consumers),
        }
        self.publish()
    }

    /// Refusals `exporter`'s gateway counted for packets from `from`.
    fn refusals(&self, exporter: usize, from: usize) -> u64 {
        self.lab
            .runtime
            .block_on(self.lab.clients[exporter].status())
            .map_or(0, |status| {
                isolation::refusals(&status, &self.cluster(from).id)
            })
    }

    /// The first external endpoint of `from` and the view at which it reaches `exporter`'s
    /// backend.
    fn backend_from(&self, from: usize, exporter: usize) -> Result<(String, Ipv4Addr), LabError> {
        let (client, backend) = (self.cluster(from), self.cluster(exporter));
        let view = objects::backend_address(backend)
            .ok()
            .and_then(|a| reach_address(client, backend, a))
            .ok_or_else(|| LabError::Internal(format!("no view of {}'s backend", backend.name)))?;
        let ns = client
            .externals
            .first()
            .map(|e| e.namespace.clone())
            .ok_or_else(|| {
                LabError::Internal(format!("{} has no external endpoint", client.name))
            })?;
        Ok((ns, view))
    }

    /// `curl http://<name>/` in the client's pod.
    fn fetch(&self) -> Fetched {
        let ns = &self.cluster(self.client).pods[0].namespace;
        let output = match fetch_by_name(ns, &self.demo.host()) {
            Ok(output) => output,
            Err(e) => return Fetched::Failed(format!("curl: {e}")),
        };
        let body = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        match output.status.code() {
            Some(0) => self
                .exporters
                .iter()
                .find(|&&e| body.starts_with(&backend_label(&self.demo, self.cluster(e))))
                .map_or_else(
                    || Fetched::Failed(format!("unexpected answer {body:?}")),
                    |&e| Fetched::From(e, body.clone()),
                ),
            Some(6) => Fetched::Unresolved,
            _ => Fetched::Failed(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        }
    }

    /// Fetches until `done` says so or [`CONVERGE`] passes; the time it took, or the last
    /// fetch's outcome.
    fn fetch_until(&self, mut done: impl FnMut(&Fetched) -> bool) -> Result<Duration, Fetched> {
        let started = Instant::now();
        loop {
            let fetched = self.fetch();
            if done(&fetched) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > CONVERGE {
                return Err(fetched);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Export by the first exporter → reachable by name, then unexport → unresolvable,
    /// [`ROUNDS`] times.
    fn timed_rounds(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let first = self.exporters[0];
        let (mut reachable, mut gone) = (Vec::new(), Vec::new());
        let mut failure = None;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            self.export(&[first], true)?;
            if let Err(last) = self.fetch_until(|f| matches!(f, Fetched::From(e, _) if *e == first))
            {
                failure = Some(format!("not reachable within {CONVERGE:?}: {last:?}"));
                break;
            }
            reachable.push(started.elapsed());
            let started = Instant::now();
            self.export(&[first], false)?;
            if let Err(last) = self.fetch_until(|f| *f == Fetched::Unresolved) {
                failure = Some(format!(
                    "still resolves {CONVERGE:?} after unexport: {last:?}"
                ));
                break;
            }
            gone.push(started.elapsed());
        }
        let outcome = match failure {
            Some(failure) => Err(failure),
            None => Ok(format!(
                "export → answering: {}; unexport → NXDOMAIN: {}",
                summary(&mut reachable),
                summary(&mut gone)
            )),
        };
        let description = format!(
            "{} from {}: export by {} → resolvable and reachable, {ROUNDS} rounds",
            self.demo.host(),
            self.cluster(self.client).name,
            self.cluster(first).name
        );
        self.check(out, description, outcome);
        Ok(())
    }

    /// Every exporter exports; each answers the client by name, along its own path.
    fn every_exporter_answers(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let exporters = self.exporters.clone();
        self.export(&exporters, true)?;
        let mut answers: Vec<Option<String>> = vec![None; self.lab.state.clusters.len()];
        let waited = self.fetch_until(|fetched| {
            if let Fetched::From(e, body) = fetched {
                answers[*e].get_or_insert_with(|| body.clone());
            }
            exporters.iter().all(|&e| answers[e].is_some())
        });
        let paths: Vec<String> = exporters
            .iter()
            .map(|&e| format!("{} ({})", self.cluster(e).name, self.path_to(e)))
            .collect();
        let description = format!(
            "{} from {} answers from {}",
            self.demo.host(),
            self.cluster(self.client).name,
            paths.join(" and ")
        );
        let bodies: Vec<String> = exporters
            .iter()
            .filter_map(|&e| answers[e].as_ref().map(|b| format!("{b:?}")))
            .collect();
        let outcome = match waited {
            Ok(took) => Ok(format!(
                "{} within {} ms",
                bodies.join("; "),
                took.as_millis()
            )),
            Err(last) => Err(format!("answered: {}; last: {last:?}", bodies.join("; "))),
        };
        self.check(out, description, outcome);
        Ok(())
    }

    /// The first exporter loses its endpoints: once the client's ClusterSetIP no longer
    /// leads there, every fetch comes from the others. Its endpoints come back afterwards.
    fn without_first_exporters_endpoints(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let Some((&first, others)) = self.exporters.split_first() else {
            return Ok(());
        };
        let others = others.to_vec();
        if others.is_empty() {
            return Ok(());
        }
        let (client, exporter) = (self.cluster(self.client), self.cluster(first));
        let view = objects::backend_address(exporter)
            .ok()
            .and_then(|a| reach_address(client, exporter, a))
            .ok_or_else(|| LabError::Internal(format!("no view of {}'s backend", exporter.name)))?;
        self.set_backend(first, false)?;
        let (client, exporter) = (self.cluster(self.client), self.cluster(first));
        let unprogrammed = wait_until(|| !proxy_leads_to(&client.namespace, view));
        let outcome = match unprogrammed {
            None => Err(format!(
                "{client_name}'s ClusterSetIP still leads to {view} {CONVERGE:?} later",
                client_name = client.name
            )),
            Some(took) => {
                let fetched: Vec<Fetched> = (0..STEADY_FETCHES).map(|_| self.fetch()).collect();
                let from_others = fetched
                    .iter()
                    .filter(|f| matches!(f, Fetched::From(e, _) if others.contains(e)))
                    .count();
                if from_others == STEADY_FETCHES {
                    Ok(format!(
                        "{from_others} of {STEADY_FETCHES} fetches answered by the others; the \
                         ClusterSetIP stopped leading to {view} {} ms after the endpoints went",
                        took.as_millis()
                    ))
                } else {
                    Err(format!("fetches: {fetched:?}"))
                }
            }
        };
        let others: Vec<&str> = others
            .iter()
            .map(|&e| self.cluster(e).name.as_str())
            .collect();
        let description = format!(
            "{}'s endpoints removed: {} answers from {} only",
            exporter.name,
            self.demo.host(),
            others.join(" and ")
        );
        self.check(out, description, outcome);
        self.set_backend(first, true)
    }

    /// Exported-only links, with clients at the same real address. The first exporter
    /// exports to the client only, the others to the client and to `outsider` (the hub,
    /// linked to every exporter directly); then every link is set to `exported`. The client's
    /// and the outsider's first external endpoints have the same real address (the seed's
    /// 10.70.0.11 in every cluster): the client reaches every exporter's backend (over the
    /// shortcut and through the hub), the outsider only the exporters that name it (over its
    /// direct link), and its packets to the first exporter are refused by that exporter's
    /// gateway and counted; a pod that is no endpoint of an export answers nothing. Adding and
    /// removing the outsider as a consumer is timed; then the links are `open` again.
    fn exported_only(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let Some((&first, others)) = self.exporters.split_first() else {
            return Ok(());
        };
        let others = others.to_vec();
        let topology = self.lab.topology;
        let outsider = topology
            .hub_of(&self.cluster(self.client).name, &self.cluster(first).name)
            .and_then(|hub| topology.cluster_index(&hub));
        let Some(outsider) = outsider.filter(|o| *o != self.client && !self.exporters.contains(o))
        else {
            say(
                out,
                "  isolation: no hub between the client and the first exporter; skipped",
            );
            return Ok(());
        };
        let (client_id, outsider_id) = (
            self.cluster(self.client).id.clone(),
            self.cluster(outsider).id.clone(),
        );
        self.set_consumers(first, Some(vec![client_id.clone()]))?;
        for &other in &others {
            self.set_consumers(other, Some(vec![client_id.clone(), outsider_id.clone()]))?;
        }
        let started = Instant::now();
        self.lab.set_isolation(Isolation::Exported, out)?;
        let set = started.elapsed();
        let (outsider_ns, outsider_view) = self.backend_from(outsider, first)?;
        let refused =
            isolation::fetch_until(&outsider_ns, outsider_view, TARGET_PORT, false, CONVERGE);
        let took = started.elapsed();
        self.isolation_check(
            out,
            format!(
                "every link set to exported: {} no longer reaches {}'s backend",
                self.cluster(outsider).name,
                self.cluster(first).name
            ),
            refused
                .map(|_| {
                    format!(
                        "refused {} ms after the change began ({} ms to set every link)",
                        took.as_millis(),
                        set.as_millis()
                    )
                })
                .map_err(|last| format!("still answered {CONVERGE:?} later: {last:?}")),
        );

        // The client, a consumer of every export, over the shortcut and through the hub.
        for &exporter in &self.exporters.clone() {
            let (ns, view) = self.backend_from(self.client, exporter)?;
            let outcome = isolation::fetch_until(&ns, view, TARGET_PORT, true, CONVERGE)
                .map(|_| isolation::fetch_address(&ns, view, TARGET_PORT))
                .map_err(|last| format!("{last:?}"))
                .and_then(|fetched| fetched);
            let description = format!(
                "exported to {client}: {client} ext -> {} web at {view} ({})",
                self.cluster(exporter).name,
                self.path_to(exporter),
                client = self.cluster(self.client).name
            );
            self.isolation_check(out, description, outcome);
        }
        // By name, through the ClusterSetIP, as before the change.
        let by_name = self.fetch_until(|f| matches!(f, Fetched::From(e, _) if *e == first));
        let description = format!(
            "exported to {}: {} by name from its pod reaches {}",
            self.cluster(self.client).name,
            self.demo.host(),
            self.cluster(first).name
        );
        self.isolation_check(
            out,
            description,
            by_name
                .map(|took| format!("answered within {} ms", took.as_millis()))
                .map_err(|last| format!("{last:?}")),
        );
        // The outsider at the same real address: refused by the first, served by the others.
        let before = self.refusals(first, outsider);
        let refused = isolation::fetch_address(&outsider_ns, outsider_view, TARGET_PORT);
        let after = self.refusals(first, outsider);
        let description = format!(
            "not exported to {outsider_name}: {outsider_name} ext (the same real address as {}'s) -> {} web at {outsider_view} (direct link)",
            self.cluster(self.client).name,
            self.cluster(first).name,
            outsider_name = self.cluster(outsider).name
        );
        let outcome = match refused {
            Ok(body) => Err(format!("answered {body:?}")),
            Err(_) if after > before => Ok(format!(
                "no answer; {}'s gateway counted {} refused packet(s) from {} ({} in all)",
                self.cluster(first).name,
                after - before,
                self.cluster(outsider).name,
                after
            )),
            Err(why) => Err(format!(
                "no answer ({why}), but {}'s gateway counted no refusal",
                self.cluster(first).name
            )),
        };
        self.isolation_check(out, description, outcome);
        for &other in &others {
            let (ns, view) = self.backend_from(outsider, other)?;
            let description = format!(
                "exported to {name}: {name} ext -> {} web at {view} (direct link)",
                self.cluster(other).name,
                name = self.cluster(outsider).name
            );
            let outcome = isolation::fetch_address(&ns, view, TARGET_PORT);
            self.isolation_check(out, description, outcome);
        }
        // A pod that is no endpoint of an export answers nothing, not even a refusal.
        let (client, exporter) = (self.cluster(self.client), self.cluster(first));
        if let (Some(pod), Some(target)) = (client.pods.first(), exporter.pods.first())
            && let Some(view) = reach_address(client, exporter, target.address)
        {
            let answered = isolation::answers(&pod.namespace, view, TARGET_PORT);
            let description = format!(
                "{} pod -> {} pod at {view}, no endpoint of an export: ping and TCP",
                client.name, exporter.name
            );
            let outcome = if answered {
                Err("it answered".to_owned())
            } else {
                Ok("no answer to either".to_owned())
            };
            self.isolation_check(out, description, outcome);
        }

        // The outsider becomes a consumer of the first export and stops being one again.
        let mut granted = Vec::new();
        let mut revoked = Vec::new();
        let mut failure = None;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            self.set_consumers(first, Some(vec![client_id.clone(), outsider_id.clone()]))?;
            match isolation::fetch_until(&outsider_ns, outsider_view, TARGET_PORT, true, CONVERGE) {
                Ok(_) => granted.push(started.elapsed()),
                Err(last) => {
                    failure = Some(format!(
                        "not served {CONVERGE:?} after it was named: {last:?}"
                    ));
                    break;
                }
            }
            let started = Instant::now();
            self.set_consumers(first, Some(vec![client_id.clone()]))?;
            match isolation::fetch_until(&outsider_ns, outsider_view, TARGET_PORT, false, CONVERGE)
            {
                Ok(_) => revoked.push(started.elapsed()),
                Err(last) => {
                    failure = Some(format!(
                        "still served {CONVERGE:?} after it was removed: {last:?}"
                    ));
                    break;
                }
            }
        }
        let description = format!(
            "{} named in and removed from the consumers of {}'s export, {ROUNDS} rounds",
            self.cluster(outsider).name,
            self.cluster(first).name
        );
        let outcome = match failure {
            Some(failure) => Err(failure),
            None => Ok(format!(
                "named → served: {}; removed → refused: {}",
                summary(&mut granted),
                summary(&mut revoked)
            )),
        };
        self.isolation_check(out, description, outcome);
        self.export_policies(out, first, outsider)?;

        // Open again: the outsider is served without being a consumer, as before.
        let started = Instant::now();
        self.lab.set_isolation(Isolation::Open, out)?;
        let served =
            isolation::fetch_until(&outsider_ns, outsider_view, TARGET_PORT, true, CONVERGE);
        let description = format!(
            "every link set to open: {} ext -> {} web at {outsider_view} again",
            self.cluster(outsider).name,
            self.cluster(first).name
        );
        self.isolation_check(
            out,
            description,
            served
                .map(|_| {
                    format!(
                        "served {} ms after the change began",
                        started.elapsed().as_millis()
                    )
                })
                .map_err(|last| format!("{last:?}")),
        );
        self.set_consumers(first, None)?;
        for &other in &others {
            self.set_consumers(other, None)?;
        }
        Ok(())
    }

    fn isolation_check(
        &mut self,
        out: &mut dyn Write,
        description: String,
        outcome: Result<String, String>,
    ) {
        let check = Check::new(ISOLATION_PHASE, description, outcome);
        report_check(out, &check);
        self.lab.checks.push(check);
    }

    /// Every exporter unexports: the name stops resolving.
    fn unexported(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let exporters = self.exporters.clone();
        self.export(&exporters, false)?;
        let outcome = match self.fetch_until(|f| *f == Fetched::Unresolved) {
            Ok(took) => Ok(format!("NXDOMAIN {} ms after unexport", took.as_millis())),
            Err(last) => Err(format!("still there: {last:?}")),
        };
        let description = format!(
            "unexported everywhere: {} no longer resolves",
            self.demo.host()
        );
        self.check(out, description, outcome);
        Ok(())
    }

    /// How the client reaches `exporter`: through their shortcut, through the hub, or over
    /// their link.
    fn path_to(&self, exporter: usize) -> String {
        let topology = self.lab.topology;
        let (a, b) = (
            &self.cluster(self.client).name,
            &self.cluster(exporter).name,
        );
        let pair = |l: &crate::topology::LinkSpec| {
            (l.0.eq_ignore_ascii_case(a) && l.1.eq_ignore_ascii_case(b))
                || (l.0.eq_ignore_ascii_case(b) && l.1.eq_ignore_ascii_case(a))
        };
        if topology.hub_only.iter().any(pair) {
            format!("through {}", topology.hub_of(a, b).unwrap_or_default())
        } else if topology.shortcuts.iter().any(pair) {
            "shortcut".to_owned()
        } else {
            "direct link".to_owned()
        }
    }
}

/// Routes the client's service range into a device in its node namespace (a veth whose peer
/// stays there too: the `dummy` module is not everywhere), as a node's
/// default route would take it: what the kube-proxy stand-in does not DNAT then reaches its
/// reject rules (without a route it would be dropped, or answered by a rate-limited ICMP
/// error, and a racing client would wait for its connect timeout).
fn route_service_range(ns: &str, range: Ipv4Net) -> Result<(), LabError> {
    let _ = netns::exec_in(ns, &["ip", "link", "del", SERVICE_LINK]);
    netns::exec_in(
        ns,
        &[
            "ip",
            "link",
            "add",
            SERVICE_LINK,
            "type",
            "veth",
            "peer",
            "name",
            SERVICE_LINK_PEER,
        ],
    )?;
    netns::exec_in(ns, &["ip", "link", "set", SERVICE_LINK_PEER, "up"])?;
    netns::exec_in(ns, &["ip", "link", "set", SERVICE_LINK, "up"])?;
    netns::exec_in(
        ns,
        &[
            "ip",
            "route",
            "add",
            &range.to_string(),
            "dev",
            SERVICE_LINK,
        ],
    )?;
    Ok(())
}

/// `curl http://<host>/` in namespace `ns` through its resolver, bounded (1 s to connect, 2 s
/// in all), never through a proxy from the environment.
pub fn fetch_by_name(ns: &str, host: &str) -> std::io::Result<std::process::Output> {
    netns::command_in(ns, "curl")
        .args([
            "-sS",
            "--noproxy",
            "*",
            "--connect-timeout",
            "1",
            "--max-time",
            "2",
        ])
        .arg(format!("http://{host}/"))
        .stdin(Stdio::null())
        .output()
}

/// Whether the kube-proxy stand-in's rules in `ns` DNAT anything to `address`.
fn proxy_leads_to(ns: &str, address: Ipv4Addr) -> bool {
    netns::exec_in(ns, &["nft", "list", "table", "ip", proxy::TABLE])
        .map(|rules| rules.contains(&format!("dnat to {address}:")))
        .unwrap_or(true)
}

/// What the backend in `cluster` answers with first: `<name> in <cluster>`.
fn backend_label(demo: &ServiceDemo, cluster: &ClusterState) -> String {
    format!("{} in {}", demo.name, cluster.name)
}

/// Starts `kubetun-lab <args>` inside namespace `ns`, detached (it lives as long as the
/// namespace), its output into `log`.
fn start_standin(ns: &str, args: &[&str], log: &Path) -> Result<(), LabError> {
    use std::os::unix::process::CommandExt as _;
    let binary = crate::options::program("kubetun-lab")?;
    let (stdout, stderr) = crate::fabric::open_log(log)?;
    netns::command_in(ns, &binary.to_string_lossy())
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map(drop)
        .map_err(|error| LabError::Io {
            path: binary,
            error,
        })
}

/// The files `ip netns exec` puts over `/etc` in namespace `ns`: `nameserver` as its
/// resolver, and host lookups by files and DNS only (no host resolver daemon).
fn write_resolver(ns: &str, nameserver: Ipv4Addr) -> Result<(), LabError> {
    let dir = Path::new("/etc/netns").join(ns);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |error| LabError::Io { path, error }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    for (file, text) in [
        (
            "resolv.conf",
            // One query at a time: A and AAAA sent together from one socket through a DNAT
            // race in conntrack, and the loser waits for the timeout (the kube-dns race).
            format!("nameserver {nameserver}\noptions timeout:1 attempts:2 single-request\n"),
        ),
        ("nsswitch.conf", "hosts: files dns\n".to_owned()),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    Ok(())
}

/// Removes the resolver files the demo wrote for namespace `ns` (absent is fine).
pub fn remove_resolver(ns: &str) {
    let dir = Path::new("/etc/netns").join(ns);
    for file in ["resolv.conf", "nsswitch.conf"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    let _ = std::fs::remove_dir(&dir);
}

/// The files the demo may write into the state directory for cluster `id`: stand-in logs and
/// the DNS table.
pub fn files_of(id: &str) -> Vec<String> {
    [
        "backend.log",
        "dns.json",
        "dns.tmp",
        "dns.log",
        "kube-proxy.log",
    ]
    .iter()
    .map(|f| format!("{id}-{f}"))
    .collect()
}
