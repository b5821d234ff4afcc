//! `kubetun network connect|disconnect|reset|status|rotate-keys`: links two clusters directly
//! with the connector, shows the links of a cluster and rotates its gateway key.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::{CidrMapping, Endpoint, Isolation};

use super::{
    ConsoleProgress, Error, KubeconfigSource, format_bytes, parse_duration, parse_endpoint,
    push_indented, render_table,
};
use kubetun_controller::connector::rotation::{self, RotationOptions, RotationReport};
use kubetun_controller::connector::{self, ClusterHandle, Connector, LinkStatus, WaitOptions};
use link_isolation::link_isolation;
pub use link_isolation::{IsolationSource, describe_isolation, plan_isolation};

mod link_isolation;

/// `kubetun network`.
#[derive(Debug, Args)]
pub struct NetworkArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: NetworkCommand,
}

/// The `network` subcommands.
#[derive(Debug, Subcommand)]
pub enum NetworkCommand {
    /// Link the local and the remote cluster (exchange NetworkConfigs, wait until both are
    /// processed and, with --wait, until both tunnels are connected).
    Connect(ConnectArgs),
    /// Remove the link on both clusters (the NetworkConfigs the connector made).
    Disconnect(DisconnectArgs),
    /// Disconnect and remove every leftover on each reachable cluster, even when the other
    /// cluster is gone.
    Reset(ResetArgs),
    /// Show every link of the local cluster.
    Status(StatusArgs),
    /// Give the local gateway a new WireGuard key and announce it to every linked peer; the
    /// tunnels move to it one by one without interruption, and the old key is removed once
    /// no tunnel uses it. Run it again to resume an interrupted rotation.
    RotateKeys(RotateKeysArgs),
}

/// `network rotate-keys`.
#[derive(Debug, Args)]
pub struct RotateKeysArgs {
    #[command(flatten)]
    local: LocalClusterArgs,
    /// Kubeconfig of a peer on a direct link (repeat for each; links a hub's
    /// ShortcutConnection manages need none).
    #[arg(long = "remote-kubeconfig", value_name = "FILE")]
    remote_kubeconfigs: Vec<PathBuf>,
    /// Namespace kubetun runs in on the peers.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    remote_namespace: String,
    /// Wait until every tunnel uses the new key and the old key is gone.
    #[arg(long)]
    wait: bool,
    /// Upper bound of the whole command (e.g. 90s, 5m).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    output: super::output::OutputArgs,
}

/// Flags naming the local cluster.
#[derive(Debug, Clone, Args)]
pub struct LocalClusterArgs {
    /// Kubeconfig of the local cluster (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the local kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace kubetun runs in on the local cluster.
    #[arg(long, short = 'n', default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
}

/// Flags naming the remote cluster.
#[derive(Debug, Clone, Args)]
pub struct RemoteClusterArgs {
    /// Kubeconfig of the remote cluster.
    #[arg(long, value_name = "FILE")]
    pub remote_kubeconfig: Option<PathBuf>,
    /// Context of the remote kubeconfig (with no --remote-kubeconfig: a context of the local one).
    #[arg(long)]
    pub remote_context: Option<String>,
    /// Namespace kubetun runs in on the remote cluster.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    pub remote_namespace: String,
}

impl RemoteClusterArgs {
    fn given(&self) -> bool {
        self.remote_kubeconfig.is_some() || self.remote_context.is_some()
    }
}

/// Flags bounding a wait.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Wait until the tunnels are connected (connect) or removed (disconnect).
    #[arg(long)]
    pub wait: bool,
    /// Upper bound of the whole command (e.g. 90s, 5m).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
}

impl WaitArgs {
    fn options(&self) -> WaitOptions {
        WaitOptions {
            wait: self.wait,
            timeout: self.timeout,
            ..WaitOptions::default()
        }
    }
}

