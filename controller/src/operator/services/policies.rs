//! IO shell of ExportPolicies, both roles of a cluster in one pass of the services sync:
//!
//! - **Exporter**: the valid policies of each exported Service become its offer's
//!   [`client_selectors`](kubetun_crds::ExportedServiceSpec::client_selectors) and the
//!   [`PolicyPlan`]s the gateway sync guards the Service's endpoints with; each policy's
//!   status says what it selects per client cluster (from the answers the gateway sync
//!   receives with the exports) or why it is invalid.
//! - **Client**: for every linked exporter whose offers ask this cluster, one
//!   `ClientIdentity` `for-<exporter>` with the addresses of the pods each selector matches
//!   (the pod watch starts with the first question); gone when nobody asks any more.
//!
//! The answers of the clients are read in each client with the read-only credential the
//! connector granted this cluster there (`ClientIdentity` `for-<this cluster>` only), by the
//! peer watch of the services sync.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::services::identity_name;
use kubetun_crds::{
    ClientIdentity, ClientIdentitySpec, ClientSelector, ExportPolicy, ExportPolicyStatus,
    ExportedServiceSpec, PolicyClient,
};

use super::sync::{Pass, Plans};
use super::writes::{FIELD_MANAGER, delete, hash, key};
use crate::planner::admission::{Answers, admissions};
use crate::planner::policy::{self, PolicyTally};
use crate::planner::{ExportEndpoints, PolicyPlan};
use crate::plumbing::{conditions, runtime};

