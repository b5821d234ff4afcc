//! The controller's log through an API-server outage, as shipped: `kubetun-controller` runs
//! with the environment the manifests give its container (`kubectl kustomize deploy/`, the
//! ConfigMap it loads with `envFrom` included, so changing deploy/ changes this test) as the
//! ServiceAccount of deploy/'s RBAC, and again with `RUST_LOG=debug`. The API server is
//! stopped for several seconds and started again; the lines logged meanwhile are counted.
//!
//! Required: at most one line per second at info and above, the outage's start and its end
//! each named once, no library line below WARN (libraries log only when named in `RUST_LOG`),
//! and neither the ServiceAccount token nor the gateway's private key in any line.

use crate::realapi_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubetun_controller_testing::FakeGateway;
use kubetun_testenv::TestCluster;
use serde_yaml::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// How long the API server stays down.
const OUTAGE: Duration = Duration::from_secs(5);
/// Lines logged this long after the outage was declared over still count as the outage's.
const TAIL: Duration = Duration::from_secs(2);
const STARTED: &str = "API server unreachable";
const ENDED: &str = "API server reachable again";

/// `kubectl kustomize deploy/`: what `kubectl apply -k deploy/` installs.
fn rendered_deploy() -> Vec<Value> {
    let assets = kubetun_testenv::Assets::find().unwrap();
    let kubectl = assets.kubectl().unwrap();
    let deploy = realapi_support::repo_root().join("deploy");
    let out = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(&deploy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        deploy.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |value, key| value.get(key))?
        .as_str()
}

/// The manifests' `kubetun-controller` container, as the kubelet would start it.
#[derive(Debug)]
struct Deployed {
    /// Its environment: the ConfigMaps of `envFrom`, then `env` (which wins).
    env: BTreeMap<String, String>,
    namespace: String,
    service_account: String,
}

/// Finds the one Deployment container whose command is `kubetun-controller` and resolves its
/// environment from the rendered manifests; anything this cannot resolve fails the test, so a
/// new kind of source in deploy/ is noticed here.
fn deployed_controller(docs: &[Value]) -> Deployed {
    let config_map = |name: &str| -> BTreeMap<String, String> {
        let doc = docs
            .iter()
            .find(|d| {
                str_at(d, &["kind"]) == Some("ConfigMap")
                    && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("deploy/ has no ConfigMap {name}"));
        serde_yaml::from_value(doc.get("data").cloned().unwrap_or_default()).unwrap()
    };
    let mut found = Vec::new();
    for doc in docs
        .iter()
        .filter(|d| str_at(d, &["kind"]) == Some("Deployment"))
    {
        let pod = &doc["spec"]["template"]["spec"];
        for container in pod["containers"].as_sequence().into_iter().flatten() {
            let command = container["command"].as_sequence();
            if command.and_then(|c| c.first()).and_then(Value::as_str) != Some("kubetun-controller")
            {
                continue;
            }
            let namespace = str_at(doc, &["metadata", "namespace"])
                .expect("the Deployment names its namespace")
                .to_owned();
            let mut env = BTreeMap::new();
            for source in container["envFrom"].as_sequence().into_iter().flatten() {
                let name = str_at(source, &["configMapRef", "name"])
                    .unwrap_or_else(|| panic!("unsupported envFrom source {source:?}"));
                env.extend(config_map(name));
            }
            for var in container["env"].as_sequence().into_iter().flatten() {
                let name = str_at(var, &["name"]).unwrap().to_owned();
                let value = if let Some(value) = var.get("value") {
                    value.as_str().unwrap_or_default().to_owned()
                } else if let Some(field) = str_at(var, &["valueFrom", "fieldRef", "fieldPath"]) {
                    assert_eq!(
                        field, "metadata.namespace",
                        "unsupported fieldRef of {name}"
                    );
                    namespace.clone()
                } else if let Some(map) = str_at(var, &["valueFrom", "configMapKeyRef", "name"]) {
                    let key = str_at(var, &["valueFrom", "configMapKeyRef", "key"]).unwrap();
                    config_map(map)[key].clone()
                } else {
                    panic!("unsupported env source of {name}: {var:?}");
                };
                assert!(
                    !value.contains("$("),
                    "{name}={value}: variable references are not resolved here"
                );
                env.insert(name, value);
            }
            found.push(Deployed {
                env,
                namespace,
                service_account: str_at(pod, &["serviceAccountName"])
                    .expect("the pod names its ServiceAccount")
                    .to_owned(),
            });
        }
    }
    assert_eq!(
        found.len(),
        1,
        "one kubetun-controller container in deploy/"
    );
    found.pop().unwrap()
}

/// Applies deploy/'s RBAC and ConfigMaps (the namespace and CRDs are installed already).
fn apply_rbac_and_config(cluster: &TestCluster, docs: &[Value], dir: &Path) {
    let kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
    ];
    let mut text = String::new();
    for doc in docs {
        if kinds.contains(&str_at(doc, &["kind"]).unwrap_or_default()) {
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(doc).unwrap());
        }
    }
    let path = dir.join("rbac-and-config.yaml");
    std::fs::write(&path, text).unwrap();
    cluster
        .kubectl(&["apply", "-f", path.to_str().unwrap()])
        .unwrap();
}

