//! `kubetun shortcut create|delete|list`: manages ShortcutConnections on the hub. `create`
//! stores each leaf's kubeconfig (minified to one context, files inlined) in a Secret and
//! applies the ShortcutConnection; the hub's operator does the rest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::{
    CidrMapping, Endpoint, LeafCluster, SecretKeyRef, ShortcutConnection, ShortcutConnectionSpec,
    ShortcutPhase,
};
use tokio::time::Instant;

use super::{
    ConsoleProgress, Error, KubeconfigSource, minify_kubeconfig, parse_duration, parse_endpoint,
    render_table,
};
use crate::cluster_info::DEFAULT_NAMESPACE;
use crate::conditions;
use crate::connector::Progress as _;
use crate::shortcut::{DEFAULT_SECRET_KEY, READY, SHORTCUT_LABEL, reason};

/// Field manager of the CLI's writes on the hub.
const FIELD_MANAGER: &str = "kubetun-cli";

/// `kubetun shortcut`.
#[derive(Debug, Args)]
pub struct ShortcutArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ShortcutCommand,
}

/// The `shortcut` subcommands.
#[derive(Debug, Subcommand)]
pub enum ShortcutCommand {
    /// Link two leaf clusters directly, managed from the hub.
    Create(Box<CreateArgs>),
    /// Remove a shortcut (the operator tears the link down on both leaves).
    Delete(DeleteArgs),
    /// Show every shortcut with how each leaf sees the other and the tunnel states.
    List(ListArgs),
}

/// Flags naming the hub.
#[derive(Debug, Clone, Args)]
pub struct HubArgs {
    /// Kubeconfig of the hub (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the hub kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace of the ShortcutConnection and the kubeconfig Secrets on the hub.
    #[arg(long, short = 'n', default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
}

impl HubArgs {
    async fn client(&self) -> Result<kube::Client, Error> {
        KubeconfigSource {
            path: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
        .client("hub")
        .await
    }
}

/// `shortcut create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Name of the ShortcutConnection.
    pub name: String,
    #[command(flatten)]
    hub: HubArgs,
    /// Name of the first leaf (shown in status and tables).
    #[arg(long)]
    left_name: String,
    /// Kubeconfig file of the first leaf.
    #[arg(long, value_name = "FILE")]
    left_kubeconfig: PathBuf,
    /// Context in the first leaf's kubeconfig (default: its current context).
    #[arg(long)]
    left_context: Option<String>,
    /// Namespace kubetun runs in on the first leaf.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    left_namespace: String,
    /// Endpoint the second leaf dials to reach the first leaf's gateway.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_endpoint)]
    left_endpoint: Option<Endpoint>,
    /// Name of the second leaf.
    #[arg(long)]
    right_name: String,
    /// Kubeconfig file of the second leaf.
    #[arg(long, value_name = "FILE")]
    right_kubeconfig: PathBuf,
    /// Context in the second leaf's kubeconfig.
    #[arg(long)]
    right_context: Option<String>,
    /// Namespace kubetun runs in on the second leaf.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    right_namespace: String,
    /// Endpoint the first leaf dials to reach the second leaf's gateway.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_endpoint)]
    right_endpoint: Option<Endpoint>,
    /// Tunnel MTU of the link.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1280..=9000))]
    mtu: Option<u32>,
    /// Wait until both tunnels are connected.
    #[arg(long)]
    wait: bool,
    /// Upper bound of the wait (e.g. 90s, 5m).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    timeout: Duration,
}

/// `shortcut delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Name of the ShortcutConnection.
    pub name: String,
    #[command(flatten)]
    hub: HubArgs,
    /// Wait until the link is removed from both leaves.
    #[arg(long)]
    wait: bool,
    /// Upper bound of the wait.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    timeout: Duration,
}

/// `shortcut list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    hub: HubArgs,
    /// Every namespace of the hub.
    #[arg(long, short = 'A')]
    all_namespaces: bool,
}

