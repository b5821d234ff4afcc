//! Pure: the `clusterset.local` zone of KEP-1645's DNS specification (schema 1.0.0), answered
//! from the imports of this cluster ([`DnsTable`]), and one DNS message in, one out
//! ([`answer`]); the wire format is hickory-proto's.
//!
//! - `<svc>.<ns>.svc.clusterset.local` A/AAAA: the ClusterSetIP, or for a headless import
//!   every ready endpoint;
//! - `_<port>._<proto>.<svc>.<ns>.svc.clusterset.local` SRV: the port on the service name, or
//!   for a headless import one record per ready endpoint naming it; SRV of
//!   `<svc>.<ns>.svc.clusterset.local` itself: the same for every port, as CoreDNS answers;
//! - `<hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local` A/AAAA: one endpoint of a headless
//!   import (the hostname is the endpoint's, else its address with dashes).
//!
//! A name nobody exports is NXDOMAIN; a name outside the zone is REFUSED (kubetun is no
//! resolver); a message that does not parse gets FORMERR when its header can be read, else
//! nothing. Answers over UDP fit the client's buffer (512 bytes without EDNS), else are sent
//! truncated so that the client retries over TCP.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use kubetun_crds::contract::services::SOURCE_CLUSTER_LABEL;
use kubetun_crds::mcs::ServiceImportType;

use super::desired::{DesiredImport, endpoint_hostname};

/// The zone kubetun answers for.
pub const ZONE: &str = "svc.clusterset.local.";
/// TTL of every answer: short, so that endpoint churn shows quickly.
pub const TTL: u32 = 5;
/// The largest UDP answer kubetun sends with EDNS, whatever the client offers.
const MAX_UDP: usize = 1232;
/// Without EDNS (RFC 1035).
const CLASSIC_UDP: usize = 512;

/// One imported Service as DNS sees it (serializable, so that a stand-in server can load a
/// table computed elsewhere).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DnsService {
    /// ClusterSetIP or Headless.
    pub type_: ServiceImportType,
    /// The ClusterSetIP(s).
    pub ips: Vec<IpAddr>,
    /// `(name, protocol, port)`.
    pub ports: Vec<(Option<String>, String, u16)>,
    /// The ready endpoints: `(cluster, hostname, address)`.
    pub endpoints: Vec<(String, String, IpAddr)>,
}

impl DnsService {
    /// How DNS sees `import`: its ClusterSetIPs `ips` (ignored for a headless import), its
    /// ports and its ready endpoints, named by the cluster that serves them.
    pub fn of_import(import: &DesiredImport, ips: Vec<IpAddr>) -> Self {
        let ips = match import.merged.type_ {
            ServiceImportType::ClusterSetIP => ips,
            ServiceImportType::Headless => Vec::new(),
        };
        let endpoints = import
            .slices
            .iter()
            .flat_map(|slice| {
                let cluster = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(SOURCE_CLUSTER_LABEL))
                    .cloned()
                    .unwrap_or_default();
                slice
                    .endpoints
                    .iter()
                    .flatten()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                    .flat_map(move |e| {
                        let cluster = cluster.clone();
                        e.addresses.iter().filter_map(move |a| {
                            let address = a.parse().ok()?;
                            let hostname = endpoint_hostname(e.hostname.as_deref(), address);
                            Some((cluster.clone(), hostname, address))
                        })
                    })
            })
            .collect();
        let ports = import
            .merged
            .ports
            .iter()
            .filter_map(|p| {
                Some((
                    p.name.clone(),
                    p.protocol.clone(),
                    u16::try_from(p.port).ok()?,
                ))
            })
            .collect();
        Self {
            type_: import.merged.type_,
            ips,
            ports,
            endpoints,
        }
    }
}

/// Every imported Service by `(namespace, name)`.
pub type DnsTable = BTreeMap<(String, String), DnsService>;

/// Over which transport a message came (bounds the answer's size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Datagrams: the answer fits the client's buffer or is truncated.
    Udp,
    /// A stream: up to 65 535 bytes.
    Tcp,
}

/// The answer to `request`, or `None` when not even its header can be read (or it is itself
/// an answer, which a server never answers).
pub fn answer(table: &DnsTable, request: &[u8], transport: Transport) -> Option<Vec<u8>> {
    let message = match Message::from_vec(request) {
        Ok(message) => message,
        Err(_) => {
            let id = u16::from_be_bytes([*request.first()?, *request.get(1)?]);
            let flags = *request.get(2)?;
            if flags & 0x80 != 0 {
                return None;
            }
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        }
    };
    if message.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(message.metadata.id, message.metadata.op_code);
    response.metadata.recursion_desired = message.metadata.recursion_desired;
    response.add_queries(message.queries.iter().cloned());
    let limit = match (transport, &message.edns) {
        (Transport::Tcp, _) => usize::from(u16::MAX),
        (Transport::Udp, Some(edns)) => usize::from(edns.max_payload()).clamp(CLASSIC_UDP, MAX_UDP),
        (Transport::Udp, None) => CLASSIC_UDP,
    };
    if message.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP as u16);
        response.set_edns(edns);
    }
    let code = match (message.metadata.op_code, message.queries.as_slice()) {
        (OpCode::Query, [query]) if query.query_class == DNSClass::IN => {
            match lookup(table, &query.name.to_lowercase(), query.query_type) {
                Lookup::Records(records) => {
                    response.metadata.authoritative = true;
                    response.add_answers(records);
                    ResponseCode::NoError
                }
                Lookup::NoName => {
                    response.metadata.authoritative = true;
                    ResponseCode::NXDomain
                }
                Lookup::OutsideZone => ResponseCode::Refused,
            }
        }
        (OpCode::Query, _) => ResponseCode::FormErr,
        _ => ResponseCode::NotImp,
    };
    response.metadata.response_code = code;
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    response.truncate().to_vec().ok()
}

