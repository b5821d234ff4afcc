//! The implementations the harness compares: kubetun-gateway, wireguard-go and boringtun-cli
//! (each a userspace WireGuard daemon started as `<daemon> -f <ifname>` and configured
//! identically with `wg setconf` over its UAPI socket), and plain veth as the ceiling.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One column of the results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Implementation {
    /// No tunnel: iperf3 over the veth pair (the ceiling).
    Veth,
    /// This project's gateway.
    Kubetun,
    /// This project's gateway in poll mode (`--busy-poll`): one thread that never sleeps.
    KubetunBusyPoll,
    /// This project's gateway with two data-path queues (`--queues 2`): a multi-queue TUN
    /// device and two `SO_REUSEPORT` sockets per family, each read by its own task.
    KubetunMq,
    /// Another build of this project's gateway (`--kubetun-baseline`), e.g. the previous
    /// release, run like `kubetun` so that two builds are compared in one run.
    KubetunBaseline,
    /// The Go userspace implementation (as packaged by the distribution).
    WireguardGo,
    /// Cloudflare's boringtun daemon.
    BoringtunCli,
}

impl Implementation {
    /// Every implementation, in column order.
    pub const ALL: [Self; 7] = [
        Self::Veth,
        Self::Kubetun,
        Self::KubetunBusyPoll,
        Self::KubetunMq,
        Self::KubetunBaseline,
        Self::WireguardGo,
        Self::BoringtunCli,
    ];

    /// The name used on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            Self::Veth => "veth",
            Self::Kubetun => "kubetun",
            Self::KubetunBusyPoll => "kubetun-busy-poll",
            Self::KubetunMq => "kubetun-mq",
            Self::KubetunBaseline => "kubetun-baseline",
            Self::WireguardGo => "wireguard-go",
            Self::BoringtunCli => "boringtun-cli",
        }
    }

    /// Parses [`Implementation::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|i| i.name() == name)
    }

    /// A short tag for interface names.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Veth => "ve",
            Self::Kubetun => "kt",
            Self::KubetunBusyPoll => "kp",
            Self::KubetunMq => "km",
            Self::KubetunBaseline => "ko",
            Self::WireguardGo => "wg",
            Self::BoringtunCli => "bt",
        }
    }

    /// Whether the daemons keep a core busy even when idle (poll mode).
    pub fn spins(self) -> bool {
        self == Self::KubetunBusyPoll
    }

    /// Whether a daemon carries the traffic (everything but veth).
    pub fn is_tunnel(self) -> bool {
        self != Self::Veth
    }
}

impl std::fmt::Display for Implementation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where each daemon's executable is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Binaries {
    /// `kubetun-gateway`.
    pub kubetun: Option<PathBuf>,
    /// `wireguard-go`.
    pub wireguard_go: Option<PathBuf>,
    /// `boringtun-cli`.
    pub boringtun_cli: Option<PathBuf>,
    /// The second `kubetun-gateway` build (only from `--kubetun-baseline`).
    pub kubetun_baseline: Option<PathBuf>,
}

impl Binaries {
    /// The executable of `implementation` (`None` for veth or when it is not available).
    pub fn of(&self, implementation: Implementation) -> Option<&Path> {
        match implementation {
            Implementation::Veth => None,
            Implementation::Kubetun
            | Implementation::KubetunBusyPoll
            | Implementation::KubetunMq => self.kubetun.as_deref(),
            Implementation::KubetunBaseline => self.kubetun_baseline.as_deref(),
            Implementation::WireguardGo => self.wireguard_go.as_deref(),
            Implementation::BoringtunCli => self.boringtun_cli.as_deref(),
        }
    }
}

/// The daemon's command line for interface `ifname`; `work_dir` takes its sockets and logs.
pub fn daemon_command(
    implementation: Implementation,
    binary: &Path,
    ifname: &str,
    work_dir: &Path,
) -> Vec<String> {
    let binary = binary.to_string_lossy().into_owned();
    match implementation {
        Implementation::Veth => Vec::new(),
        Implementation::Kubetun
        | Implementation::KubetunBusyPoll
        | Implementation::KubetunMq
        | Implementation::KubetunBaseline => {
            let mut command = vec![
                binary,
                "-f".into(),
                "--grpc-socket".into(),
                work_dir
                    .join(format!("{ifname}.grpc.sock"))
                    .to_string_lossy()
                    .into_owned(),
            ];
            match implementation {
                Implementation::KubetunBusyPoll => command.push("--busy-poll".into()),
                Implementation::KubetunMq => command.extend(["--queues".into(), "2".into()]),
                _ => {}
            }
            command.push(ifname.into());
            command
        }
        Implementation::WireguardGo => vec![binary, "-f".into(), ifname.into()],
        Implementation::BoringtunCli => vec![
            binary,
            "-f".into(),
            // As root without sudo there is no user to drop to.
            "--disable-drop-privileges".into(),
            "--log".into(),
            work_dir
                .join(format!("{ifname}.log"))
                .to_string_lossy()
                .into_owned(),
            ifname.into(),
        ],
    }
}

