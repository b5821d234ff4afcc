//! Restarts, control-socket security and secrets, against real `kubetun-gateway` processes in
//! network namespaces driven by the controller's own gateway sync (`GatewaySync`) over
//! in-memory API servers:
//!
//! - a gateway killed with SIGKILL and started again has its whole state re-applied by the
//!   running sync within 2 s, and traffic resumes;
//! - the sync stopped and a new controller context started on the same API server leave a
//!   ping train through the tunnel without loss, and re-apply nothing;
//! - the private keys appear in no debug log line, metric, gRPC status, `wg show` output or
//!   TunnelEndpoint the controller wrote;
//! - a peer whose gateway vanishes turns its TunnelEndpoint Error with the reason while
//!   traffic for it goes unanswered, and Connected again when it comes back;
//! - an endpoint learned by roaming survives re-applies of unchanged peers;
//! - the gateway holds CAP_NET_ADMIN and CAP_NET_BIND_SERVICE only;
//! - the control sockets are mode 0600 and owned by the gateway's user, and a connection from
//!   another uid is refused even when the file mode lets it through.

use std::net::Ipv4Addr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube_fake_client::ClientBuilder;
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::operator::network_config::gateway::GatewaySync;
use kubetun_controller::planner::{self, GatewaySettings};
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_crds::{
    CidrMapping, ClusterRef, ConnectionState, Endpoint, Network, NetworkConfig, TunnelEndpoint,
    TunnelEndpointSpec,
};
use kubetun_integration::netns::{
    Netns, NsChild, command_exists, gateway_command, require_root, spawn_gateway, veth,
    wait_for_path,
};
use tokio::task::JoinHandle;

const NAMESPACE: &str = "kubetun-system";
const METRICS_PORT: u16 = 9586;
const STARTUP: Duration = Duration::from_secs(10);
/// The system interpreter: one another user can execute (a per-user shim may not be).
const PYTHON: &str = "/usr/bin/python3";

/// One cluster: a namespace with a gateway, an API server and a controller gateway sync.
struct Side {
    id: &'static str,
    ns: Netns,
    ifname: String,
    underlay: Ipv4Addr,
    tunnel: Ipv4Addr,
    pod_cidr: &'static str,
    key: GatewayKey,
    dir: tempfile::TempDir,
    gateway: Option<NsChild>,
    client: kube::Client,
    sync: Option<JoinHandle<()>>,
}

impl Side {
    async fn new(tag: &str, id: &'static str, index: u8) -> Side {
        let side = Side {
            id,
            ns: Netns::new(&format!("kt-{tag}-{id}")).expect("namespace"),
            ifname: format!("kt{tag}{id}"),
            underlay: Ipv4Addr::new(192, 0, 2, index),
            tunnel: Ipv4Addr::new(10, 60 + index, 0, 1),
            pod_cidr: if index == 1 {
                "10.61.0.0/24"
            } else {
                "10.62.0.0/24"
            },
            key: GatewayKey::generate(),
            dir: tempfile::tempdir().expect("temp dir"),
            gateway: None,
            client: ClientBuilder::new()
                .with_resource::<NetworkConfig>()
                .with_resource::<TunnelEndpoint>()
                .with_resource::<Network>()
                .with_status_subresource::<NetworkConfig>()
                .with_status_subresource::<TunnelEndpoint>()
                .with_status_subresource::<Network>()
                .build()
                .await
                .expect("API server"),
            sync: None,
        };
        side.ns
            .exec(&["ip", "link", "set", "lo", "up"])
            .expect("loopback");
        side
    }

    fn grpc_socket(&self) -> PathBuf {
        self.dir.path().join("gateway.grpc.sock")
    }

    fn uapi_socket(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/wireguard/{}.sock", self.ifname))
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("gateway.log")
    }

    /// Starts the gateway at debug level, its log appended to [`Side::log`].
    fn start_gateway(&mut self, extra: &[&str]) {
        let mut cmd = gateway_command(
            self.ns.name(),
            &self.ifname,
            &self.grpc_socket(),
            &self.log(),
            "debug",
        )
        .expect("gateway command");
        cmd.args(["--metrics-addr", &format!("127.0.0.1:{METRICS_PORT}")])
            .args(extra);
        let gateway = spawn_gateway(&mut cmd, &self.grpc_socket(), STARTUP);
        self.gateway = Some(gateway.unwrap_or_else(|e| panic!("gateway {}: {e}", self.id)));
    }

