//! `kubetun gateway apply|show`: talk to a gateway's control socket directly, without
//! Kubernetes (debugging, the lab, hand-written states).

use std::io::Read as _;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};

use kubetun_controller::gateway_api::{ConnectionState, DesiredState, PeerStatus, StatusResponse};
use kubetun_controller::planner;
use kubetun_controller::plumbing::gateway_client::{
    DEFAULT_INTERFACE, GatewayClient, GatewayClientError, grpc_socket_path,
};

/// A failure of `kubetun gateway`.
#[derive(Debug, thiserror::Error)]
pub enum GatewayCliError {
    /// The state file cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file (`-` for standard input).
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The state file does not describe a DesiredState.
    #[error("{path} is not a valid gateway state (YAML or JSON DesiredState): {reason}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message.
        reason: String,
    },
    /// The gateway call failed.
    #[error(transparent)]
    Gateway(#[from] GatewayClientError),
    /// The output could not be rendered.
    #[error("cannot render the output: {0}")]
    Render(String),
}

/// `kubetun gateway`.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// The gateway's interface name; its control socket is derived from it the way the
    /// gateway derives it (`/var/run/kubetun/<interface>.grpc.sock`).
    #[arg(long, global = true, env = "KUBETUN_GATEWAY_INTERFACE", default_value = DEFAULT_INTERFACE)]
    pub interface: String,
    /// The gateway's control socket, when it was started with `--grpc-socket`.
    #[arg(long, global = true, env = "KUBETUN_GATEWAY_SOCKET")]
    pub socket: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: GatewayCommand,
}

/// The `gateway` subcommands.
#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Replace the gateway's whole state with a DesiredState file (YAML or JSON).
    Apply(ApplyArgs),
    /// Show the gateway's interface, peers, counters and drops.
    Show(ShowArgs),
}

/// `kubetun gateway apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The state file; `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: String,
}

/// Output formats of `show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human readable tables.
    Table,
    /// The raw status as JSON.
    Json,
    /// The raw status as YAML.
    Yaml,
}

/// `kubetun gateway show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Runs a `gateway` subcommand, printing to standard output.
pub async fn run(args: GatewayArgs) -> Result<(), GatewayCliError> {
    let socket = args
        .socket
        .unwrap_or_else(|| grpc_socket_path(&args.interface));
    let client = GatewayClient::new(socket);
    match args.command {
        GatewayCommand::Apply(apply) => {
            let state = read_state(&apply.file)?;
            let peers = state.peers.len();
            let version = state.version.clone();
            let response = client.apply(state).await?;
            println!(
                "applied version {version} (peers: {peers}): generation {}, {}",
                response.generation,
                if response.changed {
                    "changed"
                } else {
                    "unchanged"
                }
            );
            for error in &response.host_errors {
                eprintln!("warning: host configuration failed (the gateway retries it): {error}");
            }
        }
        GatewayCommand::Show(show) => {
            let status = client.status().await?;
            let rendered = match show.output {
                OutputFormat::Table => render_status(&status, now_unix_ms()),
                OutputFormat::Json => serde_json::to_string_pretty(&status)
                    .map(|s| s + "\n")
                    .map_err(|e| GatewayCliError::Render(e.to_string()))?,
                OutputFormat::Yaml => serde_yaml::to_string(&status)
                    .map_err(|e| GatewayCliError::Render(e.to_string()))?,
            };
            print!("{rendered}");
        }
    }
    Ok(())
}

/// Reads and parses a state file; an empty version becomes the hash of the content.
pub fn read_state(path: &str) -> Result<DesiredState, GatewayCliError> {
    let text = if path == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|source| GatewayCliError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_state(path, &text)
}

