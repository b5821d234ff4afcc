//! The node -> gateway hop: single-stream TCP throughput (iperf3) to the remote view from the
//! gateway's node itself, from a pod on it, and from a pod behind another node whose route
//! agent sends the traffic to the gateway's node directly over the shared L2 or through the
//! VXLAN overlay. One multi-node cluster of network namespaces, plain routing behind the
//! gateway's node (no tunnel: the hop is measured alone), rounds interleaved, medians.
//!
//! `cargo bench -p kubetun-benches --bench node_hop` (root, iperf3). `NODE_HOP_ROUNDS` and
//! `NODE_HOP_SECONDS` change the number of rounds (default 5) and seconds per run (default 5).

use std::time::Duration;

use anyhow::{Context as _, bail};
use kubetun_agent::plan::Attachment;
use kubetun_fixtures::multinode::{MultiNodeCluster, REMOTE_HOST, REMOTE_VIEW, remote_endpoints};
use kubetun_testenv::iperf::{self, ClientSpec, Mode, Server};
use kubetun_testenv::netns::{self, Netns};

const GATEWAY: usize = 0;
const MEMBER: usize = 1;

#[derive(Debug, Clone, Copy)]
enum Path {
    GatewayNode,
    PodOnGatewayNode,
    MemberDirect,
    MemberOverlay,
}

impl Path {
    const ALL: [Self; 4] = [
        Self::GatewayNode,
        Self::PodOnGatewayNode,
        Self::MemberDirect,
        Self::MemberOverlay,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::GatewayNode => "gateway node (host)",
            Self::PodOnGatewayNode => "pod on the gateway node",
            Self::MemberDirect => "pod on another node, direct L2 hop",
            Self::MemberOverlay => "pod on another node, VXLAN hop",
        }
    }
}

fn env_number(name: &str, default: u32) -> anyhow::Result<u32> {
    match std::env::var(name) {
        Ok(value) => value.parse().with_context(|| format!("{name}={value}")),
        Err(_) => Ok(default),
    }
}

fn measure(
    cluster: &MultiNodeCluster,
    client: &Netns,
    seconds: u32,
    port: u16,
) -> anyhow::Result<iperf::Report> {
    let log = std::env::temp_dir().join(format!("kubetun-node-hop-{}.json", std::process::id()));
    let server = Server::start(cluster.remote(), REMOTE_HOST, port, &log)?;
    let spec = ClientSpec {
        server: REMOTE_HOST.to_owned(),
        port,
        mode: Mode::Tcp { streams: 1 },
        seconds,
        omit: 1,
    };
    let report = iperf::run_client(client, &spec);
    server.finish(Duration::from_secs(3));
    let _ = std::fs::remove_file(&log);
    Ok(report?)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no such flag.
    if !std::env::args().any(|arg| arg == "--bench") {
        return Ok(());
    }
    if !netns::require_root("node hop benchmark") {
        return Ok(());
    }
    if !netns::command_exists("iperf3") {
        bail!("iperf3 is not installed");
    }
    let rounds = env_number("NODE_HOP_ROUNDS", 5)?;
    let seconds = env_number("NODE_HOP_SECONDS", 5)?;

    let cluster = MultiNodeCluster::build("hop", 2)?;
    cluster.host_gateway(GATEWAY)?;
    let endpoints = remote_endpoints(&[REMOTE_VIEW]);
    let nodes = cluster.nodes();

    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); Path::ALL.len()];
    let mut port = 5301;
    for round in 1..=rounds {
        for (index, path) in Path::ALL.into_iter().enumerate() {
            let client = match path {
                Path::GatewayNode => &nodes[GATEWAY].netns,
                Path::PodOnGatewayNode => &nodes[GATEWAY].pod,
                Path::MemberDirect => {
                    cluster.agent_pass_all(GATEWAY, Attachment::Direct, &endpoints)?;
                    &nodes[MEMBER].pod
                }
                Path::MemberOverlay => {
                    cluster.agent_pass_all(GATEWAY, Attachment::Overlay, &endpoints)?;
                    &nodes[MEMBER].pod
                }
            };
            port += 1;
            let report = measure(&cluster, client, seconds, port)
                .with_context(|| format!("round {round}, {}", path.label()))?;
            let gbps = report.received_bps / 1e9;
            let retransmits = report.retransmits.unwrap_or(0) as f64;
            eprintln!(
                "round {round}/{rounds}  {:<38} {gbps:>6.2} Gbit/s  {retransmits:>6} retransmits",
                path.label()
            );
            results[index].0.push(gbps);
            results[index].1.push(retransmits);
        }
    }
    for index in 0..nodes.len() {
        cluster.agent_cleanup(index)?;
    }

    let baseline = median(&mut results[0].0.clone());
    println!();
    println!("| path | median Gbit/s | min–max | vs gateway node | median retransmits |");
    println!("|---|---|---|---|---|");
    for (path, (gbps, retransmits)) in Path::ALL.into_iter().zip(results.iter_mut()) {
        let m = median(gbps);
        let (min, max) = (gbps[0], gbps[gbps.len() - 1]);
        println!(
            "| {} | {m:.2} | {min:.2}–{max:.2} | {:.0} % | {:.0} |",
            path.label(),
            100.0 * m / baseline,
            median(retransmits)
        );
    }
    println!();
    println!(
        "single TCP stream, {rounds} interleaved rounds of {seconds} s (1 s omitted), plain routing behind the gateway's node"
    );
    Ok(())
}
