//! The Multi-Cluster Services API's own conformance suite (kubernetes-sigs/mcs-api
//! `conformance/`, the build in `shared/tools`) against two clusters that run what a user's
//! would: real API servers with kube-controller-manager and fake-kubelet (Deployments, pods,
//! EndpointSlices, namespace deletion), kubetun's CRDs and RBAC, the clusters linked with
//! `kubetun network connect`, and each cluster's services loop running as the controller's
//! ServiceAccount. Every spec that needs no pod that really runs (labels `Connectivity` and
//! `DNS` excluded) must pass, in both address layouts users have: distinct pod CIDRs, and the
//! same pod CIDR in both clusters (kind's 10.244.0.0/16), where every endpoint is remapped.
//!
//! The suite's `report.yaml` of each layout is rendered into one Markdown report
//! (`target/mcs-conformance/conformance.md`; with `KUBETUN_WRITE_CONFORMANCE=1` also
//! `docs/conformance.md`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::realapi_support::{self, Leaf, repo_root};
use crate::services_support::{install_services_on, run_services};

/// The suite's build beside this repository and the sha256 of the unpacked binary.
const SUITE: &str = "mcs-conformance-ded161af.test";
/// What runs without pods that really run (the suite's README: 17 of its 27 specs).
const LABEL_FILTER: &str = "!Connectivity && !DNS";
const EXPECTED_RUN: usize = 17;
const EXPECTED_TOTAL: usize = 27;
/// Bounds the whole suite (it waits at most 20 s per step, 60 s for a pod).
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

/// One address layout: the two clusters' pod CIDRs.
struct Layout {
    title: &'static str,
    rome: &'static str,
    milan: &'static str,
}

const LAYOUTS: [Layout; 2] = [
    Layout {
        title: "distinct pod CIDRs (rome 10.60.0.0/16, milan 10.70.0.0/16)",
        rome: "10.60.0.0/16",
        milan: "10.70.0.0/16",
    },
    Layout {
        title: "identical pod CIDRs (10.244.0.0/16 in both, every endpoint remapped)",
        rome: "10.244.0.0/16",
        milan: "10.244.0.0/16",
    },
];

/// `report.yaml` as the suite writes it (yaml.v3's lower-cased field names).
#[derive(Debug, Deserialize)]
struct Report {
    #[serde(default)]
    groups: Vec<Group>,
    #[serde(default)]
    suitefailure: String,
    passed: usize,
    total: usize,
}

#[derive(Debug, Deserialize)]
struct Group {
    name: String,
    #[serde(default)]
    tests: Vec<Spec>,
}

#[derive(Debug, Deserialize)]
struct Spec {
    desc: String,
    #[serde(default)]
    labels: Vec<String>,
    passed: bool,
    failed: bool,
    skipped: bool,
    #[serde(default)]
    message: String,
}

/// The unpacked suite (checked against its sha256), or why it cannot run.
fn suite_binary() -> Result<PathBuf, String> {
    let tools = repo_root().join("../shared/tools");
    let archive = tools.join(format!("{SUITE}.xz"));
    let want = std::fs::read_to_string(tools.join(format!("{SUITE}.sha256")))
        .map_err(|e| format!("{}: {e}", tools.join(format!("{SUITE}.sha256")).display()))?;
    let want = want
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let dir = repo_root().join("target/mcs-conformance");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let binary = dir.join(SUITE);
    if sha256(&binary).as_deref() != Some(want.as_str()) {
        let unpacked = std::process::Command::new("xz")
            .args(["-dc"])
            .arg(&archive)
            .output()
            .map_err(|e| format!("xz: {e}"))?;
        if !unpacked.status.success() {
            return Err(format!(
                "cannot unpack {}: {}",
                archive.display(),
                realapi_support::text(&unpacked.stderr)
            ));
        }
        std::fs::write(&binary, &unpacked.stdout).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let got = sha256(&binary);
        if got.as_deref() != Some(want.as_str()) {
            return Err(format!(
                "{} unpacks to sha256 {got:?}, not {want}",
                archive.display()
            ));
        }
    }
    Ok(binary)
}

