use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_proto::op::Query;
use proptest::prelude::*;

use super::*;

fn table() -> DnsTable {
    let web = DnsService {
        type_: ServiceImportType::ClusterSetIP,
        ips: vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10))],
        ports: vec![(Some("http".into()), "TCP".into(), 80)],
        endpoints: vec![(
            "milan".into(),
            "10-71-1-5".into(),
            IpAddr::V4(Ipv4Addr::new(10, 71, 1, 5)),
        )],
    };
    let db = DnsService {
        type_: ServiceImportType::Headless,
        ips: Vec::new(),
        ports: vec![(Some("pg".into()), "TCP".into(), 5432)],
        endpoints: vec![
            (
                "milan".into(),
                "db-0".into(),
                IpAddr::V4(Ipv4Addr::new(10, 71, 1, 6)),
            ),
            (
                "paris".into(),
                "db-0".into(),
                IpAddr::V6("fd00:72::6".parse::<Ipv6Addr>().unwrap()),
            ),
        ],
    };
    DnsTable::from([
        (("shop".to_owned(), "web".to_owned()), web),
        (("shop".to_owned(), "db".to_owned()), db),
    ])
}

fn ask(name: &str, kind: RecordType, transport: Transport) -> Message {
    let mut query = Message::query();
    query.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
    let bytes = answer(&table(), &query.to_vec().unwrap(), transport).expect("an answer");
    let response = Message::from_vec(&bytes).unwrap();
    assert_eq!(response.metadata.id, query.metadata.id);
    response
}

fn rdata(response: &Message) -> Vec<String> {
    response
        .answers
        .iter()
        .map(|r| r.data.to_string())
        .collect()
}

