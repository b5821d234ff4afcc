//! The testbed: two network namespaces joined by a veth pair, and over it one tunnel per
//! implementation (its own interfaces, subnet and UDP port), all configured with `wg setconf`.
//! Dropping the testbed stops every daemon by PID and deletes both namespaces, also when a
//! run panics.
//!
//! ```text
//!   <prefix>-a                                   <prefix>-b
//!   ul0 198.18.1.1/24  ───────── veth ─────────  ul0 198.18.1.2/24
//!   <prefix>-kt-a 10.99.1.1  ═══ kubetun ══════  <prefix>-kt-b 10.99.1.2
//!   <prefix>-wg-a 10.99.2.1  ═══ wireguard-go ═  <prefix>-wg-b 10.99.2.2
//!   <prefix>-bt-a 10.99.3.1  ═══ boringtun-cli   <prefix>-bt-b 10.99.3.2
//! ```
//! iperf3 clients run in `-a`, servers in `-b`.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kubetun_controller::gateway_api;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_testenv::iperf;
use kubetun_testenv::netns::{self, Netns, NetnsError, NsChild};

use kubetun_fixtures::implementations::{
    Binaries, Implementation, WgConfig, daemon_command, uapi_socket,
};

/// The underlay subnet (RFC 2544 benchmarking range), /24; side a is .1, side b is .2.
const UNDERLAY: [u8; 3] = [198, 18, 1];
/// How long a daemon may take to open its UAPI socket.
const DAEMON_STARTUP: Duration = Duration::from_secs(10);
/// How long a fresh tunnel may take to pass its first ping.
const FIRST_PING: Duration = Duration::from_secs(10);

/// Why the testbed could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// A namespace, link or command failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A file in the work directory could not be written.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A daemon did not come up or its tunnel does not pass traffic.
    #[error("{implementation}: {message}")]
    Daemon {
        implementation: Implementation,
        /// What happened, with the end of its log.
        message: String,
    },
    /// The implementation's executable is not available.
    #[error("{0}: executable not available")]
    Missing(Implementation),
}

/// One implementation's tunnel (or the bare veth).
#[derive(Debug)]
struct Tunnel {
    implementation: Implementation,
    /// The daemons of side a and side b (empty for veth).
    daemons: Vec<NsChild>,
    /// The interfaces of side a and side b (sockets removed on drop).
    interfaces: Vec<String>,
    /// Where the iperf3 server listens (side b).
    server: Ipv4Addr,
    /// The daemons' UDP port (0 for veth).
    port: u16,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        for daemon in &mut self.daemons {
            daemon.stop();
        }
        for interface in &self.interfaces {
            let _ = std::fs::remove_file(uapi_socket(interface));
        }
    }
}

/// Both namespaces and every tunnel. Fields drop in order: tunnels (daemons) first.
#[derive(Debug)]
pub struct Testbed {
    tunnels: Vec<Tunnel>,
    a: Netns,
    b: Netns,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // Stopped daemons would only die at SIGKILL, after the grace period.
        for daemon in self.tunnels.iter().flat_map(|t| &t.daemons) {
            signal_process("-CONT", daemon.pid());
        }
    }
}

fn signal_process(signal: &str, pid: u32) {
    let _ = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .output();
}

