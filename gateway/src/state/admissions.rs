//! The admissions of an `Apply` (`DesiredState.admissions`) as the core's
//! [`AdmissionConfig`]s: every value parsed here, the invariants across clusters (unique
//! ids, views that never overlap another cluster's) checked by
//! [`kubetun_gateway_core::state::DesiredState::validate`] with the rest of the state.

use std::net::IpAddr;

use crate::proto;
use kubetun_gateway_core::state::{
    AdmissionConfig, AdmittedEndpoint, Isolation, Protocol, SourcePolicy, StateError, parse_cidr,
};

/// Parses the request's admissions, naming the cluster and the value in every error.
pub fn from_proto(admissions: Vec<proto::Admission>) -> Result<Vec<AdmissionConfig>, StateError> {
    admissions
        .into_iter()
        .enumerate()
        .map(|(index, admission)| one(index, admission))
        .collect()
}

fn one(index: usize, admission: proto::Admission) -> Result<AdmissionConfig, StateError> {
    let label = if admission.cluster.is_empty() {
        format!("#{index}")
    } else {
        admission.cluster.clone()
    };
    let problem = |problem: String| StateError::Admission {
        cluster: label.clone(),
        problem,
    };
    let isolation = match proto::Isolation::try_from(admission.isolation) {
        Ok(proto::Isolation::Open) => Isolation::Open,
        Ok(proto::Isolation::Exported) => Isolation::Exported,
        Err(_) => {
            return Err(problem(format!(
                "unknown isolation {} (expected ISOLATION_OPEN or ISOLATION_EXPORTED)",
                admission.isolation
            )));
        }
    };
    let views = admission
        .views
        .iter()
        .map(|view| parse_cidr(&format!("admission {label}: view"), view))
        .collect::<Result<_, _>>()?;
    let endpoints = admission
        .endpoints
        .iter()
        .map(|endpoint| parse_endpoint(endpoint, &problem))
        .collect::<Result<_, StateError>>()?;
    let policies = admission
        .policies
        .iter()
        .map(|policy| {
            let named = |p: String| problem(format!("policy {}: {p}", policy.name));
            Ok(SourcePolicy {
                name: policy.name.clone(),
                endpoints: policy
                    .endpoints
                    .iter()
                    .map(|endpoint| parse_endpoint(endpoint, &named))
                    .collect::<Result<_, StateError>>()?,
                sources: policy
                    .sources
                    .iter()
                    .map(|source| {
                        source
                            .trim()
                            .parse::<IpAddr>()
                            .map_err(|_| named(format!("source {source:?} is not an IP address")))
                    })
                    .collect::<Result<_, StateError>>()?,
            })
        })
        .collect::<Result<_, StateError>>()?;
    Ok(AdmissionConfig {
        cluster: admission.cluster,
        isolation,
        views,
        endpoints,
        policies,
    })
}

/// One endpoint; `problem` names where it stands in an error.
fn parse_endpoint(
    endpoint: &proto::AdmittedEndpoint,
    problem: &dyn Fn(String) -> StateError,
) -> Result<AdmittedEndpoint, StateError> {
    let address = endpoint.address.trim().parse::<IpAddr>().map_err(|_| {
        problem(format!(
            "endpoint address {:?} is not an IP address",
            endpoint.address
        ))
    })?;
    let protocol = match proto::Protocol::try_from(endpoint.protocol) {
        Ok(proto::Protocol::Tcp) => Protocol::Tcp,
        Ok(proto::Protocol::Udp) => Protocol::Udp,
        Ok(proto::Protocol::Sctp) => Protocol::Sctp,
        Err(_) => {
            return Err(problem(format!(
                "endpoint {address}: unknown protocol {} (expected TCP, UDP or SCTP)",
                endpoint.protocol
            )));
        }
    };
    let port = u16::try_from(endpoint.port)
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| {
            problem(format!(
                "endpoint {address} {protocol:?}: port {} is out of range 1..=65535",
                endpoint.port
            ))
        })?;
    Ok(AdmittedEndpoint {
        address,
        protocol,
        port,
    })
}

#[cfg(test)]
#[path = "admissions_tests.rs"]
mod tests;