/// One line of the controller's output and when it arrived.
#[derive(Debug, Clone)]
struct Line {
    at: Instant,
    text: String,
}

impl Line {
    /// The level: the first of the fmt layer's level words in the line.
    fn level(&self) -> &str {
        self.text
            .split_whitespace()
            .take(3)
            .find(|w| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(w))
            .unwrap_or("?")
    }

    fn at_info_or_above(&self) -> bool {
        !matches!(self.level(), "TRACE" | "DEBUG")
    }

    /// The target: the first word after the level that reads `path::of::a::module:`.
    fn target(&self) -> &str {
        self.text
            .split_whitespace()
            .skip_while(|w| *w != self.level())
            .skip(1)
            .filter_map(|w| w.strip_suffix(':'))
            .find(|w| {
                !w.is_empty()
                    && w.split("::").all(|part| {
                        !part.is_empty()
                            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
            })
            .unwrap_or("?")
    }

    fn is_kubetun(&self) -> bool {
        self.target().starts_with("kubetun")
    }
}

/// A running `kubetun-controller` whose stdout and stderr lines are collected as they come.
struct Controller {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<Line>>>,
}

impl Controller {
    fn start(env: &BTreeMap<String, String>, kubeconfig: &Path) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubetun-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines: Arc<Mutex<Vec<Line>>> = Arc::default();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        for stream in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            Box::new(stderr),
        ] {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(text)) = reader.next_line().await {
                    let at = Instant::now();
                    lines.lock().unwrap().push(Line { at, text });
                }
            });
        }
        Self { child, lines }
    }

    fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    fn all_text(&self) -> String {
        self.lines()
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until a line after `since` contains `needle`; returns when it arrived.
    async fn wait_for(&mut self, needle: &str, since: Instant, limit: Duration) -> Instant {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(line) = self
                .lines()
                .iter()
                .find(|l| l.at >= since && l.text.contains(needle))
            {
                return line.at;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the controller exited ({status}):\n{}", self.all_text());
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} within {limit:?}; the controller logged:\n{}",
                self.all_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(&mut self) {
        let pid = self.child.id().unwrap().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// What one outage cost in log lines.
#[derive(Debug)]
struct Outage {
    window: Duration,
    lines: Vec<Line>,
    /// Everything the controller logged, start to stop.
    log: String,
}

impl Outage {
    fn per_second(&self, lines: usize) -> f64 {
        lines as f64 / self.window.as_secs_f64()
    }

    fn at_info(&self) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.at_info_or_above()).collect()
    }

    fn by_target(&self) -> BTreeMap<(String, String), usize> {
        let mut counts = BTreeMap::new();
        for line in &self.lines {
            *counts
                .entry((line.level().to_owned(), line.target().to_owned()))
                .or_default() += 1;
        }
        counts
    }
}

/// Starts the controller with `env`, waits until it configured the gateway, stops the API
/// server for [`OUTAGE`] (`kill`: SIGKILL, else SIGTERM), starts it again and returns the
/// lines logged from the stop until [`TAIL`] after the controller said the outage was over.
async fn outage(
    cluster: &mut TestCluster,
    env: &BTreeMap<String, String>,
    kubeconfig: &Path,
    gateway: &FakeGateway,
    kill: bool,
) -> Outage {
    let started = Instant::now();
    let mut controller = Controller::start(env, kubeconfig);
    controller
        .wait_for("running;", started, Duration::from_secs(30))
        .await;
    let applied = gateway.applied().len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while gateway.applied().len() == applied && gateway.current().is_none() {
        assert!(
            Instant::now() < deadline,
            "the controller never applied to the gateway:\n{}",
            controller.all_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every watch is open by now; a second more so that none is still starting.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let down = Instant::now();
    cluster.stop_apiserver(kill).await;
    tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;
    cluster.start_apiserver().await.unwrap();
    let ended = controller
        .wait_for(ENDED, down, Duration::from_secs(30))
        .await;
    tokio::time::sleep(TAIL.saturating_sub(ended.elapsed())).await;
    let until = ended + TAIL;
    let lines: Vec<Line> = controller
        .lines()
        .into_iter()
        .filter(|l| l.at >= down && l.at <= until)
        .collect();
    controller.stop().await;
    Outage {
        window: until - down,
        lines,
        log: controller.all_text(),
    }
}

/// Prints what one outage cost in log lines.
fn report(label: &str, outage: &Outage) {
    let at_info = outage.at_info();
    println!(
        "{label}: {} lines in {:.1?} ({:.2} lines/s), {} at info and above ({:.2} lines/s)",
        outage.lines.len(),
        outage.window,
        outage.per_second(outage.lines.len()),
        at_info.len(),
        outage.per_second(at_info.len()),
    );
    for ((level, target), count) in outage.by_target() {
        println!("  {count:5} {level:5} {target}");
    }
}

/// Checks one outage's log: the budget, the two lines, no library below WARN, no secret.
fn check(label: &str, outage: &Outage, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !outage.log.contains(secret),
            "{label}: a secret in the controller's log:\n{}",
            outage.log
        );
    }
    let at_info = outage.at_info();
    let shown: Vec<&str> = at_info.iter().map(|l| l.text.as_str()).collect();
    let shown = shown.join("\n");
    assert!(
        outage.per_second(at_info.len()) <= 1.0,
        "{label}: more than one line per second at info while the API server was away:\n{shown}"
    );
    for needle in [STARTED, ENDED] {
        assert_eq!(
            at_info.iter().filter(|l| l.text.contains(needle)).count(),
            1,
            "{label}: {needle:?} once:\n{shown}"
        );
    }
    let library: Vec<&str> = outage
        .lines
        .iter()
        .filter(|l| !l.is_kubetun() && matches!(l.level(), "TRACE" | "DEBUG" | "INFO"))
        .map(|l| l.text.as_str())
        .collect();
    assert!(
        library.is_empty(),
        "{label}: library lines below WARN without their target in RUST_LOG:\n{}",
        library.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_costs_at_most_a_line_per_second_as_deployed() {
    let Some([mut cluster]) = realapi_support::clusters(["quietlog"]).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let docs = rendered_deploy();
    let deployed = deployed_controller(&docs);
    apply_rbac_and_config(&cluster, &docs, dir.path());
    let kubeconfig = cluster
        .service_account_kubeconfig(&deployed.namespace, &deployed.service_account)
        .await
        .unwrap();
    let token = std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:").map(|t| t.trim().to_owned()))
        .expect("a token in the ServiceAccount kubeconfig");

    // What a test process cannot take from the manifests: the controller reaches the
    // API server by --kubeconfig (a pod by its in-cluster config), its gateway on an interface
    // name of its own (a fake gateway serves the control socket; kubetun0's could be another
    // process's on this host), metrics and DNS on free ports.
    let mut env = deployed.env.clone();
    println!("deployed environment of the controller: {env:?}");
    let interface = format!("ktq{}", std::process::id() % 100_000);
    env.insert("KUBETUN_GATEWAY_INTERFACE".into(), interface.clone());
    if env.contains_key("KUBETUN_METRICS_ADDR") {
        env.insert("KUBETUN_METRICS_ADDR".into(), "127.0.0.1:0".into());
    }
    if env.contains_key("KUBETUN_DNS_ADDR") {
        env.insert("KUBETUN_DNS_ADDR".into(), "127.0.0.1:0".into());
    }
    let socket = kubetun_controller::socket_paths::grpc_socket_path(&interface);
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let gateway = FakeGateway::start_at(&socket).await.unwrap();

    let test_started = Instant::now();
    let deployed_level = env.get("RUST_LOG").cloned().unwrap_or_default();
    let as_deployed = outage(&mut cluster, &env, &kubeconfig, &gateway, false).await;
    let private_key = gateway
        .current()
        .and_then(|s| s.interface)
        .map(|i| i.private_key)
        .expect("the controller applied a private key");
    assert!(!private_key.is_empty());

    // The second outage on a hub (the ShortcutConnection operator runs too) with the
    // shipped example shortcut, whose leaves' kubeconfig Secrets do not exist: its retries
    // fail all through the outage.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/shortcutconnection.yaml"
    );
    cluster.kubectl(&["apply", "-f", example]).unwrap();
    let mut debug = env.clone();
    debug.insert("RUST_LOG".into(), "debug".into());
    debug.insert("KUBETUN_HUB".into(), "true".into());
    let with_debug = outage(&mut cluster, &debug, &kubeconfig, &gateway, true).await;
    println!(
        "two outages of {OUTAGE:?} took {:.1?}",
        test_started.elapsed()
    );
    let deployed_label = format!("as deployed (RUST_LOG={deployed_level:?}), SIGTERM");
    let debug_label = "RUST_LOG=debug, a hub, SIGKILL";
    report(&deployed_label, &as_deployed);
    report(debug_label, &with_debug);
    let secrets = [token.as_str(), private_key.as_str()];
    check(&deployed_label, &as_deployed, &secrets);
    check(debug_label, &with_debug, &secrets);
    drop(gateway);
    let _ = std::fs::remove_file(&socket);
}
