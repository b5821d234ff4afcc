//! Interop of `kubetun-gateway` with code we did not write: Debian's `wireguard-go` on the wire
//! and the stock `wg` / `ip` tools as the only way of configuring it.
//!
//! Every test builds two namespaces joined by a veth pair, runs one WireGuard implementation
//! in each, configures both with `wg set` and `ip`, and sends traffic only between addresses it
//! assigned itself. Processes and namespaces are removed on drop, also when a test fails.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use kubetun_integration::netns::{
    Netns, NsChild, bin_path, command_exists, remove_stale_socket, require_root, veth,
    wait_for_path,
};

/// The tunnel's inner addresses and the underlay addresses of the two sides.
const TUNNEL_A: &str = "10.99.0.1";
const TUNNEL_B: &str = "10.99.0.2";
const UNDERLAY_A: &str = "192.168.77.1";
const UNDERLAY_B: &str = "192.168.77.2";
const PORT: u16 = 51820;
const STARTUP: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Implementation {
    Kubetun,
    WireguardGo,
}

/// One side: a namespace running one WireGuard implementation on interface `ifname`.
#[derive(Debug)]
struct Side {
    // Field order matters: the process stops before its namespace is deleted.
    process: Option<NsChild>,
    ns: Netns,
    ifname: String,
    implementation: Implementation,
    private_key: PathBuf,
    public_key: String,
    metrics_port: Option<u16>,
    /// kubetun's `--queues`; `None` leaves the default.
    queues: Option<u16>,
    /// kubetun's `--spin-window-us`; `None` leaves the default (off).
    spin_window_us: Option<u32>,
    /// kubetun's `--crypto-workers`; `None` leaves the default (none below four cores).
    crypto_workers: Option<usize>,
    _keys: tempfile::TempDir,
}

fn wg_genkey() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let private = Command::new("wg")
        .arg("genkey")
        .output()
        .expect("wg genkey");
    let path = dir.path().join("private.key");
    std::fs::write(&path, &private.stdout).expect("write key");
    let mut pubkey = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("wg pubkey");
    {
        use std::io::Write as _;
        let mut stdin = pubkey.stdin.take().expect("stdin");
        stdin.write_all(&private.stdout).expect("feed wg pubkey");
    }
    let out = pubkey.wait_with_output().expect("wg pubkey output");
    let public = String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_owned();
    (dir, path, public)
}

impl Side {
    fn new(ns_name: &str, ifname: &str, implementation: Implementation) -> Side {
        let (keys, private_key, public_key) = wg_genkey();
        Side {
            process: None,
            ns: Netns::new(ns_name).expect("create namespace"),
            ifname: ifname.to_owned(),
            implementation,
            private_key,
            public_key,
            metrics_port: None,
            queues: None,
            spin_window_us: None,
            crypto_workers: None,
            _keys: keys,
        }
    }

    fn uapi_socket(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/wireguard/{}.sock", self.ifname))
    }