/// Parses a YAML or JSON DesiredState; an empty version becomes the hash of the content.
pub fn parse_state(path: &str, text: &str) -> Result<DesiredState, GatewayCliError> {
    let mut state: DesiredState =
        serde_yaml::from_str(text).map_err(|e| GatewayCliError::Parse {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if state.version.is_empty() {
        state.version = planner::version_of(&state);
    }
    Ok(state)
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The status as text: interface line, one row per peer, drops.
pub fn render_status(status: &StatusResponse, now_unix_ms: i64) -> String {
    let mut out = format!(
        "interface {} listening on {} (version {}, generation {})\npublic key {}\n\n",
        if status.interface_name.is_empty() {
            "-"
        } else {
            &status.interface_name
        },
        status.listen_port,
        if status.version.is_empty() {
            "none"
        } else {
            &status.version
        },
        status.generation,
        if status.public_key.is_empty() {
            "-"
        } else {
            &status.public_key
        },
    );
    if status.leased {
        // A replica: say whether it carries the traffic (the Lease names which one does).
        out.insert_str(
            out.len() - 1,
            &if status.active {
                format!(
                    "replica: active (lease held, {} ms left without a renewal; promoted {} times)\n",
                    status.active_remaining_ms, status.promotions
                )
            } else {
                format!(
                    "replica: standby (another replica holds the lease; promoted {} times)\n",
                    status.promotions
                )
            },
        );
    }
    let mut rows = vec![[
        "PEER".to_owned(),
        "STATE".to_owned(),
        "ENDPOINT".to_owned(),
        "HANDSHAKE".to_owned(),
        "LATENCY".to_owned(),
        "PROBES LOST".to_owned(),
        "RX".to_owned(),
        "TX".to_owned(),
        "MESSAGE".to_owned(),
    ]];
    for peer in &status.peers {
        let state = match ConnectionState::try_from(peer.state).unwrap_or_default() {
            ConnectionState::Connected => "Connected",
            ConnectionState::Connecting | ConnectionState::Unspecified => "Connecting",
            ConnectionState::Error => "Error",
        };
        rows.push([
            if peer.name.is_empty() {
                peer.public_key.clone()
            } else {
                peer.name.clone()
            },
            state.to_owned(),
            if peer.endpoint.is_empty() {
                "-".to_owned()
            } else {
                peer.endpoint.clone()
            },
            ago(peer.last_handshake_unix_ms, now_unix_ms),
            if peer.latency_us == 0 {
                "-".to_owned()
            } else {
                format!("{:.1}ms", peer.latency_us as f64 / 1000.0)
            },
            peer.conncheck.as_ref().map_or_else(
                || "-".to_owned(),
                |c| format!("{}/{}", c.probes_lost, c.probes_sent),
            ),
            bytes(peer.rx_bytes),
            bytes(peer.tx_bytes),
            peer.message.clone(),
        ]);
    }
    if status.peers.is_empty() {
        out.push_str("no peers\n");
    } else {
        out.push_str(&table(&rows));
        out.push_str(&render_routes(&status.peers));
    }
    let mut drops: Vec<_> = status
        .drops
        .iter()
        .filter(|(_, count)| **count > 0)
        .collect();
    if !drops.is_empty() {
        drops.sort();
        out.push_str("\ndrops:");
        for (reason, count) in drops {
            out.push_str(&format!(" {reason}={count}"));
        }
        out.push('\n');
    }
    for error in &status.host_errors {
        out.push_str(&format!("host configuration failing (retried): {error}\n"));
    }
    out
}

/// One row per route: peer, real prefix, the view local clients use, and the peer's ACL.
fn render_routes(peers: &[PeerStatus]) -> String {
    let mut rows = vec![[
        "PEER".to_owned(),
        "REAL".to_owned(),
        "VIEW".to_owned(),
        "ACL".to_owned(),
    ]];
    for peer in peers {
        let name = if peer.name.is_empty() {
            &peer.public_key
        } else {
            &peer.name
        };
        let acl = match &peer.acl {
            None => "-".to_owned(),
            Some(acl) if acl.allowed.is_empty() => "deny all".to_owned(),
            Some(acl) => acl.allowed.join(","),
        };
        for route in &peer.routes {
            let view = if route.view.is_empty() || route.view == route.real {
                format!("{} (not remapped)", route.real)
            } else {
                route.view.clone()
            };
            rows.push([name.clone(), route.real.clone(), view, acl.clone()]);
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    format!("\nroutes:\n{}", table(&rows))
}

fn ago(unix_ms: i64, now_unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "never".to_owned();
    }
    let seconds = (now_unix_ms - unix_ms).max(0) / 1000;
    match seconds {
        0..60 => format!("{seconds}s ago"),
        60..3600 => format!("{}m{}s ago", seconds / 60, seconds % 60),
        _ => format!("{}h{}m ago", seconds / 3600, seconds % 3600 / 60),
    }
}

fn bytes(count: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = count as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{count} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubetun_controller::gateway_api::{Acl, Route};

    #[test]
    fn yaml_states_parse_with_camel_case_fields_and_get_a_version() {
        let yaml = r#"
interface:
  listenPort: 51820
  privateKey: c2VjcmV0
peers:
  - name: rome
    publicKey: cm9tZQ==
    endpoint: 192.0.2.2:51820
    routes:
      - real: 10.70.0.0/16
        view: 10.71.0.0/16
    acl:
      allowed: [10.70.1.0/24]
"#;
        let state = parse_state("state.yaml", yaml).unwrap();
        assert_eq!(state.interface.as_ref().map(|i| i.listen_port), Some(51820));
        assert_eq!(state.peers[0].routes[0].view, "10.71.0.0/16");
        assert_eq!(
            state.peers[0].acl.as_ref().map(|a| a.allowed.len()),
            Some(1)
        );
        assert_eq!(state.version.len(), 16);

        let mut other_key = state.clone();
        other_key.version.clear();
        if let Some(i) = other_key.interface.as_mut() {
            i.private_key = "b3RoZXI=".into();
        }
        assert_eq!(
            planner::version_of(&other_key),
            state.version,
            "the key is not hashed"
        );
    }

    #[test]
    fn parse_errors_name_the_file() {
        let err = parse_state("bad.yaml", "peers: 12").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("bad.yaml is not a valid gateway state"),
            "{err}"
        );
    }

    #[test]
    fn status_renders_as_a_table() {
        let status = StatusResponse {
            version: "abc".into(),
            generation: 2,
            interface_name: "kubetun0".into(),
            listen_port: 51820,
            peers: vec![PeerStatus {
                name: "rome".into(),
                endpoint: "192.0.2.2:51820".into(),
                last_handshake_unix_ms: 10_000,
                rx_bytes: 2048,
                latency_us: 1200,
                state: ConnectionState::Connected as i32,
                routes: vec![
                    Route {
                        real: "10.202.0.0/16".into(),
                        view: "10.202.0.0/16".into(),
                        fallback: false,
                    },
                    Route {
                        real: "10.70.0.0/16".into(),
                        view: "10.71.0.0/16".into(),
                        fallback: false,
                    },
                ],
                acl: Some(Acl {
                    allowed: vec!["10.70.1.0/24".into()],
                }),
                conncheck: Some(kubetun_controller::gateway_api::ConnCheckStatus {
                    probes_sent: 40,
                    probes_lost: 2,
                    ..Default::default()
                }),
                ..PeerStatus::default()
            }],
            drops: [("acl".to_owned(), 3), ("no_route".to_owned(), 0)].into(),
            ..StatusResponse::default()
        };
        let text = render_status(&status, 75_000);
        assert!(text.contains("interface kubetun0 listening on 51820 (version abc, generation 2)"));
        assert!(
            !text.contains("replica:"),
            "a gateway alone is no replica: {text}"
        );
        let standby = StatusResponse {
            leased: true,
            promotions: 2,
            ..status.clone()
        };
        assert!(
            render_status(&standby, 75_000).contains(
                "replica: standby (another replica holds the lease; promoted 2 times)\n\n"
            )
        );
        let active = StatusResponse {
            leased: true,
            active: true,
            active_remaining_ms: 640,
            promotions: 3,
            ..status.clone()
        };
        assert!(render_status(&active, 75_000).contains(
            "replica: active (lease held, 640 ms left without a renewal; promoted 3 times)"
        ));
        let remapped = text.lines().find(|l| l.contains("10.70.0.0/16")).unwrap();
        assert!(
            remapped.contains("10.71.0.0/16") && remapped.contains("10.70.1.0/24"),
            "{remapped}"
        );
        assert!(text.contains("10.202.0.0/16 (not remapped)"), "{text}");
        let row = text.lines().find(|l| l.starts_with("rome")).unwrap();
        assert!(row.contains("Connected"), "{row}");
        assert!(row.contains("1m5s ago"), "{row}");
        assert!(row.contains("1.2ms"), "{row}");
        assert!(row.contains("2.0 KiB"), "{row}");
        assert!(row.contains(" 2/40 "), "probes lost of sent: {row}");
        assert!(
            text.contains("drops: acl=3\n"),
            "zero counters are left out: {text}"
        );
    }
}
