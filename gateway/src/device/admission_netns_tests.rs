//! Admission through two real gateways, each in its own network namespace (joined by a
//! veth pair), running in this process as `kubetun-gateway` runs them: cluster A is
//! exported to B with one endpoint of B's, TCP 10.20.0.1:8080 (A sees B's 10.20.0.0/24 as
//! 10.120.0.0/24, B sees A's 10.10.0.0/24 as 10.110.0.0/24).
//!
//! Checked: a TCP connection B's pod opened while A was open carries on after B switches A
//! to exported; A's connection to the endpoint works; to another port of the same pod it
//! does not (B refuses it before the TUN write: no reset, the connect times out) and B's
//! status counts it as `not_exported`; a connection B's pod opens to A after the switch
//! works (its replies are admitted by the flow table); a policy guarding the endpoint serves
//! the pod it selects, cuts an established connection off once it no longer does
//! (`not_selected`, counted on the policy) and serves a new one once it does again.
//!
//! Needs root, `/dev/net/tun` and iproute2; without them it prints why and passes, unless
//! `CI=true`. Namespaces are named `adm-a-<pid>` and `adm-b-<pid>` and deleted on drop.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::io_options::IoOptions;
use kubetun_gateway_core::key::Key;
use kubetun_gateway_core::state::{
    AdmissionConfig, AdmittedEndpoint, DesiredState, Endpoint, InterfaceConfig, Isolation,
    PeerConfig, Protocol, RouteConfig, SourcePolicy,
};

const TUN: &str = "ktadm0";
const WG_PORT: u16 = 51820;
const ENDPOINT_PORT: u16 = 8080;
const CLOSED_PORT: u16 = 8081;
const A_PORT: u16 = 9090;
/// Every wait of the test ends by then.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

struct Side {
    namespace: String,
    veth: &'static str,
    underlay: Ipv4Addr,
    tun_address: Ipv4Addr,
    real: &'static str,
    /// How the other side sees `real`.
    view: &'static str,
    /// `tun_address` as the other side sees it.
    viewed: Ipv4Addr,
}

fn side_a() -> Side {
    Side {
        namespace: format!("adm-a-{}", std::process::id()),
        veth: "adm-va",
        underlay: Ipv4Addr::new(192, 168, 232, 1),
        tun_address: Ipv4Addr::new(10, 10, 0, 1),
        real: "10.10.0.0/24",
        view: "10.110.0.0/24",
        viewed: Ipv4Addr::new(10, 110, 0, 1),
    }
}

fn side_b() -> Side {
    Side {
        namespace: format!("adm-b-{}", std::process::id()),
        veth: "adm-vb",
        underlay: Ipv4Addr::new(192, 168, 232, 2),
        tun_address: Ipv4Addr::new(10, 20, 0, 1),
        real: "10.20.0.0/24",
        view: "10.120.0.0/24",
        viewed: Ipv4Addr::new(10, 120, 0, 1),
    }
}

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
            panic!("admission_netns cannot run under CI: {reason}")
        }
        Some(reason) => {
            eprintln!("SKIPPED admission_netns: {reason} (needs root; CI=true makes this fatal)");
            false
        }
    }
}

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        output.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// The namespaces and their veth pair; deleted on drop, also when the test fails.
struct Namespaces(Vec<String>);

