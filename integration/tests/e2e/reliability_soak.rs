//! Soak: a gateway with 100 peers whose whole state is re-applied every 10 ms with a new
//! version (and a changed ACL, so the fast-path tables really swap) while iperf3 pushes TCP
//! through its one live peer. At the end: the memory did not grow (resident set of the last
//! third of the run against the first), the configuration is whole (Status shows 100 peers),
//! traffic flowed, and the process exits cleanly on SIGTERM.
//!
//! Runs for `KUBETUN_SOAK_SECS` seconds (default 60, the full minute; at most 120).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kubetun_controller::gateway_api::{Acl, DesiredState, Interface, Peer, Route};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::iperf::Server;
use kubetun_integration::netns::{
    Netns, bin_path, command_exists, require_root, veth, wait_for_path,
};

const PEERS: usize = 100;
const SWAP_EVERY: Duration = Duration::from_millis(10);
const STARTUP: Duration = Duration::from_secs(10);

/// A gateway process whose exit status the test reads; killed if the test fails first.
struct Gateway {
    child: Option<Child>,
    socket: PathBuf,
}

impl Gateway {
    fn start(ns: &Netns, ifname: &str, dir: &tempfile::TempDir) -> Gateway {
        let socket = dir.path().join(format!("{ifname}.grpc.sock"));
        let child = ns
            .command(bin_path("kubetun-gateway").to_str().expect("utf-8 path"))
            .args(["-f", ifname, "--grpc-socket"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the gateway");
        assert!(wait_for_path(&socket, STARTUP), "{ifname} did not start");
        Gateway {
            child: Some(child),
            socket,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("process status")
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// SIGTERM and the exit status (within 5 s).
    fn terminate(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the gateway did not exit on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn interface(key: &GatewayKey, tunnel: Ipv4Addr, pods: &str) -> Interface {
    Interface {
        private_key: key.private_base64(),
        listen_port: 51820,
        mtu: 1420,
        addresses: vec![format!("{tunnel}/24")],
        local_prefixes: vec![pods.into()],
        manage_routes: true,
        ..Interface::default()
    }
}

fn identity(cidr: &str) -> Route {
    Route {
        real: cidr.into(),
        view: cidr.into(),
        fallback: false,
    }
}

/// Round `n` of A's state: the live peer B plus 99 idle ones (distinct keys and views, one
/// real CIDR shared by all, as with overlapping clusters); one idle peer's ACL changes.
fn state_a(n: u64, key: &GatewayKey, b: &GatewayKey, idle: &[String]) -> DesiredState {
    let mut peers = vec![Peer {
        public_key: b.public_base64().to_owned(),
        name: "b".into(),
        endpoint: "192.0.2.2:51820".into(),
        routes: vec![identity("10.62.0.0/24")],
        ..Peer::default()
    }];
    let changed = usize::try_from(n).expect("round") % idle.len();
    peers.extend(idle.iter().enumerate().map(|(i, public_key)| Peer {
        public_key: public_key.clone(),
        name: format!("idle-{i}"),
        endpoint: format!("192.0.2.{}:51820", 100 + i),
        routes: vec![Route {
            real: "10.70.0.0/24".into(),
            view: format!("10.100.{i}.0/24"),
            fallback: false,
        }],
        acl: Some(Acl {
            allowed: vec![if i == changed && n % 2 == 1 {
                "10.70.0.0/25".into()
            } else {
                "10.70.0.0/24".into()
            }],
        }),
        ..Peer::default()
    }));
    DesiredState {
        version: format!("soak-{n}"),
        interface: Some(interface(key, Ipv4Addr::new(10, 61, 0, 1), "10.61.0.0/24")),
        peers,
    }
}

fn mean(samples: &[u64]) -> f64 {
    samples.iter().sum::<u64>() as f64 / samples.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_peers_table_swaps_and_traffic_without_leak_or_loss() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("soak") {
        return;
    }
    for tool in ["iperf3", "ping"] {
        assert!(command_exists(tool), "`{tool}` is not installed");
    }
    let seconds: u64 = std::env::var("KUBETUN_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
        .clamp(6, 120);

    let dir = tempfile::tempdir().expect("temp dir");
    let ns_a = Netns::new("kt-soak-a").expect("namespace");
    let ns_b = Netns::new("kt-soak-b").expect("namespace");
    veth(&ns_a, "veth-a", &ns_b, "veth-b").expect("veth");
    ns_a.exec(&["ip", "address", "add", "192.0.2.1/24", "dev", "veth-a"])
        .expect("underlay");
    ns_b.exec(&["ip", "address", "add", "192.0.2.2/24", "dev", "veth-b"])
        .expect("underlay");
    let (key_a, key_b) = (GatewayKey::generate(), GatewayKey::generate());
    let idle: Vec<String> = (0..PEERS - 1)
        .map(|_| GatewayKey::generate().public_base64().to_owned())
        .collect();

    let gateway_a = Gateway::start(&ns_a, "ktsoaka", &dir);
    let gateway_b = Gateway::start(&ns_b, "ktsoakb", &dir);
    let (client_a, client_b) = (
        GatewayClient::new(&gateway_a.socket),
        GatewayClient::new(&gateway_b.socket),
    );
    client_b
        .apply(DesiredState {
            version: "b".into(),
            interface: Some(interface(
                &key_b,
                Ipv4Addr::new(10, 62, 0, 1),
                "10.62.0.0/24",
            )),
            peers: vec![Peer {
                public_key: key_a.public_base64().to_owned(),
                name: "a".into(),
                endpoint: "192.0.2.1:51820".into(),
                routes: vec![identity("10.61.0.0/24")],
                ..Peer::default()
            }],
        })
        .await
        .expect("apply b");
    client_a
        .apply(state_a(0, &key_a, &key_b, &idle))
        .await
        .expect("apply a");
    assert!(ns_a.wait_ping("10.62.0.1", STARTUP), "no tunnel");

    let server = Server::start(&ns_b, "10.62.0.1", 5201, &dir.path().join("iperf3.json"))
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(300));
    let client = ns_a
        .command("iperf3")
        .args(["-c", "10.62.0.1", "-p", "5201", "-J", "-t"])
        .arg((seconds - 2).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3 client");

    let started = Instant::now();
    let mut ticker = tokio::time::interval(SWAP_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rss = Vec::new();
    let mut next_sample = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        ticker.tick().await;
        round += 1;
        let response = client_a
            .apply(state_a(round, &key_a, &key_b, &idle))
            .await
            .unwrap_or_else(|e| panic!("apply round {round}: {e}"));
        assert!(response.changed, "round {round} must swap the tables");
        if Instant::now() >= next_sample {
            rss.push(gateway_a.rss_kib());
            next_sample += Duration::from_millis(250);
        }
    }

    let output = tokio::task::spawn_blocking(move || client.wait_with_output())
        .await
        .expect("join")
        .expect("iperf3 output");
    server.finish(Duration::from_secs(2));
    assert!(
        output.status.success(),
        "iperf3 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = kubetun_integration::iperf::parse_report(&String::from_utf8_lossy(&output.stdout))
        .expect("iperf3 report");
    assert!(report.received_bps > 1e6, "traffic flowed: {report:?}");

    let min_rounds = seconds * 1000 / 10 / 4;
    assert!(
        round >= min_rounds,
        "only {round} swaps in {seconds} s (expected at least {min_rounds})"
    );
    let third = rss.len() / 3;
    let (first, last) = (mean(&rss[..third]), mean(&rss[rss.len() - third..]));
    assert!(
        last <= first * 1.10 + 2048.0,
        "resident memory grew from {first:.0} KiB to {last:.0} KiB over {round} swaps"
    );

    let status = client_a.status().await.expect("status");
    assert_eq!(status.version, format!("soak-{round}"));
    assert_eq!(status.peers.len(), PEERS, "configuration lost");
    assert!(ns_a.ping("10.62.0.1", 3), "the live peer still answers");

    let exit = gateway_a.terminate();
    assert!(exit.success(), "gateway exited with {exit}");
    drop(gateway_b);
    eprintln!(
        "soak: {round} swaps in {seconds} s, {:.0} Mbit/s, RSS {first:.0} -> {last:.0} KiB",
        report.received_bps / 1e6
    );
}
