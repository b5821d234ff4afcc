//! The gateway-to-gateway connectivity check against real `kubetun-gateway` processes, each in
//! its own network namespace joined by a veth pair, configured over gRPC with a 200 ms probe
//! interval:
//!
//! - both gateways probe each other: the peer's `latency_us` becomes the probe RTT (non-zero,
//!   under 50 ms on a veth) within a few intervals, and `/metrics` has the RTT histogram;
//! - a packet read from the TUN device towards the probe addresses is dropped and counted;
//! - the peer's namespace is deleted (the peer vanishes): the status turns ERROR with the
//!   probe message within interval × (threshold + 1) plus slack; the namespace and the peer
//!   recreated with the same key: CONNECTED again;
//! - a wireguard-go peer (which never answers probes) with the check disabled for it stays
//!   CONNECTED, and turns ERROR once the check is enabled for it.
//!
//! Traffic stays between the addresses the test assigns inside its namespaces.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kubetun_controller::gateway_api::{self, ConnCheck, ConnectionState, DesiredState, PeerStatus};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::netns::{
    Netns, NsChild, bin_path, command_exists, remove_stale_socket, require_root, veth,
    wait_for_path,
};

const PORT: u32 = 51820;
const METRICS_PORT: u16 = 9587;
const INTERVAL_MS: u32 = 200;
const THRESHOLD: u32 = 5;
const STARTUP: Duration = Duration::from_secs(10);

/// One WireGuard side: a namespace, its veth end, and the process serving its interface.
struct Side {
    // Field order matters: the process stops before its namespace is deleted.
    process: Option<NsChild>,
    ns: Option<Netns>,
    ns_name: String,
    ifname: String,
    veth: String,
    underlay: Ipv4Addr,
    key: GatewayKey,
    dir: tempfile::TempDir,
}