/// `network connect`.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    local: LocalClusterArgs,
    #[command(flatten)]
    remote: RemoteClusterArgs,
    #[command(flatten)]
    wait: WaitArgs,
    /// Tunnel MTU announced by both clusters (default: each cluster's own).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1280..=9000))]
    mtu: Option<u32>,
    /// Endpoint the remote cluster dials to reach the local gateway (NAT, port forwarding).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_endpoint)]
    local_endpoint: Option<Endpoint>,
    /// Endpoint the local cluster dials to reach the remote gateway.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_endpoint)]
    remote_endpoint: Option<Endpoint>,
    /// Isolation of the link, set on both sides (each side's gateway admits the other's
    /// packets by it): `exported`, the peer reaches only the endpoints of the Services
    /// exported to it and the replies to connections opened towards it; `open`, every pod
    /// and external address. Re-run with another value to change it in place (same keys,
    /// the tunnels stay up). Default: what the link has; on a new link, the cluster's
    /// default on each side (`kubetun install --isolation`).
    #[arg(long, value_name = "open|exported", value_parser = crate::install::isolation::parse_isolation)]
    isolation: Option<Isolation>,
}

/// `network disconnect`.
#[derive(Debug, Args)]
pub struct DisconnectArgs {
    #[command(flatten)]
    local: LocalClusterArgs,
    #[command(flatten)]
    remote: RemoteClusterArgs,
    #[command(flatten)]
    wait: WaitArgs,
    /// Disconnect even when the link belongs to a hub's ShortcutConnection (the hub's
    /// operator re-creates it unless the ShortcutConnection is deleted).
    #[arg(long)]
    force: bool,
}

/// `network reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    local: LocalClusterArgs,
    #[command(flatten)]
    remote: RemoteClusterArgs,
    /// The remote cluster's id, to clean the local cluster when the remote one is unreachable.
    #[arg(long)]
    remote_cluster_id: Option<String>,
    /// The local cluster's id, to clean the remote cluster when the local one is unreachable.
    #[arg(long)]
    local_cluster_id: Option<String>,
    /// How long to wait for the deleted objects to be gone (a finalizer holds a peer's
    /// NetworkConfig until its controller releases the views).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,
    /// Reset even when the link belongs to a hub's ShortcutConnection (the hub's operator
    /// re-creates it unless the ShortcutConnection is deleted).
    #[arg(long)]
    force: bool,
}

impl ResetArgs {
    fn wait(&self) -> WaitOptions {
        WaitOptions {
            wait: true,
            timeout: self.timeout,
            ..WaitOptions::default()
        }
    }
}

/// `network status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    local: LocalClusterArgs,
    /// Only the link to this peer cluster id.
    #[arg(long)]
    peer: Option<String>,
    #[command(flatten)]
    output: super::output::OutputArgs,
}

async fn local_handle(args: &LocalClusterArgs) -> Result<ClusterHandle, Error> {
    let source = KubeconfigSource {
        path: args.kubeconfig.clone(),
        context: args.context.clone(),
    };
    let (client, server) = source.client_and_server("local").await?;
    Ok(ClusterHandle::new("local", client, &args.namespace).with_server(Some(server)))
}

async fn remote_handle(
    local: &LocalClusterArgs,
    args: &RemoteClusterArgs,
) -> Result<ClusterHandle, Error> {
    if !args.given() {
        return Err(Error::Usage(
            "the remote cluster is missing: pass --remote-kubeconfig and/or --remote-context"
                .to_owned(),
        ));
    }
    let source = KubeconfigSource {
        path: args
            .remote_kubeconfig
            .clone()
            .or_else(|| local.kubeconfig.clone()),
        context: args.remote_context.clone(),
    };
    let (client, server) = source.client_and_server("remote").await?;
    Ok(ClusterHandle::new("remote", client, &args.remote_namespace).with_server(Some(server)))
}

