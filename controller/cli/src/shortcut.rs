//! `kubetun shortcut create|delete|list`: manages ShortcutConnections on the hub. `create`
//! stores each leaf's kubeconfig (minified to one context, files inlined) in a Secret and
//! applies the ShortcutConnection; the hub's operator does the rest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::shortcut::{DEFAULT_SECRET_KEY, READY, SHORTCUT_LABEL, reason};
use kubetun_crds::{
    CidrMapping, Endpoint, Isolation, LeafCluster, SecretKeyRef, ShortcutConnection,
    ShortcutConnectionSpec, ShortcutPhase,
};
use tokio::time::Instant;

use super::{
    ConsoleProgress, Error, KubeconfigSource, minify_kubeconfig, parse_duration, parse_endpoint,
    push_indented, render_table,
};
use kubetun_controller::connector::Progress;
use kubetun_controller::plumbing::conditions;

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
        let source = KubeconfigSource {
            path: self.kubeconfig.clone(),
            context: self.context.clone(),
        };
        Ok(source.client("hub").await?)
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
    /// Let the hub carry the pair's traffic while the shortcut is down (both leaves must be
    /// linked to the hub).
    #[arg(long)]
    transit: bool,
    /// No tunnel between the leaves: they reach each other only through the hub, at the
    /// addresses a shortcut would give (implies --transit).
    #[arg(long)]
    hub_only: bool,
    /// Isolation of the shortcut, set on both leaves (spec.isolation): `exported`, each leaf
    /// reaches only the endpoints of the Services the other exports to it and the replies to
    /// connections it opened; `open`, every pod and external address. Default: what the
    /// shortcut has; on a new one, each leaf's cluster default (`kubetun install
    /// --isolation`). Re-run create with another value to change it in place.
    #[arg(long, value_name = "open|exported", value_parser = crate::install::isolation::parse_isolation)]
    isolation: Option<Isolation>,
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
    #[command(flatten)]
    output: super::output::OutputArgs,
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
                        error: Box::new(source),
                    })?;
            let machine = super::output::ShortcutListOutput::new(&shortcuts.items);
            if let Some(text) = super::output::render(args.output.format, &machine)? {
                print!("{text}");
            } else if shortcuts.items.is_empty() {
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
        error: Box::new(source),
    }
}

/// Reads a leaf's kubeconfig file and makes it self-contained (one context, files inlined).
fn read_kubeconfig(leaf: &str, file: &Path, context: Option<&str>) -> Result<String, Error> {
    let fail = |reason: String| {
        Error::Kubeconfig(super::KubeconfigError {
            cluster: leaf.to_owned(),
            source_desc: file.display().to_string(),
            reason,
        })
    };
    let yaml = std::fs::read_to_string(file).map_err(|e| fail(e.to_string()))?;
    let base_dir = file.parent().unwrap_or(Path::new("."));
    minify_kubeconfig(&yaml, context, base_dir, &|path| std::fs::read(path)).map_err(fail)
}

/// One leaf of a [`ShortcutRequest`].
#[derive(Debug, Clone)]
pub struct LeafRequest {
    /// Name of the leaf.
    pub name: String,
    /// Namespace kubetun runs in on the leaf.
    pub namespace: String,
    /// Endpoint override of the leaf's gateway.
    pub endpoint: Option<Endpoint>,
    /// Self-contained kubeconfig of the leaf.
    pub kubeconfig: String,
}

/// What `shortcut create` puts on the hub.
#[derive(Debug, Clone)]
pub struct ShortcutRequest {
    /// Name of the ShortcutConnection.
    pub name: String,
    /// Hub namespace of the ShortcutConnection and the Secrets.
    pub namespace: String,
    /// First leaf.
    pub left: LeafRequest,
    /// Second leaf.
    pub right: LeafRequest,
    /// Tunnel MTU.
    pub mtu: Option<u32>,
    /// Fallback through the hub ([`ShortcutConnectionSpec::transit`]).
    pub transit: bool,
    /// Only through the hub ([`ShortcutConnectionSpec::hub_only`]; sets `transit` too).
    pub hub_only: bool,
    /// Isolation of both leaves towards each other ([`ShortcutConnectionSpec::isolation`];
    /// `None`: each leaf's cluster default).
    pub isolation: Option<Isolation>,
}

