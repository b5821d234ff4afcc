//! The demo Service as Kubernetes objects, the same in both kinds of lab: a selector-less
//! ClusterIP Service (port 80, `http`) whose EndpointSlice, written by the lab as a user writes
//! one for a backend outside the pod network, names the exporter's first external endpoint
//! (port 8080).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubetun_crds::contract::services::KUBE_SERVICE_NAME_LABEL;

use crate::error::LabError;
use crate::service_demo::{SERVICE_PORT, ServiceDemo, TARGET_PORT};
use crate::state::ClusterState;

/// The Service port's name.
const PORT_NAME: &str = "http";

/// The backend of `exporter`: its first external endpoint.
pub fn backend_address(exporter: &ClusterState) -> Result<Ipv4Addr, LabError> {
    exporter
        .externals
        .first()
        .map(|m| m.address)
        .ok_or_else(|| LabError::Internal(format!("{} has no external endpoint", exporter.name)))
}

/// The demo's namespace.
pub fn namespace(demo: &ServiceDemo) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(demo.namespace.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// The Service, selector-less.
pub fn backend_service(demo: &ServiceDemo) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(demo.name.clone()),
            namespace: Some(demo.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_owned()),
                protocol: Some("TCP".to_owned()),
                port: i32::from(SERVICE_PORT),
                target_port: Some(IntOrString::Int(i32::from(TARGET_PORT))),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The Service's EndpointSlice: `address`, ready, on the target port.
pub fn backend_slice(demo: &ServiceDemo, address: Ipv4Addr) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(demo)),
            namespace: Some(demo.namespace.clone()),
            labels: Some(BTreeMap::from([(
                KUBE_SERVICE_NAME_LABEL.to_owned(),
                demo.name.clone(),
            )])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".to_owned(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![address.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Endpoint::default()
        }]),
        ports: Some(vec![EndpointPort {
            name: Some(PORT_NAME.to_owned()),
            protocol: Some("TCP".to_owned()),
            port: Some(i32::from(TARGET_PORT)),
            ..EndpointPort::default()
        }]),
    }
}

/// The EndpointSlice's name.
pub fn slice_name(demo: &ServiceDemo) -> String {
    format!("{}-lab", demo.name)
}