    /// Starts the implementation in the foreground and waits for its UAPI socket.
    fn start(&mut self) {
        let mut cmd = match self.implementation {
            Implementation::Kubetun => {
                let mut cmd = self.ns.command(
                    bin_path("kubetun-gateway")
                        .to_str()
                        .expect("utf-8 binary path"),
                );
                cmd.args(["-f", &self.ifname, "--grpc-socket"])
                    .arg(format!("/var/run/kubetun/test-{}.grpc.sock", self.ifname));
                if let Some(port) = self.metrics_port {
                    cmd.arg("--metrics-addr").arg(format!("127.0.0.1:{port}"));
                }
                if let Some(queues) = self.queues {
                    cmd.arg("--queues").arg(queues.to_string());
                }
                if let Some(window) = self.spin_window_us {
                    cmd.arg("--spin-window-us").arg(window.to_string());
                }
                if let Some(workers) = self.crypto_workers {
                    cmd.arg("--crypto-workers").arg(workers.to_string());
                }
                cmd
            }
            Implementation::WireguardGo => {
                remove_stale_socket(&self.uapi_socket());
                let mut cmd = self.ns.command("wireguard-go");
                cmd.args(["-f", &self.ifname]);
                cmd
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.process = Some(NsChild::spawn(&mut cmd).expect("start WireGuard implementation"));
        assert!(
            wait_for_path(&self.uapi_socket(), STARTUP),
            "{:?} did not create {}",
            self.implementation,
            self.uapi_socket().display()
        );
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }

    fn wg(&self, args: &[&str]) -> String {
        let mut full = vec!["wg"];
        full.extend_from_slice(args);
        self.ns.exec(&full).expect("wg command")
    }

    /// Configures the interface through `wg set` and `ip`, with `peer` as its only peer.
    fn configure(&self, peer: &Side, tunnel_addr: &str, allowed: &str, endpoint: Option<&str>) {
        let port = PORT.to_string();
        let key = self.private_key.to_str().expect("utf-8 key path");
        let mut args = vec![
            "set",
            &self.ifname,
            "private-key",
            key,
            "listen-port",
            &port,
            "peer",
            &peer.public_key,
            "allowed-ips",
            allowed,
        ];
        if let Some(endpoint) = endpoint {
            args.extend_from_slice(&["endpoint", endpoint]);
        }
        self.wg(&args);
        let cidr = format!("{tunnel_addr}/24");
        self.ns
            .exec(&["ip", "address", "replace", &cidr, "dev", &self.ifname])
            .expect("address the tunnel");
        self.ns
            .exec(&["ip", "link", "set", &self.ifname, "up"])
            .expect("bring the tunnel up");
    }

    /// `(rx_bytes, tx_bytes)` of the only peer, from `wg show <if> transfer`.
    fn transfer(&self) -> (u64, u64) {
        let out = self.wg(&["show", &self.ifname, "transfer"]);
        let fields: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(
            fields.len(),
            3,
            "unexpected `wg show transfer` output: {out:?}"
        );
        (
            fields[1].parse().expect("rx bytes"),
            fields[2].parse().expect("tx bytes"),
        )
    }

    /// The only peer's endpoint, from `wg show <if> endpoints`.
    fn peer_endpoint(&self) -> String {
        let out = self.wg(&["show", &self.ifname, "endpoints"]);
        out.split_whitespace().nth(1).unwrap_or_default().to_owned()
    }

    /// The only peer's latest handshake (Unix seconds; 0 = never).
    fn latest_handshake(&self) -> u64 {
        let out = self.wg(&["show", &self.ifname, "latest-handshakes"]);
        out.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// The gateway's `/metrics` body, fetched inside the namespace with bash's `/dev/tcp`.
    fn metrics(&self) -> String {
        let port = self.metrics_port.expect("metrics enabled");
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port}; \
             printf 'GET /metrics HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3; cat <&3"
        );
        self.ns
            .exec(&["bash", "-c", &script])
            .expect("fetch metrics")
    }
}

/// Which sides of [`connect`] are given the other's underlay endpoint.
#[derive(Clone, Copy)]
enum Endpoints {
    Both,
    /// `b` learns `a`'s endpoint from `a`'s first handshake.
    AKnowsB,
}

/// Makes `a` (at [`TUNNEL_A`]) and `b` (at [`TUNNEL_B`]) each other's peer, each allowing the
/// other's tunnel address.
fn connect(a: &Side, b: &Side, endpoints: Endpoints) {
    a.configure(
        b,
        TUNNEL_A,
        &format!("{TUNNEL_B}/32"),
        Some(&endpoint(UNDERLAY_B)),
    );
    let a_endpoint = endpoint(UNDERLAY_A);
    let known = match endpoints {
        Endpoints::Both => Some(a_endpoint.as_str()),
        Endpoints::AKnowsB => None,
    };
    b.configure(a, TUNNEL_B, &format!("{TUNNEL_A}/32"), known);
}

/// Two sides joined by a veth pair, each running `a` / `b`, not yet configured.
fn pair(tag: &str, a: Implementation, b: Implementation) -> Option<(Side, Side)> {
    pair_with_queues(tag, a, b, None)
}

/// Like [`pair`], with kubetun sides started with `--queues queues`.
fn pair_with_queues(
    tag: &str,
    a: Implementation,
    b: Implementation,
    queues: Option<u16>,
) -> Option<(Side, Side)> {
    if !require_root(tag) {
        return None;
    }
    for tool in ["wg", "ping", "iperf3"].into_iter().chain(
        (a == Implementation::WireguardGo || b == Implementation::WireguardGo)
            .then_some("wireguard-go"),
    ) {
        assert!(
            command_exists(tool),
            "{tag}: `{tool}` is not installed (see .ci/setup)"
        );
    }
    let mut side_a = Side::new(&format!("kt-{tag}-a"), &format!("kt{tag}a"), a);
    let mut side_b = Side::new(&format!("kt-{tag}-b"), &format!("kt{tag}b"), b);
    side_a.queues = queues;
    side_b.queues = queues;
    veth(&side_a.ns, "veth-a", &side_b.ns, "veth-b").expect("veth pair");
    side_a
        .ns
        .exec(&[
            "ip",
            "address",
            "add",
            &format!("{UNDERLAY_A}/24"),
            "dev",
            "veth-a",
        ])
        .expect("underlay address");
    side_b
        .ns
        .exec(&[
            "ip",
            "address",
            "add",
            &format!("{UNDERLAY_B}/24"),
            "dev",
            "veth-b",
        ])
        .expect("underlay address");
    side_a.start();
    side_b.start();
    Some((side_a, side_b))
}

fn endpoint(addr: &str) -> String {
    format!("{addr}:{PORT}")
}

/// A bounded iperf3 run from `client` to `server`'s tunnel address; returns the receiver's
/// bits per second.
fn iperf(client: &Side, server: &Side, server_addr: &str) -> f64 {
    let json = iperf_json(client, server, server_addr, &[]);
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("no bits_per_second in iperf3 report: {json}"))
}