impl ShortcutRequest {
    fn spec(&self) -> ShortcutConnectionSpec {
        let leaf = |leaf: &LeafRequest| LeafCluster {
            name: leaf.name.clone(),
            kubeconfig_secret: SecretKeyRef {
                name: secret_name(&self.name, &leaf.name),
                key: None,
            },
            namespace: Some(leaf.namespace.clone()),
            endpoint_override: leaf.endpoint.clone(),
        };
        ShortcutConnectionSpec {
            left: leaf(&self.left),
            right: leaf(&self.right),
            mtu: self.mtu,
            transit: self.transit || self.hub_only,
            hub_only: self.hub_only,
            isolation: self.isolation,
        }
    }
}

/// Applies the two kubeconfig Secrets, then the ShortcutConnection (a request without an
/// isolation keeps the existing shortcut's), then makes it the Secrets' owner (so a garbage collector, where one runs, removes them with it; the hub's
/// operator deletes them itself too). Secrets first: the operator starts on the
/// ShortcutConnection at once and would otherwise find its Secrets missing. Writes only what
/// differs, and refuses to overwrite a Secret of the same name that belongs to something
/// else before writing anything.
pub async fn apply_shortcut(
    hub: &kube::Client,
    request: &ShortcutRequest,
    progress: &dyn Progress,
) -> Result<ShortcutConnection, Error> {
    let namespace = &request.namespace;
    if request.left.name == request.right.name {
        return Err(Error::Usage(format!(
            "both leaves are named {:?}: a shortcut links two different leaves",
            request.left.name
        )));
    }
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), namespace);
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(hub.clone(), namespace);
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let object = format!("ShortcutConnection {namespace}/{}", request.name);

    let mut spec = request.spec();
    let existing = shortcuts
        .get_opt(&request.name)
        .await
        .map_err(hub_error(format!("get {object}")))?;
    // Without --isolation an existing shortcut keeps its own: a re-run must not widen or
    // narrow what the leaves reach.
    if spec.isolation.is_none() {
        spec.isolation = existing.as_ref().and_then(|sc| sc.spec.isolation);
    }
    let owner_before = existing
        .as_ref()
        .and_then(|sc| sc.controller_owner_ref(&()));

    let mut current_secrets = Vec::new();
    for leaf in [&request.left, &request.right] {
        let name = secret_name(&request.name, &leaf.name);
        let current = secrets
            .get_opt(&name)
            .await
            .map_err(hub_error(format!("get Secret {namespace}/{name}")))?;
        if let Some(current) = &current
            && current.labels().get(SHORTCUT_LABEL) != Some(&request.name)
        {
            return Err(Error::Usage(format!(
                "Secret {namespace}/{name} exists but does not belong to shortcut {} (label \
                 {SHORTCUT_LABEL} missing): delete or rename it",
                request.name
            )));
        }
        current_secrets.push(current);
    }
    let current_secrets = write_secrets(
        &secrets,
        request,
        current_secrets,
        owner_before.as_ref(),
        progress,
        true,
    )
    .await?;

    let shortcut = match existing {
        Some(current) if current.spec == spec => {
            progress.done("hub", &format!("{object} up to date"));
            current
        }
        current => {
            let mut desired = ShortcutConnection::new(&request.name, spec);
            desired.metadata.namespace = Some(namespace.clone());
            let applied = shortcuts
                .patch(&request.name, &apply, &Patch::Apply(&desired))
                .await
                .map_err(hub_error(format!("apply {object}")))?;
            let verb = if current.is_some() {
                "updated"
            } else {
                "created"
            };
            progress.done("hub", &format!("{verb} {object}"));
            applied
        }
    };
    let owner = shortcut.controller_owner_ref(&());
    if owner != owner_before {
        write_secrets(
            &secrets,
            request,
            current_secrets,
            owner.as_ref(),
            progress,
            false,
        )
        .await?;
    }
    Ok(shortcut)
}

