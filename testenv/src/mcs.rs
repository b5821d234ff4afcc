//! The Multi-Cluster Services API's upstream conformance suite (kubernetes-sigs/mcs-api
//! `conformance/` at ded161af, built as a Go test binary in `shared/tools`): unpacked and
//! checked, run against clusters named by the contexts of one kubeconfig, and its
//! `report.yaml` read and rendered as Markdown.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The suite's build beside this repository; `.xz` and `.sha256` (of the unpacked binary).
pub const SUITE: &str = "mcs-conformance-ded161af.test";
/// What runs without pods that really run (the suite's README: 17 of its 27 specs).
pub const WITHOUT_PODS: &str = "!Connectivity && !DNS";
/// The suite's specs.
pub const TOTAL: usize = 27;
/// Bounds one run (it waits at most 20 s per step, 60 s for a pod).
pub const TIMEOUT: Duration = Duration::from_secs(1200);

fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools")
}

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mcs-conformance")
}

/// `report.yaml` as the suite writes it (yaml.v3's lower-cased field names).
#[derive(Debug, Deserialize)]
pub struct Report {
    #[serde(default)]
    /// The specs by group (`Required`, `Optional`).
    pub groups: Vec<Group>,
    #[serde(default)]
    /// Why the suite could not start, if it could not.
    pub suitefailure: String,
    /// Specs passed.
    pub passed: usize,
    /// Specs in the report (run or not).
    pub total: usize,
}

/// One group of specs.
#[derive(Debug, Deserialize)]
pub struct Group {
    /// `Required` or `Optional`.
    pub name: String,
    #[serde(default)]
    /// Its specs.
    pub tests: Vec<Spec>,
}

/// One spec and how it went.
#[derive(Debug, Deserialize)]
pub struct Spec {
    /// The spec's full text.
    pub desc: String,
    #[serde(default)]
    /// Its labels but the group.
    pub labels: Vec<String>,
    /// Ran and passed.
    pub passed: bool,
    /// Failed before conformance could be determined.
    pub failed: bool,
    /// Not run (filtered out).
    pub skipped: bool,
    #[serde(default)]
    /// Why it failed.
    pub message: String,
}

/// The unpacked suite (in `target/mcs-conformance/`, checked against its sha256), or why it
/// cannot run.
pub fn suite_binary() -> Result<PathBuf, String> {
    let tools = tools();
    let archive = tools.join(format!("{SUITE}.xz"));
    let sums = tools.join(format!("{SUITE}.sha256"));
    let want = std::fs::read_to_string(&sums).map_err(|e| format!("{}: {e}", sums.display()))?;
    let want = want
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let dir = target();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let binary = dir.join(SUITE);
    if sha256(&binary).as_deref() != Some(want.as_str()) {
        let unpacked = std::process::Command::new("xz")
            .arg("-dc")
            .arg(&archive)
            .output()
            .map_err(|e| format!("xz: {e}"))?;
        if !unpacked.status.success() {
            return Err(format!(
                "cannot unpack {}: {}",
                archive.display(),
                String::from_utf8_lossy(&unpacked.stderr)
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
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

/// One kubeconfig with a context, cluster and user per `(name, kubeconfig)`, each named
/// after it (the suite names a cluster after its context's cluster), written to `out`.
pub fn merged_kubeconfig(clusters: &[(&str, &Path)], out: &Path) -> Result<(), String> {
    let (mut contexts, mut kube_clusters, mut users) = (vec![], vec![], vec![]);
    for (name, path) in clusters {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: serde_yaml::Value =
            serde_yaml::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
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
    let mut merged = serde_yaml::Mapping::new();
    merged.insert("apiVersion".into(), "v1".into());
    merged.insert("kind".into(), "Config".into());
    merged.insert("clusters".into(), kube_clusters.into());
    merged.insert("users".into(), users.into());
    merged.insert("contexts".into(), contexts.into());
    if let Some((first, _)) = clusters.first() {
        merged.insert("current-context".into(), (*first).into());
    }
    let text = serde_yaml::to_string(&merged).map_err(|e| e.to_string())?;
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))
}

/// Runs the suite in `work` against the clusters of `kubeconfig`'s `contexts` (the first is
/// the suite's "remote" cluster), with `label_filter`; its report and run time. The suite's
/// output goes to `work/suite.log`.
///
/// `attempts` above 1 retries a failing spec (ginkgo's `--flake-attempts`); the specs that
/// needed a retry are returned by name, so that a report says so.
pub async fn run(
    suite: &Path,
    work: &Path,
    kubeconfig: &Path,
    contexts: &[&str],
    label_filter: &str,
    attempts: u32,
) -> Result<(Report, Duration, Vec<String>), String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(work.join("suite.log")).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(suite)
        .current_dir(work)
        .arg(format!("-kubeconfig={}", kubeconfig.display()))
        .arg(format!("-contexts={}", contexts.join(",")))
        .arg(format!("-ginkgo.label-filter={label_filter}"))
        .args([
            "-ginkgo.v",
            "-ginkgo.no-color",
            "-ginkgo.json-report=report.json",
        ])
        .arg(format!("-ginkgo.flake-attempts={}", attempts.max(1)))
        .args(["-organization", "kubetun", "-project", "kubetun"])
        .arg(format!("-version={}", env!("CARGO_PKG_VERSION")))
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", suite.display()))?;
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .map_err(|_| format!("the suite ran past {TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let took = started.elapsed();
    let text = std::fs::read(work.join("report.yaml"))
        .map_err(|e| format!("no report.yaml (suite exit {status}): {e}"))?;
    let report: Report = serde_yaml::from_slice(&text).map_err(|e| e.to_string())?;
    Ok((report, took, retried(&work.join("report.json"))))
}

/// The specs of ginkgo's JSON report that passed only after more than one attempt.
fn retried(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(suites) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    suites
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|suite| suite["SpecReports"].as_array().into_iter().flatten())
        .filter(|spec| spec["NumAttempts"].as_u64().unwrap_or(1) > 1 && spec["State"] == "passed")
        .map(|spec| {
            let containers: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str())
                .collect();
            format!(
                "{} {}",
                containers.join(" "),
                spec["LeafNodeText"].as_str().unwrap_or_default()
            )
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
        })
        .collect()
}

/// Specs of `report` that should have run and did not pass, in words.
pub fn failures(report: &Report) -> Vec<String> {
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

pub fn ran(report: &Report) -> usize {
    report
        .groups
        .iter()
        .flat_map(|g| &g.tests)
        .filter(|t| !t.skipped)
        .count()
}

/// One run's section of a Markdown report: its title, the specs and their results.
pub fn render_section(title: &str, report: &Report, took: Duration) -> String {
    let mut md = String::new();
    let _ = write!(
        md,
        "\n## {title}\n\n{} of {} specs run, {} passed, in {:.0} s.\n\n\
         | group | spec | labels | result |\n|---|---|---|---|\n",
        ran(report),
        report.total,
        report.passed,
        took.as_secs_f64()
    );
    for group in &report.groups {
        for spec in &group.tests {
            let result = if spec.skipped {
                "not run here".to_owned()
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
    md
}