/// Runs a `shortcut` subcommand.
pub async fn run(args: ShortcutArgs) -> Result<(), Error> {
    match args.command {
        ShortcutCommand::Create(args) => create(*args).await,
        ShortcutCommand::Delete(args) => delete(args).await,
        ShortcutCommand::List(args) => {
            let client = args.hub.client().await?;
            let api: Api<ShortcutConnection> = if args.all_namespaces {
                Api::all(client)
            } else {
                Api::namespaced(client, &args.hub.namespace)
            };
            let shortcuts =
                api.list(&ListParams::default())
                    .await
                    .map_err(|source| Error::Api {
                        cluster: "hub".to_owned(),
                        action: "list ShortcutConnections".to_owned(),
                        source: Box::new(source),
                    })?;
            if shortcuts.items.is_empty() {
                println!("no shortcuts");
            } else {
                print!("{}", render_shortcuts(&shortcuts.items));
            }
            Ok(())
        }
    }
}

/// Name of the Secret holding a leaf's kubeconfig for shortcut `shortcut`.
pub fn secret_name(shortcut: &str, leaf: &str) -> String {
    format!("{shortcut}-{leaf}-kubeconfig")
}

fn hub_error(action: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api {
        cluster: "hub".to_owned(),
        action,
        source: Box::new(source),
    }
}

/// The kubeconfig Secret of one leaf, minified and self-contained.
fn kubeconfig_secret(
    shortcut: &str,
    namespace: &str,
    leaf: &str,
    file: &Path,
    context: Option<&str>,
) -> Result<Secret, Error> {
    let fail = |reason: String| Error::Kubeconfig {
        cluster: leaf.to_owned(),
        source_desc: file.display().to_string(),
        reason,
    };
    let yaml = std::fs::read_to_string(file).map_err(|e| fail(e.to_string()))?;
    let base_dir = file.parent().unwrap_or(Path::new("."));
    let minified =
        minify_kubeconfig(&yaml, context, base_dir, &|path| std::fs::read(path)).map_err(fail)?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(shortcut, leaf)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                SHORTCUT_LABEL.to_owned(),
                shortcut.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            DEFAULT_SECRET_KEY.to_owned(),
            ByteString(minified.into_bytes()),
        )])),
        ..Secret::default()
    })
}

