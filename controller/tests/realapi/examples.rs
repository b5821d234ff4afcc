//! Every file in `deploy/examples/`, applied to a real API server while `kubetun-controller`
//! runs as deployed (the hub Europe of `deploy/config.yaml`, as the ServiceAccount of
//! `deploy/rbac.yaml`, a fake gateway): each object is acted on or says why not, never
//! nothing. A new example is covered by the generic rule without touching this test:
//!
//! - an object that is gone was removed by the controller, and an Event on it says why;
//! - a NetworkID (no status: a lock) has an Event from the controller, unless its Network holds it;
//! - any other object has conditions for its current generation, each with an UpperCamelCase
//!   reason and a readable message, and when none of them is True (nothing was done), a
//!   Warning Event with one of their reasons.
//!
//! The known examples must also do what their comments say (from-rome processed, both
//! Networks Ready, ...), the shipped example's unlabelled form gets a condition naming the
//! labels and name it needs, and a controller that is not the hub marks ShortcutConnections
//! `NotHub`. No condition or Event carries the ServiceAccount token or the gateway's private
//! key.

use crate::realapi_support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kubetun_controller_testing::FakeGateway;
use kubetun_testenv::TestCluster;
use realapi_support::{NAMESPACE, repo_root};
use serde_json::Value;

/// How long the objects may take to settle after the last apply.
const SETTLE: Duration = Duration::from_secs(30);

/// One object of an example file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Applied {
    kind: String,
    name: String,
    /// `None` for cluster-scoped kinds.
    namespace: Option<String>,
    file: String,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.kind, self.name, self.file)
    }
}

/// The API resource of a kubetun kind.
fn resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "NetworkConfig" => "networkconfigs",
        "TunnelEndpoint" => "tunnelendpoints",
        "ShortcutConnection" => "shortcutconnections",
        "Network" => "networks",
        "NetworkID" => "networkids",
        other => panic!("an example of unknown kind {other}: teach this test its plural"),
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("net.kubetun.io", "v1alpha1", kind),
        plural,
    )
}

fn api(client: &kube::Client, object: &Applied) -> Api<DynamicObject> {
    let resource = resource(&object.kind);
    match &object.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// The documents of `file`, each with its kind, name and namespace.
fn objects_of(file: &Path) -> Vec<(Applied, Value)> {
    let text = std::fs::read_to_string(file).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|doc: &Value| !doc.is_null())
        .map(|doc| {
            let kind = doc["kind"].as_str().unwrap().to_owned();
            let cluster_scoped = kind == "NetworkID";
            let applied = Applied {
                name: doc["metadata"]["name"].as_str().unwrap().to_owned(),
                namespace: (!cluster_scoped).then(|| {
                    doc["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or(NAMESPACE)
                        .to_owned()
                }),
                kind,
                file: file.file_name().unwrap().to_string_lossy().into_owned(),
            };
            (applied, doc)
        })
        .collect()
}

/// Every example file, sorted.
fn example_files() -> Vec<PathBuf> {
    let dir = repo_root().join("deploy/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

fn apply_file(cluster: &TestCluster, path: &Path) {
    cluster
        .kubectl(&["apply", "-f", path.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("kubectl apply -f {}: {e}", path.display()));
}

/// Writes `doc` as YAML into the cluster's directory and applies it.
fn apply_value(cluster: &TestCluster, name: &str, doc: &Value) {
    let path = cluster.dir().join(format!("{name}.yaml"));
    std::fs::write(&path, serde_yaml::to_string(doc).unwrap()).unwrap();
    apply_file(cluster, &path);
}

/// Every Event about kubetun objects (namespaced ones live in their namespace, cluster-scoped
/// ones in `default`).
async fn events(client: &kube::Client) -> Vec<Event> {
    let mut all = Vec::new();
    for ns in [NAMESPACE, "default"] {
        let api: Api<Event> = Api::namespaced(client.clone(), ns);
        all.extend(api.list(&ListParams::default()).await.unwrap().items);
    }
    all
}

fn events_about<'a>(events: &'a [Event], object: &Applied) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some(object.kind.as_str())
                    && r.name.as_deref() == Some(object.name.as_str())
            })
        })
        .collect()
}

