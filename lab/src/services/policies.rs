//! The export-policy checks of the services demo (in-process labs): the first exporter's
//! Service guarded by an ExportPolicy for the `app=frontend` pods of the client and of the
//! outsider. Only the labelled pod gets through; swapping the label between the two pods
//! moves access both ways, timed over several rounds.

use std::io::Write;
use std::net::Ipv4Addr;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kubetun_crds::{ExportPolicySpec, PolicyPeer};

use super::isolation;
use super::objects;
use super::timing::{CONVERGE, summary};
use super::{Driver, ROUNDS, Steps};
use crate::checks::reach_address;
use crate::error::LabError;
use crate::output::say;
use crate::service_demo::TARGET_PORT;

/// The label value the policy selects.
const FRONTEND: &str = "frontend";

/// A pod of one cluster and the view at which it reaches the exporter's backend.
struct Caller {
    cluster: String,
    pod: String,
    view: Ipv4Addr,
}

impl Steps<'_, '_> {
    /// The checks (links already exported, `first` offered to the client and `outsider`).
    pub(super) fn export_policies(
        &mut self,
        out: &mut dyn Write,
        first: usize,
        outsider: usize,
    ) -> Result<(), LabError> {
        if !matches!(self.driver, Driver::InProcess(_)) {
            say(
                out,
                "  isolation: export policies are checked in the in-process lab (the real-API test covers their API flow)",
            );
            return Ok(());
        }
        let (Some(client), Some(other)) = (
            self.caller(self.client, first),
            self.caller(outsider, first),
        ) else {
            say(
                out,
                "  isolation: no pods to check export policies with; skipped",
            );
            return Ok(());
        };
        let exporter = self.cluster(first).name.clone();
        let ids = vec![
            self.cluster(self.client).id.clone(),
            self.cluster(outsider).id.clone(),
        ];
        let policy = ExportPolicySpec {
            service: self.demo.name.clone(),
            ports: Vec::new(),
            from: vec![PolicyPeer {
                clusters: ids.clone(),
                namespace_selector: None,
                pod_selector: Some(LabelSelector {
                    match_labels: Some([("app".to_owned(), FRONTEND.to_owned())].into()),
                    ..LabelSelector::default()
                }),
            }],
        };
        self.set_consumers(first, Some(ids))?;
        self.guard(first, Some(policy), &[(&client.pod, Some(FRONTEND))])?;

        // The labelled pod of the client gets through; the outsider's, at a pod of its own
        // and not selected, is refused and counted.
        let served = isolation::fetch_until(&client.pod, client.view, TARGET_PORT, true, CONVERGE);
        self.isolation_check(
            out,
            format!(
                "policy on {exporter}'s web for app={FRONTEND}: {} pod (selected) -> web at {}",
                client.cluster, client.view
            ),
            served
                .map(|took| format!("served within {} ms", took.as_millis()))
                .map_err(|last| format!("{last:?}")),
        );
        let before = self.policy_refusals(first, outsider);
        let refused = isolation::fetch_address(&other.pod, other.view, TARGET_PORT);
        let after = self.policy_refusals(first, outsider);
        let outcome = match refused {
            Ok(body) => Err(format!("answered {body:?}")),
            Err(_) if after > before => Ok(format!(
                "no answer; {exporter}'s gateway counted {} not_selected packet(s)",
                after - before
            )),
            Err(why) => Err(format!(
                "no answer ({why}) but no not_selected refusal counted"
            )),
        };
        self.isolation_check(
            out,
            format!(
                "policy on {exporter}'s web: {} pod (a consumer, not selected) -> web at {}",
                other.cluster, other.view
            ),
            outcome,
        );

        // The label moves from one pod to the other and back, each way under the clock.
        let (mut moved, mut back) = (Vec::new(), Vec::new());
        let mut failure = None;
        for _ in 0..ROUNDS {
            for (pods, times) in [
                (
                    [(&client.pod, None), (&other.pod, Some(FRONTEND))],
                    &mut moved,
                ),
                (
                    [(&other.pod, None), (&client.pod, Some(FRONTEND))],
                    &mut back,
                ),
            ] {
                let (gained, lost) = if pods[1].0 == &other.pod {
                    (&other, &client)
                } else {
                    (&client, &other)
                };
                let started = Instant::now();
                self.guard(first, None, &pods)?;
                let cut =
                    isolation::fetch_until(&lost.pod, lost.view, TARGET_PORT, false, CONVERGE);
                let let_in =
                    isolation::fetch_until(&gained.pod, gained.view, TARGET_PORT, true, CONVERGE);
                match (cut, let_in) {
                    (Ok(_), Ok(_)) => times.push(started.elapsed()),
                    (cut, let_in) => {
                        failure = Some(format!(
                            "{CONVERGE:?} after the relabel: {} {:?}, {} {:?}",
                            lost.cluster, cut, gained.cluster, let_in
                        ));
                        break;
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        let outcome = match failure {
            Some(failure) => Err(failure),
            None => Ok(format!(
                "label moved to {} → {} cut off and {} let in: {}; moved back: {}",
                other.cluster,
                client.cluster,
                other.cluster,
                summary(&mut moved),
                summary(&mut back)
            )),
        };
        self.isolation_check(
            out,
            format!(
                "app={FRONTEND} moved between {}'s and {}'s pods (the same policy), {ROUNDS} rounds",
                client.cluster, other.cluster
            ),
            outcome,
        );
        self.guard(first, None, &[(&client.pod, None), (&other.pod, None)])?;
        self.set_policy(first, None)?;
        self.set_consumers(first, Some(vec![self.cluster(self.client).id.clone()]))
    }

    /// The first pod of `from` and the view at which it reaches `exporter`'s backend.
    fn caller(&self, from: usize, exporter: usize) -> Option<Caller> {
        let (cluster, backend) = (self.cluster(from), self.cluster(exporter));
        let pod = cluster.pods.first()?;
        let view = reach_address(cluster, backend, objects::backend_address(backend).ok()?)?;
        Some(Caller {
            cluster: cluster.name.clone(),
            pod: pod.namespace.clone(),
            view,
        })
    }

    /// Sets the policy (when `Some`) and the pods' labels, then publishes.
    fn guard(
        &mut self,
        exporter: usize,
        policy: Option<ExportPolicySpec>,
        labels: &[(&String, Option<&str>)],
    ) -> Result<(), LabError> {
        if let Driver::InProcess(driver) = &mut self.driver {
            if let Some(policy) = policy {
                driver.set_policy(&self.lab.state.clusters[exporter], Some(policy));
            }
            for (pod, app) in labels {
                driver.set_label(pod, *app);
            }
        }
        self.publish()
    }

    fn set_policy(
        &mut self,
        exporter: usize,
        policy: Option<ExportPolicySpec>,
    ) -> Result<(), LabError> {
        if let Driver::InProcess(driver) = &mut self.driver {
            driver.set_policy(&self.lab.state.clusters[exporter], policy);
        }
        self.publish()
    }

    /// Packets from `from` that `exporter`'s gateway refused as not selected by a policy.
    fn policy_refusals(&self, exporter: usize, from: usize) -> u64 {
        self.lab
            .runtime
            .block_on(self.lab.clients[exporter].status())
            .map_or(0, |status| {
                status
                    .admissions
                    .iter()
                    .filter(|a| a.cluster == self.cluster(from).id)
                    .filter_map(|a| a.drops.get("not_selected"))
                    .sum()
            })
    }
}