impl Side {
    fn new(ns_name: &str, ifname: &str, veth: &str, underlay: Ipv4Addr) -> Side {
        Side {
            process: None,
            ns: Some(Netns::new(ns_name).expect("namespace")),
            ns_name: ns_name.to_owned(),
            ifname: ifname.to_owned(),
            veth: veth.to_owned(),
            underlay,
            key: GatewayKey::generate(),
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn ns(&self) -> &Netns {
        self.ns.as_ref().expect("namespace exists")
    }

    fn grpc_socket(&self) -> PathBuf {
        self.dir.path().join("gateway.grpc.sock")
    }

    fn uapi_socket(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/wireguard/{}.sock", self.ifname))
    }

    fn endpoint(&self) -> String {
        format!("{}:{PORT}", self.underlay)
    }

    fn address_underlay(&self) {
        let cidr = format!("{}/24", self.underlay);
        self.ns()
            .exec(&["ip", "address", "add", &cidr, "dev", &self.veth])
            .expect("underlay address");
    }

    fn start_kubetun(&mut self) {
        let _ = std::fs::remove_file(self.grpc_socket());
        let mut cmd = self
            .ns()
            .command(bin_path("kubetun-gateway").to_str().expect("utf-8 path"));
        cmd.args(["-f", &self.ifname, "--grpc-socket"])
            .arg(self.grpc_socket())
            .args(["--metrics-addr", &format!("127.0.0.1:{METRICS_PORT}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.process = Some(NsChild::spawn(&mut cmd).expect("start kubetun-gateway"));
        assert!(
            wait_for_path(&self.grpc_socket(), STARTUP),
            "{} did not open its control socket",
            self.ifname
        );
    }

    fn start_wireguard_go(&mut self) {
        remove_stale_socket(&self.uapi_socket());
        let mut cmd = self.ns().command("wireguard-go");
        cmd.args(["-f", &self.ifname])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.process = Some(NsChild::spawn(&mut cmd).expect("start wireguard-go"));
        assert!(
            wait_for_path(&self.uapi_socket(), STARTUP),
            "wireguard-go did not create {}",
            self.uapi_socket().display()
        );
    }

    fn client(&self) -> GatewayClient {
        GatewayClient::new(self.grpc_socket())
    }

    /// Deletes the namespace with everything in it: the process, the TUN device, the veth
    /// pair (the other end goes with it).
    fn vanish(&mut self) {
        drop(self.ns.take());
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }

    /// `/metrics`, fetched inside the namespace with bash's `/dev/tcp`.
    fn metrics(&self) -> String {
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{METRICS_PORT}; \
             printf 'GET /metrics HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3; cat <&3"
        );
        self.ns()
            .exec(&["bash", "-c", &script])
            .expect("fetch metrics")
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }
}

/// Joins two sides with a veth pair and addresses both ends.
fn link(a: &Side, b: &Side) {
    veth(a.ns(), &a.veth, b.ns(), &b.veth).expect("veth pair");
    a.address_underlay();
    b.address_underlay();
}

/// The state of a kubetun side with one peer.
fn state(
    own: &Side,
    peer: &Side,
    name: &str,
    own_prefix: &str,
    peer_prefix: &str,
    conncheck_disabled: bool,
) -> DesiredState {
    DesiredState {
        version: format!("{name}-{conncheck_disabled}"),
        interface: Some(gateway_api::Interface {
            private_key: own.key.private_base64(),
            listen_port: PORT,
            addresses: vec![own_prefix.to_owned()],
            conncheck: Some(ConnCheck {
                interval_ms: INTERVAL_MS,
                loss_threshold: THRESHOLD,
                fallback_interval_ms: 0,
            }),
            ..Default::default()
        }),
        peers: vec![gateway_api::Peer {
            public_key: peer.key.public_base64().to_owned(),
            name: name.to_owned(),
            endpoint: peer.endpoint(),
            persistent_keepalive: 1,
            routes: vec![gateway_api::Route {
                real: peer_prefix.to_owned(),
                view: String::new(),
                fallback: false,
            }],
            conncheck_disabled,
            ..Default::default()
        }],
    }
}

async fn peer_status(client: &GatewayClient, name: &str) -> Option<PeerStatus> {
    let status = client.status().await.ok()?;
    status.peers.into_iter().find(|p| p.name == name)
}

/// Polls every 20 ms until `done` holds for the peer's status or `timeout` passes; returns the
/// elapsed time and the last status seen.
async fn wait_for(
    client: &GatewayClient,
    name: &str,
    timeout: Duration,
    done: impl Fn(&PeerStatus) -> bool,
) -> (Option<Duration>, Option<PeerStatus>) {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        if let Some(peer) = peer_status(client, name).await {
            if done(&peer) {
                return (Some(start.elapsed()), Some(peer));
            }
            last = Some(peer);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (None, last)
}

fn state_of(peer: &PeerStatus) -> ConnectionState {
    ConnectionState::try_from(peer.state).unwrap_or_default()
}

fn connected_with_rtt(peer: &PeerStatus) -> bool {
    state_of(peer) == ConnectionState::Connected && peer.latency_us > 0
}

/// The value of the sample line starting with `prefix` in a metrics body.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

const PROBE_MESSAGE: &str = "no reply to the last 5 connectivity probes (200 ms interval)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_peer_turns_error_and_a_recreated_one_connected() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("a_vanished_peer_turns_error_and_a_recreated_one_connected") {
        return;
    }
    assert!(command_exists("bash"), "bash is needed to read /metrics");
    let mut a = Side::new("kt-cc-a", "ktcca", "vcc-a", Ipv4Addr::new(198, 51, 100, 1));
    let mut b = Side::new("kt-cc-b", "ktccb", "vcc-b", Ipv4Addr::new(198, 51, 100, 2));
    link(&a, &b);
    a.start_kubetun();
    b.start_kubetun();
    let (client_a, client_b) = (a.client(), b.client());
    let state_a = state(&a, &b, "b", "10.91.0.1/24", "10.92.0.0/24", false);
    let state_b = state(&b, &a, "a", "10.92.0.1/24", "10.91.0.0/24", false);
    client_a.apply(state_a).await.expect("apply a");
    client_b.apply(state_b.clone()).await.expect("apply b");

    // Probes flow: a probe RTT within a few intervals (the first handshake included).
    let (took, peer) = wait_for(&client_a, "b", Duration::from_secs(5), connected_with_rtt).await;
    let peer = peer.expect("a reports b");
    let took = took.unwrap_or_else(|| panic!("no probe RTT within 5 s: {peer:?}"));
    assert!(
        peer.latency_us < 50_000,
        "implausible RTT on a veth: {} µs",
        peer.latency_us
    );
    let conncheck = peer.conncheck.expect("the check is on for b");
    assert_eq!(conncheck.interval_ms, INTERVAL_MS);
    assert!(conncheck.probes_sent >= 1, "{conncheck:?}");
    assert!(conncheck.last_reply_unix_ms > 0, "{conncheck:?}");
    eprintln!(
        "probe RTT after {took:?}: latency_us {} (smoothed), last {} µs",
        peer.latency_us, conncheck.last_rtt_us
    );
    // Both directions: b measures a too.
    let (_, back) = wait_for(&client_b, "a", Duration::from_secs(5), connected_with_rtt).await;
    assert!(back.is_some_and(|p| connected_with_rtt(&p)), "b measures a");

    // The histogram and counters are exported.
    tokio::time::sleep(Duration::from_millis(3 * u64::from(INTERVAL_MS))).await;
    let metrics = a.metrics();
    let count = sample(&metrics, "kubetun_peer_rtt_seconds_count{peer=\"b\"}")
        .unwrap_or_else(|| panic!("no RTT histogram in /metrics:\n{metrics}"));
    assert!(count >= 2.0, "RTT samples: {count}");
    let fast = sample(
        &metrics,
        "kubetun_peer_rtt_seconds_bucket{le=\"0.05\",peer=\"b\"}",
    )
    .or_else(|| {
        sample(
            &metrics,
            "kubetun_peer_rtt_seconds_bucket{peer=\"b\",le=\"0.05\"}",
        )
    })
    .unwrap_or_else(|| panic!("no 50 ms bucket in /metrics:\n{metrics}"));
    assert!(fast >= 1.0, "samples under 50 ms: {fast}");
    assert!(
        sample(&metrics, "kubetun_peer_probes_sent_total{peer=\"b\"}").is_some_and(|n| n >= 2.0),
        "probe counter missing:\n{metrics}"
    );

    let peer = peer_status(&client_a, "b").await.expect("b");
    eprintln!(
        "steady state: latency_us {} (smoothed), last {:?} µs, {count} samples",
        peer.latency_us,
        peer.conncheck.map(|c| c.last_rtt_us)
    );
    // Probes are consumed by the gateways, never user-traffic drops: unconsumed, they would
    // fail the source check (169.254.90.x is no peer's prefix).
    for (side, client) in [("a", &client_a), ("b", &client_b)] {
        let drops = client.status().await.expect("status").drops;
        for reason in ["source_not_allowed", "bad_packet", "acl", "tun_write"] {
            assert_eq!(drops[reason], 0, "{side} dropped {reason}: {drops:?}");
        }
    }

    // Local traffic cannot pose as a probe: packets from the TUN to the probe prefix are
    // dropped and counted.
    a.ns()
        .exec(&["ip", "route", "add", "169.254.90.0/30", "dev", &a.ifname])
        .expect("route to the probe prefix");
    let dropped_before = client_a.status().await.expect("status").drops["probe_address"];
    assert!(
        !a.ns().ping("169.254.90.2", 3),
        "the probe address answered"
    );
    let dropped = client_a.status().await.expect("status").drops["probe_address"];
    assert!(
        dropped >= dropped_before + 3,
        "probe_address drops {dropped_before} -> {dropped}"
    );
    let peer = peer_status(&client_a, "b").await.expect("b");
    assert_eq!(state_of(&peer), ConnectionState::Connected);

    // The peer vanishes with its namespace.
    b.vanish();
    let vanished = Instant::now();
    let bound =
        Duration::from_millis(u64::from(INTERVAL_MS * (THRESHOLD + 1))) + Duration::from_secs(2);
    let (took, peer) = wait_for(&client_a, "b", Duration::from_secs(10), |p| {
        state_of(p) == ConnectionState::Error
    })
    .await;
    let peer = peer.expect("a reports b");
    let took = took.unwrap_or_else(|| panic!("b never turned ERROR: {peer:?}"));
    eprintln!("ERROR {took:?} after the namespace was deleted (bound {bound:?})");
    assert!(took <= bound, "ERROR after {took:?}, bound {bound:?}");
    assert_eq!(peer.message, PROBE_MESSAGE);
    let conncheck = peer.conncheck.expect("the check is on");
    assert!(conncheck.consecutive_losses >= THRESHOLD, "{conncheck:?}");
    assert!(
        conncheck.probes_lost >= u64::from(THRESHOLD),
        "{conncheck:?}"
    );
    // Still ERROR a while later, with the same message.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let peer = peer_status(&client_a, "b").await.expect("b");
    assert_eq!(state_of(&peer), ConnectionState::Error);
    assert_eq!(peer.message, PROBE_MESSAGE);
    eprintln!("vanish observed for {:?}", vanished.elapsed());

    // The namespace and the peer come back, same key and address.
    b.ns = Some(Netns::new(&b.ns_name).expect("namespace again"));
    link(&a, &b);
    b.start_kubetun();
    b.client().apply(state_b).await.expect("apply b again");
    let recreated = Instant::now();
    let (took, peer) = wait_for(&client_a, "b", Duration::from_secs(15), |p| {
        state_of(p) == ConnectionState::Connected
    })
    .await;
    let took = took.unwrap_or_else(|| panic!("b never came back: {peer:?}"));
    eprintln!("CONNECTED again {took:?} after the peer was recreated");
    let peer = peer.expect("b");
    assert!(peer.message.is_empty(), "{}", peer.message);
    assert_eq!(peer.conncheck.map(|c| c.consecutive_losses), Some(0));
    assert!(recreated.elapsed() < Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wireguard_go_peer_with_the_check_disabled_stays_connected() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("a_wireguard_go_peer_with_the_check_disabled_stays_connected") {
        return;
    }
    for tool in ["wireguard-go", "wg"] {
        assert!(command_exists(tool), "`{tool}` is not installed");
    }
    let mut k = Side::new(
        "kt-ccw-k",
        "ktccwk",
        "vccw-k",
        Ipv4Addr::new(198, 51, 100, 11),
    );
    let mut w = Side::new(
        "kt-ccw-w",
        "ktccww",
        "vccw-w",
        Ipv4Addr::new(198, 51, 100, 12),
    );
    link(&k, &w);
    k.start_kubetun();
    w.start_wireguard_go();
    let key_file = w.dir.path().join("private.key");
    std::fs::write(&key_file, w.key.private_base64()).expect("write key");
    let port = PORT.to_string();
    w.ns()
        .exec(&[
            "wg",
            "set",
            &w.ifname,
            "private-key",
            key_file.to_str().expect("utf-8 path"),
            "listen-port",
            &port,
            "peer",
            k.key.public_base64(),
            "allowed-ips",
            "10.93.0.0/24",
            "endpoint",
            &k.endpoint(),
        ])
        .expect("configure wireguard-go");
    w.ns()
        .exec(&["ip", "link", "set", &w.ifname, "up"])
        .expect("wireguard-go link up");

    let client = k.client();
    let disabled = state(&k, &w, "w", "10.93.0.1/24", "10.94.0.0/24", true);
    client.apply(disabled).await.expect("apply");
    let (took, peer) = wait_for(&client, "w", Duration::from_secs(10), |p| {
        state_of(p) == ConnectionState::Connected
    })
    .await;
    assert!(took.is_some(), "no handshake with wireguard-go: {peer:?}");
    // Many intervals past the threshold: still CONNECTED, nothing probed.
    let watch = Duration::from_millis(u64::from(INTERVAL_MS * THRESHOLD * 3));
    let start = Instant::now();
    while start.elapsed() < watch {
        let peer = peer_status(&client, "w").await.expect("w");
        assert_eq!(
            state_of(&peer),
            ConnectionState::Connected,
            "{}",
            peer.message
        );
        assert!(peer.conncheck.is_none(), "the check is off for w");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The control: probing wireguard-go, which never answers, makes it ERROR.
    let enabled = state(&k, &w, "w", "10.93.0.1/24", "10.94.0.0/24", false);
    client.apply(enabled).await.expect("apply");
    let (took, peer) = wait_for(&client, "w", Duration::from_secs(5), |p| {
        state_of(p) == ConnectionState::Error
    })
    .await;
    assert!(
        took.is_some(),
        "probing wireguard-go never failed: {peer:?}"
    );
    assert_eq!(peer.map(|p| p.message).as_deref(), Some(PROBE_MESSAGE));
}