/// Runs a `network` subcommand, printing progress to stdout.
pub async fn run(args: NetworkArgs) -> Result<(), Error> {
    let progress = ConsoleProgress::stdout();
    match args.command {
        NetworkCommand::Connect(args) => {
            let mut local = local_handle(&args.local).await?;
            let mut remote = remote_handle(&args.local, &args.remote).await?;
            local.endpoint_override = args.local_endpoint;
            remote.endpoint_override = args.remote_endpoint;
            let connector = Connector::new(local, remote).with_mtu(args.mtu);
            let [on_local, on_remote] = link_isolation(&connector, args.isolation).await?;
            let state = connector
                .with_isolation(on_local, on_remote)
                .connect(args.wait.options(), &progress)
                .await?;
            let verdict = if state.is_connected() {
                "connected"
            } else {
                "configured (run with --wait to wait for the tunnels)"
            };
            println!(
                "{} <-> {}: {verdict}",
                state.local.cluster.id, state.remote.cluster.id
            );
            Ok(())
        }
        NetworkCommand::Disconnect(args) => {
            let local = local_handle(&args.local).await?;
            let remote = remote_handle(&args.local, &args.remote).await?;
            let connector = Connector::new(local, remote);
            if !args.force {
                refuse_shortcut_links(&connector).await?;
            }
            let [on_local, on_remote] =
                connector.disconnect(args.wait.options(), &progress).await?;
            println!(
                "disconnected: {} object(s) deleted locally, {} remotely",
                on_local.objects.len(),
                on_remote.objects.len()
            );
            Ok(())
        }
        NetworkCommand::Reset(args) => {
            let local = local_handle(&args.local).await;
            let remote = remote_handle(&args.local, &args.remote).await;
            let (local, remote) = match (local, remote) {
                (Ok(local), Ok(remote)) => (local, remote),
                (Ok(local), Err(error)) => {
                    let peer_id = args.remote_cluster_id.clone();
                    return reset_one_side(&local, peer_id, error, &args, &progress).await;
                }
                (Err(error), Ok(remote)) => {
                    let peer_id = args.local_cluster_id.clone();
                    return reset_one_side(&remote, peer_id, error, &args, &progress).await;
                }
                (Err(error), Err(_)) => return Err(error),
            };
            if !args.force {
                let local_id = cluster_id(&local, args.local_cluster_id.as_deref()).await;
                let remote_id = cluster_id(&remote, args.remote_cluster_id.as_deref()).await;
                refuse_owned_link(&local, &local_id, &remote_id).await?;
                refuse_owned_link(&remote, &remote_id, &local_id).await?;
            }
            let peer_ids = [
                args.remote_cluster_id.as_deref(),
                args.local_cluster_id.as_deref(),
            ];
            let removed = connector::reset(&local, &remote, peer_ids, &progress).await?;
            // Deleted is not gone: a finalizer may hold an object until its controller runs.
            let mut left = Vec::new();
            for (handle, removed) in [(&local, &removed[0]), (&remote, &removed[1])] {
                let Some(removed) = removed else { continue };
                let id = handle
                    .load_info()
                    .await
                    .map_or_else(|_| handle.label.clone(), |info| info.cluster.id);
                if let Err(error) =
                    connector::wait_removed(handle, &id, removed, args.wait(), &progress).await
                {
                    left.push(error);
                }
            }
            if let Some(error) = left.into_iter().next() {
                return Err(error.into());
            }
            let count = |r: &Option<connector::Removed>| {
                r.as_ref()
                    .map_or("skipped".to_owned(), |r| r.objects.len().to_string())
            };
            println!(
                "reset: local {}, remote {}",
                count(&removed[0]),
                count(&removed[1])
            );
            Ok(())
        }
        NetworkCommand::RotateKeys(args) => rotate_keys(args, &progress).await,
        NetworkCommand::Status(args) => {
            let local = local_handle(&args.local).await?;
            let links = connector::link_statuses(&local).await?;
            let links: Vec<LinkStatus> = links
                .into_iter()
                .filter(|l| args.peer.as_ref().is_none_or(|p| *p == l.peer.id))
                .collect();
            let machine = super::output::NetworkStatusOutput::new(&local.namespace, &links);
            if let Some(text) = super::output::render(args.output.format, &machine)? {
                print!("{text}");
                return Ok(());
            }
            if links.is_empty() {
                println!("no links in namespace {}", local.namespace);
            }
            for link in &links {
                println!("{}", render_link(link));
            }
            Ok(())
        }
    }
}

