//! Machine-readable output of the `kubetun` listing commands (`network status`, `shortcut
//! list`): `-o table|json|yaml`. JSON and YAML render the serde structs below, whose field
//! names (camelCase, like Kubernetes objects) are a stable interface for scripts: fields may
//! be added, none renamed or removed. `gateway show -o json|yaml` prints the gateway's own
//! status message instead (the field names of `gateway.proto`).

use clap::{Args, ValueEnum};
use kube::ResourceExt as _;
use kubetun_crds::{CidrMapping, ShortcutConnection};
use serde::Serialize;

use kubetun_controller::connector::{CidrKind, LinkStatus};

/// Output formats of the listing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// Human readable tables.
    #[default]
    Table,
    /// JSON (one document, pretty-printed).
    Json,
    /// YAML (one document).
    Yaml,
}

/// `-o/--output`, flattened into a command's arguments.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Output format: table, json or yaml (field names are stable; see the CLI reference).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Rendering failed (serializers of these types do not fail in practice).
#[derive(Debug, thiserror::Error)]
#[error("cannot render the output: {0}")]
pub struct RenderError(String);

/// Renders `value` as JSON or YAML (`None` for [`Format::Table`]).
pub fn render<T: Serialize>(format: Format, value: &T) -> Result<Option<String>, RenderError> {
    match format {
        Format::Table => Ok(None),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|s| Some(s + "\n"))
            .map_err(|e| RenderError(e.to_string())),
        Format::Yaml => serde_yaml::to_string(value)
            .map(Some)
            .map_err(|e| RenderError(e.to_string())),
    }
}

/// `kubetun network status -o json|yaml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatusOutput {
    /// The namespace the links were read from.
    pub namespace: String,
    /// One entry per peer cluster.
    pub links: Vec<LinkOutput>,
}

/// One link to a peer cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkOutput {
    /// The peer cluster's id.
    pub peer_id: String,
    /// The peer cluster's name (may be empty).
    pub peer_name: String,
    /// The peer gateway's endpoint (`host:port`), if known.
    pub endpoint: Option<String>,
    /// `Connected`, `Connecting`, `Error`, or `Pending` (no TunnelEndpoint yet).
    pub state: String,
    /// Why, for `Error` and `Pending`; otherwise empty.
    pub message: String,
    /// Round-trip time through the tunnel in microseconds, if measured.
    pub latency_us: Option<u64>,
    /// The latency as the gateway reports it (e.g. `1.2ms`).
    pub latency: Option<String>,
    /// Time of the last handshake (RFC 3339), if any.
    pub last_handshake: Option<String>,
    /// Bytes received from the peer.
    pub rx_bytes: u64,
    /// Bytes sent to the peer.
    pub tx_bytes: u64,
    /// `open` or `exported`: how this cluster's gateway admits the peer's packets (absent
    /// until the link has a TunnelEndpoint).
    pub isolation: Option<String>,
    /// Every CIDR of both clusters and how the other side sees it.
    pub cidrs: Vec<CidrOutput>,
}

/// A CIDR and the address range another cluster reaches it at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CidrOutput {
    /// The cluster owning the CIDR (`local` or a peer id; a leaf name for shortcuts).
    pub owner: String,
    /// The cluster seeing it through its view.
    pub seen_by: String,
    /// `pod` or `external`.
    pub kind: String,
    /// The real CIDR.
    pub cidr: String,
    /// The view the other cluster uses for it.
    pub view: String,
    /// Whether the view differs from the real CIDR.
    pub remapped: bool,
}

fn cidr(owner: &str, seen_by: &str, kind: &str, mapping: &CidrMapping) -> CidrOutput {
    CidrOutput {
        owner: owner.to_owned(),
        seen_by: seen_by.to_owned(),
        kind: kind.to_owned(),
        cidr: mapping.real.clone(),
        view: mapping.view.clone(),
        remapped: mapping.is_remapped(),
    }
}

fn kind_name(kind: CidrKind) -> String {
    kind.to_string()
}

impl NetworkStatusOutput {
    /// The output of `links` read in `namespace`.
    pub fn new(namespace: &str, links: &[LinkStatus]) -> Self {
        Self {
            namespace: namespace.to_owned(),
            links: links.iter().map(LinkOutput::from).collect(),
        }
    }
}

