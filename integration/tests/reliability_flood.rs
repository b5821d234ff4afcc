//! A handshake flood from unknown keys: a few seconds of well-formed initiations (valid MAC1,
//! so only the rate limiter can tell them apart) blasted at a gateway from another namespace.
//! The gateway answers all but its handshake allowance with cookie replies instead of doing
//! the Diffie-Hellman work of each initiation, stays below one core of CPU time, and keeps
//! serving its real peer during the flood.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use kubetun_controller::gateway_api::{DesiredState, Interface, Peer, Route};
use kubetun_controller::gateway_client::GatewayClient;
use kubetun_controller::keys::GatewayKey;
use kubetun_integration::netns::{
    Netns, bin_path, command_exists, require_root, run_in, veth, wait_for_path,
};

const FLOOD: Duration = Duration::from_secs(3);
const STARTUP: Duration = Duration::from_secs(10);
/// Distinct unknown initiator keys in the flood; all of them are sent once per batch.
const ATTACKERS: usize = 256;
/// One batch every 100 ms: about 2 500 initiations per second, 25 times the rate at which the
/// gateway starts demanding cookies, and within what a debug build on two busy cores answers.
const FLOOD_BATCH_EVERY: Duration = Duration::from_millis(100);

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(ns: &Netns, ifname: &str, socket: &std::path::Path) -> Gateway {
    let child = ns
        .command(bin_path("kubetun-gateway").to_str().expect("utf-8 path"))
        .args(["-f", ifname, "--grpc-socket"])
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the gateway");
    assert!(wait_for_path(socket, STARTUP), "{ifname} did not start");
    Gateway(child)
}

fn state(
    key: &GatewayKey,
    own: &str,
    peer: &GatewayKey,
    endpoint: &str,
    peer_cidr: &str,
) -> DesiredState {
    DesiredState {
        version: "v1".into(),
        interface: Some(Interface {
            private_key: key.private_base64(),
            listen_port: 51820,
            mtu: 1420,
            addresses: vec![own.into()],
            manage_routes: true,
            ..Interface::default()
        }),
        peers: vec![Peer {
            public_key: peer.public_base64().to_owned(),
            name: "peer".into(),
            endpoint: endpoint.into(),
            routes: vec![Route {
                real: peer_cidr.into(),
                view: peer_cidr.into(),
            }],
            ..Peer::default()
        }],
    }
}