impl Namespaces {
    fn create(a: &Side, b: &Side) -> Namespaces {
        let mut namespaces = Namespaces(Vec::new());
        for side in [a, b] {
            ip(&["netns", "add", &side.namespace]);
            namespaces.0.push(side.namespace.clone());
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
        for name in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Runs `work` on a thread inside namespace `name` and returns what it returns.
fn in_namespace<T: Send + 'static>(name: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_in(name, work).join().expect("namespace thread")
}

fn spawn_in<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let name = name.to_owned();
    std::thread::spawn(move || {
        let file = std::fs::File::open(format!("/run/netns/{name}")).expect("open the namespace");
        // SAFETY: setns with a namespace descriptor `file` keeps open for the call; it moves
        // only this thread, which runs nothing but `work`.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        work()
    })
}

fn state(this: &Side, this_key: Key, other: &Side, other_key: Key) -> DesiredState {
    let mut peer = PeerConfig::new(other_key.public_key());
    peer.name = other.namespace.clone();
    peer.endpoint = Some(Endpoint::Addr(SocketAddr::from((other.underlay, WG_PORT))));
    peer.routes = vec![RouteConfig::remapped(
        other.real.parse().expect("real"),
        other.view.parse().expect("view"),
    )];
    DesiredState {
        version: "admission".into(),
        interface: InterfaceConfig {
            private_key: Some(this_key),
            listen_port: WG_PORT,
            addresses: vec![format!("{}/24", this.tun_address).parse().expect("address")],
            manage_routes: true,
            ..InterfaceConfig::default()
        },
        peers: vec![peer],
        admissions: Vec::new(),
    }
}

/// B's admission of A.
fn admission_of_a(a: &Side, b: &Side, isolation: Isolation) -> AdmissionConfig {
    AdmissionConfig {
        cluster: "cluster-a".into(),
        isolation,
        views: vec![a.view.parse().expect("view")],
        endpoints: vec![AdmittedEndpoint {
            address: b.tun_address.into(),
            protocol: Protocol::Tcp,
            port: ENDPOINT_PORT,
        }],
        policies: Vec::new(),
    }
}

type Apply = (DesiredState, std::sync::mpsc::Sender<Result<(), String>>);

/// A gateway on its own thread in its namespace; applies states sent to it there (host
/// configuration is the namespace's); stopped and joined on drop.
struct Gateway {
    device: Arc<Device>,
    commands: Option<tokio::sync::mpsc::UnboundedSender<Apply>>,
    thread: Option<JoinHandle<()>>,
}

impl Gateway {
    fn start(namespace: &str, initial: DesiredState) -> Gateway {
        let (ready, started) = std::sync::mpsc::channel();
        let (commands, mut requests) = tokio::sync::mpsc::unbounded_channel::<Apply>();
        let thread = spawn_in(namespace, move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(async move {
                let device = match Device::create_with(TUN, IoOptions::default()) {
                    Ok(device) => device,
                    Err(error) => {
                        let _ = ready.send(Err(error.to_string()));
                        return;
                    }
                };
                if let Err(error) = device.apply(initial).await {
                    let _ = ready.send(Err(error.to_string()));
                    device.shutdown().await;
                    return;
                }
                let _ = ready.send(Ok(Arc::clone(&device)));
                while let Some((next, done)) = requests.recv().await {
                    let outcome = device.apply(next).await;
                    let _ = done.send(outcome.map(|_| ()).map_err(|e| e.to_string()));
                }
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
            commands: Some(commands),
            thread: Some(thread),
        }
    }

    fn apply(&self, next: DesiredState) {
        let (done, outcome) = std::sync::mpsc::channel();
        self.commands
            .as_ref()
            .expect("running")
            .send((next, done))
            .expect("gateway thread");
        outcome
            .recv_timeout(Duration::from_secs(20))
            .expect("apply answered")
            .expect("apply");
    }

    /// The refusals of `cluster` for `reason`.
    fn refused(&self, cluster: &str, reason: &str) -> u64 {
        let report = self.device.report();
        let admission = report
            .admissions
            .iter()
            .find(|a| a.cluster == cluster)
            .unwrap_or_else(|| panic!("no admission for {cluster}: {:?}", report.admissions));
        admission
            .drops
            .iter()
            .find(|(name, _)| *name == reason)
            .map_or(0, |(_, count)| *count)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        drop(self.commands.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An echo server in `namespace` on `bound`: answers every line it reads, for every
/// connection, until the test ends (its threads die with the process).
fn echo_server(namespace: &str, bound: SocketAddr) {
    let listener = in_namespace(namespace, move || TcpListener::bind(bound)).expect("bind");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buffer = [0u8; 256];
                while let Ok(len) = stream.read(&mut buffer) {
                    if len == 0 || stream.write_all(&buffer[..len]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// A connection from `namespace` to `to`, or the error of the attempt (bounded).
fn connect(namespace: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    in_namespace(namespace, move || {
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(stream)
    })
}

/// Writes `line` and reads its echo.
fn round_trip(stream: &mut TcpStream, line: &[u8]) -> std::io::Result<()> {
    stream.write_all(line)?;
    let mut echoed = vec![0u8; line.len()];
    stream.read_exact(&mut echoed)?;
    assert_eq!(echoed, line);
    Ok(())
}

/// Connects from `namespace` to `to` until it works (the first handshake), by `deadline`.
fn connect_eventually(namespace: &str, to: SocketAddr, deadline: Instant) -> TcpStream {
    loop {
        match connect(namespace, to) {
            Ok(stream) => return stream,
            Err(error) if Instant::now() > deadline => panic!("no connection to {to}: {error}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn an_exported_cluster_reaches_only_its_endpoint_and_our_flows_replies() {
    if !can_run() {
        return;
    }
    let deadline = Instant::now() + TEST_TIMEOUT;
    let (a, b) = (side_a(), side_b());
    let _namespaces = Namespaces::create(&a, &b);
    let (key_a, key_b) = (Key::generate_private(), Key::generate_private());
    let mut state_b = state(&b, key_b, &a, key_a);
    state_b.admissions = vec![admission_of_a(&a, &b, Isolation::Open)];
    let gateway_a = Gateway::start(&a.namespace, state(&a, key_a, &b, key_b));
    let gateway_b = Gateway::start(&b.namespace, state_b.clone());

    for port in [ENDPOINT_PORT, CLOSED_PORT] {
        echo_server(&b.namespace, SocketAddr::from((b.tun_address, port)));
    }
    for port in [A_PORT, A_PORT + 1] {
        echo_server(&a.namespace, SocketAddr::from((a.tun_address, port)));
    }

    // While open: B's pod opens a connection to A.
    let mut opened_while_open =
        connect_eventually(&b.namespace, SocketAddr::from((a.viewed, A_PORT)), deadline);
    round_trip(&mut opened_while_open, b"before the switch\n").expect("echo while open");
    // A reaches the closed port too while open.
    let mut closed = connect(&a.namespace, SocketAddr::from((b.viewed, CLOSED_PORT)))
        .expect("open: every port is reachable");
    round_trip(&mut closed, b"open\n").expect("echo");
    drop(closed);

    // Open → exported under the running connection.
    state_b.admissions = vec![admission_of_a(&a, &b, Isolation::Exported)];
    gateway_b.apply(state_b);
    round_trip(&mut opened_while_open, b"after the switch\n")
        .expect("the connection B's pod opened survives the switch");

    // A's connection to the endpoint works.
    let mut to_endpoint = connect(&a.namespace, SocketAddr::from((b.viewed, ENDPOINT_PORT)))
        .expect("A reaches the exported endpoint");
    round_trip(&mut to_endpoint, b"exported\n").expect("echo through the export");

    // Another port of the same pod: refused at B, silently, and counted.
    let before = gateway_b.refused("cluster-a", "not_exported");
    let error = connect(&a.namespace, SocketAddr::from((b.viewed, CLOSED_PORT)))
        .expect_err("a port that is not exported");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::TimedOut,
        "dropped without an answer, not reset: {error}"
    );
    let after = gateway_b.refused("cluster-a", "not_exported");
    assert!(
        after > before,
        "B counted the SYNs it refused ({before} → {after})"
    );

    // B's pod opens a new connection to A after the switch: its replies are admitted.
    let mut opened_after =
        connect(&b.namespace, SocketAddr::from((a.viewed, A_PORT + 1))).expect("B opens to A");
    round_trip(&mut opened_after, b"ours\n").expect("the replies of B's own flow");
    let flows = gateway_b.device.report().flow_table;
    assert!(flows.in_use >= 2, "B's flows are recorded: {flows:?}");
    round_trip(&mut opened_while_open, b"still\n").expect("still carried");

    // A policy selecting A's pod guards the endpoint: the connection carries on. Relabelled
    // away (the policy selects nothing), its next segment is refused as not_selected and
    // the echo never comes; selected again, a new connection works.
    let policy = |sources: Vec<std::net::IpAddr>| {
        let mut state = state(&b, key_b, &a, key_a);
        let mut admission = admission_of_a(&a, &b, Isolation::Exported);
        admission.policies = vec![SourcePolicy {
            name: "shop/frontend".into(),
            endpoints: admission.endpoints.clone(),
            sources,
        }];
        state.admissions = vec![admission];
        state
    };
    gateway_b.apply(policy(vec![a.viewed.into()]));
    round_trip(&mut to_endpoint, b"selected\n").expect("the selected pod is served");
    gateway_b.apply(policy(Vec::new()));
    let before = gateway_b.refused("cluster-a", "not_selected");
    round_trip(&mut to_endpoint, b"relabelled\n")
        .expect_err("a pod the policy no longer selects is cut off under traffic");
    assert!(gateway_b.refused("cluster-a", "not_selected") > before);
    let policies = &gateway_b.device.report().admissions[0].policies;
    assert!(policies[0].drops > 0, "counted on the policy: {policies:?}");
    gateway_b.apply(policy(vec![a.viewed.into()]));
    let mut again =
        connect(&a.namespace, SocketAddr::from((b.viewed, ENDPOINT_PORT))).expect("selected again");
    round_trip(&mut again, b"back\n").expect("served again");
    drop(gateway_a);
}
