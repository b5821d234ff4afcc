//! The gateway's side of a key rotation, on two `kubetun-gateway` processes in network
//! namespaces driven over gRPC with the controller's planner:
//!
//! - applying a new key with the old one as previous key keeps the tunnel and its session (a
//!   20 ms ping train loses nothing), and the peer is reported on the previous key;
//! - once the peer learns the new public key, its handshake moves the tunnel to the new key
//!   (the silence is one handshake) and the report says so;
//! - a gateway restarted in the middle of a rotation answers a peer that still knows only the
//!   previous key on that key, and moves it once the peer learns the new one;
//! - ending the rotation (no previous key) keeps the moved tunnel.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kubetun_controller::keys::GatewayKey;
use kubetun_controller::planner::{self, GatewaySettings};
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_crds::{CidrMapping, ClusterRef, Endpoint, TunnelEndpointSpec};
use kubetun_integration::netns::{
    Netns, NsChild, command_exists, gateway_command, require_root, spawn_gateway, veth,
};

const STARTUP: Duration = Duration::from_secs(10);

struct Gateway {
    id: &'static str,
    ns: Netns,
    ifname: String,
    underlay: Ipv4Addr,
    tunnel: Ipv4Addr,
    pod_cidr: &'static str,
    dir: tempfile::TempDir,
    child: Option<NsChild>,
}