impl From<&LinkStatus> for LinkOutput {
    fn from(link: &LinkStatus) -> Self {
        let peer = &link.peer.id;
        let mut cidrs: Vec<CidrOutput> = link
            .local_cidrs
            .iter()
            .map(|(kind, m)| cidr("local", peer, &kind_name(*kind), m))
            .collect();
        cidrs.extend(
            link.remote_cidrs
                .iter()
                .map(|(kind, m)| cidr(peer, "local", &kind_name(*kind), m)),
        );
        let (state, message) = match (&link.connection, &link.pending) {
            (Some(c), _) => (c.status.to_string(), c.message.clone()),
            (None, Some(pending)) => ("Pending".to_owned(), pending.clone()),
            (None, None) => (
                "Connecting".to_owned(),
                "no report from the gateway yet".to_owned(),
            ),
        };
        let connection = link.connection.as_ref();
        Self {
            peer_id: link.peer.id.clone(),
            peer_name: link.peer.name.clone(),
            endpoint: link.endpoint.as_ref().map(ToString::to_string),
            state,
            message,
            latency_us: connection.and_then(|c| c.latency_us),
            latency: connection.and_then(|c| c.latency.clone()),
            last_handshake: connection.and_then(|c| c.last_handshake.clone()),
            rx_bytes: connection.map_or(0, |c| c.rx_bytes),
            tx_bytes: connection.map_or(0, |c| c.tx_bytes),
            isolation: link.isolation.map(|i| i.as_str().to_owned()),
            cidrs,
        }
    }
}

/// `kubetun shortcut list -o json|yaml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShortcutListOutput {
    /// One entry per ShortcutConnection.
    pub shortcuts: Vec<ShortcutOutput>,
}

/// One ShortcutConnection.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShortcutOutput {
    /// Its namespace on the hub.
    pub namespace: String,
    pub name: String,
    /// The left leaf's name.
    pub left: String,
    /// The right leaf's name.
    pub right: String,
    /// How the leaves reach each other: `direct`, `direct+hub` or `hub-only`.
    pub paths: String,
    /// `open` or `exported` on both leaves; absent: each leaf's cluster default.
    pub isolation: Option<String>,
    /// The phase (`Pending`, `Connecting`, `Connected`, `Error`, ...).
    pub phase: String,
    /// The Ready condition's message (empty when there is none).
    pub message: String,
    /// Each direction's view of the other leaf.
    pub directions: Vec<DirectionOutput>,
}

/// One direction of a shortcut: what `from` sees of `to`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectionOutput {
    /// The leaf looking.
    pub from: String,
    /// The leaf seen.
    pub to: String,
    /// The tunnel's state as `from` reports it, if known.
    pub tunnel: Option<String>,
    /// `direct`, or `via hub` while the hub carries the traffic, if known.
    pub path: Option<String>,
    /// When the path last changed (RFC 3339).
    pub path_changed: Option<String>,
    /// `to`'s CIDRs and the views `from` uses for them.
    pub cidrs: Vec<CidrOutput>,
}

impl ShortcutListOutput {
    /// The output of `shortcuts`.
    pub fn new(shortcuts: &[ShortcutConnection]) -> Self {
        Self {
            shortcuts: shortcuts.iter().map(ShortcutOutput::from).collect(),
        }
    }
}

