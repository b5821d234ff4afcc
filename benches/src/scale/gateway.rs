//! One `kubetun-gateway` process and many WireGuard peers in one network namespace.
//!
//! Every simulated peer is a boringtun `noise::Tunn` with its own UDP socket on the
//! namespace's loopback, answering the gateway's handshake initiations like any WireGuard
//! endpoint. The run, in order:
//!
//! 1. the busy peer alone is applied; its throughput (encrypted UDP datagrams into a socket
//!    on the gateway's TUN address) is the baseline;
//! 2. the state with all peers is applied (the Apply's round trip is timed), and the time until
//!    the gateway reports a handshake with every peer is taken from its `Status`;
//! 3. the busy peer's throughput with every other peer configured and handshaken (idle);
//! 4. one peer of the full state changes (its endpoint) and is applied again (timed);
//! 5. the busy peer alone again (the baseline's second half, which also shows drift).
//!
//! The gateway's resident memory (`VmRSS`, `VmHWM`) is read from `/proc` after each step.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use kubetun_controller::gateway_api::{self, DesiredState};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_testenv::netns::{self, Netns, NsChild};
use serde::Serialize;

use super::{ScaleError, raise_fd_limit, read_memory};

/// The gateway's UDP port inside the namespace: below the ephemeral range (32768-60999), so
/// none of the peers' sockets (bound to port 0 before the gateway's first apply binds its
/// wildcard address) can have taken it. 51820 did, now and then.
const GATEWAY_PORT: u16 = 31820;
/// The gateway's TUN address; the busy peer's datagrams are addressed to it.
const TUN_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The sink's UDP port on [`TUN_ADDRESS`].
const SINK_PORT: u16 = 9000;
/// Size of the busy peer's inner IPv4 packets.
const PACKET_LEN: usize = 1400;
/// How long the gateway may take to open its control socket.
const STARTUP: Duration = Duration::from_secs(15);

/// What to run.
#[derive(Debug, Clone)]
pub struct GatewayScaleConfig {
    /// Peers in the full state (the busy one included).
    pub peers: usize,
    /// Seconds of each throughput measurement.
    pub throughput_seconds: f64,
    /// The `kubetun-gateway` executable.
    pub gateway: PathBuf,
    /// How long to wait for every handshake before giving up.
    pub handshake_timeout: Duration,
    /// Rounds of (busy peer alone, busy peer among all), interleaved so drift of a shared
    /// machine hits both sides alike.
    pub rounds: usize,
    /// Where the gateway's info-level log goes; `None`: warnings only, discarded.
    pub gateway_log: Option<PathBuf>,
}

/// What one run measured. Lists hold one value per round.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayScaleReport {
    /// Peers in the full state.
    pub peers: usize,
    /// Rounds (busy peer alone, then among all peers).
    pub rounds: usize,
    /// Apply round trip of the state with the busy peer only, milliseconds.
    pub apply_one_peer_ms: Vec<f64>,
    /// Apply round trip of the full state (all peers added to the busy one), milliseconds.
    pub apply_all_peers_ms: Vec<f64>,
    /// Apply round trip of the full state with one peer's endpoint changed, milliseconds.
    pub apply_one_changed_ms: f64,
    /// From the full Apply until the gateway reported a handshake with every peer, ms
    /// (`None`: not all within the timeout).
    pub all_handshakes_ms: Vec<Option<f64>>,
    /// Peers with a handshake when the wait ended (the fewest of the rounds).
    pub handshaken_peers: usize,
    /// Cookie replies the gateway sent over the run ("under load").
    pub under_load_drops: u64,
    /// Handshake messages the gateway's queue shed over the run.
    pub handshake_queue_drops: u64,
    /// Gateway RSS with the busy peer only (first round), KiB.
    pub rss_one_peer_kib: u64,
    /// Gateway RSS with all peers handshaken (first round), KiB.
    pub rss_all_peers_kib: u64,
    /// Gateway peak RSS over the run (`VmHWM`), KiB.
    pub rss_peak_kib: u64,
    /// Busy peer alone, Mbit/s.
    pub busy_alone_mbps: Vec<f64>,
    /// Busy peer with every other peer configured and idle, Mbit/s.
    pub busy_with_idle_mbps: Vec<f64>,
    /// Median of `busy_with_idle_mbps` over the median of `busy_alone_mbps`.
    pub busy_ratio: f64,
}