/// `network rotate-keys`: progress on stdout for tables, none for `-o json|yaml` (the
/// report is the output); fails when the key did not reach every peer or, with `--wait`,
/// not every tunnel moved.
async fn rotate_keys(args: RotateKeysArgs, console: &ConsoleProgress) -> Result<(), Error> {
    let local = local_handle(&args.local).await?;
    let mut remotes = Vec::new();
    for (index, path) in args.remote_kubeconfigs.iter().enumerate() {
        let label = format!("remote {}", index + 1);
        let source = KubeconfigSource {
            path: Some(path.clone()),
            context: None,
        };
        let client = source.client(&label).await?;
        remotes.push(ClusterHandle::new(label, client, &args.remote_namespace));
    }
    let options = RotationOptions {
        wait: args.wait,
        timeout: args.timeout,
        ..RotationOptions::default()
    };
    let quiet = connector::TracingProgress;
    let progress: &dyn connector::Progress = match args.output.format {
        super::output::Format::Table => console,
        _ => &quiet,
    };
    let report = rotation::rotate_keys(&local, &remotes, options, progress).await?;
    match super::output::render(args.output.format, &report)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render_rotation(&report)),
    }
    let unannounced: Vec<&str> = report.unannounced().map(|p| p.peer_id.as_str()).collect();
    if !unannounced.is_empty() {
        return Err(Error::Incomplete(format!(
            "the new key did not reach {}; their tunnels stay on the previous key: run the \
             command again (with their --remote-kubeconfig) to resume",
            unannounced.join(", ")
        )));
    }
    if args.wait && !report.complete {
        let pending = report.pending();
        return Err(Error::Incomplete(format!(
            "timed out after {:?}: still on the previous key: {} (their gateways have not \
             handshaken with the new key; `kubetun diagnose` checks those links); run the \
             command again to go on waiting",
            args.timeout,
            pending.join(", ")
        )));
    }
    Ok(())
}