impl From<&ShortcutConnection> for ShortcutOutput {
    fn from(sc: &ShortcutConnection) -> Self {
        let status = sc.status.clone().unwrap_or_default();
        let message = kubetun_controller::plumbing::conditions::find(
            &status.conditions,
            kubetun_crds::contract::shortcut::READY,
        )
        .map_or_else(String::new, |c| c.message.clone());
        let directions = status
            .directions
            .iter()
            .map(|d| {
                let mut cidrs: Vec<CidrOutput> = d
                    .pod_cidrs
                    .iter()
                    .map(|m| cidr(&d.to, &d.from, "pod", m))
                    .collect();
                cidrs.extend(
                    d.external_cidrs
                        .iter()
                        .map(|m| cidr(&d.to, &d.from, "external", m)),
                );
                DirectionOutput {
                    from: d.from.clone(),
                    to: d.to.clone(),
                    tunnel: d.connection.map(|c| c.to_string()),
                    path: d.path.map(|p| p.to_string()),
                    path_changed: d.path_changed.clone(),
                    cidrs,
                }
            })
            .collect();
        Self {
            namespace: sc.namespace().unwrap_or_default(),
            name: sc.name_any(),
            left: sc.spec.left.name.clone(),
            right: sc.spec.right.name.clone(),
            paths: sc.spec.paths().to_owned(),
            isolation: sc.spec.isolation.map(|i| i.as_str().to_owned()),
            phase: format!("{:?}", status.phase),
            message,
            directions,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};
    use kubetun_crds::{
        ClusterRef, ConnectionState, ConnectionStatus, Endpoint, Isolation, ShortcutConnectionSpec,
        ShortcutConnectionStatus, ShortcutDirection, ShortcutPhase,
    };
    use serde_json::{Value, json};

    use super::*;
    use crate::network::{NetworkArgs, NetworkCommand};
    use crate::shortcut::{ShortcutArgs, ShortcutCommand};

    fn mapping(real: &str, view: &str) -> CidrMapping {
        CidrMapping {
            real: real.into(),
            view: view.into(),
        }
    }

    fn link() -> LinkStatus {
        LinkStatus {
            peer: ClusterRef {
                id: "milan".into(),
                name: "Milan".into(),
            },
            endpoint: Some(Endpoint {
                address: "192.0.2.3".into(),
                port: 51820,
            }),
            local_cidrs: vec![(CidrKind::Pod, mapping("10.202.0.0/16", "10.202.0.0/16"))],
            remote_cidrs: vec![(CidrKind::External, mapping("10.70.0.0/16", "10.68.0.0/16"))],
            connection: Some(ConnectionStatus {
                status: ConnectionState::Connected,
                latency: Some("1.2ms".into()),
                latency_us: Some(1200),
                last_handshake: Some("2026-11-22T00:00:00Z".into()),
                rx_bytes: 2048,
                tx_bytes: 10,
                ..ConnectionStatus::default()
            }),
            pending: None,
            isolation: Some(Isolation::Exported),
        }
    }

    /// The JSON of the network status, with every field name spelled out: renaming one
    /// breaks scripts, so it has to break this test too.
    #[test]
    fn network_status_json_has_the_documented_field_names() {
        let out = NetworkStatusOutput::new("kubetun-system", &[link()]);
        let text = render(Format::Json, &out).unwrap().unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value,
            json!({
                "namespace": "kubetun-system",
                "links": [{
                    "peerId": "milan",
                    "peerName": "Milan",
                    "endpoint": "192.0.2.3:51820",
                    "state": "Connected",
                    "message": "",
                    "latencyUs": 1200,
                    "latency": "1.2ms",
                    "lastHandshake": "2026-11-22T00:00:00Z",
                    "rxBytes": 2048,
                    "txBytes": 10,
                    "isolation": "exported",
                    "cidrs": [
                        {"owner": "local", "seenBy": "milan", "kind": "pod",
                         "cidr": "10.202.0.0/16", "view": "10.202.0.0/16", "remapped": false},
                        {"owner": "milan", "seenBy": "local", "kind": "external",
                         "cidr": "10.70.0.0/16", "view": "10.68.0.0/16", "remapped": true},
                    ],
                }],
            })
        );
    }