fn upper_camel_case(reason: &str) -> bool {
    reason
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_uppercase())
        && reason.chars().all(|c| c.is_ascii_alphanumeric())
}

/// A message a person can act on: a sentence, not a code (a True condition's may be short,
/// "1 peering ready").
fn readable(message: &str) -> bool {
    message.len() >= 20 && message.contains(' ')
}

/// What the controller made of one object: `Ok` with a one-line summary once it was acted on
/// or explained itself, `Err` with what is missing.
fn verdict(
    object: &Applied,
    found: Option<&DynamicObject>,
    events: &[Event],
) -> Result<String, String> {
    let about = events_about(events, object);
    let explained_by_event = |wanted: &dyn Fn(&str) -> bool| {
        about.iter().find_map(|e| {
            let reason = e.reason.as_deref().unwrap_or_default();
            let note = e.note.as_deref().unwrap_or_default();
            (wanted(reason) && upper_camel_case(reason) && readable(note))
                .then(|| format!("Event {reason}: {note}"))
        })
    };
    let Some(found) = found else {
        return explained_by_event(&|_| true)
            .map(|e| format!("removed; {e}"))
            .ok_or_else(|| "gone without an Event saying why".to_owned());
    };
    if object.kind == "NetworkID" {
        return explained_by_event(&|_| true)
            .ok_or_else(|| "no Event about it (a NetworkID has no status)".to_owned());
    }
    let generation = found.metadata.generation;
    let conditions = found.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if conditions.is_empty() {
        return Err("no conditions".to_owned());
    }
    let mut summary = Vec::new();
    let mut false_reasons = Vec::new();
    let mut any_true = false;
    for c in &conditions {
        let type_ = c["type"].as_str().unwrap_or_default();
        let status = c["status"].as_str().unwrap_or_default();
        let reason = c["reason"].as_str().unwrap_or_default();
        let message = c["message"].as_str().unwrap_or_default();
        if c["observedGeneration"].as_i64() != generation {
            return Err(format!(
                "condition {type_} is for generation {}, the object is at {generation:?}",
                c["observedGeneration"]
            ));
        }
        let said = if status == "True" {
            message.trim().contains(' ')
        } else {
            readable(message)
        };
        if !upper_camel_case(reason) || !said {
            return Err(format!(
                "condition {type_}: reason {reason:?}, message {message:?}"
            ));
        }
        any_true |= status == "True";
        if status == "False" {
            false_reasons.push(reason.to_owned());
        }
        summary.push(format!("{type_}={status} {reason}: {message}"));
    }
    if !any_true {
        let event = explained_by_event(&|reason| false_reasons.iter().any(|r| r == reason))
            .ok_or_else(|| {
                format!(
                    "nothing done ({}) and no Warning Event with its reason",
                    summary.join("; ")
                )
            })?;
        summary.push(event);
    }
    Ok(summary.join("; "))
}

fn condition<'a>(found: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    found.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// `(status, reason, message)` of condition `type_`.
fn condition_of(found: Option<&DynamicObject>, type_: &str) -> Option<(String, String, String)> {
    let c = condition(found?, type_)?;
    let field = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((field("status"), field("reason"), field("message")))
}