async fn create(args: CreateArgs) -> Result<(), Error> {
    if args.left_name == args.right_name {
        return Err(Error::Usage(format!(
            "--left-name and --right-name are both {:?}: a shortcut links two different leaves",
            args.left_name
        )));
    }
    let progress = ConsoleProgress::stdout();
    let namespace = &args.hub.namespace;
    let client = args.hub.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(client, namespace);
    let apply = PatchParams::apply(FIELD_MANAGER).force();

    let leaves = [
        (
            &args.left_name,
            &args.left_kubeconfig,
            args.left_context.as_deref(),
        ),
        (
            &args.right_name,
            &args.right_kubeconfig,
            args.right_context.as_deref(),
        ),
    ];
    let mut secret_names = Vec::new();
    for (leaf, file, context) in leaves {
        let secret = kubeconfig_secret(&args.name, namespace, leaf, file, context)?;
        let name = secret.name_any();
        secrets
            .patch(&name, &apply, &Patch::Apply(&secret))
            .await
            .map_err(hub_error(format!("apply Secret {namespace}/{name}")))?;
        progress.done(
            "hub",
            &format!("stored the kubeconfig of {leaf} in Secret {namespace}/{name}"),
        );
        secret_names.push(name);
    }

    let leaf = |name: &str, namespace: &str, endpoint: &Option<Endpoint>| LeafCluster {
        name: name.to_owned(),
        kubeconfig_secret: SecretKeyRef {
            name: secret_name(&args.name, name),
            key: None,
        },
        namespace: Some(namespace.to_owned()),
        endpoint_override: endpoint.clone(),
    };
    let mut shortcut = ShortcutConnection::new(
        &args.name,
        ShortcutConnectionSpec {
            left: leaf(&args.left_name, &args.left_namespace, &args.left_endpoint),
            right: leaf(
                &args.right_name,
                &args.right_namespace,
                &args.right_endpoint,
            ),
            mtu: args.mtu,
        },
    );
    shortcut.metadata.namespace = Some(namespace.clone());
    let applied = shortcuts
        .patch(&args.name, &apply, &Patch::Apply(&shortcut))
        .await
        .map_err(hub_error(format!(
            "apply ShortcutConnection {namespace}/{}",
            args.name
        )))?;
    progress.done(
        "hub",
        &format!("applied ShortcutConnection {namespace}/{}", args.name),
    );

    if let Some(owner) = applied.controller_owner_ref(&()) {
        for name in &secret_names {
            let patch = serde_json::json!({ "metadata": { "ownerReferences": [owner] } });
            secrets
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(hub_error(format!(
                    "set the owner of Secret {namespace}/{name}"
                )))?;
        }
    }

    if !args.wait {
        println!(
            "shortcut {} created; `kubetun shortcut list` shows its progress",
            args.name
        );
        return Ok(());
    }
    let what = format!("shortcut {} to connect", args.name);
    progress.waiting("hub", &format!("waiting for {what}"));
    let deadline = Instant::now() + args.timeout;
    loop {
        let current = shortcuts
            .get_opt(&args.name)
            .await
            .map_err(hub_error(format!(
                "get ShortcutConnection {namespace}/{}",
                args.name
            )))?;
        let status = current.as_ref().and_then(|s| s.status.as_ref());
        let ready = status.and_then(|s| conditions::find(&s.conditions, READY));
        match (status.map(|s| s.phase), ready) {
            (Some(ShortcutPhase::Connected), _) => {
                progress.waited("hub", &format!("shortcut {} connected", args.name));
                if let Some(current) = current {
                    print!("{}", render_shortcuts(std::slice::from_ref(&current)));
                }
                return Ok(());
            }
            (Some(ShortcutPhase::Error), Some(ready)) if ready.reason == reason::REJECTED => {
                progress.failed("hub", &ready.message);
                return Err(Error::Usage(format!(
                    "shortcut {} failed: {}",
                    args.name, ready.message
                )));
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            let last = ready.map_or_else(
                || "no status yet: is the operator running on the hub?".to_owned(),
                |c| c.message.clone(),
            );
            progress.failed("hub", &format!("timed out; last state: {last}"));
            return Err(Error::Timeout {
                what,
                timeout: args.timeout,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn delete(args: DeleteArgs) -> Result<(), Error> {
    let progress = ConsoleProgress::stdout();
    let namespace = &args.hub.namespace;
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(args.hub.client().await?, namespace);
    let object = format!("ShortcutConnection {namespace}/{}", args.name);
    shortcuts
        .delete(&args.name, &DeleteParams::default())
        .await
        .map_err(hub_error(format!("delete {object}")))?;
    progress.done("hub", &format!("deletion of {object} requested"));
    if !args.wait {
        return Ok(());
    }
    let what = format!("the operator to remove the link of {object} from both leaves");
    progress.waiting("hub", &format!("waiting for {what}"));
    let deadline = Instant::now() + args.timeout;
    loop {
        let current = shortcuts
            .get_opt(&args.name)
            .await
            .map_err(hub_error(format!("get {object}")))?;
        let Some(current) = current else {
            progress.waited("hub", &format!("{object} removed"));
            return Ok(());
        };
        if Instant::now() >= deadline {
            let last = current
                .status
                .as_ref()
                .and_then(|s| conditions::find(&s.conditions, READY))
                .map_or_else(String::new, |c| format!(" (last state: {})", c.message));
            progress.failed("hub", &format!("timed out{last}"));
            return Err(Error::Timeout {
                what,
                timeout: args.timeout,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Renders a summary table of shortcuts, then each shortcut's directions.
pub fn render_shortcuts(shortcuts: &[ShortcutConnection]) -> String {
    let summary: Vec<Vec<String>> = shortcuts
        .iter()
        .map(|sc| {
            let status = sc.status.clone().unwrap_or_default();
            let message = conditions::find(&status.conditions, READY)
                .map_or_else(String::new, |c| c.message.clone());
            vec![
                sc.namespace().unwrap_or_default(),
                sc.name_any(),
                sc.spec.left.name.clone(),
                sc.spec.right.name.clone(),
                format!("{:?}", status.phase),
                message,
            ]
        })
        .collect();
    let mut out = render_table(
        &["NAMESPACE", "NAME", "LEFT", "RIGHT", "PHASE", "MESSAGE"],
        &summary,
    );
    for sc in shortcuts {
        let Some(status) = &sc.status else { continue };
        let mut rows = Vec::new();
        for direction in &status.directions {
            let connection = direction
                .connection
                .map_or_else(|| "-".to_owned(), |c| c.to_string());
            let kinds = [
                ("pod", &direction.pod_cidrs),
                ("external", &direction.external_cidrs),
            ];
            for (kind, mappings) in kinds {
                for CidrMapping { real, view } in mappings {
                    let remapped = if real == view { "no" } else { "yes" };
                    rows.push(vec![
                        direction.from.clone(),
                        direction.to.clone(),
                        kind.to_owned(),
                        real.clone(),
                        view.clone(),
                        remapped.to_owned(),
                        connection.clone(),
                    ]);
                }
            }
        }
        if rows.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "\n{} ({} <-> {}):\n",
            sc.name_any(),
            sc.spec.left.name,
            sc.spec.right.name
        ));
        let table = render_table(
            &["FROM", "SEES", "KIND", "CIDR", "AS", "REMAPPED", "TUNNEL"],
            &rows,
        );
        for line in table.lines() {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kubetun_crds::{ConnectionState, ShortcutConnectionStatus, ShortcutDirection};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        Shortcut(ShortcutArgs),
    }

    #[test]
    fn create_takes_both_leaves() {
        let cli = Cli::try_parse_from([
            "kubetun",
            "shortcut",
            "create",
            "rome-milan",
            "--left-name",
            "rome",
            "--left-kubeconfig",
            "rome.yaml",
            "--right-name",
            "milan",
            "--right-kubeconfig",
            "milan.yaml",
            "--right-endpoint",
            "198.51.100.9:31820",
            "--wait",
        ])
        .unwrap();
        let Top::Shortcut(ShortcutArgs {
            command: ShortcutCommand::Create(args),
        }) = cli.command
        else {
            panic!("expected shortcut create");
        };
        assert_eq!(args.name, "rome-milan");
        assert_eq!(args.left_name, "rome");
        assert_eq!(args.right_namespace, DEFAULT_NAMESPACE);
        assert_eq!(args.right_endpoint.map(|e| e.port), Some(31820));
        assert!(args.left_endpoint.is_none());
        assert!(args.wait);
        assert!(
            Cli::try_parse_from(["kubetun", "shortcut", "create", "x", "--left-name", "rome"])
                .is_err()
        );
    }

    #[test]
    fn listing_shows_each_direction_with_its_views() {
        let mut sc = ShortcutConnection::new("rome-milan", ShortcutConnectionSpec::default());
        sc.metadata.namespace = Some("kubetun-system".into());
        sc.spec.left.name = "rome".into();
        sc.spec.right.name = "milan".into();
        let mapping = |real: &str, view: &str| CidrMapping {
            real: real.into(),
            view: view.into(),
        };
        sc.status = Some(ShortcutConnectionStatus {
            phase: ShortcutPhase::Connected,
            directions: vec![
                ShortcutDirection {
                    from: "rome".into(),
                    to: "milan".into(),
                    pod_cidrs: vec![mapping("10.203.0.0/16", "10.203.0.0/16")],
                    external_cidrs: vec![mapping("10.70.0.0/16", "10.68.0.0/16")],
                    connection: Some(ConnectionState::Connected),
                },
                ShortcutDirection {
                    from: "milan".into(),
                    to: "rome".into(),
                    pod_cidrs: vec![mapping("10.202.0.0/16", "10.202.0.0/16")],
                    external_cidrs: vec![mapping("10.70.0.0/16", "10.68.0.0/16")],
                    connection: Some(ConnectionState::Connecting),
                },
            ],
            ..ShortcutConnectionStatus::default()
        });
        let text = render_shortcuts(&[sc]);
        let summary = text.lines().nth(1).unwrap();
        assert_eq!(
            summary.split_whitespace().collect::<Vec<_>>(),
            ["kubetun-system", "rome-milan", "rome", "milan", "Connected"]
        );
        assert!(text.contains("rome-milan (rome <-> milan):"), "{text}");
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("milan") && l.contains("external"))
            .unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            [
                "milan",
                "rome",
                "external",
                "10.70.0.0/16",
                "10.68.0.0/16",
                "yes",
                "Connecting"
            ]
        );
    }

    #[test]
    fn secret_names_are_per_shortcut_and_leaf() {
        assert_eq!(
            secret_name("rome-milan", "rome"),
            "rome-milan-rome-kubeconfig"
        );
    }
}
