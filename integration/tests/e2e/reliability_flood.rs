//! A handshake flood from unknown keys: well-formed initiations (valid MAC1, so only the rate
//! limiter can tell them apart) sent at [`FLOOD_RATE`] at a gateway from another namespace. The gateway does the Diffie-Hellman work only for its
//! limiter's allowance, answers with cookie replies, sheds what the flooding address's share
//! of the handshake queue cannot hold, and keeps serving its real peer: pings during the flood
//! are answered, and after the real peer restarts, its new handshake (cookie reply, then a
//! retry with the cookie) completes while the flood goes on.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use kubetun_controller::gateway_api::{DesiredState, Interface, Peer, Route};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::netns::{
    Netns, bin_path, command_exists, require_root, run_in, veth, wait_for_path,
};

/// Initiations per second: 1 500 times the handshake allowance, and below what the gateway's
/// socket reader drains in a debug build here (~400 000/s). An unpaced flood (~450 000/s from
/// one thread) overflows the socket's receive buffer, and the kernel then drops the real
/// peer's packets with the flood's before the gateway sees either: that measures the
/// flooder's speed against the reader's, not the gateway's defences.
const FLOOD_RATE: f64 = 150_000.0;
/// The flood's bound, whatever happens.
const FLOOD_LIMIT: Duration = Duration::from_secs(30);
/// A restarted real peer's handshake meets a cookie reply, then retries with the cookie after
/// 5 s; a second round is allowed for a first initiation lost to the flood.
const REHANDSHAKE_WITHIN: Duration = Duration::from_secs(12);
/// Pings before the real peer's restart and after its re-handshake, each.
const PING_SECONDS: u64 = 2;
const STARTUP: Duration = Duration::from_secs(10);
/// Distinct unknown initiator keys in the flood, sent round-robin.
const ATTACKERS: usize = 256;
/// The real peer pings every 50 ms during the flood.
const PING_INTERVAL: &str = "0.05";

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
                fallback: false,
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
    let _turn = kubetun_integration::netns::turn(module_path!());
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
    let peer = start(&ns_b, "ktfloodb", &socket_b);
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
    let apply_b = |socket: &std::path::Path| {
        runtime
            .block_on(GatewayClient::new(socket).apply(state(
                &key_b,
                "10.62.0.1/24",
                &key_a,
                "192.0.2.1:51820",
                "10.61.0.0/24",
            )))
            .expect("apply b");
    };
    apply_b(&socket_b);
    assert!(ns_b.wait_ping("10.61.0.1", STARTUP), "no tunnel");

    let messages = initiations(&key_a);
    let ping = |seconds: u64| {
        let mut ping = ns_b.command("ping");
        ping.args(["-n", "-q", "-i", PING_INTERVAL, "-w"])
            .arg(seconds.to_string())
            .arg("10.61.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        ping_summary(ping.spawn().expect("ping"))
    };
    let stop = AtomicBool::new(false);
    let cpu_before = cpu_time(victim.0.id());
    let started = Instant::now();
    let (flood, before_restart, rehandshake, after_rehandshake, _peer) =
        std::thread::scope(|scope| {
            let flood = scope.spawn(|| {
                run_in(&ns_b, || flood_until(&stop, &messages)).expect("flood from the namespace")
            });
            let before_restart = ping(PING_SECONDS);

            // The real peer loses its session and must handshake again while the flood goes
            // on: its first initiation meets the limiter (a cookie reply), its retry five
            // seconds later carries the cookie and passes.
            let restarted = unix_ms();
            drop(peer);
            // A fresh socket path: the killed process left its socket file behind.
            let socket_b = dir.path().join("b2.sock");
            let peer = start(&ns_b, "ktfloodb", &socket_b);
            apply_b(&socket_b);
            // Traffic makes the restarted peer initiate.
            let mut traffic = ns_b
                .command("ping")
                .args(["-n", "-q", "-i", "0.2", "10.61.0.1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("ping");
            let deadline = Instant::now() + REHANDSHAKE_WITHIN;
            let rehandshake = loop {
                let status = runtime
                    .block_on(GatewayClient::new(&socket_a).status())
                    .expect("status a");
                let last = status.peers.first().map_or(0, |p| p.last_handshake_unix_ms);
                if last >= restarted {
                    break Some(Duration::from_millis((last - restarted) as u64));
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let _ = traffic.kill();
            let _ = traffic.wait();
            let after_rehandshake = rehandshake.map(|_| ping(PING_SECONDS));
            stop.store(true, Ordering::Relaxed);
            let flood = flood.join().expect("flood thread");
            (flood, before_restart, rehandshake, after_rehandshake, peer)
        });
    let flooded_for = started.elapsed();
    let cpu = cpu_time(victim.0.id()).saturating_sub(cpu_before);
    let drops = runtime
        .block_on(GatewayClient::new(&socket_a).status())
        .expect("status a")
        .drops;
    let count = |reason: &str| drops.get(reason).copied().unwrap_or(0);
    let (shed, handshakes) = (count("handshake_queue_full"), count("unknown_initiator"));

    eprintln!(
        "flood: {} initiations in {flooded_for:.1?} ({:.0}/s), {} cookie replies received, {shed} \
         shed by the handshake queue, {handshakes} Diffie-Hellman handshakes done; gateway CPU \
         {cpu:.1?}; real peer: pings answered {before_restart:?} before its restart, \
         re-handshake after {rehandshake:.1?}, pings answered {after_rehandshake:?} after",
        flood.sent,
        flood.sent as f64 / flooded_for.as_secs_f64(),
        flood.cookies,
    );
    assert!(
        flood.sent as f64 / flooded_for.as_secs_f64() > 20_000.0,
        "the flood was too small to mean anything: {} in {flooded_for:?}",
        flood.sent
    );
    assert!(flood.cookies > 0, "no cookie replies were sent");
    // Only the limiter's allowance (100 a second) gets the Diffie-Hellman work.
    let allowance = 100 * (flooded_for.as_secs() + 1) + 100;
    assert!(
        handshakes <= allowance,
        "{handshakes} handshakes from unknown keys were computed, allowance {allowance}"
    );
    assert!(
        cpu < flooded_for * 3 / 2,
        "the flood took more than the handshake worker and the readers: {cpu:?} in \
         {flooded_for:?}"
    );
    let served = |(transmitted, received): (u32, u32)| received * 10 >= transmitted * 9;
    assert!(
        served(before_restart),
        "the real peer must be served during the flood: {before_restart:?} (sent, answered)"
    );
    assert!(
        rehandshake.is_some(),
        "the real peer's new handshake did not complete within {REHANDSHAKE_WITHIN:?} of the \
         flood"
    );
    assert!(
        after_rehandshake.is_some_and(served),
        "after its re-handshake the real peer must be served: {after_rehandshake:?}"
    );
}

/// What the flood sent and got back.
struct Flood {
    sent: u64,
    cookies: u64,
}

/// Sends the initiations round-robin at [`FLOOD_RATE`] until `stop` (at most
/// [`FLOOD_LIMIT`]), counting the cookie replies that come back.
fn flood_until(stop: &AtomicBool, messages: &[Vec<u8>]) -> Flood {
    let socket = UdpSocket::bind("192.0.2.3:0").expect("attacker socket");
    socket.set_nonblocking(true).expect("non-blocking");
    let target: SocketAddr = "192.0.2.1:51820".parse().expect("address");
    let mut flood = Flood {
        sent: 0,
        cookies: 0,
    };
    let mut reply = [0u8; 256];
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD_LIMIT {
        for message in messages {
            if socket.send_to(message, target).is_ok() {
                flood.sent += 1;
            }
        }
        while let Ok((len, _)) = socket.recv_from(&mut reply) {
            if len == 64 && reply[0] == 3 {
                flood.cookies += 1;
            }
        }
        let due = Duration::from_secs_f64(flood.sent as f64 / FLOOD_RATE);
        if let Some(ahead) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
    flood
}

/// `(transmitted, received)` from a finished `ping -q`.
fn ping_summary(ping: Child) -> (u32, u32) {
    let output = ping.wait_with_output().expect("ping output");
    let summary = String::from_utf8_lossy(&output.stdout);
    let line = summary
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_default();
    let mut numbers = line
        .split(", ")
        .filter_map(|part| part.split_whitespace().next()?.parse::<u32>().ok());
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

fn unix_ms() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(now.as_millis()).expect("ms")
}