/// A bounded iperf3 run (`-t 2`, plus `extra` client arguments) from `client` to `server`'s
/// tunnel address; returns the client's JSON report.
fn iperf_json(
    client: &Side,
    server: &Side,
    server_addr: &str,
    extra: &[&str],
) -> serde_json::Value {
    let mut cmd = server.ns.command("iperf3");
    cmd.args(["-s", "-1", "-B", server_addr])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut daemon = NsChild::spawn(&mut cmd).expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(300));
    let mut args = vec!["iperf3", "-c", server_addr, "-t", "2", "-J"];
    args.extend_from_slice(extra);
    let out = client.ns.exec(&args).expect("iperf3 client");
    daemon.stop();
    serde_json::from_str(&out).expect("iperf3 JSON")
}

/// Ping both ways, a bounded iperf3 run from `a` to `b`, and the counters `wg show` reports.
fn ping_and_iperf(a: &Side, a_addr: &str, b: &Side, b_addr: &str) {
    assert!(
        a.ns.wait_ping(b_addr, Duration::from_secs(10)),
        "{:?} -> {:?}: no ping reply through the tunnel",
        a.implementation,
        b.implementation
    );
    assert!(b.ns.ping(a_addr, 3), "reverse ping failed");
    let bps = iperf(a, b, b_addr);
    eprintln!(
        "{:?} -> {:?}: {:.0} Mbit/s (iperf3 -t 2, profile as built)",
        a.implementation,
        b.implementation,
        bps / 1e6
    );
    assert!(bps > 1e6, "throughput collapsed: {bps} bit/s");
    let (rx, tx) = a.transfer();
    assert!(
        rx > 0 && tx > 0,
        "wg show transfer must count traffic: rx={rx} tx={tx}"
    );
    assert!(
        a.latest_handshake() > 0,
        "wg show must report the handshake"
    );
}