#[test]
fn a_clustersetip_service_resolves_to_its_clustersetip() {
    let response = ask(
        "web.shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(response.metadata.response_code, ResponseCode::NoError);
    assert!(response.metadata.authoritative);
    assert_eq!(rdata(&response), ["10.96.0.10"]);
    assert_eq!(response.answers[0].ttl, TTL);
    // Case does not matter.
    let upper = ask(
        "WEB.Shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(rdata(&upper), ["10.96.0.10"]);
    // No AAAA: NODATA, not NXDOMAIN.
    let aaaa = ask(
        "web.shop.svc.clusterset.local.",
        RecordType::AAAA,
        Transport::Udp,
    );
    assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
    assert!(aaaa.answers.is_empty());
}

#[test]
fn srv_records_name_the_port() {
    let response = ask(
        "_http._tcp.web.shop.svc.clusterset.local.",
        RecordType::SRV,
        Transport::Udp,
    );
    assert_eq!(
        rdata(&response),
        ["0 100 80 web.shop.svc.clusterset.local."]
    );
    let headless = ask(
        "_pg._tcp.db.shop.svc.clusterset.local.",
        RecordType::SRV,
        Transport::Udp,
    );
    assert_eq!(
        rdata(&headless),
        [
            "0 100 5432 db-0.milan.db.shop.svc.clusterset.local.",
            "0 100 5432 db-0.paris.db.shop.svc.clusterset.local."
        ]
    );
    let missing = ask(
        "_grpc._tcp.web.shop.svc.clusterset.local.",
        RecordType::SRV,
        Transport::Udp,
    );
    assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
}

#[test]
fn a_headless_service_resolves_to_its_endpoints_and_each_by_name() {
    let all = ask(
        "db.shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(rdata(&all), ["10.71.1.6"]);
    let v6 = ask(
        "db.shop.svc.clusterset.local.",
        RecordType::AAAA,
        Transport::Udp,
    );
    assert_eq!(rdata(&v6), ["fd00:72::6"]);
    let one = ask(
        "db-0.milan.db.shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(rdata(&one), ["10.71.1.6"]);
    let other = ask(
        "db-1.milan.db.shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(other.metadata.response_code, ResponseCode::NXDomain);
    // Per-endpoint names exist for headless imports only.
    let clusterset = ask(
        "10-71-1-5.milan.web.shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(clusterset.metadata.response_code, ResponseCode::NXDomain);
}

#[test]
fn what_nobody_exports_does_not_resolve_and_other_zones_are_refused() {
    let unknown = ask(
        "api.shop.svc.clusterset.local.",
        RecordType::A,
        Transport::Udp,
    );
    assert_eq!(unknown.metadata.response_code, ResponseCode::NXDomain);
    let local = ask("web.shop.svc.cluster.local.", RecordType::A, Transport::Udp);
    assert_eq!(local.metadata.response_code, ResponseCode::Refused);
    let elsewhere = ask("example.com.", RecordType::A, Transport::Udp);
    assert_eq!(elsewhere.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn malformed_truncated_and_oversized_input_gets_formerr_or_nothing() {
    // Too short for a header: nothing.
    assert_eq!(answer(&table(), &[0x12], Transport::Udp), None);
    // A header and garbage: FORMERR with the same id.
    let garbage = [0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0xff, 0xff];
    let reply = Message::from_vec(&answer(&table(), &garbage, Transport::Udp).unwrap()).unwrap();
    assert_eq!(reply.metadata.id, 0xabcd);
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    // A response is never answered (no loops between servers).
    let mut response = Message::response(7, OpCode::Query);
    response.add_query(Query::query(
        Name::from_ascii("web.shop.svc.clusterset.local.").unwrap(),
        RecordType::A,
    ));
    assert_eq!(
        answer(&table(), &response.to_vec().unwrap(), Transport::Udp),
        None
    );
    // Two questions: FORMERR.
    let mut two = Message::query();
    for name in [
        "web.shop.svc.clusterset.local.",
        "db.shop.svc.clusterset.local.",
    ] {
        two.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    }
    let reply =
        Message::from_vec(&answer(&table(), &two.to_vec().unwrap(), Transport::Udp).unwrap())
            .unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
}

#[test]
fn a_udp_answer_too_big_for_the_client_is_truncated() {
    let mut big = table();
    let endpoints = (0..200u32)
        .map(|i| {
            (
                "milan".to_owned(),
                format!("db-{i}"),
                IpAddr::V4(Ipv4Addr::from(0x0a47_0000 + i)),
            )
        })
        .collect();
    big.get_mut(&("shop".to_owned(), "db".to_owned()))
        .unwrap()
        .endpoints = endpoints;
    let mut query = Message::query();
    query.add_query(Query::query(
        Name::from_ascii("db.shop.svc.clusterset.local.").unwrap(),
        RecordType::A,
    ));
    let bytes = query.to_vec().unwrap();
    let udp = Message::from_vec(&answer(&big, &bytes, Transport::Udp).unwrap()).unwrap();
    assert!(udp.metadata.truncation);
    assert!(udp.answers.is_empty());
    let tcp = Message::from_vec(&answer(&big, &bytes, Transport::Tcp).unwrap()).unwrap();
    assert!(!tcp.metadata.truncation);
    assert_eq!(tcp.answers.len(), 200);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = answer(&table(), &bytes, Transport::Udp);
        let _ = answer(&table(), &bytes, Transport::Tcp);
    }
}

#[test]
fn srv_of_the_service_name_itself_lists_its_ports_as_coredns_does() {
    let web = ask(
        "web.shop.svc.clusterset.local.",
        RecordType::SRV,
        Transport::Udp,
    );
    assert_eq!(web.metadata.response_code, ResponseCode::NoError);
    assert_eq!(rdata(&web), ["0 100 80 web.shop.svc.clusterset.local."]);
    let db = ask(
        "db.shop.svc.clusterset.local.",
        RecordType::SRV,
        Transport::Udp,
    );
    let mut records = rdata(&db);
    records.sort();
    assert_eq!(
        records,
        [
            "0 100 5432 db-0.milan.db.shop.svc.clusterset.local.",
            "0 100 5432 db-0.paris.db.shop.svc.clusterset.local."
        ]
    );
}
