//! The gateway's packet path allocates nothing per packet, measured over the real device
//! loop rather than the remap core alone.
//!
//! Two [`Device`]s run in this process, each in its own network namespace (joined by a veth
//! pair), configured as each other's peer with remapped routes and the connectivity check on,
//! exactly as `kubetun-gateway` runs them: TUN batch reads with offloads, remap, encryption
//! into the send arena, `sendmmsg` with GSO, `recvmmsg` with GRO, decryption, TUN writes with
//! GRO coalescing, plus the timer, prober and handshake tasks. UDP datagrams, then a TCP
//! stream over IPv4 and one over IPv6, cross the tunnel. After a warm-up (handshake, first
//! batches, pools filled) a counting global allocator is switched on for a steady window of
//! [`WINDOW_DATAGRAMS`] tunnel datagrams and counts the allocations of every thread of the
//! process. The bound, [`MAX_ALLOCATIONS_PER_DATAGRAM`], is one allocation per thousand
//! datagrams: one allocation per packet, or per batch of up to 128 packets, exceeds it
//! several times over, while the 250 ms timer ticks and probes of a window stay well below.
//! When the bound is exceeded, the test prints the threads and backtraces of the first
//! allocations it saw (that is how tun-rs's GRO, which copied every packet written to the
//! TUN device into a fresh `Vec`, was found; see `kubetun_gateway_io::gro`).
//! Each gateway holds the other as an exported cluster, so admission (endpoint lookups on
//! one side, flow-table records and hits on the other) is on for every packet.
//! The whole run happens twice: with one data-path queue and with two
//! ([`IoOptions::queues`]: a multi-queue TUN device, two reader tasks per side and family).
//!
//! Needs root and `/dev/net/tun`; without them it prints why and passes, unless `CI=true`.

mod support;
use support::CountingAllocator;

use std::backtrace::Backtrace;
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ipnet::{Ipv4Net, Ipv6Net};
use kubetun_gateway::device::Device;
use kubetun_gateway::io_options::IoOptions;
use kubetun_gateway_core::conncheck::ConnCheckConfig;
use kubetun_gateway_core::key::Key;
use kubetun_gateway_core::state::{
    AdmissionConfig, AdmittedEndpoint, DesiredState, Endpoint, InterfaceConfig, Isolation,
    PeerConfig, Protocol, RouteConfig,
};

// ---------------------------------------------------------------------------------------------
// The counting allocator.

/// Whether allocations are being counted (only during a measuring window).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations (`alloc`, `alloc_zeroed`, `realloc`) counted, on every thread.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Deallocations counted, for the report.
static DEALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Backtraces are recorded for this many of the first allocations counted.
const TRACED_ALLOCATIONS: u64 = 12;
/// The thread name and backtrace of the first allocations counted.
static TRACES: Mutex<Vec<(String, Backtrace)>> = Mutex::new(Vec::new());