#[test]
fn kubetun_initiates_to_wireguard_go() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair("i1", Implementation::Kubetun, Implementation::WireguardGo) else {
        return;
    };
    connect(&a, &b, Endpoints::AKnowsB);
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    assert_eq!(b.peer_endpoint(), endpoint(UNDERLAY_A));
}

#[test]
fn wireguard_go_initiates_to_kubetun() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair("i2", Implementation::WireguardGo, Implementation::Kubetun) else {
        return;
    };
    connect(&a, &b, Endpoints::AKnowsB);
    assert_eq!(
        b.peer_endpoint(),
        "(none)",
        "kubetun starts without an endpoint"
    );
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    // The responder learned the initiator's endpoint from its authenticated packets.
    assert_eq!(b.peer_endpoint(), endpoint(UNDERLAY_A));
    let (rx, tx) = b.transfer();
    assert!(rx > 0 && tx > 0, "kubetun counters: rx={rx} tx={tx}");
}

#[test]
fn kubetun_to_kubetun() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair("i3", Implementation::Kubetun, Implementation::Kubetun) else {
        return;
    };
    connect(&a, &b, Endpoints::Both);
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    ping_and_iperf(&b, TUNNEL_B, &a, TUNNEL_A);
}

/// The value of the sample `series` (name and labels) in a metrics exposition.
fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
}

#[test]
fn source_outside_allowed_ips_is_dropped_and_counted() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((mut a, b)) = pair("i4", Implementation::Kubetun, Implementation::WireguardGo) else {
        return;
    };
    // Restart A with metrics on; `pair` started it without.
    a.stop();
    a.metrics_port = Some(9586);
    a.start();
    a.configure(
        &b,
        TUNNEL_A,
        &format!("{TUNNEL_B}/32"),
        Some(&endpoint(UNDERLAY_B)),
    );
    // B may send anything to A, and owns a second address A does not allow.
    b.configure(&a, TUNNEL_B, "10.99.0.0/24", None);
    b.ns.exec(&["ip", "address", "add", "10.99.0.3/32", "dev", &b.ifname])
        .expect("second address");

    assert!(
        a.ns.wait_ping(TUNNEL_B, Duration::from_secs(10)),
        "allowed source must pass"
    );
    assert!(
        !b.ns.succeeds(&[
            "ping",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            "-I",
            "10.99.0.3",
            TUNNEL_A
        ]),
        "a packet from outside the peer's allowed IPs must not be answered"
    );
    let metrics = a.metrics();
    let dropped = counter(
        &metrics,
        "kubetun_drops_total{reason=\"source_not_allowed\"}",
    );
    assert!(dropped >= 3, "expected >= 3 counted drops, got {dropped}");
    // Malformed datagrams are dropped and counted, and the gateway keeps working.
    b.ns.exec(&[
        "bash",
        "-c",
        &format!(
            "for i in 1 2 3; do echo garbage > /dev/udp/{UNDERLAY_A}/{PORT}; done; \
             head -c 148 /dev/urandom > /dev/udp/{UNDERLAY_A}/{PORT}"
        ),
    ])
    .expect("send garbage");
    assert!(
        a.ns.ping(TUNNEL_B, 2),
        "the gateway must survive malformed datagrams"
    );
    let metrics = a.metrics();
    let invalid = counter(&metrics, "kubetun_drops_total{reason=\"invalid_datagram\"}");
    let rejected = counter(&metrics, "kubetun_drops_total{reason=\"rejected\"}");
    assert!(
        invalid >= 3 && invalid + rejected >= 4,
        "malformed datagrams must be counted: invalid={invalid} rejected={rejected}"
    );
    assert!(
        metrics.contains("kubetun_handshakes_total{peer="),
        "per-peer handshake counter missing:\n{metrics}"
    );
}