fn sha256(path: &Path) -> Option<String> {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .ok()?;
    out.status.success().then(|| {
        realapi_support::text(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

/// One kubeconfig with a context, cluster and user per test cluster, each named after it
/// (the suite names a cluster after its context's cluster).
fn merged_kubeconfig(clusters: &[(&str, &Path)], out: &Path) {
    let mut merged = serde_yaml::Mapping::new();
    let (mut contexts, mut kube_clusters, mut users) = (vec![], vec![], vec![]);
    for (name, path) in clusters {
        let config: serde_yaml::Value =
            serde_yaml::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let mut cluster = config["clusters"][0].clone();
        cluster["name"] = (*name).into();
        let mut user = config["users"][0].clone();
        user["name"] = (*name).into();
        let mut context = config["contexts"][0].clone();
        context["name"] = (*name).into();
        context["context"]["cluster"] = (*name).into();
        context["context"]["user"] = (*name).into();
        kube_clusters.push(cluster);
        users.push(user);
        contexts.push(context);
    }
    merged.insert("apiVersion".into(), "v1".into());
    merged.insert("kind".into(), "Config".into());
    merged.insert("clusters".into(), kube_clusters.into());
    merged.insert("users".into(), users.into());
    merged.insert("contexts".into(), contexts.into());
    merged.insert("current-context".into(), clusters[0].0.into());
    std::fs::write(out, serde_yaml::to_string(&merged).unwrap()).unwrap();
}

/// Starts both clusters of `layout`, links them, runs the suite; its report and run time.
async fn run_layout(suite: &Path, layout: &Layout, work: &Path) -> Option<(Report, Duration)> {
    let [rome_cluster, milan_cluster] = realapi_support::clusters(["rome", "milan"]).await?;
    let workloads = [
        rome_cluster.start_workloads(layout.rome, "rome-node-1"),
        milan_cluster.start_workloads(layout.milan, "milan-node-1"),
    ];
    let _workloads: Vec<_> = match workloads.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(w) => w,
        Err(e) => {
            assert!(!kubetun_testenv::required(), "CI=true: {e}");
            eprintln!("skipping the MCS conformance suite: {e}");
            return None;
        }
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    let _rome_leaf = Leaf::start(&rome_cluster, "rome", layout.rome, "10.90.0.0/16").await;
    let _milan_leaf = Leaf::start(&milan_cluster, "milan", layout.milan, "10.91.0.0/16").await;
    let tasks = [
        run_services(&rome_cluster, "rome", layout.rome).await,
        run_services(&milan_cluster, "milan", layout.milan).await,
    ];
    let (rome_k, milan_k) = (
        rome_cluster.kubeconfig_path(),
        milan_cluster.kubeconfig_path(),
    );
    let connect = realapi_support::kubetun(&[
        "network",
        "connect",
        "--kubeconfig",
        rome_k.to_str().unwrap(),
        "--remote-kubeconfig",
        milan_k.to_str().unwrap(),
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;
    assert!(
        connect.status.success(),
        "{}{}",
        realapi_support::text(&connect.stdout),
        realapi_support::text(&connect.stderr)
    );
    // The layout is what it says: with one pod CIDR in both, Rome sees Milan's pods remapped.
    let te = kube::Api::<kubetun_crds::TunnelEndpoint>::namespaced(
        rome_cluster.client().await.unwrap(),
        realapi_support::NAMESPACE,
    )
    .get("milan")
    .await
    .unwrap();
    let pods = &te.spec.remote_pod_cidrs[0];
    assert_eq!(pods.real, layout.milan);
    assert_eq!(
        pods.view == pods.real,
        layout.rome != layout.milan,
        "Rome's view of Milan's pods: {pods:?}"
    );
    std::fs::create_dir_all(work).unwrap();
    let kubeconfig = work.join("kubeconfig");
    merged_kubeconfig(&[("milan", &milan_k), ("rome", &rome_k)], &kubeconfig);
    let log = std::fs::File::create(work.join("suite.log")).unwrap();
    let started = Instant::now();
    let mut child = tokio::process::Command::new(suite)
        .current_dir(work)
        .arg(format!("-kubeconfig={}", kubeconfig.display()))
        .args(["-contexts", "milan,rome"])
        .arg(format!("-ginkgo.label-filter={LABEL_FILTER}"))
        .args(["-ginkgo.v", "-ginkgo.no-color"])
        .args(["-organization", "kubetun", "-project", "kubetun"])
        .arg(format!("-version={}", env!("CARGO_PKG_VERSION")))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start the conformance suite");
    let status = tokio::time::timeout(SUITE_TIMEOUT, child.wait())
        .await
        .unwrap_or_else(|_| panic!("the suite ran past {SUITE_TIMEOUT:?}"))
        .unwrap();
    let took = started.elapsed();
    for task in tasks {
        task.abort();
    }
    let report: Report = serde_yaml::from_slice(
        &std::fs::read(work.join("report.yaml"))
            .unwrap_or_else(|e| panic!("no report.yaml (suite exit {status}): {e}")),
    )
    .unwrap();
    println!(
        "MCS conformance, {}: {} of {} passed in {took:.1?} (suite exit {status})",
        layout.title, report.passed, report.total
    );
    Some((report, took))
}

/// Specs of `report` that should have run and did not pass, in words.
fn failures(report: &Report) -> Vec<String> {
    let mut failures: Vec<String> = report
        .groups
        .iter()
        .flat_map(|g| &g.tests)
        .filter(|t| !t.skipped && !t.passed)
        .map(|t| format!("{}{}", t.desc, t.message))
        .collect();
    if !report.suitefailure.is_empty() {
        failures.push(format!("suite set-up: {}", report.suitefailure));
    }
    failures
}

fn ran(report: &Report) -> usize {
    report
        .groups
        .iter()
        .flat_map(|g| &g.tests)
        .filter(|t| !t.skipped)
        .count()
}

/// The Markdown report of every layout.
fn render(results: &[(&Layout, Report, Duration)]) -> String {
    let mut md = String::from(
        "# MCS API conformance\n\n\
         The upstream suite (kubernetes-sigs/mcs-api `conformance/` at ded161af, ServiceImport \
         and ServiceExport `v1beta1`) run against two clusters, `milan` (the suite's first, \
         \"remote\" cluster) and `rome`: real kube-apiservers with kube-controller-manager and \
         fake-kubelet, kubetun's CRDs and RBAC, linked with `kubetun network connect`, each \
         cluster's services loop running as the controller's ServiceAccount. Regenerated by \
         `KUBETUN_WRITE_CONFORMANCE=1 cargo test -p kubetun-controller --test realapi \
         conformance -- --nocapture`; CI runs the same test and fails when a spec that should \
         run does not pass.\n\n\
         Not run here (`-ginkgo.label-filter='!Connectivity && !DNS'`): the specs labelled \
         `Connectivity` or `DNS` send traffic and `clusterset.local` lookups from a request pod \
         with `kubectl exec`, which needs pods that really run (real nodes); fake-kubelet only \
         marks pods Running. For the same reason the Required spec \"Connectivity to a service \
         that is not exported should be inaccessible\", which carries neither label, passes \
         here without reaching a pod: its `kubectl exec` finds no kubelet, so nothing answers, \
         which is what it checks.\n",
    );
    for (layout, report, took) in results {
        let _ = write!(
            md,
            "\n## {}\n\n{} of {} specs run, {} passed, in {:.0} s.\n\n\
             | group | spec | labels | result |\n|---|---|---|---|\n",
            layout.title,
            ran(report),
            report.total,
            report.passed,
            took.as_secs_f64()
        );
        for group in &report.groups {
            for spec in &group.tests {
                let result = if spec.skipped {
                    "not run: needs pods that really run".to_owned()
                } else if spec.passed {
                    "passed".to_owned()
                } else if spec.failed {
                    format!("**failed** (conformance not determined){}", spec.message)
                } else {
                    format!("**not conformant**{}", spec.message)
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} |",
                    group.name,
                    spec.desc.split_whitespace().collect::<Vec<_>>().join(" "),
                    spec.labels.join(", "),
                    result.replace('|', "\\|").replace('\n', " ")
                );
            }
        }
    }
    md
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcs_conformance_suite_passes_without_running_pods_in_both_layouts() {
    let _turn = kubetun_testenv::turn(module_path!());
    let suite = match suite_binary() {
        Ok(suite) => suite,
        Err(e) => {
            assert!(!kubetun_testenv::required(), "CI=true: {e}");
            eprintln!("skipping the MCS conformance suite: {e}");
            return;
        }
    };
    let out = repo_root().join("target/mcs-conformance");
    let mut results = Vec::new();
    for (index, layout) in LAYOUTS.iter().enumerate() {
        let work = out.join(format!("layout-{index}"));
        let _ = std::fs::remove_dir_all(&work);
        let Some((report, took)) = run_layout(&suite, layout, &work).await else {
            return;
        };
        results.push((layout, report, took));
    }
    let md = render(&results);
    std::fs::write(out.join("conformance.md"), &md).unwrap();
    if std::env::var_os("KUBETUN_WRITE_CONFORMANCE").is_some_and(|v| v == "1") {
        std::fs::write(repo_root().join("docs/conformance.md"), &md).unwrap();
    }
    for (layout, report, _) in &results {
        let failed = failures(report);
        assert!(
            failed.is_empty(),
            "{}: {} spec(s) failed (logs in target/mcs-conformance/):\n{}",
            layout.title,
            failed.len(),
            failed.join("\n")
        );
        assert_eq!(
            report.total, EXPECTED_TOTAL,
            "{}: the suite's specs",
            layout.title
        );
        assert_eq!(ran(report), EXPECTED_RUN, "{}: specs run", layout.title);
        assert_eq!(
            report.passed, EXPECTED_RUN,
            "{}: specs passed",
            layout.title
        );
    }
}