/// Applies both leaves' kubeconfig Secrets (owned by `owner`) where they differ from
/// `current`; returns them as written. `report` prints a line per Secret.
async fn write_secrets(
    secrets: &Api<Secret>,
    request: &ShortcutRequest,
    current: Vec<Option<Secret>>,
    owner: Option<&OwnerReference>,
    progress: &dyn Progress,
    report: bool,
) -> Result<Vec<Option<Secret>>, Error> {
    let namespace = &request.namespace;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let mut written = Vec::new();
    for (leaf, current) in [&request.left, &request.right].into_iter().zip(current) {
        let name = secret_name(&request.name, &leaf.name);
        let secret_object = format!("Secret {namespace}/{name}");
        let desired = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                labels: Some(BTreeMap::from([(
                    SHORTCUT_LABEL.to_owned(),
                    request.name.clone(),
                )])),
                owner_references: owner.map(|o| vec![o.clone()]),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(BTreeMap::from([(
                DEFAULT_SECRET_KEY.to_owned(),
                ByteString(leaf.kubeconfig.clone().into_bytes()),
            )])),
            ..Secret::default()
        };
        if let Some(current) = &current
            && current.data == desired.data
            && current.metadata.owner_references == desired.metadata.owner_references
        {
            if report {
                progress.done(
                    "hub",
                    &format!("kubeconfig of {} in {secret_object} up to date", leaf.name),
                );
            }
            written.push(Some(current.clone()));
            continue;
        }
        let applied = secrets
            .patch(&name, &apply, &Patch::Apply(&desired))
            .await
            .map_err(hub_error(format!("apply {secret_object}")))?;
        if report {
            progress.done(
                "hub",
                &format!("stored the kubeconfig of {} in {secret_object}", leaf.name),
            );
        }
        written.push(Some(applied));
    }
    Ok(written)
}

async fn create(args: CreateArgs) -> Result<(), Error> {
    let progress = ConsoleProgress::stdout();
    let namespace = &args.hub.namespace;
    let request = ShortcutRequest {
        name: args.name.clone(),
        namespace: namespace.clone(),
        left: LeafRequest {
            kubeconfig: read_kubeconfig(
                &args.left_name,
                &args.left_kubeconfig,
                args.left_context.as_deref(),
            )?,
            name: args.left_name.clone(),
            namespace: args.left_namespace.clone(),
            endpoint: args.left_endpoint.clone(),
        },
        right: LeafRequest {
            kubeconfig: read_kubeconfig(
                &args.right_name,
                &args.right_kubeconfig,
                args.right_context.as_deref(),
            )?,
            name: args.right_name.clone(),
            namespace: args.right_namespace.clone(),
            endpoint: args.right_endpoint.clone(),
        },
        mtu: args.mtu,
        transit: args.transit,
        hub_only: args.hub_only,
        isolation: args.isolation,
    };
    let client = args.hub.client().await?;
    apply_shortcut(&client, &request, &progress).await?;
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(client, namespace);

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
    // A watch of this one object: the answer arrives when the operator writes it.
    let changes = kube::runtime::watcher(
        shortcuts.clone(),
        kube::runtime::watcher::Config::default().fields(&format!("metadata.name={}", args.name)),
    );
    let changes = kube::runtime::WatchStreamExt::applied_objects(
        kube::runtime::WatchStreamExt::default_backoff(changes),
    );
    futures::pin_mut!(changes);
    let mut current = shortcuts
        .get_opt(&args.name)
        .await
        .map_err(hub_error(format!(
            "get ShortcutConnection {namespace}/{}",
            args.name
        )))?;
    loop {
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
        let next = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut changes)).await;
        match next {
            Ok(Some(Ok(object))) => current = Some(object),
            // Watch errors are retried with backoff inside the stream.
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => {
                let last = ready.map_or_else(
                    || "no status yet: is the operator running on the hub (--hub)?".to_owned(),
                    |c| c.message.clone(),
                );
                progress.failed("hub", &format!("timed out; last state: {last}"));
                return Err(Error::Timeout {
                    what,
                    timeout: args.timeout,
                });
            }
        }
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