#[test]
fn restarted_peer_rehandshakes_and_traffic_resumes() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, mut b)) = pair("i5", Implementation::Kubetun, Implementation::Kubetun) else {
        return;
    };
    connect(&a, &b, Endpoints::Both);
    assert!(
        a.ns.wait_ping(TUNNEL_B, Duration::from_secs(10)),
        "first session"
    );
    let first = a.latest_handshake();

    b.stop();
    assert!(
        !b.uapi_socket().exists(),
        "a stopped gateway must remove its UAPI socket"
    );
    assert!(
        !b.ns.succeeds(&["ip", "link", "show", &b.ifname]),
        "a stopped gateway must remove its TUN device"
    );
    b.start();
    b.configure(
        &a,
        TUNNEL_B,
        &format!("{TUNNEL_A}/32"),
        Some(&endpoint(UNDERLAY_A)),
    );
    // A still holds the old session; it must notice the silence and handshake again.
    assert!(
        a.ns.wait_ping(TUNNEL_B, Duration::from_secs(30)),
        "traffic did not resume after the peer restarted"
    );
    assert!(
        b.latest_handshake() > 0,
        "the restarted peer must have handshaken"
    );
    assert!(
        a.latest_handshake() >= first,
        "A's handshake time must not go back"
    );
}

/// The controller's own client drives kubetun over gRPC against a plain wireguard-go peer: a
/// remapped route (A reaches B's 10.99.0.2 as 10.201.0.2), managed routes and addresses,
/// idempotent re-apply, rejection of an invalid state, and per-peer status.
#[test]
fn grpc_apply_remaps_against_wireguard_go_and_reports_status() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    use kubetun_controller::gateway_api as api;
    use kubetun_controller::plumbing::gateway_client::GatewayClient;

    let Some((a, b)) = pair("i6", Implementation::Kubetun, Implementation::WireguardGo) else {
        return;
    };
    b.configure(&a, TUNNEL_B, &format!("{TUNNEL_A}/32"), None);
    let private_key = std::fs::read_to_string(&a.private_key).expect("read key");
    let desired = |view: &str| api::DesiredState {
        version: "v1".into(),
        interface: Some(api::Interface {
            private_key: private_key.trim().to_owned(),
            listen_port: u32::from(PORT),
            addresses: vec![format!("{TUNNEL_A}/32")],
            manage_routes: true,
            ..Default::default()
        }),
        peers: vec![api::Peer {
            public_key: b.public_key.clone(),
            name: "cluster-b".into(),
            endpoint: endpoint(UNDERLAY_B),
            routes: vec![api::Route {
                real: format!("{TUNNEL_B}/32"),
                view: view.into(),
                fallback: false,
            }],
            ..Default::default()
        }],
    };
    let socket = format!("/var/run/kubetun/test-{}.grpc.sock", a.ifname);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _context = runtime.enter();
    let client = GatewayClient::new(&socket);

    let first = runtime
        .block_on(client.apply(desired("10.201.0.2/32")))
        .expect("apply");
    assert!(first.changed);
    let again = runtime
        .block_on(client.apply(desired("10.201.0.2/32")))
        .expect("re-apply");
    assert!(!again.changed, "the same state must not change anything");
    assert_eq!(again.generation, first.generation);

    let rejected = runtime
        .block_on(client.apply(desired("10.201.0.0/24")))
        .expect_err("a view of another length is invalid");
    assert!(rejected.is_rejection(), "{rejected}");
    assert!(
        rejected.to_string().contains("same family and length"),
        "{rejected}"
    );

    assert!(
        a.ns.wait_ping("10.201.0.2", Duration::from_secs(10)),
        "the view address must reach the peer's real address"
    );
    assert!(
        !a.ns.succeeds(&["ping", "-c", "1", "-W", "1", TUNNEL_B]),
        "the real address is not routed on A (only its view is)"
    );
    let status = runtime.block_on(client.status()).expect("status");
    assert_eq!(
        status.version, "v1",
        "the rejected state must not be active"
    );
    assert_eq!(status.listen_port, u32::from(PORT));
    let peer = &status.peers[0];
    assert_eq!(peer.name, "cluster-b");
    assert_eq!(
        peer.state(),
        api::ConnectionState::Connected,
        "{}",
        peer.message
    );
    assert!(peer.rx_bytes > 0 && peer.tx_packets > 0);
    assert!(peer.last_handshake_unix_ms > 0);
    assert_eq!(peer.endpoint, endpoint(UNDERLAY_B));
    let mut updates = runtime
        .block_on(client.watch(Duration::from_millis(200)))
        .expect("watch");
    let update = runtime
        .block_on(updates.message())
        .expect("watch stream")
        .expect("a status update");
    assert_eq!(update.generation, first.generation);
    assert_eq!(update.peers.len(), 1);
    // The stock tool sees the same peer, with the prefix as this side sees it (the view:
    // unique per device, where two peers' real prefixes may overlap).
    let allowed = a.wg(&["show", &a.ifname, "allowed-ips"]);
    assert!(allowed.contains("10.201.0.2/32"), "{allowed}");
    assert!(!allowed.contains(&format!("{TUNNEL_B}/32")), "{allowed}");
}

