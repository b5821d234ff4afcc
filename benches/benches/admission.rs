//! Admission's per-packet cost: one TCP segment out (admission egress step + remap egress)
//! and its reply in (remap ingress + admission ingress), for 1024 flows, with no admission
//! at all, the remote cluster open, and the remote cluster exported (every reply a flow-table
//! hit), in the same run.
//!
//! The routes come in a pair whose views are each other's real prefixes (peer 0 sees
//! 10.60/16 as 10.50/16, peer 1 the reverse), so a packet translated twice is restored and
//! the same buffers serve every iteration; the admission names both views as the remote
//! cluster's, so both passes are judged alike.
//!
//! A second group judges inbound segments of 1024 remote pods to one exported endpoint
//! (admission ingress only: the remap's cost is the same in every case): the endpoint open to
//! every source of the cluster, guarded by a policy selecting those 1024 sources, and by one
//! selecting 10 000 (the scale of a large client cluster), in the same run.
//!
//! Run: `cargo bench -p kubetun-benches --bench admission`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use etherparse::PacketBuilder;
use ipnet::IpNet;
use kubetun_gateway_core::Now;
use kubetun_gateway_core::admission::allowed::Admissions;
use kubetun_gateway_core::admission::flows::FlowTable;
use kubetun_gateway_core::state::{
    AdmissionConfig, AdmittedEndpoint, DesiredState, Isolation, Protocol, SourcePolicy,
};
use kubetun_remap::{RemapTable, Route, TableBuilder, Verdict};

const FLOWS: usize = 1024;
const PACKET_LEN: usize = 1400;

fn net(text: &str) -> IpNet {
    text.parse().expect("prefix")
}

fn table() -> RemapTable {
    let mut builder = TableBuilder::new();
    let (p, q) = (net("10.50.0.0/16"), net("10.60.0.0/16"));
    builder
        .add_peer(0, &[Route { real: q, view: p }], None)
        .expect("peer 0");
    builder
        .add_peer(1, &[Route { real: p, view: q }], None)
        .expect("peer 1");
    builder.build().expect("table")
}

fn admissions(isolation: Option<Isolation>) -> Admissions {
    let mut state = DesiredState::default();
    if let Some(isolation) = isolation {
        state.admissions = vec![AdmissionConfig {
            cluster: "remote".into(),
            isolation,
            views: vec![net("10.50.0.0/16"), net("10.60.0.0/16")],
            endpoints: Vec::new(),
            policies: Vec::new(),
        }];
    }
    Admissions::build(&state, &Admissions::default())
}

/// Flow `i`: a segment from local pod 10.10.x.y to remote 10.50.x.y (a view) and its reply
/// from 10.60.x.y (the real address on the wire).
fn packets(i: usize) -> (Vec<u8>, Vec<u8>) {
    let (hi, lo) = ((i >> 8) as u8, i as u8);
    let payload = vec![0u8; PACKET_LEN - 40];
    let mut out = Vec::new();
    PacketBuilder::ipv4([10, 10, hi, lo], [10, 50, hi, lo], 64)
        .tcp(40_000 + i as u16, 443, 1, 1000)
        .ack(1)
        .write(&mut out, &payload)
        .expect("segment");
    let mut reply = Vec::new();
    PacketBuilder::ipv4([10, 60, hi, lo], [10, 10, hi, lo], 64)
        .tcp(443, 40_000 + i as u16, 1, 1000)
        .ack(1)
        .write(&mut reply, &payload)
        .expect("reply");
    (out, reply)
}

fn now() -> Now {
    Now {
        unix_ms: 0,
        mono_us: 1_000_000,
    }
}

fn bench(c: &mut Criterion) {
    let remap = table();
    let mut group = c.benchmark_group("admission");
    group.throughput(Throughput::Elements(FLOWS as u64));
    for (name, isolation) in [
        ("none", None),
        ("open", Some(Isolation::Open)),
        ("exported", Some(Isolation::Exported)),
    ] {
        let admissions = admissions(isolation);
        let flows = FlowTable::new(65_536);
        let (mut outs, mut replies): (Vec<_>, Vec<_>) = (0..FLOWS).map(packets).unzip();
        // Our SYNs opened the flows (both passes' views), so every reply is a table hit.
        for (i, out) in outs.iter().enumerate() {
            for view in [50u8, 60] {
                let mut syn = Vec::new();
                let mut dst = [out[16], out[17], out[18], out[19]];
                dst[1] = view;
                PacketBuilder::ipv4([out[12], out[13], out[14], out[15]], dst, 64)
                    .tcp(40_000 + i as u16, 443, 0, 1000)
                    .syn()
                    .write(&mut syn, &[])
                    .expect("syn");
                assert!(admissions.egress(&flows, &syn, now()));
            }
        }
        let mut pass = 0usize;
        group.bench_function(BenchmarkId::new("egress+ingress", name), |b| {
            b.iter(|| {
                let peer = (pass & 1) as u32;
                for (out, reply) in outs.iter_mut().zip(replies.iter_mut()) {
                    let sent = admissions.egress(&flows, out, now())
                        && matches!(remap.egress(out), Verdict::Forward(_));
                    let admitted = matches!(remap.ingress(peer, reply), Verdict::Deliver)
                        && admissions.ingress(&flows, reply, now());
                    assert!(sent && admitted);
                }
                pass += 1;
                black_box(&outs);
            });
        });
    }
    group.finish();
}

/// The remote cluster exported with endpoint 10.10.0.5 tcp/443, guarded by a policy that
/// selects `sources` remote pods (10.50.0.0 onwards) when `Some`.
fn inbound_admissions(sources: Option<usize>) -> Admissions {
    let endpoint = AdmittedEndpoint {
        address: "10.10.0.5".parse().expect("address"),
        protocol: Protocol::Tcp,
        port: 443,
    };
    let policies = sources
        .map(|n| SourcePolicy {
            name: "shop/frontend".into(),
            endpoints: vec![endpoint],
            sources: (0..n as u32)
                .map(|i| std::net::Ipv4Addr::from(u32::from_be_bytes([10, 50, 0, 0]) + i).into())
                .collect(),
        })
        .into_iter()
        .collect();
    let state = DesiredState {
        admissions: vec![AdmissionConfig {
            cluster: "remote".into(),
            isolation: Isolation::Exported,
            views: vec![net("10.50.0.0/16")],
            endpoints: vec![endpoint],
            policies,
        }],
        ..DesiredState::default()
    };
    state.validate().expect("valid");
    Admissions::build(&state, &Admissions::default())
}

fn bench_inbound(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_inbound");
    group.throughput(Throughput::Elements(FLOWS as u64));
    let segments: Vec<Vec<u8>> = (0..FLOWS)
        .map(|i| {
            let mut segment = Vec::new();
            PacketBuilder::ipv4([10, 50, (i >> 8) as u8, i as u8], [10, 10, 0, 5], 64)
                .tcp(40_000 + i as u16, 443, 1, 1000)
                .ack(1)
                .write(&mut segment, &[0u8; 64])
                .expect("segment");
            segment
        })
        .collect();
    for (name, sources) in [
        ("exported", None),
        ("policy-1k", Some(FLOWS)),
        ("policy-10k", Some(10_000)),
    ] {
        let admissions = inbound_admissions(sources);
        let flows = FlowTable::new(65_536);
        group.bench_function(BenchmarkId::new("ingress", name), |b| {
            b.iter(|| {
                for segment in &segments {
                    assert!(admissions.ingress(&flows, black_box(segment), now()));
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench, bench_inbound);
criterion_main!(benches);
