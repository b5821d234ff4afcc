//! Pure: the gateway's admissions, what each linked cluster may open towards this one.
//!
//! One [`Admission`](gateway_api::Admission) per TunnelEndpoint: the cluster's id, the
//! isolation resolved into its spec, the views of its pod and external CIDRs (the views its
//! direct, fallback and hub-only routes carry alike) and, in `exported` mode, the local
//! endpoints of every Service this cluster exports to it ([`ExportEndpoints`]: what one
//! offer lets its consumers open, computed from the offer by [`ExportEndpoints::of_offer`]),
//! guarded by the source policies of those Services ([`super::policy`]).

use std::collections::BTreeMap;

use kubetun_crds::{ClientIdentitySpec, Isolation, TunnelEndpointSpec};

use super::endpoints::{ExportEndpoints, PolicyPlan, sort_endpoints};
use super::policy::{PolicyTally, source_policies};
use crate::gateway_api::{self, AdmittedEndpoint};

/// The isolation towards a peer: the link's own setting (what this cluster wrote into its
/// `to-` NetworkConfig), else `cluster_default`.
pub fn link_isolation(own: Option<Isolation>, cluster_default: Isolation) -> Isolation {
    own.unwrap_or(cluster_default)
}

/// The clusters' answers to this cluster's selectors, by cluster id.
pub type Answers = BTreeMap<String, ClientIdentitySpec>;

/// One admission per TunnelEndpoint in `endpoints` (sorted by cluster id by the caller), and
/// per exported cluster and policy naming it what its answer gave.
pub fn admissions(
    endpoints: &[&TunnelEndpointSpec],
    exports: &[ExportEndpoints],
    answers: &Answers,
) -> (Vec<gateway_api::Admission>, Vec<PolicyTally>) {
    let mut tallies = Vec::new();
    let admissions = endpoints
        .iter()
        .map(|te| {
            let mut views: Vec<String> = te
                .remote_pod_cidrs
                .iter()
                .chain(&te.remote_external_cidrs)
                .map(|m| m.view.clone())
                .chain(
                    te.fallback
                        .iter()
                        .flat_map(|f| f.routes.iter().map(|m| m.view.clone())),
                )
                .collect();
            views.sort();
            views.dedup();
            let (isolation, endpoints, policies) = match te.isolation {
                Isolation::Open => (gateway_api::Isolation::Open, Vec::new(), Vec::new()),
                Isolation::Exported => {
                    let offered: Vec<&ExportEndpoints> = exports
                        .iter()
                        .filter(|export| export.offered_to(&te.cluster.id))
                        .collect();
                    let mut admitted: Vec<AdmittedEndpoint> = offered
                        .iter()
                        .flat_map(|export| export.endpoints.iter().cloned())
                        .collect();
                    sort_endpoints(&mut admitted);
                    let mut plans: Vec<&PolicyPlan> =
                        offered.iter().flat_map(|e| e.policies.iter()).collect();
                    plans.sort_by(|a, b| a.name.cmp(&b.name));
                    plans.dedup_by(|a, b| a.name == b.name);
                    let (policies, found) =
                        source_policies(te, &plans, answers.get(&te.cluster.id));
                    tallies.extend(found);
                    (gateway_api::Isolation::Exported, admitted, policies)
                }
            };
            gateway_api::Admission {
                cluster: te.cluster.id.clone(),
                isolation: isolation as i32,
                views,
                endpoints,
                policies,
            }
        })
        .collect();
    (admissions, tallies)
}