impl Gateway {
    fn new(id: &'static str, index: u8) -> Self {
        let gateway = Self {
            id,
            ns: Netns::new(&format!("kt-rot-{id}")).expect("namespace"),
            ifname: format!("ktrot{id}"),
            underlay: Ipv4Addr::new(192, 0, 2, index),
            tunnel: Ipv4Addr::new(10, 60 + index, 0, 1),
            pod_cidr: if index == 1 {
                "10.61.0.0/24"
            } else {
                "10.62.0.0/24"
            },
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        gateway
            .ns
            .exec(&["ip", "link", "set", "lo", "up"])
            .expect("loopback");
        gateway
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("gateway.grpc.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    fn start(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let log = self.dir.path().join("gateway.log");
        let mut cmd = gateway_command(self.ns.name(), &self.ifname, &self.socket(), &log, "info")
            .expect("gateway command");
        let child = spawn_gateway(&mut cmd, &self.socket(), STARTUP);
        self.child = Some(child.unwrap_or_else(|e| panic!("{}: {e}", self.id)));
    }

    fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill_hard().expect("kill");
    }

    /// Applies our `key` (with `previous` during a rotation) and one peer with `peer_key`.
    async fn apply(
        &self,
        key: &GatewayKey,
        previous: Option<&GatewayKey>,
        peer: &Gateway,
        peer_key: &GatewayKey,
    ) {
        let mut settings = GatewaySettings {
            listen_port: 51820,
            mtu: 1420,
            addresses: vec![format!("{}/24", self.tunnel)],
            local_prefixes: vec![self.pod_cidr.to_owned()],
            manage_routes: true,
            persistent_keepalive: 0,
            ..GatewaySettings::default()
        };
        settings.set_keys(key, previous);
        let identity = |cidr: &str| CidrMapping {
            real: cidr.into(),
            view: cidr.into(),
        };
        let te = TunnelEndpointSpec {
            cluster: ClusterRef {
                id: peer.id.into(),
                name: peer.id.into(),
            },
            local_pod_cidrs: vec![identity(self.pod_cidr)],
            local_external_cidrs: vec![],
            remote_pod_cidrs: vec![identity(peer.pod_cidr)],
            remote_external_cidrs: vec![],
            endpoint: Endpoint {
                address: peer.underlay.to_string(),
                port: 51820,
            },
            public_key: peer_key.public_base64().to_owned(),
            mtu: Some(1420),
            allowed_prefixes: None,
            ..Default::default()
        };
        let state = planner::desired_state(&settings, &[te]);
        GatewayClient::new(self.socket())
            .apply(state)
            .await
            .unwrap_or_else(|e| panic!("apply to {}: {e}", self.id));
    }

    /// Whether the one peer's tunnel is still on the previous key.
    async fn on_previous_key(&self) -> bool {
        let status = GatewayClient::new(self.socket())
            .status()
            .await
            .expect("status");
        status.peers.first().expect("peer").previous_key
    }

    /// Waits until the peer's `previous_key` flag is `wanted`.
    async fn wait_previous_key(&self, wanted: bool, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.on_previous_key().await == wanted {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Pings `peer`'s tunnel address every 20 ms for `seconds`; returns (sent, received).
    fn ping_train(&self, peer: &Gateway, seconds: u32) -> std::process::Child {
        self.ns
            .command("ping")
            .args(["-n", "-q", "-i", "0.02", "-W", "1", "-w"])
            .arg(seconds.to_string())
            .arg(peer.tunnel.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping")
    }
}

fn ping_counts(child: std::process::Child) -> (u32, u32) {
    let out = child.wait_with_output().expect("ping output");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary in {text}"));
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_moves_each_tunnel_when_its_peer_learns_the_key() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("gateway_rotation") {
        return;
    }
    assert!(command_exists("ping"), "`ping` is not installed");
    let mut a = Gateway::new("a", 1);
    let mut b = Gateway::new("b", 2);
    veth(&a.ns, "veth-a", &b.ns, "veth-b").expect("veth pair");
    for (gateway, dev) in [(&a, "veth-a"), (&b, "veth-b")] {
        gateway
            .ns
            .exec(&[
                "ip",
                "address",
                "add",
                &format!("{}/24", gateway.underlay),
                "dev",
                dev,
            ])
            .expect("underlay address");
    }
    let (a1, b1) = (GatewayKey::generate(), GatewayKey::generate());
    a.start();
    b.start();
    a.apply(&a1, None, &b, &b1).await;
    b.apply(&b1, None, &a, &a1).await;
    assert!(a.ns.wait_ping(&b.tunnel.to_string(), STARTUP), "no tunnel");
    assert!(
        !a.on_previous_key().await,
        "no rotation, nothing on a previous key"
    );

    // A takes a new key and keeps the old one: the tunnel and its session stay.
    let a2 = GatewayKey::generate();
    let train = a.ping_train(&b, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.apply(&a2, Some(&a1), &b, &b1).await;
    let (sent, received) = ping_counts(train);
    println!("new key with the previous one kept: {received}/{sent} pings");
    assert!(received + 1 >= sent, "lost pings: {received}/{sent}");
    assert!(a.on_previous_key().await, "b has not learned the new key");

    // B learns it: its handshake moves the tunnel; the silence is about one handshake.
    let train = a.ping_train(&b, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.apply(&b1, None, &a, &a2).await;
    let (sent, received) = ping_counts(train);
    println!("peer learned the new key: {received}/{sent} pings");
    assert!(
        received + 10 >= sent,
        "more than 200 ms of pings lost: {received}/{sent}"
    );
    assert!(
        a.wait_previous_key(false, Duration::from_secs(5)).await,
        "tunnel not moved"
    );
    assert!(a.log().contains("peer's tunnel moved"), "{}", a.log());

    // A restarts in the middle of the next rotation; B still knows only a2.
    let a3 = GatewayKey::generate();
    a.apply(&a3, Some(&a2), &b, &b1).await;
    a.kill();
    a.start();
    let restarted = Instant::now();
    a.apply(&a3, Some(&a2), &b, &b1).await;
    // B notices the dead session and initiates with a2 (boringtun's rekey after unanswered
    // data); A answers on a2.
    assert!(
        a.ns.wait_ping(&b.tunnel.to_string(), Duration::from_secs(40)),
        "the restarted gateway does not answer a peer on its previous key:\n{}",
        a.log()
    );
    println!(
        "restart mid-rotation: traffic back after {:.1?}",
        restarted.elapsed()
    );
    assert!(a.on_previous_key().await, "b is on the previous key");
    b.apply(&b1, None, &a, &a3).await;
    assert!(
        a.wait_previous_key(false, Duration::from_secs(5)).await,
        "tunnel not moved"
    );

    // The rotation ends: the moved tunnel stays.
    let train = a.ping_train(&b, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.apply(&a3, None, &b, &b1).await;
    let (sent, received) = ping_counts(train);
    println!("rotation ended: {received}/{sent} pings");
    assert!(received + 1 >= sent, "lost pings: {received}/{sent}");
    assert!(!a.on_previous_key().await);
    for secret in [&a1, &a2, &a3] {
        assert!(
            !a.log().contains(&secret.private_base64()),
            "a private key in the log"
        );
    }
}