impl Pass {
    /// Adds the selectors of the valid policies of `offer` (named `offer_name`) to it and
    /// records their plans in `plans`.
    pub(super) fn guard(
        &self,
        offer_name: &str,
        offer: &mut ExportedServiceSpec,
        plans: &mut Plans,
    ) {
        let Some(store) = &self.local.policies else {
            return;
        };
        let mut found: Vec<PolicyPlan> = Vec::new();
        let mut selectors: Vec<ClientSelector> = Vec::new();
        for object in store.state() {
            if object.namespace().as_deref() != Some(offer.namespace.as_str())
                || object.spec.service != offer.name
                || object.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let name = format!("{}/{}", offer.namespace, object.name_any());
            match policy::plan(&name, &object.spec, offer) {
                Ok((plan, asked)) => {
                    found.push(plan);
                    selectors.extend(asked);
                }
                // Fail closed: an invalid policy guards every endpoint and admits nothing,
                // rather than leave the Service open while it is fixed.
                Err(message) => {
                    found.push(policy::closed(&name, offer));
                    plans.invalid.push((object, message));
                }
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        selectors.sort_by(|a, b| a.key.cmp(&b.key).then(a.clusters.cmp(&b.clusters)));
        selectors.dedup();
        offer.client_selectors = selectors;
        if !found.is_empty() {
            plans.by_offer.insert(offer_name.to_owned(), found);
        }
    }

    /// The policies' statuses: `Valid`, and per client cluster what its answer selects.
    pub(super) async fn policy_status(
        &mut self,
        plans: &Plans,
        exports: &[ExportEndpoints],
        answers: &Answers,
    ) -> Result<(), kube::Error> {
        let Some(store) = self.local.policies.clone() else {
            return Ok(());
        };
        let tunnels = self.local.tunnels.state();
        let specs: Vec<_> = tunnels.iter().map(|te| &te.spec).collect();
        let (_, tallies) = admissions(&specs, exports, answers);
        let mut by_policy: HashMap<&str, Vec<&PolicyTally>> = HashMap::new();
        for tally in &tallies {
            by_policy
                .entry(tally.policy.as_str())
                .or_default()
                .push(tally);
        }
        let guarded: HashSet<&str> = plans
            .by_offer
            .values()
            .flatten()
            .map(|plan| plan.name.as_str())
            .collect();
        for object in store.state() {
            let namespace = object.namespace().unwrap_or_default();
            let name = format!("{namespace}/{}", object.name_any());
            let invalid = plans
                .invalid
                .iter()
                .find(|(o, _)| o.metadata.uid == object.metadata.uid)
                .map(|(_, message)| message.clone());
            let (valid, reason, message, clients) = match invalid {
                Some(message) => (
                    false,
                    "InvalidPolicy",
                    format!("{message}; until it is fixed the Service admits nobody it guards"),
                    Vec::new(),
                ),
                None if !guarded.contains(name.as_str()) => (
                    false,
                    "ServiceNotExported",
                    format!(
                        "Service {} is not exported (no valid ServiceExport of that name in \
                         {namespace})",
                        object.spec.service
                    ),
                    Vec::new(),
                ),
                None => (
                    true,
                    "Valid",
                    "the policy guards its Service".to_owned(),
                    clients_of(&object, by_policy.get(name.as_str())),
                ),
            };
            let old = object.status.clone().unwrap_or_default();
            let mut conditions = old.conditions.clone();
            conditions::set(
                &mut conditions,
                "Valid",
                valid,
                reason,
                &message,
                object.metadata.generation,
                Time(Timestamp::now()),
            );
            let status = ExportPolicyStatus {
                conditions,
                selected: clients.iter().map(|c| c.selected).sum(),
                clients,
                observed_generation: object.metadata.generation,
            };
            // The transition time stays unless the status flips, so an unchanged policy
            // hashes the same and is not written again.
            let key = format!("ExportPolicy/status/{name}");
            let digest = hash(&serde_json::to_string(&status).unwrap_or_default());
            if self.written.get(&key) == Some(&digest) {
                continue;
            }
            // A Warning Event when a problem appears or changes (not when the same one is
            // written again, e.g. after a restart).
            if let Some(problem) = status.conditions.iter().find(|c| c.status == "False") {
                let known = old.conditions.iter().any(|o| {
                    o.type_ == problem.type_
                        && o.status == problem.status
                        && o.message == problem.message
                });
                if !known {
                    crate::plumbing::events::warn(
                        &self.ctx.client,
                        &object.object_ref(&()),
                        &problem.reason,
                        "Guard",
                        &problem.message,
                    )
                    .await;
                }
            }
            let api: Api<ExportPolicy> = Api::namespaced(self.ctx.client.clone(), &namespace);
            match runtime::apply_status(&api, &object.name_any(), FIELD_MANAGER, &status).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
            self.written.insert(key, digest);
        }
        Ok(())
    }

    /// This cluster's answers: one ClientIdentity per exporter that asks it something,
    /// none for the others. `asked` holds, per linked exporter, the selectors of its offers
    /// that name this cluster.
    pub(super) async fn answer(
        &mut self,
        asked: BTreeMap<String, Vec<ClientSelector>>,
    ) -> Result<(), kube::Error> {
        let Some(own) = self.local.answers.clone() else {
            return Ok(());
        };
        let asking: BTreeMap<&String, &Vec<ClientSelector>> =
            asked.iter().filter(|(_, s)| !s.is_empty()).collect();
        let api: Api<ClientIdentity> =
            Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace);
        if !asking.is_empty() {
            let Some(pods) = self.pods() else {
                return Ok(()); // the pod watch just started; its first list wakes a pass
            };
            let pods: Vec<Pod> = pods.state().iter().map(|p| (**p).clone()).collect();
            let namespaces: Vec<_> = self
                .local
                .namespaces
                .state()
                .iter()
                .map(|n| (**n).clone())
                .collect();
            let id = self.ctx.cluster.cluster.id.clone();
            for (exporter, selectors) in &asking {
                let name = identity_name(exporter);
                let spec = ClientIdentitySpec {
                    cluster: id.clone(),
                    exporter: (*exporter).clone(),
                    selections: policy::select(&id, selectors, &namespaces, &pods),
                };
                let mut object = ClientIdentity::new(&name, spec);
                object.meta_mut().namespace = Some(self.ctx.namespace.clone());
                self.apply(&api, &name, &object).await?;
            }
        }
        for stale in own.state() {
            let exporter = stale.spec.exporter.as_str();
            if !asking.keys().any(|e| e.as_str() == exporter)
                || stale.name_any() != identity_name(exporter)
            {
                delete(&api, &stale.name_any()).await?;
                self.written.remove(&key::<ClientIdentity>(
                    &self.ctx.namespace,
                    &stale.name_any(),
                ));
            }
        }
        Ok(())
    }
}

/// Per client cluster the policy names: what its answer selects there.
fn clients_of(object: &ExportPolicy, tallies: Option<&Vec<&PolicyTally>>) -> Vec<PolicyClient> {
    let mut named: Vec<&String> = object.spec.from.iter().flat_map(|p| &p.clusters).collect();
    named.sort();
    named.dedup();
    named
        .into_iter()
        .map(|cluster| {
            let tally = tallies
                .into_iter()
                .flatten()
                .find(|t| &t.cluster == cluster);
            let message = match tally {
                None => Some(format!(
                    "{cluster} is not linked in exported mode, or the Service is not offered to it"
                )),
                Some(t) if t.unanswered => Some(format!("no answer from {cluster} yet")),
                Some(_) => None,
            };
            PolicyClient {
                cluster: cluster.clone(),
                selected: tally.map_or(0, |t| t.selected),
                rejected: tally.map_or(0, |t| t.rejected),
                message,
            }
        })
        .collect()
}