    #[test]
    fn a_pending_link_says_what_it_waits_for_and_yaml_matches_json() {
        let pending = LinkStatus {
            connection: None,
            pending: Some("waiting for the peer".into()),
            ..link()
        };
        let out = NetworkStatusOutput::new("ns", &[pending]);
        let json: Value =
            serde_json::from_str(&render(Format::Json, &out).unwrap().unwrap()).unwrap();
        let yaml: Value =
            serde_yaml::from_str(&render(Format::Yaml, &out).unwrap().unwrap()).unwrap();
        assert_eq!(json, yaml);
        assert_eq!(json["links"][0]["state"], "Pending");
        assert_eq!(json["links"][0]["message"], "waiting for the peer");
        assert_eq!(json["links"][0]["latencyUs"], Value::Null);
        assert_eq!(json["links"][0]["rxBytes"], 0);
        let unbuilt = LinkStatus {
            isolation: None,
            ..link()
        };
        let json = render(Format::Json, &NetworkStatusOutput::new("ns", &[unbuilt]))
            .unwrap()
            .unwrap();
        let json: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(json["links"][0]["isolation"], Value::Null);
        let empty = render(Format::Json, &NetworkStatusOutput::new("ns", &[]))
            .unwrap()
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&empty).unwrap(),
            json!({"namespace": "ns", "links": []})
        );
        assert_eq!(render(Format::Table, &out).unwrap(), None);
    }

    #[test]
    fn shortcut_list_json_has_the_documented_field_names() {
        let mut sc = ShortcutConnection::new("rome-milan", ShortcutConnectionSpec::default());
        sc.metadata.namespace = Some("kubetun-system".into());
        sc.spec.left.name = "rome".into();
        sc.spec.right.name = "milan".into();
        sc.status = Some(ShortcutConnectionStatus {
            phase: ShortcutPhase::Connected,
            directions: vec![ShortcutDirection {
                from: "rome".into(),
                to: "milan".into(),
                pod_cidrs: vec![mapping("10.203.0.0/16", "10.203.0.0/16")],
                external_cidrs: vec![mapping("10.70.0.0/16", "10.68.0.0/16")],
                connection: Some(ConnectionState::Connected),
                path: Some(kubetun_crds::ShortcutPath::Direct),
                ..Default::default()
            }],
            ..ShortcutConnectionStatus::default()
        });
        let no_status = ShortcutConnection::new("new", ShortcutConnectionSpec::default());
        let out = ShortcutListOutput::new(&[sc, no_status]);
        let value: Value =
            serde_json::from_str(&render(Format::Json, &out).unwrap().unwrap()).unwrap();
        assert_eq!(
            value["shortcuts"][0],
            json!({
                "namespace": "kubetun-system",
                "name": "rome-milan",
                "left": "rome",
                "right": "milan",
                "paths": "direct",
                "isolation": null,
                "phase": "Connected",
                "message": "",
                "directions": [{
                    "from": "rome",
                    "to": "milan",
                    "tunnel": "Connected",
                    "path": "direct",
                    "pathChanged": null,
                    "cidrs": [
                        {"owner": "milan", "seenBy": "rome", "kind": "pod",
                         "cidr": "10.203.0.0/16", "view": "10.203.0.0/16", "remapped": false},
                        {"owner": "milan", "seenBy": "rome", "kind": "external",
                         "cidr": "10.70.0.0/16", "view": "10.68.0.0/16", "remapped": true},
                    ],
                }],
            })
        );
        assert_eq!(value["shortcuts"][1]["name"], "new");
        assert_eq!(value["shortcuts"][1]["directions"], json!([]));
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        Network(NetworkArgs),
        Shortcut(ShortcutArgs),
    }

    #[test]
    fn status_and_list_take_the_output_flag() {
        let parse = |args: &[&str]| Cli::try_parse_from(args);
        for (argv, is_status) in [
            (&["kubetun", "network", "status", "-o", "json"][..], true),
            (
                &["kubetun", "network", "status", "--output", "yaml"][..],
                true,
            ),
            (&["kubetun", "shortcut", "list", "-o", "yaml"][..], false),
            (
                &["kubetun", "shortcut", "list", "-A", "-o", "table"][..],
                false,
            ),
        ] {
            let cli = parse(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            match cli.command {
                Top::Network(NetworkArgs {
                    command: NetworkCommand::Status(_),
                    ..
                }) => assert!(is_status),
                Top::Shortcut(ShortcutArgs {
                    command: ShortcutCommand::List(_),
                    ..
                }) => assert!(!is_status),
                other => panic!("{argv:?} parsed as {other:?}"),
            }
        }
        assert!(parse(&["kubetun", "network", "status", "-o", "xml"]).is_err());
        assert!(parse(&["kubetun", "shortcut", "list", "-o", "wide"]).is_err());
    }
}