/// IPv6 on both layers: the IPv6 socket carries the tunnel, and IPv6 packets cross it.
#[test]
fn ipv6_underlay_and_inner_packets_with_wireguard_go() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair("i7", Implementation::Kubetun, Implementation::WireguardGo) else {
        return;
    };
    for (side, veth, underlay) in [(&a, "veth-a", "fd77::1/64"), (&b, "veth-b", "fd77::2/64")] {
        side.ns
            .exec(&["ip", "-6", "address", "add", underlay, "dev", veth, "nodad"])
            .expect("IPv6 underlay address");
    }
    a.configure(&b, TUNNEL_A, "fd99::2/128", Some("[fd77::2]:51820"));
    b.configure(&a, TUNNEL_B, "fd99::1/128", None);
    for (side, inner) in [(&a, "fd99::1/64"), (&b, "fd99::2/64")] {
        side.ns
            .exec(&[
                "ip",
                "-6",
                "address",
                "add",
                inner,
                "dev",
                &side.ifname,
                "nodad",
            ])
            .expect("IPv6 tunnel address");
    }
    assert!(
        a.ns.wait_ping("fd99::2", Duration::from_secs(10)),
        "no IPv6 ping reply through an IPv6 tunnel"
    );
    assert_eq!(b.peer_endpoint(), "[fd77::1]:51820");
    assert!(b.ns.ping("fd99::1", 2), "reverse IPv6 ping failed");
}

/// The queues of interface `ifname` and the UDP sockets on [`PORT`] in `side`'s namespace:
/// `(TUN transmit queues, sockets)`.
fn queues_and_sockets(side: &Side) -> (usize, usize) {
    let queues = side
        .ns
        .exec(&["ls", &format!("/sys/class/net/{}/queues", side.ifname)])
        .expect("list the interface's queues");
    let tx_queues = queues
        .split_whitespace()
        .filter(|q| q.starts_with("tx-"))
        .count();
    let sockets = side
        .ns
        .exec(&["ss", "-Hnul", "sport", "=", &format!(":{PORT}")])
        .expect("list the UDP sockets");
    (tx_queues, sockets.lines().count())
}