/// The median of `values` (0 for none).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// One simulated WireGuard endpoint.
struct SimPeer {
    name: String,
    public_base64: String,
    tunn: Mutex<Tunn>,
    socket: Arc<UdpSocket>,
    real_prefix: String,
    data_packets: AtomicU64,
}

impl SimPeer {
    fn tunn(&self) -> std::sync::MutexGuard<'_, Tunn> {
        self.tunn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn endpoint(&self) -> String {
        self.socket
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }
}

/// Peer `index`'s own loopback address (127.1.0.1 on): real peers have addresses of their
/// own, and the gateway's handshake queue gives each source address a share.
fn peer_address(index: usize) -> Ipv4Addr {
    let offset = u32::try_from(index).unwrap_or(0) + 1;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 1, 0, 0)) + offset)
}

/// The real prefix of peer `index`: the `index`-th /24 of 100.64.0.0/10.
fn peer_prefix(index: usize) -> Result<(Ipv4Addr, String), ScaleError> {
    let index = u32::try_from(index)
        .ok()
        .filter(|i| *i < 1 << 14)
        .ok_or(ScaleError::TooMany {
            what: "peers",
            most: 1 << 14,
        })?;
    let base = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + (index << 8));
    Ok((base, format!("{base}/24")))
}

fn peer_state(peer: &SimPeer, endpoint: String) -> gateway_api::Peer {
    gateway_api::Peer {
        public_key: peer.public_base64.clone(),
        name: peer.name.clone(),
        endpoint,
        routes: vec![gateway_api::Route {
            real: peer.real_prefix.clone(),
            view: String::new(),
            fallback: false,
        }],
        ..Default::default()
    }
}

fn desired(key: &GatewayKey, version: String, peers: Vec<gateway_api::Peer>) -> DesiredState {
    DesiredState {
        version,
        interface: Some(gateway_api::Interface {
            private_key: key.private_base64(),
            listen_port: u32::from(GATEWAY_PORT),
            addresses: vec![format!("{TUN_ADDRESS}/16")],
            manage_routes: true,
            // The peers stand for kubetun gateways, as a hub's are: with the connectivity
            // check on, the gateway initiates with every one of them after the apply (it
            // does not with plain WireGuard peers). Probing once a minute keeps the probes
            // out of the throughput figures.
            conncheck: Some(gateway_api::ConnCheck {
                interval_ms: 60_000,
                ..Default::default()
            }),
            ..Default::default()
        }),
        peers,
        admissions: Vec::new(),
    }
}

/// A minimal IPv4/UDP packet from `source` to the sink, header checksum set (UDP checksum 0).
fn inner_packet(source: Ipv4Addr) -> Vec<u8> {
    let mut packet = vec![0u8; PACKET_LEN];
    let total = u16::try_from(PACKET_LEN).unwrap_or(u16::MAX);
    packet[0] = 0x45;
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet[8] = 64;
    packet[9] = 17;
    packet[12..16].copy_from_slice(&source.octets());
    packet[16..20].copy_from_slice(&TUN_ADDRESS.octets());
    let mut sum: u32 = packet[..20]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = !u16::try_from(sum).unwrap_or(u16::MAX);
    packet[10..12].copy_from_slice(&checksum.to_be_bytes());
    packet[20..22].copy_from_slice(&40000u16.to_be_bytes());
    packet[22..24].copy_from_slice(&SINK_PORT.to_be_bytes());
    let udp_len = u16::try_from(PACKET_LEN - 20).unwrap_or(u16::MAX);
    packet[24..26].copy_from_slice(&udp_len.to_be_bytes());
    packet
}