/// What each example (and the unlabelled NetworkConfig) must come to besides the generic rule.
fn expectation(
    object: &Applied,
    found: Option<&DynamicObject>,
    events: &[Event],
) -> Result<(), String> {
    let is = |kind: &str, name: &str| object.kind == kind && object.name == name;
    let reason_of = |type_: &str| condition_of(found, type_).map(|(s, r, _)| (s, r));
    let pair = |s: &str, r: &str| Some((s.to_owned(), r.to_owned()));
    let ok = |cond: bool, what: &str| if cond { Ok(()) } else { Err(what.to_owned()) };
    if is("NetworkConfig", "from-rome") {
        ok(
            reason_of("Processed") == pair("True", "Processed"),
            "from-rome processed",
        )
    } else if is("NetworkConfig", "rome") {
        let (status, reason, message) = condition_of(found, "Processed").unwrap_or_default();
        ok(
            status == "False"
                && reason == "MissingLabels"
                && message.contains("from-rome")
                && message.contains("net.kubetun.io/role=remote")
                && message.contains("net.kubetun.io/peer=rome"),
            "unlabelled: Processed=False MissingLabels naming from-rome and both labels",
        )
    } else if object.kind == "Network" {
        let id = found.and_then(|f| f.data["status"]["id"].as_str().map(str::to_owned));
        ok(
            reason_of("IDAllocated") == pair("True", "Allocated")
                && reason_of("PeeringsReady") == pair("True", "PeeringsReady")
                && (object.name != "rome-payments" || id.as_deref() == Some("4242")),
            "an ID (4242 as pinned for rome-payments) and every peering Ready",
        )
    } else if object.kind == "ShortcutConnection" {
        let (status, reason, message) = condition_of(found, "LeafReachable").unwrap_or_default();
        ok(
            status == "False" && reason == "KubeconfigMissing" && message.contains("-kubeconfig"),
            "LeafReachable=False KubeconfigMissing naming the Secret",
        )
    } else if is("TunnelEndpoint", "rome") {
        ok(
            found.is_none()
                && events_about(events, object)
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("NotManaged")),
            "removed with a NotManaged Event",
        )
    } else if object.kind == "NetworkID" {
        ok(
            events_about(events, object)
                .iter()
                .any(|e| e.reason.as_deref() == Some("Orphaned")),
            "an Orphaned Event",
        )
    } else {
        Ok(())
    }
}