    /// SIGKILL, no cleanup: the socket files stay behind, the TUN device goes with the process.
    fn kill_gateway(&mut self) {
        let mut gateway = self.gateway.take().expect("gateway running");
        let status = gateway.kill_hard().expect("kill");
        assert!(
            !status.success(),
            "the gateway was killed, not exited: {status}"
        );
    }

    /// The capability sets of the running gateway, from `/proc/<pid>/status`.
    fn capabilities(&self) -> Vec<(String, u64)> {
        let pid = self.gateway.as_ref().expect("gateway running").pid();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .expect("process status")
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                let name = name.strip_prefix("Cap")?;
                Some((name.to_owned(), u64::from_str_radix(value.trim(), 16).ok()?))
            })
            .collect()
    }

    fn settings(&self) -> GatewaySettings {
        GatewaySettings {
            private_key: self.key.private_base64(),
            public_key: self.key.public_base64().to_owned(),
            listen_port: 51820,
            mtu: 1420,
            addresses: vec![format!("{}/24", self.tunnel)],
            local_prefixes: vec![self.pod_cidr.to_owned()],
            manage_routes: true,
            persistent_keepalive: 0,
            ..GatewaySettings::default()
        }
    }

    fn info(&self) -> ClusterInfo {
        ClusterInfo {
            cluster: ClusterRef {
                id: self.id.into(),
                name: self.id.into(),
            },
            pod_cidrs: vec![self.pod_cidr.parse().expect("CIDR")],
            external_cidrs: vec![],
            service_cidrs: vec![],
            endpoint: Endpoint {
                address: self.underlay.to_string(),
                port: 51820,
            },
            public_key: self.key.public_base64().to_owned(),
            mtu: 1420,
        }
    }

    /// The TunnelEndpoint this cluster holds for `peer`, as the planner would have made it.
    async fn add_peer(&self, peer: &Side) {
        let identity = |cidr: &str| CidrMapping {
            real: cidr.into(),
            view: cidr.into(),
        };
        let te = TunnelEndpoint {
            metadata: ObjectMeta {
                name: Some(peer.id.into()),
                namespace: Some(NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            spec: TunnelEndpointSpec {
                cluster: peer.info().cluster,
                local_pod_cidrs: vec![identity(self.pod_cidr)],
                local_external_cidrs: vec![],
                remote_pod_cidrs: vec![identity(peer.pod_cidr)],
                remote_external_cidrs: vec![],
                endpoint: peer.info().endpoint,
                public_key: peer.key.public_base64().to_owned(),
                mtu: Some(1420),
                allowed_prefixes: None,
                ..Default::default()
            },
            status: None,
        };
        self.endpoints()
            .create(&PostParams::default(), &te)
            .await
            .expect("create TunnelEndpoint");
    }

    fn endpoints(&self) -> Api<TunnelEndpoint> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn gateway_client(&self) -> GatewayClient {
        GatewayClient::new(self.grpc_socket())
    }

    /// A fresh controller context on this API server with its gateway sync running.
    async fn start_controller(&mut self) {
        let ctx = Context::new(
            self.client.clone(),
            ControllerConfig {
                namespace: NAMESPACE.into(),
                cluster: self.info(),
                ipam: IpamConfig::default(),
                gateway: self.settings(),
            },
            Some(self.gateway_client()),
        )
        .await
        .expect("controller context");
        let sync =
            GatewaySync::new(ctx, self.gateway_client()).with_counter_refresh(Duration::ZERO);
        self.sync = Some(tokio::spawn(sync.run()));
    }

    async fn stop_controller(&mut self) {
        if let Some(task) = self.sync.take() {
            task.abort();
            let _ = task.await;
        }
    }

    fn metrics(&self) -> String {
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{METRICS_PORT}; \
             printf 'GET /metrics HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3; cat <&3"
        );
        self.ns
            .exec(&["bash", "-c", &script])
            .expect("fetch metrics")
    }

    /// The endpoint the gateway uses for its one peer.
    async fn peer_endpoint(&self) -> String {
        let status = self.gateway_client().status().await.expect("status");
        status
            .peers
            .first()
            .map(|p| p.endpoint.clone())
            .unwrap_or_default()
    }

    /// Waits until the TunnelEndpoint of `peer` shows `state`; returns its message.
    async fn wait_connection(
        &self,
        peer: &str,
        state: ConnectionState,
        timeout: Duration,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let connection = self
                .endpoints()
                .get(peer)
                .await
                .ok()
                .and_then(|te| te.status)
                .and_then(|s| s.connection);
            if let Some(connection) = connection
                && connection.status == state
            {
                return Some(connection.message);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// Waits until the gateway runs a state with `peers` peers; returns that version.
    async fn wait_applied(&self, peers: usize, timeout: Duration) -> Option<(String, u64)> {
        let client = self.gateway_client();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(status) = client.status().await
                && status.peers.len() == peers
                && !status.version.is_empty()
            {
                return Some((status.version, status.generation));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(task) = self.sync.take() {
            task.abort();
        }
    }
}

/// Two clusters joined by a veth underlay, each with a gateway and a running controller sync,
/// connected (a ping through the tunnel answers).
async fn connected_pair(tag: &str) -> Option<(Side, Side)> {
    if !require_root(tag) {
        return None;
    }
    for tool in ["ping", "wg", "bash"] {
        assert!(command_exists(tool), "{tag}: `{tool}` is not installed");
    }
    let mut a = Side::new(tag, "a", 1).await;
    let mut b = Side::new(tag, "b", 2).await;
    veth(&a.ns, "veth-a", &b.ns, "veth-b").expect("veth pair");
    for (side, dev) in [(&a, "veth-a"), (&b, "veth-b")] {
        side.ns
            .exec(&[
                "ip",
                "address",
                "add",
                &format!("{}/24", side.underlay),
                "dev",
                dev,
            ])
            .expect("underlay address");
    }
    a.add_peer(&b).await;
    b.add_peer(&a).await;
    for side in [&mut a, &mut b] {
        side.start_gateway(&[]);
        side.start_controller().await;
    }
    assert!(a.wait_applied(1, STARTUP).await.is_some(), "a not applied");
    assert!(b.wait_applied(1, STARTUP).await.is_some(), "b not applied");
    assert!(
        a.ns.wait_ping(&b.tunnel.to_string(), STARTUP),
        "no traffic through the tunnel"
    );
    Some((a, b))
}

/// `ping` summary: (transmitted, received).
fn ping_counts(output: &str) -> (u32, u32) {
    let line = output
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary in {output}"));
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_lose_nothing_and_secrets_stay_secret() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some((mut a, mut b)) = connected_pair("rlr").await else {
        return;
    };

    // The gateways run with CAP_NET_ADMIN and CAP_NET_BIND_SERVICE only, in every set that
    // can hold them, and the traffic above went through routes applied after the drop.
    let runtime = 1 << 12 | 1 << 10;
    for side in [&a, &b] {
        let sets = side.capabilities();
        let expected: Vec<(String, u64)> = [
            ("Inh", 0),
            ("Prm", runtime),
            ("Eff", runtime),
            ("Bnd", runtime),
            ("Amb", 0),
        ]
        .into_iter()
        .map(|(name, mask)| (name.to_owned(), mask))
        .collect();
        assert_eq!(sets, expected, "gateway {}", side.id);
    }

    // Controller restart: a ping train across stopping the sync, a pause, and a new context.
    let train =
        a.ns.command("ping")
            .args(["-n", "-q", "-i", "0.05", "-c", "60", "-W", "1"])
            .arg(b.tunnel.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ping train");
    let (_, generation_before) = a.wait_applied(1, STARTUP).await.expect("a status");
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.stop_controller().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    a.start_controller().await;
    let output = tokio::task::spawn_blocking(move || train.wait_with_output())
        .await
        .expect("join")
        .expect("ping output");
    let (sent, received) = ping_counts(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(sent, 60);
    assert_eq!(
        received, sent,
        "packets lost while the controller restarted"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, generation_after) = a.wait_applied(1, STARTUP).await.expect("a status");
    assert_eq!(
        generation_after, generation_before,
        "a restarted controller re-applied a state the gateway already ran"
    );

    // Gateway restart: SIGKILL, start again, the running sync re-applies within 2 s.
    let (version, _) = a.wait_applied(1, STARTUP).await.expect("a status");
    a.kill_gateway();
    let restarted = Instant::now();
    a.start_gateway(&[]);
    let (again, _) = a
        .wait_applied(1, Duration::from_secs(5))
        .await
        .expect("state re-applied");
    let elapsed = restarted.elapsed();
    assert_eq!(again, version);
    assert!(
        elapsed <= Duration::from_secs(2),
        "state back after {elapsed:?}"
    );
    assert!(
        a.ns.wait_ping(&b.tunnel.to_string(), STARTUP),
        "traffic did not resume after the gateway restart"
    );

    // Secrets: nowhere in logs, metrics, status, `wg show` or the CRs the controller wrote.
    let secrets = [a.key.private_base64(), b.key.private_base64()];
    let mut exposed: Vec<(String, String)> = Vec::new();
    for side in [&a, &b] {
        let wg = side
            .ns
            .exec(&["wg", "show", &side.ifname])
            .expect("wg show");
        assert!(
            wg.contains(side.key.public_base64()),
            "wg show lacks the public key:\n{wg}"
        );
        let status = side.gateway_client().status().await.expect("status");
        assert_eq!(status.public_key, side.key.public_base64());
        let crs = side
            .endpoints()
            .list(&ListParams::default())
            .await
            .expect("list TunnelEndpoints");
        assert!(
            crs.items.iter().all(|te| te.status.is_some()),
            "the sync wrote every TunnelEndpoint status"
        );
        let log = std::fs::read_to_string(side.log()).expect("gateway log");
        assert!(log.contains("DEBUG"), "the gateway logged at debug level");
        let surfaces = [
            ("log", log),
            ("metrics", side.metrics()),
            ("status", format!("{status:?}")),
            ("wg show", wg),
            (
                "TunnelEndpoints",
                serde_json::to_string(&crs.items).expect("JSON"),
            ),
        ];
        for (surface, text) in surfaces {
            for secret in &secrets {
                if text.contains(secret.as_str()) {
                    exposed.push((side.id.to_owned(), surface.to_owned()));
                }
            }
        }
    }
    assert!(exposed.is_empty(), "private key exposed in {exposed:?}");

    // A peer that vanishes: its TunnelEndpoint turns Error with a reason while traffic for it
    // goes unanswered, and Connected again once it is back.
    b.kill_gateway();
    let mut ping = a.ns.command("ping");
    ping.args(["-n", "-q", "-i", "0.5", "-w", "60"])
        .arg(b.tunnel.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _traffic = NsChild::spawn(&mut ping).expect("ping");
    let message = a
        .wait_connection("b", ConnectionState::Error, Duration::from_secs(45))
        .await
        .expect("a vanished peer turns Error");
    // The gateway's connectivity check (the planner turns it on) usually notices first.
    assert!(
        message.contains("connectivity probes") || message.contains("no handshake response"),
        "{message}"
    );
    b.start_gateway(&[]);
    a.wait_connection("b", ConnectionState::Connected, Duration::from_secs(20))
        .await
        .expect("the peer that came back is Connected again");

    // Roaming: A's address changes (the new one added, the old one removed), so A's datagrams
    // leave from the new one (replies stick to the address the peer sent to while it
    // exists), B learns it, and re-applies of B's unchanged peers (by hand with a new
    // version, then by its sync restoring its own) keep the learned endpoint.
    a.ns.exec(&[
        "sysctl",
        "-qw",
        "net.ipv4.conf.veth-a.promote_secondaries=1",
    ])
    .expect("keep the second address when the first goes");
    a.ns.exec(&["ip", "address", "add", "192.0.2.11/24", "dev", "veth-a"])
        .expect("second address");
    a.ns.exec(&[
        "ip",
        "address",
        "del",
        &format!("{}/24", a.underlay),
        "dev",
        "veth-a",
    ])
    .expect("the old address goes");
    let roamed = "192.0.2.11:51820";
    let deadline = Instant::now() + STARTUP;
    while b.peer_endpoint().await != roamed {
        assert!(Instant::now() < deadline, "b did not learn A's new address");
        let _ = a.ns.ping(&b.tunnel.to_string(), 1);
    }
    let te = b.endpoints().get("a").await.expect("TunnelEndpoint a");
    let mut state = planner::desired_state(&b.settings(), &[te.spec]);
    state.version = "re-applied".into();
    let response = b.gateway_client().apply(state).await.expect("re-apply");
    assert!(response.changed, "a new version swaps the tables");
    assert_eq!(
        b.peer_endpoint().await,
        roamed,
        "re-apply forgot the roamed endpoint"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        b.peer_endpoint().await,
        roamed,
        "the sync's re-apply forgot it"
    );
    assert!(
        b.ns.ping(&a.tunnel.to_string(), 2),
        "traffic over the roamed endpoint"
    );

    a.stop_controller().await;
    b.stop_controller().await;
}

/// Runs a tiny UAPI client as uid/gid 65534; returns its exit code and what it printed.
fn uapi_get_as_nobody(socket: &Path) -> (i32, String) {
    let script = "import socket,sys\n\
                  s=socket.socket(socket.AF_UNIX)\n\
                  try:\n  s.connect(sys.argv[1])\n\
                  except PermissionError:\n  print('denied'); sys.exit(3)\n\
                  data=b''\n\
                  try:\n  s.sendall(b'get=1\\n\\n'); s.settimeout(5)\n\
                  \x20 while True:\n    chunk=s.recv(4096)\n    data+=chunk\n    if not chunk or data.endswith(b'\\n\\n'): break\n\
                  except (BrokenPipeError, ConnectionResetError):\n  pass\n\
                  print(len(data) if data else 'closed')\n";
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            PYTHON,
            "-c",
            script,
        ])
        .arg(socket)
        .output()
        .expect("setpriv");
    let code = out.status.code().unwrap_or(-1);
    assert!(
        matches!(code, 0 | 3),
        "the client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_sockets_are_private_to_the_gateway_user() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("control socket permissions") {
        return;
    }
    for tool in ["setpriv", PYTHON] {
        assert!(command_exists(tool), "`{tool}` is not installed");
    }
    let mut side = Side::new("rls", "a", 1).await;
    side.start_gateway(&[]);
    let uapi = side.uapi_socket();
    assert!(wait_for_path(&uapi, STARTUP));
    for socket in [side.grpc_socket(), uapi.clone()] {
        let meta = std::fs::metadata(&socket).expect("socket metadata");
        assert_eq!(
            meta.permissions().mode() & 0o777,
            0o600,
            "{}",
            socket.display()
        );
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        #[allow(unsafe_code)]
        let euid = unsafe { libc::geteuid() };
        assert_eq!(meta.uid(), euid, "owned by the gateway's user");
    }

    // The mode keeps other users out at connect(2)...
    assert_eq!(uapi_get_as_nobody(&uapi), (3, "denied".into()));
    // ...and with the mode loosened, the credential check still closes the connection unread.
    std::fs::set_permissions(&uapi, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(uapi_get_as_nobody(&uapi), (0, "closed".into()));
    let log = std::fs::read_to_string(side.log()).expect("log");
    assert!(
        log.contains("UAPI connection refused") && log.contains("uid 65534"),
        "refusal not logged:\n{log}"
    );

    // An explicitly allowed uid is served.
    side.gateway.take();
    side.start_gateway(&["--allow-uid", "65534"]);
    assert!(wait_for_path(&uapi, STARTUP));
    std::fs::set_permissions(&uapi, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let (code, length) = uapi_get_as_nobody(&uapi);
    assert_eq!(code, 0);
    assert!(
        length.parse::<usize>().expect("length") > 0,
        "an allowed uid gets an answer"
    );
}