thread_local! {
    /// Set while this thread records an allocation, so that the recording's own
    /// allocations are neither counted nor traced.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

fn on_allocation() {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    match RECORDING.try_with(|recording| recording.replace(true)) {
        Ok(true) => {} // an allocation made by the recording below
        Ok(false) => {
            let seen = ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            // Not while panicking: the panic hook may hold the backtrace lock.
            if seen < TRACED_ALLOCATIONS && !std::thread::panicking() {
                let thread = std::thread::current();
                let name = thread.name().unwrap_or("unnamed").to_owned();
                let trace = Backtrace::force_capture();
                if let Ok(mut traces) = TRACES.lock() {
                    traces.push((name, trace));
                }
            }
            RECORDING.with(|recording| recording.set(false));
        }
        // The thread is shutting down: count without recording.
        Err(_) => {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Counts a deallocation while [`COUNTING`] is on.
fn on_deallocation() {
    if COUNTING.load(Ordering::Relaxed) {
        DEALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts allocations of all threads while [`COUNTING`] is on; the recording it does for
/// the first allocations allocates through this same allocator, which the thread-local flag
/// of [`on_allocation`] turns into a no-op.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::new(on_allocation, on_deallocation);

/// Starts a measuring window from zero.
fn start_counting() {
    ALLOCATIONS.store(0, Ordering::Relaxed);
    DEALLOCATIONS.store(0, Ordering::Relaxed);
    if let Ok(mut traces) = TRACES.lock() {
        traces.clear();
    }
    COUNTING.store(true, Ordering::SeqCst);
}

/// Ends the window: (allocations, deallocations) counted in it.
fn stop_counting() -> (u64, u64) {
    COUNTING.store(false, Ordering::SeqCst);
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        DEALLOCATIONS.load(Ordering::Relaxed),
    )
}

/// The threads and backtraces of the first allocations of the last window.
fn traces() -> String {
    let traces = TRACES
        .lock()
        .map(|mut t| std::mem::take(&mut *t))
        .unwrap_or_default();
    traces
        .iter()
        .enumerate()
        .map(|(n, (thread, trace))| format!("allocation {n} on thread {thread}:\n{trace}\n"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The topology.

/// At most this many allocations per tunnel datagram in a window (see the module docs).
const MAX_ALLOCATIONS_PER_DATAGRAM: f64 = 0.001;
/// Tunnel datagrams (received by either gateway) in a measuring window.
const WINDOW_DATAGRAMS: u64 = 20_000;
/// Datagrams delivered before a UDP window starts.
const UDP_WARMUP: u64 = 3_000;
/// Bytes delivered before a TCP window starts.
const TCP_WARMUP_BYTES: u64 = 8 << 20;
/// The whole test, including set-up, stays within this.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);

/// The TUN interface name (one per namespace).
const TUN: &str = "ktalloc0";
/// The WireGuard port of both gateways.
const WG_PORT: u16 = 51820;
/// UDP and TCP ports of the traffic inside the tunnel.
const UDP_PORT: u16 = 9000;
const TCP_PORT: u16 = 9001;
/// Payload of one test datagram: well inside the 1420-byte tunnel MTU.
const UDP_PAYLOAD: usize = 1200;

/// One side of the tunnel.
struct Side {
    namespace: String,
    veth: &'static str,
    underlay: Ipv4Addr,
    /// The addresses of the side's TUN device, inside its real prefixes.
    tun_address: Ipv4Addr,
    tun_address6: Ipv6Addr,
    /// The side's real prefixes.
    real: &'static str,
    real6: &'static str,
    /// How the other side sees the real prefixes.
    view: &'static str,
    view6: &'static str,
}

impl Side {
    fn a() -> Side {
        Side {
            namespace: format!("ktalloc-a-{}", std::process::id()),
            veth: "ktalloc-va",
            underlay: Ipv4Addr::new(192, 168, 231, 1),
            tun_address: Ipv4Addr::new(10, 10, 0, 1),
            tun_address6: "fd10:a::1".parse().expect("address"),
            real: "10.10.0.0/24",
            real6: "fd10:a::/64",
            view: "10.110.0.0/24",
            view6: "fd10:6a::/64",
        }
    }

    fn b() -> Side {
        Side {
            namespace: format!("ktalloc-b-{}", std::process::id()),
            veth: "ktalloc-vb",
            underlay: Ipv4Addr::new(192, 168, 231, 2),
            tun_address: Ipv4Addr::new(10, 20, 0, 1),
            tun_address6: "fd10:14::1".parse().expect("address"),
            real: "10.20.0.0/24",
            real6: "fd10:14::/64",
            view: "10.120.0.0/24",
            view6: "fd10:78::/64",
        }
    }

    /// The address the other side uses for this side's TUN address: the same host in the
    /// view prefix.
    fn viewed_address(&self) -> Ipv4Addr {
        let view: Ipv4Net = self.view.parse().expect("view prefix");
        let host = u32::from(self.tun_address) & !u32::from(view.netmask());
        Ipv4Addr::from(u32::from(view.network()) | host)
    }

    /// The same for the IPv6 address.
    fn viewed_address6(&self) -> Ipv6Addr {
        let view: Ipv6Net = self.view6.parse().expect("view prefix");
        let host = u128::from(self.tun_address6) & !u128::from(view.netmask());
        Ipv6Addr::from(u128::from(view.network()) | host)
    }
}

/// Whether the test can run; when not, says why (and fails under `CI=true`).
fn can_run() -> bool {
    let missing = if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        Some("not running as root")
    } else if !std::path::Path::new("/dev/net/tun").exists() {
        Some("/dev/net/tun is missing")
    } else if !Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        Some("iproute2 (`ip`) is not installed")
    } else {
        None
    };
    match missing {
        None => true,
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("datapath_no_alloc cannot run under CI: {reason}")
        }
        Some(reason) => {
            eprintln!("SKIPPED datapath_no_alloc: {reason} (needs root; CI=true makes this fatal)");
            false
        }
    }
}

/// Runs `ip <args>`, panicking with its stderr on failure.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        output.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// The two namespaces and the veth pair between them; deleted on drop, also when the test
/// fails half-way (the TUN devices go with the gateways, the veth with its namespaces).
struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    fn create(a: &Side, b: &Side) -> Namespaces {
        let mut namespaces = Namespaces { names: Vec::new() };
        for side in [a, b] {
            ip(&["netns", "add", &side.namespace]);
            namespaces.names.push(side.namespace.clone());
            ip(&["-n", &side.namespace, "link", "set", "lo", "up"]);
        }
        ip(&[
            "-n",
            &a.namespace,
            "link",
            "add",
            a.veth,
            "type",
            "veth",
            "peer",
            "name",
            b.veth,
            "netns",
            &b.namespace,
        ]);
        for side in [a, b] {
            let address = format!("{}/24", side.underlay);
            ip(&[
                "-n",
                &side.namespace,
                "address",
                "add",
                &address,
                "dev",
                side.veth,
            ]);
            ip(&["-n", &side.namespace, "link", "set", side.veth, "up"]);
        }
        namespaces
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Moves the calling thread into the named network namespace.
fn enter_namespace(name: &str) {
    let file = std::fs::File::open(format!("/run/netns/{name}")).expect("open the namespace");
    // SAFETY: setns with a namespace descriptor that `file` keeps open for the call; it moves
    // only the calling thread, which the caller dedicates to this namespace.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

/// Spawns a named thread inside a namespace.
fn spawn_in<T: Send + 'static>(
    namespace: &str,
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let namespace = namespace.to_owned();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            enter_namespace(&namespace);
            work()
        })
        .expect("spawn a thread")
}

/// The desired state of `this` gateway with `other` as its one peer: the other's real
/// prefix is seen through its view, the conncheck probes every 250 ms. The other cluster is
/// exported: it may open this side's UDP and TCP ports, and what this side opens towards
/// it is recorded in the flow table (whose replies it admits), so admission runs both ways
/// on every packet.
fn desired_state(this: &Side, this_key: Key, other: &Side, other_key: Key) -> DesiredState {
    let mut peer = PeerConfig::new(other_key.public_key());
    peer.name = other.namespace.clone();
    peer.endpoint = Some(Endpoint::Addr(SocketAddr::from((other.underlay, WG_PORT))));
    peer.routes = vec![
        RouteConfig::remapped(
            other.real.parse().expect("real prefix"),
            other.view.parse().expect("view prefix"),
        ),
        RouteConfig::remapped(
            other.real6.parse().expect("real prefix"),
            other.view6.parse().expect("view prefix"),
        ),
    ];
    DesiredState {
        version: "datapath-no-alloc".to_owned(),
        interface: InterfaceConfig {
            private_key: Some(this_key),
            listen_port: WG_PORT,
            addresses: vec![
                format!("{}/24", this.tun_address).parse().expect("address"),
                format!("{}/64", this.tun_address6)
                    .parse()
                    .expect("address"),
            ],
            manage_routes: true,
            conncheck: Some(ConnCheckConfig {
                interval_ms: 250,
                ..ConnCheckConfig::default()
            }),
            ..InterfaceConfig::default()
        },
        peers: vec![peer],
        admissions: vec![AdmissionConfig {
            cluster: other.namespace.clone(),
            isolation: Isolation::Exported,
            views: vec![
                other.view.parse().expect("view prefix"),
                other.view6.parse().expect("view prefix"),
            ],
            endpoints: [
                (this.tun_address.into(), Protocol::Udp, UDP_PORT),
                (this.tun_address.into(), Protocol::Tcp, TCP_PORT),
                (this.tun_address6.into(), Protocol::Tcp, TCP_PORT),
            ]
            .into_iter()
            .map(|(address, protocol, port)| AdmittedEndpoint {
                address,
                protocol,
                port,
            })
            .collect(),
            policies: Vec::new(),
        }],
    }
}

/// A gateway running on its own thread (a current-thread tokio runtime, as small as the
/// real one) inside its namespace; stopped and joined on drop.
struct Gateway {
    device: Arc<Device>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Gateway {
    fn start(namespace: &str, state: DesiredState, io: IoOptions) -> Gateway {
        let (ready, started) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = spawn_in(namespace, &format!("gw-{namespace}"), move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(async move {
                let device = match Device::create_with(TUN, io) {
                    Ok(device) => device,
                    Err(error) => {
                        let _ = ready.send(Err(error.to_string()));
                        return;
                    }
                };
                if let Err(error) = device.apply(state).await {
                    let _ = ready.send(Err(error.to_string()));
                    device.shutdown().await;
                    return;
                }
                let _ = ready.send(Ok(Arc::clone(&device)));
                // Runs the data path until the test drops its handle.
                let _ = stopped.await;
                device.shutdown().await;
            });
        });
        let device = match started.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(device)) => device,
            Ok(Err(error)) => panic!("gateway in {namespace} did not start: {error}"),
            Err(error) => panic!("gateway in {namespace} did not start: {error}"),
        };
        Gateway {
            device,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Datagrams this gateway received and accepted from its peers so far. Reads the
    /// counters the data path keeps, without allocating.
    fn received_datagrams(&self) -> u64 {
        self.device
            .snapshot()
            .slots()
            .filter_map(|(_, slot)| slot.runtime.as_ref())
            .map(|peer| peer.stats.rx_packets.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Tunnel datagrams received by both gateways so far.
fn tunnel_datagrams(gateways: &[Gateway; 2]) -> u64 {
    gateways.iter().map(Gateway::received_datagrams).sum()
}

// ---------------------------------------------------------------------------------------------
// Traffic.

/// Counters and the stop flag shared by the traffic threads and the test.
#[derive(Default)]
struct Traffic {
    stop: AtomicBool,
    /// UDP datagrams or TCP bytes delivered to the receiver.
    delivered: AtomicU64,
}

/// A UDP receiver in B and a sender in A that keeps at most `WINDOW` datagrams in flight,
/// so the tunnel runs steadily without overflowing queues.
fn start_udp(a: &Side, b: &Side, traffic: &Arc<Traffic>) -> Running {
    /// Datagrams sent but not yet delivered before the sender waits.
    const IN_FLIGHT: u64 = 256;
    /// A wait this long means the in-flight datagrams were lost.
    const STALL: Duration = Duration::from_millis(20);
    let bound = SocketAddr::from((b.tun_address, UDP_PORT));
    let receiver_socket = {
        let (tx, rx) = std::sync::mpsc::channel();
        let namespace = b.namespace.clone();
        spawn_in(&namespace, "udp-bind", move || {
            let _ = tx.send(UdpSocket::bind(bound));
        })
        .join()
        .expect("bind thread");
        rx.recv().expect("bound").expect("bind the UDP receiver")
    };
    receiver_socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let receiving = Arc::clone(traffic);
    let receiver = spawn_in(&b.namespace, "udp-receiver", move || {
        let mut buffer = [0u8; 2048];
        while !receiving.stop.load(Ordering::Relaxed) {
            if let Ok((len, _)) = receiver_socket.recv_from(&mut buffer) {
                assert_eq!(len, UDP_PAYLOAD, "datagram arrived whole");
                receiving.delivered.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let sending = Arc::clone(traffic);
    let source = SocketAddr::from((a.tun_address, 0));
    let destination = SocketAddr::from((b.viewed_address(), UDP_PORT));
    let sender = spawn_in(&a.namespace, "udp-sender", move || {
        let socket = UdpSocket::bind(source).expect("bind the UDP sender");
        let payload = [0x5au8; UDP_PAYLOAD];
        let (mut sent, mut written_off) = (0u64, 0u64);
        let mut waiting_since: Option<Instant> = None;
        while !sending.stop.load(Ordering::Relaxed) {
            let delivered = sending.delivered.load(Ordering::Relaxed) + written_off;
            if sent.saturating_sub(delivered) < IN_FLIGHT {
                waiting_since = None;
                for _ in 0..32 {
                    // A full socket buffer loses the datagram; the stall rule accounts for it.
                    let _ = socket.send_to(&payload, destination);
                    sent += 1;
                }
                continue;
            }
            match waiting_since {
                Some(since) if since.elapsed() > STALL => {
                    written_off += sent - delivered;
                    waiting_since = None;
                }
                Some(_) => std::thread::sleep(Duration::from_micros(200)),
                None => waiting_since = Some(Instant::now()),
            }
        }
    });
    Running {
        traffic: Arc::clone(traffic),
        threads: vec![receiver, sender],
    }
}

/// A TCP receiver in B bound to `bound` and a sender in A streaming 64 KiB writes to
/// `destination` until stopped.
fn start_tcp(
    a: &Side,
    b: &Side,
    (bound, destination): (SocketAddr, SocketAddr),
    traffic: &Arc<Traffic>,
) -> Running {
    let listener = {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_in(&b.namespace, "tcp-bind", move || {
            let _ = tx.send(TcpListener::bind(bound));
        })
        .join()
        .expect("bind thread");
        rx.recv().expect("bound").expect("bind the TCP listener")
    };
    let receiving = Arc::clone(traffic);
    let receiver = spawn_in(&b.namespace, "tcp-receiver", move || {
        // Non-blocking accept, so that a sender that never connects does not leave this
        // thread stuck when the test stops.
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    if receiving.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(error) => panic!("accept: {error}"),
            }
        };
        stream.set_nonblocking(false).expect("blocking stream");
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let mut buffer = vec![0u8; 1 << 16];
        while !receiving.stop.load(Ordering::Relaxed) {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(len) => {
                    receiving.delivered.fetch_add(len as u64, Ordering::Relaxed);
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(error) => panic!("TCP receive: {error}"),
            }
        }
    });
    let sending = Arc::clone(traffic);
    let sender = spawn_in(&a.namespace, "tcp-sender", move || {
        let mut stream = TcpStream::connect_timeout(&destination, Duration::from_secs(10))
            .expect("connect through the tunnel");
        stream
            .set_write_timeout(Some(Duration::from_millis(50)))
            .expect("write timeout");
        let chunk = vec![0x5au8; 1 << 16];
        while !sending.stop.load(Ordering::Relaxed) {
            match stream.write(&chunk) {
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(error) => panic!("TCP send: {error}"),
            }
        }
    });
    Running {
        traffic: Arc::clone(traffic),
        threads: vec![receiver, sender],
    }
}

/// Traffic threads, stopped and joined on drop (also when the test fails half-way).
struct Running {
    traffic: Arc<Traffic>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops the threads, surfacing a panic of theirs.
    fn stop(mut self) {
        self.traffic.stop.store(true, Ordering::Relaxed);
        for thread in std::mem::take(&mut self.threads) {
            thread.join().expect("traffic thread");
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.traffic.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Polls `done` every few ms until it holds; panics (after switching counting off) at
/// `deadline`. Allocates nothing, so it may run inside a window.
fn wait_until(deadline: Instant, what: &str, mut done: impl FnMut() -> bool) {
    while !done() {
        if Instant::now() > deadline {
            COUNTING.store(false, Ordering::SeqCst);
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What one measuring window saw.
#[derive(Debug)]
struct Window {
    datagrams: u64,
    delivered: u64,
    allocations: u64,
    deallocations: u64,
    elapsed: Duration,
}

/// Counts allocations while at least [`WINDOW_DATAGRAMS`] tunnel datagrams pass.
fn measure(gateways: &[Gateway; 2], traffic: &Traffic, deadline: Instant) -> Window {
    let datagrams_before = tunnel_datagrams(gateways);
    let delivered_before = traffic.delivered.load(Ordering::Relaxed);
    let started = Instant::now();
    start_counting();
    wait_until(deadline, "the measuring window's datagrams", || {
        tunnel_datagrams(gateways) - datagrams_before >= WINDOW_DATAGRAMS
    });
    let (allocations, deallocations) = stop_counting();
    Window {
        datagrams: tunnel_datagrams(gateways) - datagrams_before,
        delivered: traffic.delivered.load(Ordering::Relaxed) - delivered_before,
        allocations,
        deallocations,
        elapsed: started.elapsed(),
    }
}

/// Reports a window; returns what is wrong with it, if anything.
fn check(phase: &str, window: &Window) -> Option<String> {
    let per_datagram = window.allocations as f64 / window.datagrams as f64;
    eprintln!(
        "{phase}: {} tunnel datagrams ({} delivered) in {:?}: {} allocations, {} frees, \
         {per_datagram:.6} allocations per datagram",
        window.datagrams,
        window.delivered,
        window.elapsed,
        window.allocations,
        window.deallocations
    );
    let traces = traces();
    if window.allocations > 0 {
        eprintln!("{phase}: first allocations of the window:\n{traces}");
    }
    if window.delivered == 0 {
        return Some(format!("{phase}: no traffic reached the receiver"));
    }
    (per_datagram > MAX_ALLOCATIONS_PER_DATAGRAM).then(|| {
        format!(
            "{phase}: {} allocations for {} datagrams ({per_datagram:.4} per datagram, at most \
             {MAX_ALLOCATIONS_PER_DATAGRAM}); backtraces above",
            window.allocations, window.datagrams
        )
    })
}

#[test]
fn the_device_loop_does_not_allocate_per_packet() {
    if !can_run() {
        return;
    }
    // The allocator counts what it should: a window with one allocation in it sees it.
    start_counting();
    let boxed = std::hint::black_box(Box::new(7u64));
    let (allocations, _) = stop_counting();
    drop(boxed);
    assert!(
        allocations >= 1,
        "the counting allocator missed an allocation"
    );

    // As in the gateway binary: events at info and above are formatted and written.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_test_writer()
        .try_init();

    // One data-path queue, two (multi-queue TUN device, SO_REUSEPORT sockets), and one
    // whose long runs are sealed and opened in parts on a crypto helper thread.
    let mut failures = Vec::new();
    for (queues, crypto_workers) in [(1, 1), (2, 1), (1, 2)] {
        let io = IoOptions {
            queues,
            crypto_workers,
            ..IoOptions::default()
        };
        failures.extend(measure_device_loop(io).into_iter().map(|failure| {
            format!("{queues} queue(s), {crypto_workers} crypto worker(s): {failure}")
        }));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Runs both gateways with `io` in fresh namespaces, pushes UDP, TCP/IPv4 and TCP/IPv6
/// traffic through them and returns the phases whose window allocated too much.
fn measure_device_loop(io: IoOptions) -> Vec<String> {
    let deadline = Instant::now() + TEST_TIMEOUT;
    let (a, b) = (Side::a(), Side::b());
    let _namespaces = Namespaces::create(&a, &b);
    let (key_a, key_b) = (Key::generate_private(), Key::generate_private());
    let gateways = [
        Gateway::start(&a.namespace, desired_state(&a, key_a, &b, key_b), io),
        Gateway::start(&b.namespace, desired_state(&b, key_b, &a, key_a), io),
    ];

    // UDP, A → B.
    let udp = Arc::new(Traffic::default());
    let running = start_udp(&a, &b, &udp);
    wait_until(deadline, "the UDP warm-up", || {
        udp.delivered.load(Ordering::Relaxed) >= UDP_WARMUP
    });
    let udp_window = measure(&gateways, &udp, deadline);
    running.stop();
    let udp_failure = check("UDP", &udp_window);

    // TCP over IPv4 and over IPv6, A → B (data one way, ACKs the other): TSO super-packets
    // split on TUN reads, TCP GRO on TUN writes.
    let mut failures: Vec<String> = udp_failure.into_iter().collect();
    let tcp_paths = [
        (
            "TCP/IPv4",
            SocketAddr::from((b.tun_address, TCP_PORT)),
            SocketAddr::from((b.viewed_address(), TCP_PORT)),
        ),
        (
            "TCP/IPv6",
            SocketAddr::from((b.tun_address6, TCP_PORT)),
            SocketAddr::from((b.viewed_address6(), TCP_PORT)),
        ),
    ];
    for (phase, bound, destination) in tcp_paths {
        let tcp = Arc::new(Traffic::default());
        let running = start_tcp(&a, &b, (bound, destination), &tcp);
        wait_until(deadline, "the TCP warm-up", || {
            tcp.delivered.load(Ordering::Relaxed) >= TCP_WARMUP_BYTES
        });
        let window = measure(&gateways, &tcp, deadline);
        running.stop();
        failures.extend(check(phase, &window));
    }
    // Admission was on and admitted all of it: A's flows (whose replies it admitted) are
    // in its table, and neither side refused anything.
    let flows = gateways[0].device.report().flow_table;
    if flows.in_use == 0 {
        failures.push(format!("A's flow table holds no flow: {flows:?}"));
    }
    for gateway in &gateways {
        for admission in gateway.device.report().admissions {
            if admission.drops.iter().any(|(_, count)| *count > 0) {
                failures.push(format!("admission refused packets: {admission:?}"));
            }
        }
    }
    failures
}