/// The WireGuard UAPI socket of `ifname` (shared by all three daemons).
pub fn uapi_socket(ifname: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"))
}

/// One side of a tunnel, as `wg setconf` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgConfig {
    /// Base64 private key.
    pub private_key: String,
    /// UDP listen port.
    pub listen_port: u16,
    /// The peer's base64 public key.
    pub peer_public_key: String,
    /// The peer's `ip:port`.
    pub peer_endpoint: String,
    /// The peer's allowed IPs.
    pub allowed_ips: String,
}

impl WgConfig {
    /// The configuration file text.
    pub fn render(&self) -> String {
        format!(
            "[Interface]\nPrivateKey = {}\nListenPort = {}\n\n[Peer]\nPublicKey = {}\n\
             AllowedIPs = {}\nEndpoint = {}\n",
            self.private_key,
            self.listen_port,
            self.peer_public_key,
            self.allowed_ips,
            self.peer_endpoint
        )
    }
}

/// Finds `name` on `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Why boringtun-cli could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// cargo could not be started.
    #[error("cannot run cargo: {0}")]
    Spawn(std::io::Error),
    /// cargo install failed or ran out of time.
    #[error("`cargo install boringtun-cli` failed ({0}); see its output above")]
    Failed(String),
}

/// Installs boringtun-cli with `cargo install --locked` into `root` (binary in
/// `root/bin`), bounded by `timeout`.
pub fn install_boringtun(root: &Path, timeout: Duration) -> Result<PathBuf, InstallError> {
    let status = Command::new("timeout")
        .arg(timeout.as_secs().to_string())
        .args(["cargo", "install", "boringtun-cli", "--locked", "--root"])
        .arg(root)
        .status()
        .map_err(InstallError::Spawn)?;
    let binary = root.join("bin").join("boringtun-cli");
    if status.success() && binary.is_file() {
        Ok(binary)
    } else {
        Err(InstallError::Failed(status.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for implementation in Implementation::ALL {
            assert_eq!(
                Implementation::from_name(implementation.name()),
                Some(implementation)
            );
        }
        assert_eq!(Implementation::from_name("kernel"), None);
    }

    #[test]
    fn daemons_start_in_the_foreground() {
        let dir = Path::new("/run/bench");
        let kubetun = daemon_command(
            Implementation::Kubetun,
            Path::new("/bin/kubetun-gateway"),
            "kb-kt-a",
            dir,
        );
        assert_eq!(
            kubetun.join(" "),
            "/bin/kubetun-gateway -f --grpc-socket /run/bench/kb-kt-a.grpc.sock kb-kt-a"
        );
        let multiqueue = daemon_command(
            Implementation::KubetunMq,
            Path::new("/bin/kubetun-gateway"),
            "kb-km-a",
            dir,
        );
        assert_eq!(
            multiqueue.join(" "),
            "/bin/kubetun-gateway -f --grpc-socket /run/bench/kb-km-a.grpc.sock --queues 2 kb-km-a"
        );
        let boringtun = daemon_command(
            Implementation::BoringtunCli,
            Path::new("boringtun-cli"),
            "kb-bt-a",
            dir,
        );
        assert!(boringtun.contains(&"--disable-drop-privileges".to_owned()));
        assert_eq!(boringtun.last().map(String::as_str), Some("kb-bt-a"));
        let baseline = daemon_command(
            Implementation::KubetunBaseline,
            Path::new("/old/kubetun-gateway"),
            "kb-ko-a",
            dir,
        );
        assert_eq!(
            baseline.join(" "),
            "/old/kubetun-gateway -f --grpc-socket /run/bench/kb-ko-a.grpc.sock kb-ko-a"
        );
        assert!(daemon_command(Implementation::Veth, Path::new("x"), "y", dir).is_empty());
    }

    #[test]
    fn wg_config_renders_like_wg_quick_files() {
        let config = WgConfig {
            private_key: "priv".into(),
            listen_port: 51821,
            peer_public_key: "pub".into(),
            peer_endpoint: "198.18.1.2:51821".into(),
            allowed_ips: "10.99.1.2/32".into(),
        };
        assert_eq!(
            config.render(),
            "[Interface]\nPrivateKey = priv\nListenPort = 51821\n\n[Peer]\nPublicKey = pub\n\
             AllowedIPs = 10.99.1.2/32\nEndpoint = 198.18.1.2:51821\n"
        );
    }
}