impl Testbed {
    /// Builds the namespaces and a tunnel for each of `implementations`.
    pub fn new(
        prefix: &str,
        work_dir: &Path,
        implementations: &[Implementation],
        binaries: &Binaries,
        mtu: u32,
    ) -> Result<Self, TestbedError> {
        std::fs::create_dir_all(work_dir).map_err(|error| TestbedError::Io {
            path: work_dir.to_owned(),
            error,
        })?;
        let a = Netns::new(&format!("{prefix}-a"))?;
        let b = Netns::new(&format!("{prefix}-b"))?;
        netns::veth(&a, "ul0", &b, "ul0")?;
        a.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", underlay(1)),
            "dev",
            "ul0",
        ])?;
        b.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", underlay(2)),
            "dev",
            "ul0",
        ])?;
        let mut testbed = Self {
            tunnels: Vec::new(),
            a,
            b,
        };
        for implementation in implementations {
            let tunnel = testbed.tunnel(prefix, work_dir, *implementation, binaries, mtu)?;
            testbed.tunnels.push(tunnel);
        }
        Ok(testbed)
    }

    fn tunnel(
        &self,
        prefix: &str,
        work_dir: &Path,
        implementation: Implementation,
        binaries: &Binaries,
        mtu: u32,
    ) -> Result<Tunnel, TestbedError> {
        if !implementation.is_tunnel() {
            return Ok(Tunnel {
                implementation,
                daemons: Vec::new(),
                interfaces: Vec::new(),
                server: underlay(2),
                port: 0,
            });
        }
        let binary = binaries
            .of(implementation)
            .ok_or(TestbedError::Missing(implementation))?;
        let subnet = subnet_of(implementation);
        let port = 51820 + u16::from(subnet);
        let keys = [GatewayKey::generate(), GatewayKey::generate()];
        let interfaces: Vec<String> = ["a", "b"]
            .iter()
            .map(|side| format!("{prefix}-{}-{side}", implementation.tag()))
            .collect();
        let mut tunnel = Tunnel {
            implementation,
            daemons: Vec::new(),
            interfaces: interfaces.clone(),
            server: tunnel_address(subnet, 2),
            port,
        };
        for (side, ns) in [&self.a, &self.b].into_iter().enumerate() {
            let ifname = &interfaces[side];
            let daemon = start_daemon(ns, implementation, binary, ifname, work_dir)?;
            tunnel.daemons.push(daemon);
            let peer = 1 - side;
            let config = WgConfig {
                private_key: keys[side].private_base64(),
                listen_port: port,
                peer_public_key: keys[peer].public_base64().to_owned(),
                peer_endpoint: format!("{}:{port}", underlay(peer as u8 + 1)),
                allowed_ips: format!("{}/32", tunnel_address(subnet, peer as u8 + 1)),
            };
            let path = work_dir.join(format!("{ifname}.conf"));
            write_private(&path, &config.render())?;
            let path_text = path.to_string_lossy();
            ns.exec(&["wg", "setconf", ifname, &path_text])?;
            let _ = std::fs::remove_file(&path);
            let address = format!("{}/24", tunnel_address(subnet, side as u8 + 1));
            ns.exec(&["ip", "addr", "add", &address, "dev", ifname])?;
            ns.exec(&["ip", "link", "set", ifname, "mtu", &mtu.to_string(), "up"])?;
            if let Some(isolation) = admission_of(implementation) {
                let socket = work_dir.join(format!("{ifname}.grpc.sock"));
                let state = admitting_state(&config, &address, mtu, isolation, tunnel.server);
                apply(&socket, state).map_err(|message| TestbedError::Daemon {
                    implementation,
                    message,
                })?;
            }
        }
        if !self.a.wait_ping(&tunnel.server.to_string(), FIRST_PING) {
            return Err(TestbedError::Daemon {
                implementation,
                message: format!(
                    "the tunnel does not pass a ping to {}; logs in {}",
                    tunnel.server,
                    work_dir.display()
                ),
            });
        }
        Ok(tunnel)
    }

    /// The namespace iperf3 clients run in.
    pub fn client_ns(&self) -> &Netns {
        &self.a
    }

    /// The namespace iperf3 servers run in.
    pub fn server_ns(&self) -> &Netns {
        &self.b
    }

    /// Where the iperf3 server of `implementation` listens.
    pub fn server_address(&self, implementation: Implementation) -> Option<Ipv4Addr> {
        self.tunnel_of(implementation).map(|t| t.server)
    }

    /// The tunnel interface of the sending side (none for veth).
    pub fn sender_interface(&self, implementation: Implementation) -> Option<&str> {
        self.tunnel_of(implementation)?
            .interfaces
            .first()
            .map(String::as_str)
    }

    /// The daemons' UDP port (none for veth).
    pub fn listen_port(&self, implementation: Implementation) -> Option<u16> {
        self.tunnel_of(implementation)
            .map(|t| t.port)
            .filter(|port| *port != 0)
    }

    /// The PIDs of `implementation`'s daemons (side a, side b).
    pub fn daemon_pids(&self, implementation: Implementation) -> Vec<u32> {
        self.tunnel_of(implementation)
            .map(|t| t.daemons.iter().map(NsChild::pid).collect())
            .unwrap_or_default()
    }

    /// Lets, among the daemons that spin when idle (poll mode), only `active`'s run: the others
    /// are stopped (SIGSTOP) so they do not take the CPU from other implementations' runs.
    pub fn focus(&self, active: Implementation) {
        for tunnel in self.tunnels.iter().filter(|t| t.implementation.spins()) {
            let signal = if tunnel.implementation == active {
                "-CONT"
            } else {
                "-STOP"
            };
            for daemon in &tunnel.daemons {
                signal_process(signal, daemon.pid());
            }
        }
    }

    /// The PIDs of every daemon.
    pub fn all_daemon_pids(&self) -> Vec<u32> {
        self.tunnels
            .iter()
            .flat_map(|t| t.daemons.iter().map(NsChild::pid))
            .collect()
    }

    fn tunnel_of(&self, implementation: Implementation) -> Option<&Tunnel> {
        self.tunnels
            .iter()
            .find(|t| t.implementation == implementation)
    }
}