/// Several TCP flows each way between two gateways with `--queues 2`: every stream moves
/// data, and the TUN device has two queues and each family two sockets on the port.
#[test]
fn multiqueue_gateways_carry_several_flows_each_way() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair_with_queues(
        "q2",
        Implementation::Kubetun,
        Implementation::Kubetun,
        Some(2),
    ) else {
        return;
    };
    connect(&a, &b, Endpoints::Both);
    for side in [&a, &b] {
        let (queues, sockets) = queues_and_sockets(side);
        assert_eq!(queues, 2, "{}: TUN queues", side.ifname);
        // Two IPv4 and two IPv6 sockets (one of each when IPv6 is off).
        assert!(
            sockets == 4 || sockets == 2,
            "{}: {sockets} sockets",
            side.ifname
        );
    }
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    for reverse in [false, true] {
        let mut extra = vec!["-P", "4"];
        if reverse {
            extra.push("-R");
        }
        let json = iperf_json(&a, &b, TUNNEL_B, &extra);
        let streams = json["end"]["streams"].as_array().expect("iperf3 streams");
        assert_eq!(streams.len(), 4, "four flows expected: {json}");
        for stream in streams {
            let bytes = stream["receiver"]["bytes"].as_u64().unwrap_or(0);
            assert!(
                bytes > 0,
                "a flow carried nothing (reverse={reverse}): {stream}"
            );
        }
        let bps = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        eprintln!(
            "--queues 2, 4 flows (reverse={reverse}): {:.0} Mbit/s",
            bps / 1e6
        );
        assert!(bps > 1e6, "throughput collapsed: {bps} bit/s");
    }
}

/// `--queues 2` against wireguard-go, both directions initiating traffic.
#[test]
fn multiqueue_gateway_interoperates_with_wireguard_go() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair_with_queues(
        "q3",
        Implementation::Kubetun,
        Implementation::WireguardGo,
        Some(2),
    ) else {
        return;
    };
    connect(&a, &b, Endpoints::AKnowsB);
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    ping_and_iperf(&b, TUNNEL_B, &a, TUNNEL_A);
}

/// `--queues 1` is the single-queue device: one TUN queue, one socket per family.
#[test]
fn single_queue_gateways_carry_traffic() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((a, b)) = pair_with_queues(
        "q1",
        Implementation::Kubetun,
        Implementation::Kubetun,
        Some(1),
    ) else {
        return;
    };
    connect(&a, &b, Endpoints::Both);
    let (queues, sockets) = queues_and_sockets(&a);
    assert_eq!(queues, 1, "TUN queues");
    assert!(sockets == 2 || sockets == 1, "{sockets} sockets");
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    ping_and_iperf(&b, TUNNEL_B, &a, TUNNEL_A);
}

/// A kubetun gateway restarted with `configure` applied, against `peer`: ping and bulk
/// traffic both ways.
fn configured_kubetun_carries_traffic(
    tag: &str,
    peer: Implementation,
    endpoints: Endpoints,
    configure: impl FnOnce(&mut Side),
) {
    let Some((mut a, b)) = pair(tag, Implementation::Kubetun, peer) else {
        return;
    };
    a.stop();
    configure(&mut a);
    a.start();
    connect(&a, &b, endpoints);
    ping_and_iperf(&a, TUNNEL_A, &b, TUNNEL_B);
    ping_and_iperf(&b, TUNNEL_B, &a, TUNNEL_A);
}

/// The opt-in spin window (one thread that polls after traffic) against the default
/// runtime, both ways: traffic, bulk and the idle ping.
#[test]
fn a_spin_window_gateway_carries_traffic() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    configured_kubetun_carries_traffic("sw", Implementation::Kubetun, Endpoints::Both, |a| {
        a.spin_window_us = Some(200);
    });
}

/// Crypto helpers (`--crypto-workers 2`: one peer's runs sealed and opened outside its lock,
/// long runs in parts on two threads, as on a node of four cores or more) against
/// wireguard-go, bulk traffic both ways.
#[test]
fn a_gateway_with_crypto_helpers_interoperates_with_wireguard_go() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    configured_kubetun_carries_traffic(
        "cw",
        Implementation::WireguardGo,
        Endpoints::AKnowsB,
        |a| a.crypto_workers = Some(2),
    );
}
