//! Fallback through a hub, against three real gateways in namespaces joined by veth pairs:
//! Rome and Milan (both 10.70.0.0/16) linked directly (the shortcut) and each to the hub,
//! which sees them as 10.71.0.0/16 and 10.72.0.0/16 and forwards between them. Rome sees
//! Milan as 10.73.0.0/16 over the shortcut, and over the hub through a fallback route
//! (10.72.0.0/16 on the wire, the same view), so switching path changes no address; Milan
//! likewise sees Rome as 10.74.0.0/16 both ways.
//!
//! - With the shortcut up, traffic goes direct: the hub's counters stay flat.
//! - The shortcut's link is cut: both ends' connectivity checks (100 ms, 5 probes) find it
//!   unreachable and their views move to the hub; the hub carries the traffic.
//! - The link heals: after 3 s of answered probes the traffic returns to the shortcut.
//! - A TCP stream (iperf3) runs across both switches without a reset; the longest stall
//!   is reported.
//! - A hub that does not allow transit (its leaves' views are not among its sources) drops
//!   what a leaf sends through it.
//!
//! Traffic stays between the addresses the test assigns inside its namespaces.

use crate::gateway_ns;

use std::process::Stdio;
use std::time::{Duration, Instant};

use gateway_ns::GatewayNs;
use kubetun_controller::gateway_api::{self, ConnCheck, DesiredState, PeerStatus};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::ha::{PingTrain, unix_now};
use kubetun_integration::netns::{NsChild, require_root, veth};

const PORT: u32 = 51820;
/// Cuts and heals of the shortcut.
const ROUNDS: u32 = 5;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn route(real: &str, view: &str, fallback: bool) -> gateway_api::Route {
    gateway_api::Route {
        real: real.to_owned(),
        view: view.to_owned(),
        fallback,
    }
}

fn peer(
    name: &str,
    key: &GatewayKey,
    endpoint: &str,
    routes: Vec<gateway_api::Route>,
) -> gateway_api::Peer {
    gateway_api::Peer {
        public_key: key.public_base64().to_owned(),
        name: name.to_owned(),
        endpoint: format!("{endpoint}:{PORT}"),
        persistent_keepalive: 1,
        routes,
        ..Default::default()
    }
}

fn state(
    own: &GatewayNs,
    address: &str,
    local: &[&str],
    peers: Vec<gateway_api::Peer>,
) -> DesiredState {
    DesiredState {
        version: "v1".to_owned(),
        interface: Some(gateway_api::Interface {
            private_key: own.key.private_base64(),
            listen_port: PORT,
            addresses: vec![format!("{address}/32")],
            local_prefixes: local.iter().map(|p| (*p).to_owned()).collect(),
            manage_routes: true,
            // Every peer on the default 2 s but the shortcut's, whose losses move traffic.
            conncheck: Some(ConnCheck {
                interval_ms: 2000,
                loss_threshold: 5,
                fallback_interval_ms: 100,
            }),
            ..Default::default()
        }),
        peers,
    }
}

/// A leaf's state (both leaves have 10.70.0.0/16): the other leaf over the shortcut at
/// `view`, and the hub (10.200.0.0/16) carrying the same view as a fallback, the other leaf
/// being `at_hub` there.
fn leaf_state(
    own: &GatewayNs,
    address: &str,
    (other, other_key, other_endpoint): (&str, &GatewayKey, &str),
    view: &str,
    (hub_key, hub_endpoint): (&GatewayKey, &str),
    at_hub: &str,
) -> DesiredState {
    state(
        own,
        address,
        &["10.70.0.0/16"],
        vec![
            peer(
                other,
                other_key,
                other_endpoint,
                vec![route("10.70.0.0/16", view, false)],
            ),
            peer(
                "hub",
                hub_key,
                hub_endpoint,
                vec![route("10.200.0.0/16", "", false), route(at_hub, view, true)],
            ),
        ],
    )
}

async fn peer_status(client: &GatewayClient, name: &str) -> PeerStatus {
    client
        .status()
        .await
        .expect("status")
        .peers
        .into_iter()
        .find(|p| p.name == name)
        .expect("peer")
}