/// Answers whatever the gateway sends to `peer` (handshake initiations, keepalives, cookie
/// replies) until `stop`; one thread serves a share of the peers through non-blocking reads.
fn serve_peers(peers: &[Arc<SimPeer>], stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    let mut out = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        for peer in peers {
            while let Ok((n, from)) = peer.socket.recv_from(&mut buf) {
                idle = false;
                let mut datagram: &[u8] = &buf[..n];
                let mut tunn = peer.tunn();
                loop {
                    match tunn.decapsulate(Some(from.ip()), datagram, &mut out) {
                        TunnResult::WriteToNetwork(packet) => {
                            let _ = peer.socket.send_to(packet, from);
                            datagram = &[];
                        }
                        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
                            peer.data_packets.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        TunnResult::Done | TunnResult::Err(_) => break,
                    }
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// Receives on the gateway's TUN address and counts payload bytes.
struct Sink {
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sink {
    fn start(socket: UdpSocket) -> Result<Self, ScaleError> {
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(ScaleError::io("sink read timeout"))?;
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (bytes, stop) = (bytes.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = socket.recv(&mut buf) {
                        bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            })
        };
        Ok(Self {
            bytes,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends the busy peer's packets as fast as it can for `seconds` (after a 0.5 s warm-up) and
/// returns the sink's goodput in Mbit/s (inner UDP payload).
fn measure_busy(
    busy: &SimPeer,
    source: Ipv4Addr,
    sink_bytes: &AtomicU64,
    gateway: SocketAddr,
    seconds: f64,
) -> f64 {
    let packet = inner_packet(source);
    let mut out = vec![0u8; PACKET_LEN + 64];
    let warmup = Duration::from_millis(500);
    let measured = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut window: Option<(Instant, u64)> = None;
    loop {
        let now = Instant::now();
        if window.is_none() && now >= started + warmup {
            window = Some((now, sink_bytes.load(Ordering::Relaxed)));
        }
        if let Some((from, bytes)) = window
            && now >= from + measured
        {
            // Let what is in flight land.
            std::thread::sleep(Duration::from_millis(20));
            let got = sink_bytes.load(Ordering::Relaxed) - bytes;
            let elapsed = from.elapsed().as_secs_f64();
            return got as f64 * 8.0 / elapsed / 1e6;
        }
        let sent = {
            let mut tunn = busy.tunn();
            match tunn.encapsulate(&packet, &mut out) {
                TunnResult::WriteToNetwork(datagram) => Some(datagram.len()),
                _ => None,
            }
        };
        if let Some(len) = sent {
            while let Err(e) = busy.socket.send_to(&out[..len], gateway) {
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    break;
                }
                std::thread::yield_now();
            }
        }
    }
}

fn public_key_base64(public: &PublicKey) -> String {
    base64::engine::general_purpose::STANDARD.encode(public.as_bytes())
}

fn static_secret(key: &GatewayKey) -> Result<StaticSecret, ScaleError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(key.private_base64())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or(ScaleError::Setup("a generated key is not 32 bytes".into()))?;
    Ok(StaticSecret::from(bytes))
}

/// Polls the gateway's status until every peer has a handshake or `timeout` passes; returns
/// the elapsed time (if all) and how many had one.
async fn wait_handshakes(
    client: &GatewayClient,
    peers: usize,
    since: Instant,
    timeout: Duration,
) -> Result<(Option<f64>, usize), ScaleError> {
    loop {
        let status = client.status().await.map_err(ScaleError::gateway)?;
        let done = status
            .peers
            .iter()
            .filter(|p| p.last_handshake_unix_ms > 0)
            .count();
        if done >= peers {
            return Ok((Some(since.elapsed().as_secs_f64() * 1e3), done));
        }
        if since.elapsed() > timeout {
            return Ok((None, done));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn timed_apply(client: &GatewayClient, state: DesiredState) -> Result<f64, ScaleError> {
    let started = Instant::now();
    client.apply(state).await.map_err(ScaleError::gateway)?;
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

fn drop_count(status: &gateway_api::StatusResponse, reason: &str) -> u64 {
    status.drops.get(reason).copied().unwrap_or(0)
}

/// Runs the scenario described in the module documentation. Needs root.
pub async fn run(config: &GatewayScaleConfig) -> Result<GatewayScaleReport, ScaleError> {
    if config.peers == 0 {
        return Err(ScaleError::Setup("at least one peer".into()));
    }
    raise_fd_limit(config.peers as u64 + 256)?;
    let tag = std::process::id() % 100_000;
    let ns = Netns::new(&format!("kts-gw-{tag}"))?;
    let dir = tempfile::tempdir().map_err(ScaleError::io("temp dir"))?;
    let socket_path = dir.path().join("gateway.grpc.sock");
    let ifname = format!("kts{tag}");
    let mut cmd = ns.command(
        config
            .gateway
            .to_str()
            .ok_or(ScaleError::Setup("gateway path is not UTF-8".into()))?,
    );
    cmd.args(["-f", &ifname, "--grpc-socket"])
        .arg(&socket_path)
        .arg("--uapi-dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    match &config.gateway_log {
        Some(path) => cmd
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(path).map_err(ScaleError::io("the gateway log"))?),
        None => cmd.env("RUST_LOG", "warn").stderr(Stdio::null()),
    };
    let gateway_process = NsChild::spawn(&mut cmd)?;
    if !netns::wait_for_path(&socket_path, STARTUP) {
        return Err(ScaleError::Setup(
            "the gateway did not open its control socket".into(),
        ));
    }
    let gateway_pid = gateway_process.pid();
    let client = GatewayClient::with_timeout(&socket_path, Duration::from_secs(60));
    let gateway_key = GatewayKey::generate();
    let gateway_public = PublicKey::from(&static_secret(&gateway_key)?);
    let gateway_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, GATEWAY_PORT));

    // The peers' sockets are opened inside the namespace (a socket stays in the namespace it
    // was created in).
    let count = config.peers;
    let sockets = netns::run_in(&ns, || -> std::io::Result<Vec<UdpSocket>> {
        (0..count)
            .map(|index| {
                let socket = UdpSocket::bind((peer_address(index), 0))?;
                socket.set_nonblocking(true)?;
                Ok(socket)
            })
            .collect()
    })
    .map_err(ScaleError::io("enter the namespace"))?
    .map_err(ScaleError::io("peer sockets"))?;
    let mut peers = Vec::with_capacity(count);
    for (index, socket) in sockets.into_iter().enumerate() {
        let key = GatewayKey::generate();
        let secret = static_secret(&key)?;
        let public = PublicKey::from(&secret);
        let index32 = u32::try_from(index).unwrap_or(u32::MAX);
        peers.push(Arc::new(SimPeer {
            name: format!("peer-{index}"),
            public_base64: public_key_base64(&public),
            tunn: Mutex::new(Tunn::new(secret, gateway_public, None, None, index32, None)),
            socket: Arc::new(socket),
            real_prefix: peer_prefix(index)?.1,
            data_packets: AtomicU64::new(0),
        }));
    }
    // Two threads answer the idle peers; the busy one is answered by its own so its
    // keepalives and handshakes never wait behind 999 others.
    let stop = Arc::new(AtomicBool::new(false));
    let mut servers = Vec::new();
    let (busy_group, idle) = peers.split_at(1);
    let shares: Vec<Vec<Arc<SimPeer>>> = std::iter::once(busy_group.to_vec())
        .chain(
            idle.chunks(idle.len().div_ceil(2).max(1))
                .map(<[_]>::to_vec),
        )
        .collect();
    for share in shares {
        let stop = stop.clone();
        servers.push(std::thread::spawn(move || serve_peers(&share, &stop)));
    }
    let result = measure(
        config,
        &ns,
        &client,
        &gateway_key,
        gateway_pid,
        gateway_addr,
        &peers,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for server in servers {
        let _ = server.join();
    }
    drop(gateway_process);
    drop(ns);
    result
}

async fn measure(
    config: &GatewayScaleConfig,
    ns: &Netns,
    client: &GatewayClient,
    gateway_key: &GatewayKey,
    gateway_pid: u32,
    gateway_addr: SocketAddr,
    peers: &[Arc<SimPeer>],
) -> Result<GatewayScaleReport, ScaleError> {
    let busy = &peers[0];
    let busy_source = Ipv4Addr::from(u32::from(peer_prefix(0)?.0) + 1);
    let all: Vec<gateway_api::Peer> = peers.iter().map(|p| peer_state(p, p.endpoint())).collect();
    let first = client.status().await.map_err(ScaleError::gateway)?;
    let seconds = config.throughput_seconds;
    let mut sink: Option<Sink> = None;
    let mut report = GatewayScaleReport {
        peers: peers.len(),
        rounds: config.rounds.max(1),
        apply_one_peer_ms: Vec::new(),
        apply_all_peers_ms: Vec::new(),
        apply_one_changed_ms: 0.0,
        all_handshakes_ms: Vec::new(),
        handshaken_peers: peers.len(),
        under_load_drops: 0,
        handshake_queue_drops: 0,
        rss_one_peer_kib: 0,
        rss_all_peers_kib: 0,
        rss_peak_kib: 0,
        busy_alone_mbps: Vec::new(),
        busy_with_idle_mbps: Vec::new(),
        busy_ratio: 0.0,
    };
    for round in 0..report.rounds {
        // The busy peer alone.
        report.apply_one_peer_ms.push(
            timed_apply(
                client,
                desired(gateway_key, format!("one-{round}"), vec![all[0].clone()]),
            )
            .await?,
        );
        let (one_done, _) =
            wait_handshakes(client, 1, Instant::now(), config.handshake_timeout).await?;
        if one_done.is_none() {
            return Err(ScaleError::Setup(
                "no handshake with the busy peer alone".into(),
            ));
        }
        if sink.is_none() {
            let socket = netns::run_in(ns, || UdpSocket::bind((TUN_ADDRESS, SINK_PORT)))
                .map_err(ScaleError::io("enter the namespace"))?
                .map_err(ScaleError::io("sink socket"))?;
            sink = Some(Sink::start(socket)?);
        }
        let bytes = sink.as_ref().map(|s| s.bytes.clone()).unwrap_or_default();
        let alone =
            busy_throughput(busy, busy_source, bytes.clone(), gateway_addr, seconds).await?;
        if alone <= 0.0 {
            return Err(ScaleError::Setup(
                "no data from the busy peer reached the gateway's TUN address".into(),
            ));
        }
        report.busy_alone_mbps.push(alone);
        if round == 0 {
            report.rss_one_peer_kib = read_memory(gateway_pid)?.rss_kib;
        }

        // All peers: the busy one keeps its session, the others handshake.
        let started = Instant::now();
        report.apply_all_peers_ms.push(
            timed_apply(
                client,
                desired(gateway_key, format!("all-{round}"), all.clone()),
            )
            .await?,
        );
        let (handshakes, done) =
            wait_handshakes(client, peers.len(), started, config.handshake_timeout).await?;
        report.all_handshakes_ms.push(handshakes);
        report.handshaken_peers = report.handshaken_peers.min(done);
        if round == 0 {
            report.rss_all_peers_kib = read_memory(gateway_pid)?.rss_kib;
            // One peer's endpoint changes in the full state, and back.
            let mut changed = all.clone();
            if let Some(last) = changed.last_mut() {
                last.endpoint = format!("127.0.0.2:{}", 40000 + peers.len() % 20000);
            }
            report.apply_one_changed_ms =
                timed_apply(client, desired(gateway_key, "changed".into(), changed)).await?;
            timed_apply(
                client,
                desired(gateway_key, "all-again".into(), all.clone()),
            )
            .await?;
            wait_handshakes(
                client,
                peers.len(),
                Instant::now(),
                config.handshake_timeout,
            )
            .await?;
        }
        report
            .busy_with_idle_mbps
            .push(busy_throughput(busy, busy_source, bytes, gateway_addr, seconds).await?);
    }
    drop(sink);
    let last = client.status().await.map_err(ScaleError::gateway)?;
    report.under_load_drops =
        drop_count(&last, "under_load").saturating_sub(drop_count(&first, "under_load"));
    report.handshake_queue_drops = drop_count(&last, "handshake_queue_full")
        .saturating_sub(drop_count(&first, "handshake_queue_full"));
    report.rss_peak_kib = read_memory(gateway_pid)?.peak_kib;
    let alone = median(&report.busy_alone_mbps);
    report.busy_ratio = if alone > 0.0 {
        median(&report.busy_with_idle_mbps) / alone
    } else {
        0.0
    };
    Ok(report)
}

async fn busy_throughput(
    busy: &Arc<SimPeer>,
    source: Ipv4Addr,
    sink_bytes: Arc<AtomicU64>,
    gateway: SocketAddr,
    seconds: f64,
) -> Result<f64, ScaleError> {
    let peer = Arc::clone(busy);
    tokio::task::spawn_blocking(move || measure_busy(&peer, source, &sink_bytes, gateway, seconds))
        .await
        .map_err(|e| ScaleError::Setup(format!("throughput task: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_packet_has_a_valid_header_checksum() {
        let packet = inner_packet(Ipv4Addr::new(100, 64, 0, 1));
        let sum: u32 = packet[..20]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        assert_eq!(folded, 0xffff);
        assert_eq!(packet.len(), PACKET_LEN);
    }

    #[test]
    fn peer_prefixes_are_distinct_24s() {
        assert_eq!(peer_prefix(0).unwrap().1, "100.64.0.0/24");
        assert_eq!(peer_prefix(257).unwrap().1, "100.65.1.0/24");
        assert!(peer_prefix(1 << 14).is_err());
    }
}