/// Polls until every object passes [`verdict`] and [`expectation`]; returns the verdicts.
async fn settle(client: &kube::Client, objects: &[Applied]) -> BTreeMap<Applied, String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let events = events(client).await;
        let mut verdicts = BTreeMap::new();
        let mut missing = Vec::new();
        for object in objects {
            let found = api(client, object).get_opt(&object.name).await.unwrap();
            match verdict(object, found.as_ref(), &events)
                .and_then(|v| expectation(object, found.as_ref(), &events).map(|()| v))
            {
                Ok(v) => {
                    verdicts.insert(object.clone(), v);
                }
                Err(why) => missing.push(format!("{object}: {why}")),
            }
        }
        if missing.is_empty() {
            return verdicts;
        }
        assert!(
            Instant::now() < deadline,
            "after {SETTLE:?}, not every object is acted on or says why:\n{}",
            missing.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A running `kubetun-controller`, killed on drop.
fn controller(env: &BTreeMap<String, String>, kubeconfig: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kubetun-controller"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_clear()
        .envs(env)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Values no condition or Event may contain: the ServiceAccount token and the gateway keys.
async fn secrets(client: &kube::Client, kubeconfig: &Path) -> Vec<String> {
    let config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
    let token = config["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut values = vec![token];
    let keys: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret = keys.get("kubetun-gateway-key").await.unwrap();
    for (name, value) in secret.data.unwrap_or_default() {
        if name.contains("rivate") {
            values.push(String::from_utf8(value.0).unwrap().trim().to_owned());
        }
    }
    assert!(values.len() >= 2, "the token and the private key");
    values
}

/// Every condition message and Event note about kubetun objects.
async fn everything_said(client: &kube::Client, objects: &[Applied]) -> String {
    let mut said = String::new();
    for object in objects {
        if let Some(found) = api(client, object).get_opt(&object.name).await.unwrap() {
            writeln!(said, "{}", found.data["status"]).unwrap();
        }
    }
    for event in events(client).await {
        writeln!(said, "{}", event.note.unwrap_or_default()).unwrap();
    }
    said
}

#[tokio::test]
async fn every_example_is_acted_on_or_says_why() {
    let started = Instant::now();
    let Some([cluster]) = realapi_support::clusters(["examples"]).await else {
        return;
    };
    let root = repo_root();
    for file in ["deploy/rbac.yaml", "deploy/config.yaml"] {
        apply_file(&cluster, &root.join(file));
    }
    let client = cluster.client().await.unwrap();
    let mut env: BTreeMap<String, String> = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get("kubetun-controller-config")
        .await
        .unwrap()
        .data
        .unwrap();
    // Europe is the hub the ShortcutConnection examples are written for.
    env.insert("KUBETUN_HUB".into(), "true".into());
    // On this host, not in a pod: DNS on a free port.
    env.insert("KUBETUN_DNS_ADDR".into(), "127.0.0.1:0".into());
    let socket = cluster.dir().join("gateway.grpc.sock");
    env.insert(
        "KUBETUN_GATEWAY_SOCKET".into(),
        socket.display().to_string(),
    );
    let gateway = FakeGateway::start_at(&socket).await.unwrap();
    let kubeconfig = cluster
        .service_account_kubeconfig(NAMESPACE, "kubetun-controller")
        .await
        .unwrap();
    let mut hub = controller(&env, &kubeconfig);
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.current().is_none() {
        assert!(
            Instant::now() < deadline,
            "the controller never applied to its gateway"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = started.elapsed();

    let mut objects = Vec::new();
    for file in example_files() {
        apply_file(&cluster, &file);
        objects.extend(objects_of(&file).into_iter().map(|(object, _)| object));
    }
    // The defect this test was written for: the shipped example as it used to be, named
    // after the peer and without the role/peer labels.
    let (mut unlabelled_object, mut unlabelled) =
        objects_of(&root.join("deploy/examples/networkconfig.yaml"))
            .into_iter()
            .find(|(o, _)| o.kind == "NetworkConfig")
            .unwrap();
    unlabelled["metadata"]["name"] = "rome".into();
    unlabelled["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    unlabelled_object.name = "rome".into();
    unlabelled_object.file = "networkconfig.yaml, unlabelled".into();
    apply_value(&cluster, "unlabelled-networkconfig", &unlabelled);
    objects.push(unlabelled_object);

    let verdicts = settle(&client, &objects).await;
    for (object, verdict) in &verdicts {
        println!("{object}: {verdict}");
    }
    let said = everything_said(&client, &objects).await;
    for secret in secrets(&client, &kubeconfig).await {
        assert!(
            !said.contains(&secret),
            "a secret in a condition or Event:\n{said}"
        );
    }
    let hub_settled = started.elapsed();

    // A controller that is not the hub: a ShortcutConnection gets NotHub, and no finalizer.
    hub.kill().await.unwrap();
    env.insert("KUBETUN_HUB".into(), "false".into());
    let _leaf = controller(&env, &kubeconfig);
    let (mut shortcut, mut doc) = objects_of(&root.join("deploy/examples/shortcutconnection.yaml"))
        .into_iter()
        .next()
        .unwrap();
    shortcut.name = "not-on-the-hub".into();
    doc["metadata"]["name"] = shortcut.name.clone().into();
    apply_value(&cluster, "not-on-the-hub", &doc);
    let deadline = Instant::now() + SETTLE;
    loop {
        let found = api(&client, &shortcut)
            .get_opt(&shortcut.name)
            .await
            .unwrap();
        let ready = condition_of(found.as_ref(), "Ready");
        let events = events(&client).await;
        let event = events_about(&events, &shortcut)
            .into_iter()
            .any(|e| e.reason.as_deref() == Some("NotHub"));
        if let Some((status, reason, message)) = &ready
            && status == "False"
            && reason == "NotHub"
            && event
        {
            assert!(message.contains("KUBETUN_HUB"), "{message}");
            assert!(
                found
                    .unwrap()
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .is_empty(),
                "no finalizer where nothing removes it"
            );
            verdict(
                &shortcut,
                api(&client, &shortcut)
                    .get_opt(&shortcut.name)
                    .await
                    .unwrap()
                    .as_ref(),
                &events,
            )
            .unwrap();
            println!("{shortcut}: Ready=False NotHub: {message}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a ShortcutConnection on a non-hub: Ready is {ready:?}, NotHub Event: {event}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!(
        "controller ready after {ready:?}, examples settled after {hub_settled:?}, all done after {:?}",
        started.elapsed()
    );
}