/// Polls until `done` holds for `name`'s status; the time it took.
async fn wait_for(
    client: &GatewayClient,
    name: &str,
    timeout: Duration,
    done: impl Fn(&PeerStatus) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        if done(&peer_status(client, name).await) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "{name}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A burst of 50 1000-byte pings from Rome to Milan's view; returns how many bytes the hub
/// received from Rome meanwhile (other traffic included).
async fn hub_bytes_during_burst(rome: &GatewayNs, hub: &GatewayClient) -> u64 {
    let before = peer_status(hub, "rome").await.rx_bytes;
    assert!(
        rome.ns.succeeds(&[
            "ping",
            "-q",
            "-c",
            "50",
            "-i",
            "0.01",
            "-s",
            "1000",
            "-W",
            "1",
            "-I",
            "10.70.1.1",
            "10.73.2.2"
        ]),
        "the burst got no answer"
    );
    peer_status(hub, "rome").await.rx_bytes - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_carries_a_cut_shortcut_and_gives_it_back_once_healed() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("gateway_fallback") {
        return;
    }
    let mut rome = GatewayNs::new("kfb-r");
    let mut hub = GatewayNs::new("kfb-h");
    let mut milan = GatewayNs::new("kfb-m");
    for (a, a_if, a_ip, b, b_if, b_ip) in [
        (&rome, "dm", "198.19.1.1", &milan, "dr", "198.19.1.2"),
        (&rome, "hu", "198.19.2.1", &hub, "ru", "198.19.2.2"),
        (&hub, "mu", "198.19.3.1", &milan, "hu", "198.19.3.2"),
    ] {
        veth(&a.ns, a_if, &b.ns, b_if).expect("veth");
        a.ns.exec(&["ip", "addr", "add", &format!("{a_ip}/30"), "dev", a_if])
            .expect("address");
        b.ns.exec(&["ip", "addr", "add", &format!("{b_ip}/30"), "dev", b_if])
            .expect("address");
    }
    for gateway in [&mut rome, &mut hub, &mut milan] {
        gateway.start(&[]);
    }
    let rome_state = leaf_state(
        &rome,
        "10.70.1.1",
        ("milan", &milan.key, "198.19.1.2"),
        "10.73.0.0/16",
        (&hub.key, "198.19.2.2"),
        "10.72.0.0/16",
    );
    let milan_state = leaf_state(
        &milan,
        "10.70.2.2",
        ("rome", &rome.key, "198.19.1.1"),
        "10.74.0.0/16",
        (&hub.key, "198.19.3.1"),
        "10.71.0.0/16",
    );
    // The hub forwards between its views of the two leaves: their sources are allowed.
    let hub_state = state(
        &hub,
        "10.200.0.1",
        &["10.200.0.0/16", "10.71.0.0/16", "10.72.0.0/16"],
        vec![
            peer(
                "rome",
                &rome.key,
                "198.19.2.1",
                vec![route("10.70.0.0/16", "10.71.0.0/16", false)],
            ),
            peer(
                "milan",
                &milan.key,
                "198.19.3.2",
                vec![route("10.70.0.0/16", "10.72.0.0/16", false)],
            ),
        ],
    );
    let (r, h, m) = (rome.client(), hub.client(), milan.client());
    r.apply(rome_state).await.expect("apply rome");
    h.apply(hub_state.clone()).await.expect("apply hub");
    m.apply(milan_state).await.expect("apply milan");
    let started = Instant::now();
    while !rome.pings("10.70.1.1", "10.73.2.2", 1) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "Rome does not reach Milan"
        );
    }

    // Direct: the hub sees almost nothing of a 50 kB burst.
    let direct = hub_bytes_during_burst(&rome, &h).await;
    println!("shortcut up: the hub received {direct} bytes from Rome during a 50 kB burst");
    assert!(
        direct < 10_000,
        "traffic went through the hub: {direct} bytes"
    );

    let mut iperf_server = NsChild::spawn(
        milan
            .ns
            .command("iperf3")
            .args(["-s", "-1", "-B", "10.70.2.2", "-p", "5299"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("iperf3 server");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = rome
        .ns
        .command("iperf3")
        .args([
            "-c",
            "10.73.2.2",
            "-B",
            "10.70.1.1",
            "-p",
            "5299",
            "-t",
            "44",
            "-i",
            "0.1",
            "-b",
            "50M",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3 client");
    let train = PingTrain::start(rome.ns.name(), "10.70.1.1", "10.73.2.2").expect("pings");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Cut the shortcut and heal it, five times.
    let (mut cut_gaps, mut heal_gaps, mut switch_times) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let cut_at = unix_now();
        rome.ns
            .exec(&["ip", "link", "set", "dm", "down"])
            .expect("cut");
        let switched = wait_for(&r, "milan", Duration::from_secs(5), |p| p.failed_over).await;
        wait_for(&m, "rome", Duration::from_secs(5), |p| p.failed_over).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let cut_gap = train
            .longest_gap(cut_at, unix_now())
            .expect("replies via the hub");
        let through_hub = hub_bytes_during_burst(&rome, &h).await;
        assert!(
            through_hub > 50_000,
            "the hub carried only {through_hub} bytes of a 50 kB burst while the shortcut was cut"
        );

        let healed_at = unix_now();
        rome.ns
            .exec(&["ip", "link", "set", "dm", "up"])
            .expect("heal");
        let returned = wait_for(&r, "milan", Duration::from_secs(10), |p| !p.failed_over).await;
        wait_for(&m, "rome", Duration::from_secs(10), |p| !p.failed_over).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let heal_gap = train.longest_gap(healed_at, unix_now()).expect("replies");
        println!(
            "round {round}: cut: Rome switched to the hub after {switched:?}, pings stopped for {cut_gap:.3} s \
             (a 50 kB burst: {through_hub} bytes through the hub); healed: back after {returned:?}, longest silence {heal_gap:.3} s"
        );
        assert!(
            returned >= Duration::from_secs(3),
            "hysteresis: the shortcut must answer 3 s before traffic returns"
        );
        cut_gaps.push(cut_gap);
        heal_gaps.push(heal_gap);
        switch_times.push(switched.as_secs_f64());
    }
    let (cut, heal, switch) = (median(cut_gaps), median(heal_gaps), median(switch_times));
    println!(
        "median of {ROUNDS}: switch to the hub {switch:.3} s after the cut, pings stopped {cut:.3} s; \
         back to the shortcut: pings stopped {heal:.3} s"
    );
    assert!(cut <= 2.0, "switch to the hub: {cut:.3} s");
    assert!(heal <= 2.0, "return to the shortcut: {heal:.3} s");
    assert_eq!(
        peer_status(&r, "milan").await.path_switches,
        2 * u64::from(ROUNDS)
    );
    drop(train);

    let out = client.wait_with_output().expect("iperf3 client");
    assert!(
        out.status.success(),
        "the TCP stream broke: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let mut stall = 0.0f64;
    let mut longest = 0.0f64;
    for interval in report["intervals"].as_array().expect("intervals") {
        let sum = &interval["sum"];
        if sum["bytes"].as_u64() == Some(0) {
            stall += sum["seconds"].as_f64().unwrap_or(0.0);
            longest = longest.max(stall);
        } else {
            stall = 0.0;
        }
    }
    let retransmits = report["end"]["sum_sent"]["retransmits"]
        .as_u64()
        .unwrap_or(0);
    println!(
        "TCP stream across {} switches: longest stall {longest:.1} s, {retransmits} retransmits, no reset",
        2 * ROUNDS
    );
    assert!(longest <= 2.0, "the TCP stream stalled for {longest:.1} s");
    iperf_server.stop();

    // The direct path again: the hub is quiet.
    let direct = hub_bytes_during_burst(&rome, &h).await;
    assert!(
        direct < 10_000,
        "traffic still through the hub: {direct} bytes"
    );

    // A hub that does not allow transit between them forwards nothing: the leaves switch,
    // but the hub drops what it would send on (its sources are not its own).
    let mut denied = hub_state;
    if let Some(interface) = denied.interface.as_mut() {
        interface.local_prefixes = vec!["10.200.0.0/16".to_owned()];
    }
    denied.version = "v2".to_owned();
    h.apply(denied)
        .await
        .expect("apply the hub without transit");
    let drops = |status: &kubetun_controller::gateway_api::StatusResponse| {
        status
            .drops
            .get("local_source_not_allowed")
            .copied()
            .unwrap_or(0)
    };
    let dropped_before = drops(&h.status().await.expect("status"));
    rome.ns
        .exec(&["ip", "link", "set", "dm", "down"])
        .expect("cut");
    wait_for(&r, "milan", Duration::from_secs(5), |p| p.failed_over).await;
    assert!(
        !rome.pings("10.70.1.1", "10.73.2.2", 3),
        "transit that the hub does not allow went through"
    );
    let dropped = drops(&h.status().await.expect("status")) - dropped_before;
    println!("transit not allowed on the hub: no reply, {dropped} packets dropped by the hub");
    assert!(dropped >= 1, "the hub dropped {dropped} packets");
    rome.ns
        .exec(&["ip", "link", "set", "dm", "up"])
        .expect("heal");
}