/// CPU time (user + system) of a process so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat format")
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command name.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    let hz: u64 = String::from_utf8(
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .expect("getconf")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .parse()
    .expect("CLK_TCK");
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// One initiation from each of `ATTACKERS` unknown keys to `victim`.
fn initiations(victim: &GatewayKey) -> Vec<Vec<u8>> {
    let bytes: [u8; 32] = base64_decode(victim.public_base64());
    let victim_public = PublicKey::from(bytes);
    let mut buf = vec![0u8; 256];
    let messages: Vec<Vec<u8>> = (0..ATTACKERS)
        .map(|i| {
            let mut tunn = Tunn::new(
                StaticSecret::random_from_rng(rand_core::OsRng),
                victim_public,
                None,
                None,
                u32::try_from(i).expect("index"),
                None,
            );
            match tunn.format_handshake_initiation(&mut buf, true) {
                TunnResult::WriteToNetwork(init) => init.to_vec(),
                _ => panic!("initiation expected"),
            }
        })
        .collect();

    messages
}

fn base64_decode(text: &str) -> [u8; 32] {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
        .try_into()
        .expect("32 bytes")
}

#[test]
fn handshake_flood_gets_cookies_not_cpu_and_the_real_peer_is_served() {
    if !require_root("handshake flood") {
        return;
    }
    assert!(command_exists("ping"), "`ping` is not installed");
    let dir = tempfile::tempdir().expect("temp dir");
    let ns_a = Netns::new("kt-flood-a").expect("namespace");
    let ns_b = Netns::new("kt-flood-b").expect("namespace");
    veth(&ns_a, "veth-a", &ns_b, "veth-b").expect("veth");
    ns_a.exec(&["ip", "address", "add", "192.0.2.1/24", "dev", "veth-a"])
        .expect("underlay");
    ns_b.exec(&["ip", "address", "add", "192.0.2.2/24", "dev", "veth-b"])
        .expect("underlay");
    ns_b.exec(&["ip", "address", "add", "192.0.2.3/24", "dev", "veth-b"])
        .expect("attacker address");

    let (key_a, key_b) = (GatewayKey::generate(), GatewayKey::generate());
    let (socket_a, socket_b) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let victim = start(&ns_a, "ktflooda", &socket_a);
    let _peer = start(&ns_b, "ktfloodb", &socket_b);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _context = runtime.enter();
    runtime
        .block_on(GatewayClient::new(&socket_a).apply(state(
            &key_a,
            "10.61.0.1/24",
            &key_b,
            "192.0.2.2:51820",
            "10.62.0.0/24",
        )))
        .expect("apply a");
    runtime
        .block_on(GatewayClient::new(&socket_b).apply(state(
            &key_b,
            "10.62.0.1/24",
            &key_a,
            "192.0.2.1:51820",
            "10.61.0.0/24",
        )))
        .expect("apply b");
    assert!(ns_b.wait_ping("10.61.0.1", STARTUP), "no tunnel");

    let messages = initiations(&key_a);
    let mut ping = ns_b.command("ping");
    ping.args(["-n", "-q", "-i", "0.1", "-w"])
        .arg(FLOOD.as_secs().to_string())
        .arg("10.61.0.1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let ping = ping.spawn().expect("ping");

    let cpu_before = cpu_time(victim.0.id());
    let (sent, cookies) = run_in(&ns_b, || {
        let socket = UdpSocket::bind("192.0.2.3:0").expect("attacker socket");
        socket.set_nonblocking(true).expect("non-blocking");
        let target: SocketAddr = "192.0.2.1:51820".parse().expect("address");
        let (mut sent, mut cookies) = (0u64, 0u64);
        let mut reply = [0u8; 256];
        let started = Instant::now();
        let mut batch_due = started;
        while started.elapsed() < FLOOD {
            // Paced so that the sender, on the same machine, leaves the gateways their CPU.
            batch_due += FLOOD_BATCH_EVERY;
            std::thread::sleep(batch_due.saturating_duration_since(Instant::now()));
            for message in &messages {
                if socket.send_to(message, target).is_ok() {
                    sent += 1;
                }
            }
            while let Ok((len, _)) = socket.recv_from(&mut reply) {
                if len == 64 && reply[0] == 3 {
                    cookies += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        while let Ok((len, _)) = socket.recv_from(&mut reply) {
            if len == 64 && reply[0] == 3 {
                cookies += 1;
            }
        }
        (sent, cookies)
    })
    .expect("flood from the peer namespace");
    let cpu = cpu_time(victim.0.id()).saturating_sub(cpu_before);

    let output = ping.wait_with_output().expect("ping output");
    let summary = String::from_utf8_lossy(&output.stdout);
    let received: u32 = summary
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);

    let per_datagram = cpu / u32::try_from(sent.max(1)).expect("count");
    eprintln!(
        "flood: {sent} initiations, {cookies} cookie replies, gateway CPU {cpu:?} \
         ({per_datagram:?} per datagram), real peer {received} pings"
    );
    assert!(
        sent > 5_000,
        "the flood was too small to mean anything: {sent}"
    );
    // All but the limiter's allowance (100 handshakes a second) are answered with a cookie;
    // some replies overflow the attacker's own receive buffer between batches.
    assert!(
        cookies * 3 >= sent * 2,
        "the gateway must answer a flood with cookie replies ({cookies} of {sent})"
    );
    assert!(
        cpu < FLOOD,
        "the flood kept the gateway busier than one core: {cpu:?} in {FLOOD:?}"
    );
    assert!(
        received >= 20,
        "the real peer must be served during the flood: {received} pings answered\n{summary}"
    );
}