/// A shortcut's isolation as `shortcut list` shows it: `open`, `exported`, or `default`
/// (each leaf's cluster default).
pub fn isolation_cell(isolation: Option<Isolation>) -> String {
    isolation.map_or_else(|| "default".to_owned(), |i| i.as_str().to_owned())
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
                sc.spec.paths().to_owned(),
                isolation_cell(sc.spec.isolation),
                format!("{:?}", status.phase),
                message,
            ]
        })
        .collect();
    let mut out = render_table(
        &[
            "NAMESPACE",
            "NAME",
            "LEFT",
            "RIGHT",
            "PATHS",
            "ISOLATION",
            "PHASE",
            "MESSAGE",
        ],
        &summary,
    );
    for sc in shortcuts {
        let Some(status) = &sc.status else { continue };
        let mut rows = Vec::new();
        for direction in &status.directions {
            let connection = direction
                .connection
                .map_or_else(|| "-".to_owned(), |c| c.to_string());
            let path = match (&direction.path, &direction.path_changed) {
                (Some(path), Some(since)) => format!("{path} since {since}"),
                (Some(path), None) => path.to_string(),
                (None, _) => "-".to_owned(),
            };
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
                        path.clone(),
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
            &[
                "FROM", "SEES", "KIND", "CIDR", "AS", "REMAPPED", "TUNNEL", "PATH",
            ],
            &rows,
        );
        push_indented(&mut out, &table);
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

    /// `kubetun shortcut create rome-milan` between rome and milan, with `extra` flags.
    fn parse_create(extra: &[&str]) -> Box<CreateArgs> {
        let mut argv = vec![
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
        ];
        argv.extend(extra);
        let cli = Cli::try_parse_from(argv).unwrap();
        let Top::Shortcut(ShortcutArgs {
            command: ShortcutCommand::Create(args),
        }) = cli.command
        else {
            panic!("expected shortcut create");
        };
        args
    }

    #[test]
    fn create_takes_both_leaves() {
        let args = parse_create(&["--right-endpoint", "198.51.100.9:31820", "--wait"]);
        assert_eq!(args.name, "rome-milan");
        assert_eq!(args.left_name, "rome");
        assert_eq!(args.right_namespace, DEFAULT_NAMESPACE);
        assert_eq!(args.right_endpoint.map(|e| e.port), Some(31820));
        assert!(args.left_endpoint.is_none());
        assert!(args.wait);
        assert_eq!(args.isolation, None);
        assert!(
            Cli::try_parse_from(["kubetun", "shortcut", "create", "x", "--left-name", "rome"])
                .is_err()
        );
    }

    #[test]
    fn create_isolation_lands_in_the_spec() {
        let args = parse_create(&["--isolation", "exported"]);
        assert_eq!(args.isolation, Some(Isolation::Exported));
        let leaf = |name: &str| LeafRequest {
            name: name.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            endpoint: None,
            kubeconfig: String::new(),
        };
        let mut request = ShortcutRequest {
            name: args.name,
            namespace: DEFAULT_NAMESPACE.into(),
            left: leaf("rome"),
            right: leaf("milan"),
            mtu: None,
            transit: false,
            hub_only: false,
            isolation: args.isolation,
        };
        assert_eq!(request.spec().isolation, Some(Isolation::Exported));
        request.isolation = None;
        assert_eq!(request.spec().isolation, None);
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
                    ..Default::default()
                },
                ShortcutDirection {
                    from: "milan".into(),
                    to: "rome".into(),
                    pod_cidrs: vec![mapping("10.202.0.0/16", "10.202.0.0/16")],
                    external_cidrs: vec![mapping("10.70.0.0/16", "10.68.0.0/16")],
                    connection: Some(ConnectionState::Connecting),
                    path: Some(kubetun_crds::ShortcutPath::ViaHub),
                    path_changed: Some("2026-11-25T21:00:00Z".into()),
                },
            ],
            ..ShortcutConnectionStatus::default()
        });
        let text = render_shortcuts(std::slice::from_ref(&sc));
        let summary = text.lines().nth(1).unwrap();
        assert_eq!(
            summary.split_whitespace().collect::<Vec<_>>(),
            [
                "kubetun-system",
                "rome-milan",
                "rome",
                "milan",
                "direct",
                "default",
                "Connected"
            ]
        );
        let mut exported = sc.clone();
        exported.spec.isolation = Some(Isolation::Exported);
        let text = render_shortcuts(&[exported]);
        assert_eq!(
            text.lines().nth(1).unwrap().split_whitespace().nth(5),
            Some("exported"),
            "{text}"
        );
        assert!(text.lines().next().unwrap().contains("ISOLATION"), "{text}");
        let mut hub_only = sc.clone();
        (hub_only.spec.transit, hub_only.spec.hub_only) = (true, true);
        let mut fallback = sc.clone();
        fallback.spec.transit = true;
        for (shortcut, paths) in [(hub_only, "hub-only"), (fallback, "direct+hub")] {
            let text = render_shortcuts(&[shortcut]);
            let summary = text.lines().nth(1).unwrap();
            assert_eq!(summary.split_whitespace().nth(4), Some(paths), "{text}");
        }
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
                "Connecting",
                "via",
                "hub",
                "since",
                "2026-11-25T21:00:00Z"
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