fn underlay(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(UNDERLAY[0], UNDERLAY[1], UNDERLAY[2], host)
}

fn subnet_of(implementation: Implementation) -> u8 {
    match implementation {
        Implementation::Veth => 0,
        Implementation::Kubetun => 1,
        Implementation::WireguardGo => 2,
        Implementation::BoringtunCli => 3,
        Implementation::KubetunBusyPoll => 4,
        Implementation::KubetunMq => 5,
        Implementation::KubetunBaseline => 6,
        Implementation::KubetunOpen => 7,
        Implementation::KubetunExported => 8,
    }
}

fn tunnel_address(subnet: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, subnet, host)
}

fn write_private(path: &Path, text: &str) -> Result<(), TestbedError> {
    kubetun_testenv::write_private(path, text.as_bytes()).map_err(|error| TestbedError::Io {
        path: path.to_owned(),
        error,
    })
}

fn start_daemon(
    ns: &Netns,
    implementation: Implementation,
    binary: &Path,
    ifname: &str,
    work_dir: &Path,
) -> Result<NsChild, TestbedError> {
    let argv = daemon_command(implementation, binary, ifname, work_dir);
    let socket = uapi_socket(ifname);
    // A socket left by a crashed run (its namespace, and the daemon in it, are gone already).
    let _ = std::fs::remove_file(&socket);
    let log_path = work_dir.join(format!("{ifname}.out"));
    let io = |error| TestbedError::Io {
        path: log_path.clone(),
        error,
    };
    let log = File::create(&log_path).map_err(io)?;
    let log_err = log.try_clone().map_err(io)?;
    let (program, args) = argv
        .split_first()
        .expect("tunnel implementations have a command");
    let mut cmd = ns.command(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    let mut daemon = NsChild::spawn(&mut cmd)?;
    let ready = netns::wait_for_path(&socket, DAEMON_STARTUP);
    if !ready || !daemon.is_running() {
        daemon.stop();
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        return Err(TestbedError::Daemon {
            implementation,
            message: format!(
                "`{}` did not open {}; its output ends with:\n{}",
                argv.join(" "),
                socket.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ),
        });
    }
    Ok(daemon)
}

/// The admission the controller would give the peer, for the variants measured with one.
fn admission_of(implementation: Implementation) -> Option<gateway_api::Isolation> {
    match implementation {
        Implementation::KubetunOpen => Some(gateway_api::Isolation::Open),
        Implementation::KubetunExported => Some(gateway_api::Isolation::Exported),
        _ => None,
    }
}

/// The state `wg setconf` gave the gateway, with an admission for its peer: in exported
/// mode the iperf3 server (on side b) is the one endpoint, TCP and UDP.
fn admitting_state(
    config: &WgConfig,
    address: &str,
    mtu: u32,
    isolation: gateway_api::Isolation,
    server: Ipv4Addr,
) -> gateway_api::DesiredState {
    let endpoint = |protocol: gateway_api::Protocol| gateway_api::AdmittedEndpoint {
        address: server.to_string(),
        protocol: protocol as i32,
        port: u32::from(iperf::DEFAULT_PORT),
    };
    gateway_api::DesiredState {
        version: format!("bench-{}", isolation.as_str_name()),
        interface: Some(gateway_api::Interface {
            private_key: config.private_key.clone(),
            listen_port: u32::from(config.listen_port),
            mtu,
            addresses: vec![address.to_owned()],
            ..Default::default()
        }),
        peers: vec![gateway_api::Peer {
            public_key: config.peer_public_key.clone(),
            name: "peer".to_owned(),
            endpoint: config.peer_endpoint.clone(),
            routes: vec![gateway_api::Route {
                real: config.allowed_ips.clone(),
                view: config.allowed_ips.clone(),
                fallback: false,
            }],
            ..Default::default()
        }],
        admissions: vec![gateway_api::Admission {
            cluster: "peer".to_owned(),
            isolation: isolation as i32,
            views: vec![config.allowed_ips.clone()],
            endpoints: vec![
                endpoint(gateway_api::Protocol::Tcp),
                endpoint(gateway_api::Protocol::Udp),
            ],
            policies: Vec::new(),
        }],
    }
}

/// Applies `state` over the gateway's gRPC socket.
fn apply(socket: &Path, state: gateway_api::DesiredState) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime
        .block_on(async { GatewayClient::new(socket).apply(state).await })
        .map(drop)
        .map_err(|e| format!("apply over {}: {e}", socket.display()))
}