enum Lookup {
    Records(Vec<Record>),
    NoName,
    OutsideZone,
}

fn lookup(table: &DnsTable, name: &Name, kind: RecordType) -> Lookup {
    let Some(labels) = zone_labels(name) else {
        return Lookup::OutsideZone;
    };
    let find = |ns: &str, svc: &str| table.get(&(ns.to_owned(), svc.to_owned()));
    let records = match labels.as_slice() {
        [svc, ns] if kind == RecordType::SRV => {
            let Some(service) = find(ns, svc) else {
                return Lookup::NoName;
            };
            // As CoreDNS answers a Service's own name: every port (one record per number),
            // on the service name or, headless, on each ready endpoint's name.
            let mut numbers: Vec<u16> = service.ports.iter().map(|(_, _, n)| *n).collect();
            numbers.sort_unstable();
            numbers.dedup();
            srv_records(name, service, &format!("{svc}.{ns}.{ZONE}"), &numbers)
        }
        [svc, ns] => {
            let Some(service) = find(ns, svc) else {
                return Lookup::NoName;
            };
            let addresses: Vec<IpAddr> = match service.type_ {
                ServiceImportType::ClusterSetIP => service.ips.clone(),
                ServiceImportType::Headless => {
                    service.endpoints.iter().map(|(_, _, a)| *a).collect()
                }
            };
            address_records(name, kind, &addresses)
        }
        [port, proto, svc, ns] if port.starts_with('_') && proto.starts_with('_') => {
            let Some(service) = find(ns, svc) else {
                return Lookup::NoName;
            };
            let Some((_, _, number)) = service.ports.iter().find(|(n, p, _)| {
                n.as_deref() == Some(&port[1..]) && p.eq_ignore_ascii_case(&proto[1..])
            }) else {
                return Lookup::NoName;
            };
            if kind != RecordType::SRV {
                return Lookup::Records(Vec::new());
            }
            srv_records(name, service, &format!("{svc}.{ns}.{ZONE}"), &[*number])
        }
        [host, cluster, svc, ns] => {
            let Some(service) = find(ns, svc) else {
                return Lookup::NoName;
            };
            let addresses: Vec<IpAddr> = service
                .endpoints
                .iter()
                .filter(|(c, h, _)| c == cluster && h == host)
                .map(|(_, _, a)| *a)
                .collect();
            if service.type_ != ServiceImportType::Headless || addresses.is_empty() {
                return Lookup::NoName;
            }
            address_records(name, kind, &addresses)
        }
        _ => return Lookup::NoName,
    };
    Lookup::Records(records)
}

/// SRV records at `name` for each port of `numbers`: on the service name, or for a headless
/// import on each ready endpoint's `<host>.<cluster>.<service name>`.
fn srv_records(
    name: &Name,
    service: &DnsService,
    service_name: &str,
    numbers: &[u16],
) -> Vec<Record> {
    let targets: Vec<String> = match service.type_ {
        ServiceImportType::ClusterSetIP => vec![service_name.to_owned()],
        ServiceImportType::Headless => service
            .endpoints
            .iter()
            .map(|(cluster, host, _)| format!("{host}.{cluster}.{service_name}"))
            .collect(),
    };
    let mut records = Vec::new();
    for target in targets {
        let Ok(target) = Name::from_ascii(target) else {
            continue;
        };
        for number in numbers {
            records.push(Record::from_rdata(
                name.clone(),
                TTL,
                RData::SRV(SRV::new(0, 100, *number, target.clone())),
            ));
        }
    }
    records
}

/// The labels of `name` before the zone, in order (`["web", "shop"]`), or `None` outside it.
fn zone_labels(name: &Name) -> Option<Vec<String>> {
    let zone = Name::from_ascii(ZONE).ok()?;
    if !zone.zone_of(name) {
        return None;
    }
    let own = usize::from(name.num_labels()) - usize::from(zone.num_labels());
    Some(
        name.iter()
            .take(own)
            .map(|label| String::from_utf8_lossy(label).into_owned())
            .collect(),
    )
}

fn address_records(name: &Name, kind: RecordType, addresses: &[IpAddr]) -> Vec<Record> {
    addresses
        .iter()
        .filter_map(|address| {
            let rdata = match (kind, address) {
                (RecordType::A, IpAddr::V4(v4)) => RData::A(A(*v4)),
                (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(*v6)),
                _ => return None,
            };
            Some(Record::from_rdata(name.clone(), TTL, rdata))
        })
        .collect()
}

#[cfg(test)]
mod tests;