/// The table form of a rotation report.
pub fn render_rotation(report: &RotationReport) -> String {
    let mut out = format!(
        "cluster {}: public key {}{}\n",
        report.cluster_id,
        report.public_key,
        report
            .previous_public_key
            .as_ref()
            .map(|p| format!(" (was {p})"))
            .unwrap_or_default()
    );
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let rows: Vec<Vec<String>> = report
        .peers
        .iter()
        .map(|p| {
            vec![
                p.peer_id.clone(),
                format!("{:?}", p.propagation).to_lowercase(),
                yes_no(p.announced),
                yes_no(p.moved),
                p.message.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&render_table(
            &["PEER", "PROPAGATION", "ANNOUNCED", "MOVED", "MESSAGE"],
            &rows,
        ));
    }
    out.push_str(if report.complete {
        "rotation complete: the previous key is gone\n"
    } else {
        "rotation in progress: the previous key serves the tunnels that have not moved yet \
         (--wait waits for them)\n"
    });
    out
}

/// `reset` when only one cluster can be reached: forget the peer given by id.
async fn reset_one_side(
    handle: &ClusterHandle,
    peer_id: Option<String>,
    unreachable: Error,
    args: &ResetArgs,
    progress: &ConsoleProgress,
) -> Result<(), Error> {
    let other = if handle.label == "local" {
        "remote"
    } else {
        "local"
    };
    let Some(peer_id) = peer_id else {
        return Err(Error::Usage(format!(
            "{unreachable}; to clean the {} cluster alone pass --{other}-cluster-id",
            handle.label
        )));
    };
    let own_id = cluster_id(handle, None).await;
    if !args.force {
        refuse_owned_link(handle, &own_id, &peer_id).await?;
    }
    let removed = connector::forget(handle, &own_id, &peer_id, progress).await?;
    connector::wait_removed(handle, &own_id, &removed, args.wait(), progress).await?;
    println!(
        "reset: {} {}, {other} skipped ({unreachable})",
        handle.label,
        removed.objects.len()
    );
    Ok(())
}

/// The cluster's id from its ClusterInfo, else `given` (a `--*-cluster-id` flag), else the
/// handle's label: reset must work on a cluster whose setup is half gone.
async fn cluster_id(handle: &ClusterHandle, given: Option<&str>) -> String {
    match handle.load_info().await {
        Ok(info) => info.cluster.id,
        Err(_) => given.map_or_else(|| handle.label.clone(), str::to_owned),
    }
}

/// Fails when a hub's ShortcutConnection manages the link (its NetworkConfigs carry the
/// hub's annotations on either side): a direct disconnect or reset would silently break the
/// shortcut, and the hub would re-create it.
async fn refuse_shortcut_links(connector: &Connector) -> Result<(), Error> {
    let (local, remote) = connector.load_infos().await?;
    refuse_owned_link(connector.local(), &local.cluster.id, &remote.cluster.id).await?;
    refuse_owned_link(connector.remote(), &remote.cluster.id, &local.cluster.id).await
}

/// Only a found owner stops the command: a cluster that cannot be read is the command's own
/// case (reset cleans the side it reaches and names the flags for the other), and it reports
/// that itself.
async fn refuse_owned_link(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
) -> Result<(), Error> {
    match connector::link_owner(handle, cluster_id, peer_id).await {
        Ok(Some(owner)) => Err(connector::ConnectError::OwnedByShortcut {
            cluster: handle.label.clone(),
            cluster_id: cluster_id.to_owned(),
            peer_id: peer_id.to_owned(),
            shortcut: owner.shortcut,
            hub: owner.hub,
        }
        .into()),
        Ok(None) | Err(_) => Ok(()),
    }
}

/// Renders one link: a header (peer, endpoint, state, latency, handshake, bytes) and a table
/// of the CIDRs in both directions with their views.
pub fn render_link(link: &LinkStatus) -> String {
    let peer = if link.peer.name.is_empty() || link.peer.name == link.peer.id {
        link.peer.id.clone()
    } else {
        format!("{} ({})", link.peer.id, link.peer.name)
    };
    let endpoint = link
        .endpoint
        .as_ref()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    let mut out = format!("Peer {peer}\n  endpoint:       {endpoint}\n");
    if let Some(isolation) = link.isolation {
        let what = match isolation {
            Isolation::Exported => "only the Services exported to it",
            Isolation::Open => "every pod and external address",
        };
        out.push_str(&format!(
            "  isolation:      {isolation} ({} reaches {what})\n",
            link.peer.id
        ));
    }
    match (&link.connection, &link.pending) {
        (Some(c), _) => {
            let detail = if c.message.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.message)
            };
            out.push_str(&format!("  connection:     {}{detail}\n", c.status));
            out.push_str(&format!(
                "  latency:        {}\n",
                c.latency.as_deref().unwrap_or("-")
            ));
            out.push_str(&format!(
                "  last handshake: {}\n",
                c.last_handshake.as_deref().unwrap_or("never")
            ));
            out.push_str(&format!(
                "  traffic:        rx {}, tx {}\n",
                format_bytes(c.rx_bytes),
                format_bytes(c.tx_bytes)
            ));
        }
        (None, Some(pending)) => out.push_str(&format!("  connection:     Pending ({pending})\n")),
        (None, None) => {
            out.push_str("  connection:     Connecting (no report from the gateway yet)\n")
        }
    }
    let row = |owner: &str, seen_by: &str, kind: connector::CidrKind, mapping: &CidrMapping| {
        let remapped = if mapping.is_remapped() { "yes" } else { "no" };
        vec![
            owner.to_owned(),
            kind.to_string(),
            mapping.real.clone(),
            seen_by.to_owned(),
            mapping.view.clone(),
            remapped.to_owned(),
        ]
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    rows.extend(
        link.local_cidrs
            .iter()
            .map(|(kind, m)| row("local", &link.peer.id, *kind, m)),
    );
    rows.extend(
        link.remote_cidrs
            .iter()
            .map(|(kind, m)| row(&link.peer.id, "local", *kind, m)),
    );
    if !rows.is_empty() {
        let table = render_table(
            &["OWNER", "KIND", "CIDR", "SEEN BY", "AS", "REMAPPED"],
            &rows,
        );
        push_indented(&mut out, &table);
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kubetun_crds::{ClusterRef, ConnectionState, ConnectionStatus};

    use super::*;

    #[test]
    fn a_rotation_table_names_the_unannounced_peers() {
        let report = RotationReport {
            cluster_id: "rome".into(),
            public_key: "NEW".into(),
            previous_public_key: Some("OLD".into()),
            resumed: true,
            complete: false,
            peers: vec![rotation::PeerRotation {
                peer_id: "europe".into(),
                propagation: rotation::Propagation::Missing,
                announced: false,
                moved: false,
                message: "pass --remote-kubeconfig".into(),
            }],
        };
        let table = render_rotation(&report);
        assert!(
            table.contains("europe") && table.contains("missing"),
            "{table}"
        );
        assert!(table.contains("rotation in progress"), "{table}");
    }
    use kubetun_controller::connector::CidrKind;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        Network(NetworkArgs),
    }

    fn parse(args: &[&str]) -> Result<NetworkCommand, clap::Error> {
        let mut argv = vec!["kubetun", "network"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Top::Network(network) => network.command,
        })
    }

    #[test]
    fn connect_takes_both_clusters_wait_and_timeout() {
        let command = parse(&[
            "connect",
            "--kubeconfig",
            "rome.yaml",
            "--remote-kubeconfig",
            "milan.yaml",
            "--remote-namespace",
            "kt",
            "--wait",
            "--timeout",
            "5m",
            "--remote-endpoint",
            "198.51.100.7:31820",
        ])
        .unwrap();
        let NetworkCommand::Connect(args) = command else {
            panic!("expected connect, got {command:?}");
        };
        assert_eq!(
            args.local.kubeconfig.as_deref(),
            Some(std::path::Path::new("rome.yaml"))
        );
        assert_eq!(args.local.namespace, DEFAULT_NAMESPACE);
        assert_eq!(args.remote.remote_namespace, "kt");
        assert!(args.wait.wait);
        assert_eq!(args.wait.timeout, Duration::from_secs(300));
        assert_eq!(args.remote_endpoint.map(|e| e.port), Some(31820));
        assert!(args.remote.given());
    }

    #[test]
    fn connect_isolation_parses_and_is_absent_by_default() {
        let connect = |extra: &[&str]| {
            let mut args = vec!["connect", "--remote-context", "milan"];
            args.extend_from_slice(extra);
            match parse(&args).unwrap() {
                NetworkCommand::Connect(args) => args.isolation,
                other => panic!("expected connect, got {other:?}"),
            }
        };
        assert_eq!(connect(&[]), None);
        assert_eq!(connect(&["--isolation", "open"]), Some(Isolation::Open));
        assert_eq!(
            connect(&["--isolation", "exported"]),
            Some(Isolation::Exported)
        );
        let error = parse(&["connect", "--isolation", "closed"]).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("invalid value 'closed'"), "{text}");
        assert!(text.contains("expected `open` or `exported`"), "{text}");
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(parse(&["connect", "--timeout", "soon"]).is_err());
        assert!(parse(&["connect", "--mtu", "100"]).is_err());
        assert!(parse(&["connect", "--remote-endpoint", "nope"]).is_err());
        assert!(parse(&["teleport"]).is_err());
    }

    fn mapping(real: &str, view: &str) -> CidrMapping {
        CidrMapping {
            real: real.into(),
            view: view.into(),
        }
    }

    #[test]
    fn link_rendering_shows_views_state_and_traffic() {
        let link = LinkStatus {
            peer: ClusterRef {
                id: "milan".into(),
                name: "Milan".into(),
            },
            endpoint: Some(Endpoint {
                address: "192.0.2.3".into(),
                port: 51820,
            }),
            local_cidrs: vec![(CidrKind::Pod, mapping("10.202.0.0/16", "10.202.0.0/16"))],
            remote_cidrs: vec![
                (CidrKind::Pod, mapping("10.203.0.0/16", "10.203.0.0/16")),
                (CidrKind::External, mapping("10.70.0.0/16", "10.68.0.0/16")),
            ],
            connection: Some(ConnectionStatus {
                status: ConnectionState::Connected,
                latency: Some("1.2ms".into()),
                last_handshake: Some("2026-11-22T00:00:00Z".into()),
                rx_bytes: 2048,
                tx_bytes: 10,
                ..ConnectionStatus::default()
            }),
            pending: None,
            isolation: Some(Isolation::Exported),
        };
        let text = render_link(&link);
        assert!(
            text.contains(
                "isolation:      exported (milan reaches only the Services exported to it)"
            ),
            "{text}"
        );
        assert!(text.starts_with("Peer milan (Milan)\n"), "{text}");
        assert!(text.contains("endpoint:       192.0.2.3:51820"), "{text}");
        assert!(text.contains("connection:     Connected\n"), "{text}");
        assert!(text.contains("latency:        1.2ms"), "{text}");
        assert!(text.contains("rx 2.0 KiB, tx 10 B"), "{text}");
        let external = text.lines().find(|l| l.contains("external")).unwrap();
        let cells: Vec<&str> = external.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "milan",
                "external",
                "10.70.0.0/16",
                "local",
                "10.68.0.0/16",
                "yes"
            ]
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.trim_start().starts_with("local "))
                .count(),
            1
        );

        let pending = LinkStatus {
            connection: None,
            pending: Some("waiting for the peer to process our NetworkConfig".into()),
            local_cidrs: Vec::new(),
            remote_cidrs: Vec::new(),
            isolation: None,
            ..link
        };
        let text = render_link(&pending);
        assert!(!text.contains("isolation:"), "{text}");
        assert!(text.contains("Pending (waiting for the peer"), "{text}");
        assert!(!text.contains("OWNER"), "{text}");
    }
}
