//! The real-node kit beside this repository (`shared/tools`): `kube-test-apiserver` (etcd and
//! kube-apiserver per cluster) and `kube-test-node` (per node a network namespace with
//! containerd, runc, CNI, a real kubelet and kube-proxy; per cluster kube-scheduler,
//! kube-controller-manager and `nk-dns`), driven as processes, and `kubectl`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::cluster::NodeLabError;

/// Where the kit is: `KUBETUN_NODE_KIT`, else `../shared/tools` of this repository.
pub fn dir() -> PathBuf {
    std::env::var_os("KUBETUN_NODE_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools"))
}

/// The Debian packages a node needs, checked by [`missing_tools`].
pub const NODE_TOOLS: [(&str, &str); 6] = [
    ("containerd", "containerd"),
    ("runc", "runc"),
    ("conntrack", "conntrack"),
    ("iptables", "iptables"),
    ("nsenter", "util-linux"),
    ("etcd", "etcd-server"),
];

/// The tools of [`NODE_TOOLS`] (and the CNI plugins) that are missing, with their packages.
pub fn missing_tools() -> Vec<String> {
    let mut missing: Vec<String> = NODE_TOOLS
        .iter()
        .filter(|(tool, _)| !kubetun_testenv::netns::command_exists(tool) && !in_assets(tool))
        .map(|(tool, package)| format!("{tool} (apt-get install {package})"))
        .collect();
    if !Path::new("/usr/lib/cni/bridge").exists() && !Path::new("/opt/cni/bin/bridge").exists() {
        missing.push("the CNI plugins (apt-get install containernetworking-plugins)".into());
    }
    for script in ["kube-test-apiserver", "kube-test-node"] {
        if !dir().join(script).is_file() {
            missing.push(format!(
                "{} (the real-node kit)",
                dir().join(script).display()
            ));
        }
    }
    missing
}

fn in_assets(tool: &str) -> bool {
    kubetun_testenv::Assets::find().is_ok_and(|a| match tool {
        "etcd" => a.etcd.is_file(),
        _ => false,
    })
}

/// Runs a kit script; its stdout (trimmed), or its stderr's tail in the error.
pub fn run(script: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<String, NodeLabError> {
    let mut command = Command::new(dir().join(script));
    command.args(args);
    for (key, value) in envs {
        command.env(key, value);
    }
    // The API servers' binaries are found beside the kit (its `.xz` archives).
    command.env("KUBE_TEST_NODE_ARCHIVES", dir());
    let output = command
        .output()
        .map_err(|e| NodeLabError::step(format!("{script} {}", args.join(" ")), e))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(NodeLabError::step(
            format!("{script} {}", args.join(" ")),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `kubectl --kubeconfig KUBECONFIG args…`, bounded by `timeout`; stdout, or the failure.
pub fn kubectl(kubeconfig: &Path, args: &[&str], timeout: Duration) -> Result<String, String> {
    kubectl_with_input(kubeconfig, args, timeout, None)
}

fn kubectl_with_input(
    kubeconfig: &Path,
    args: &[&str],
    timeout: Duration,
    input: Option<&str>,
) -> Result<String, String> {
    use std::io::Write as _;
    use std::process::Stdio;
    let kubectl = kubetun_testenv::Assets::find()
        .map_err(|e| e.to_string())?
        .kubectl()
        .map_err(|e| e.to_string())?
        .to_owned();
    let mut child = Command::new("timeout")
        .arg("--kill-after=2")
        .arg(timeout.as_secs().max(1).to_string())
        .arg(&kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("kubectl: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("kubectl stdin: {e}"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("kubectl: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `kubectl apply -f -` of `yaml`.
pub fn apply(kubeconfig: &Path, yaml: &str) -> Result<(), NodeLabError> {
    kubectl_with_input(
        kubeconfig,
        &["apply", "-f", "-"],
        Duration::from_secs(60),
        Some(yaml),
    )
    .map_err(|e| NodeLabError::step("kubectl apply", e))?;
    Ok(())
}

/// The cluster slot `kube-test-node` gave cluster `dir` (its nodes are 172.30.SLOT.k and its
/// API server is reachable from every cluster's nodes and pods at 172.30.SLOT.1:6443).
pub fn cluster_slot(dir: &Path) -> Result<u8, NodeLabError> {
    let state = dir.join("nodekit/state");
    let text =
        std::fs::read_to_string(&state).map_err(|e| NodeLabError::step("nodekit state", e))?;
    text.lines()
        .find_map(|l| l.strip_prefix("CSLOT="))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            NodeLabError::step("nodekit state", format!("no CSLOT in {}", state.display()))
        })
}

/// A copy of the cluster's kubeconfig that names its API server as the other clusters' pods
/// reach it (`https://172.30.SLOT.1:6443`, checked against the certificate's name
/// `kubernetes`): what `network connect` and `shortcut create` hand to the peers.
pub fn underlay_kubeconfig(dir: &Path, out: &Path) -> Result<(), NodeLabError> {
    let slot = cluster_slot(dir)?;
    let text = std::fs::read_to_string(dir.join("kubeconfig"))
        .map_err(|e| NodeLabError::step("read kubeconfig", e))?;
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| NodeLabError::step("parse kubeconfig", e))?;
    let Some(clusters) = config["clusters"].as_sequence_mut() else {
        return Err(NodeLabError::step("parse kubeconfig", "no clusters"));
    };
    for cluster in clusters {
        cluster["cluster"]["server"] = format!("https://172.30.{slot}.1:6443").into();
        cluster["cluster"]["tls-server-name"] = "kubernetes".into();
    }
    let text = serde_yaml::to_string(&config).map_err(|e| NodeLabError::step("kubeconfig", e))?;
    kubetun_testenv::write_private(out, text.as_bytes())
        .map_err(|e| NodeLabError::step("write kubeconfig", e))
}
