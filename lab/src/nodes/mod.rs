//! The lab on real nodes (`kubetun-lab up --nodes`): kubetun as a user installs it. Every
//! cluster of the seed's shape — the hub Europe and the leaves Rome, Milan and Paris, Milan and
//! Paris with the same pod CIDR (kind's 10.244.0.0/16), so Rome sees both remapped — gets a
//! control plane (`kube-test-apiserver`) and two real nodes (`kube-test-node`: containerd,
//! runc, CNI, kubelet, kube-proxy), the kubetun image this build makes (imported into each
//! node's containerd), and `kubetun install`; the gateway, the controller, kubetun DNS and the
//! route agents run as the pods the install creates. Workloads are real pods behind real
//! Services. The clusters are linked with `kubetun network connect` (the hub to each leaf) and
//! the hub's `kubetun shortcut create` (Rome–Milan with the hub as fallback, Rome–Paris through
//! the hub only), `web` is exported from Milan and Paris with `kubectl apply`, and the checks
//! run from a client pod on the node that does not run the gateway, so the route agent's
//! routes carry them (see [`checks`]).
//!
//! Everything lives below `<state dir>/nodes/` and stays up after `up` (inspect it with the
//! printed kubeconfigs); [`down`] (also `kubetun-lab down`) stops every node and control plane
//! by their directories and removes them.

pub mod checks;
mod cluster;
pub mod kit;
pub mod workloads;

pub use cluster::{Cluster, ClusterSpec, GATEWAY_LABEL, IMAGE, NodeLabError, NodeLabOptions, SEED};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::checks::Check;
use crate::image;
use crate::output::say;

/// What [`up`] did and found.
#[derive(Debug)]
pub struct NodeLabReport {
    /// The clusters.
    pub clusters: Vec<Cluster>,
    /// Every check, in the order run.
    pub checks: Vec<Check>,
    /// Named durations (image build, clusters ready, installs, links).
    pub timings: Vec<(String, Duration)>,
}

impl NodeLabReport {
    /// Every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

fn nodes_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("nodes")
}

/// Builds the lab (removing a previous one first), links it and runs the checks.
pub fn up(options: &NodeLabOptions, out: &mut dyn Write) -> Result<NodeLabReport, NodeLabError> {
    let missing = kit::missing_tools();
    if !missing.is_empty() {
        return Err(NodeLabError::step(
            "preflight",
            format!("missing {} (.ci/setup installs them)", missing.join(", ")),
        ));
    }
    down(&options.state_dir, out)?;
    let root = nodes_dir(&options.state_dir);
    std::fs::create_dir_all(&root).map_err(|e| NodeLabError::step("create the state dir", e))?;
    let mut timings = Vec::new();

    let started = Instant::now();
    let tar = root.join("kubetun-image.tar");
    build_image(&options.binaries, &root, &tar)?;
    timings.push(("image built and saved".into(), started.elapsed()));
    say(
        out,
        &format!(
            "image {IMAGE}: built from {} in {:.1} s",
            options.binaries.display(),
            started.elapsed().as_secs_f64()
        ),
    );

    let started = Instant::now();
    let kubelet_wrapper = hub_kubelet(&root)?;
    let clusters = start_clusters(options, &root, &tar, &kubelet_wrapper)?;
    timings.push((
        "clusters ready (API servers, 2 nodes each)".into(),
        started.elapsed(),
    ));
    say(
        out,
        &format!(
            "{} clusters with 2 real nodes each ready in {:.1} s",
            clusters.len(),
            started.elapsed().as_secs_f64()
        ),
    );

    let started = Instant::now();
    install_all(&options.binaries, &clusters, out)?;
    timings.push(("kubetun installed, pods Ready".into(), started.elapsed()));

    let mut checks = Vec::new();
    let started = Instant::now();
    checks::link(&options.binaries, &clusters, out, &mut checks)?;
    timings.push(("linked".into(), started.elapsed()));
    checks::run_all(&options.binaries, &clusters, out, &mut checks)?;
    for check in &checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        say(
            out,
            &format!("    [{mark}] {} — {}", check.description, check.detail),
        );
    }
    for cluster in &clusters {
        say(
            out,
            &format!(
                "{}: kubectl --kubeconfig {} get pods -A -o wide",
                cluster.spec.name,
                cluster.kubeconfig.display()
            ),
        );
    }
    Ok(NodeLabReport {
        clusters,
        checks,
        timings,
    })
}

/// The image from the binaries of this build, saved as `tar`.
fn build_image(binaries: &Path, root: &Path, tar: &Path) -> Result<(), NodeLabError> {
    let missing: Vec<&str> = image::TOOLS
        .into_iter()
        .filter(|t| !kubetun_testenv::netns::command_exists(t))
        .collect();
    if !missing.is_empty() {
        return Err(NodeLabError::step(
            "build the image",
            format!("missing {}", missing.join(", ")),
        ));
    }
    let work = root.join("image-build");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| NodeLabError::step("image build dir", e))?;
    let files: Vec<PathBuf> = ["kubetun-gateway", "kubetun-controller", "kubetun-agent"]
        .iter()
        .map(|b| binaries.join(b))
        .collect();
    let mut made = image::Artifacts::default();
    let tag = format!("lab{}", std::process::id());
    let step = |e| NodeLabError::step("build the image", e);
    let base = image::build_base(&mut made, &work, &files, &tag).map_err(step)?;
    image::build_image(&mut made, &work, &files, &base, IMAGE).map_err(step)?;
    image::save(IMAGE, tar).map_err(step)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// A kubelet that allows `net.ipv4.ip_forward` in pods, for the hub's nodes: the hub's gateway
/// forwards transit traffic through its pod's kernel (`kubetun install --hub-forwarding`).
fn hub_kubelet(root: &Path) -> Result<PathBuf, NodeLabError> {
    let tools = kit::dir();
    let step = |e: String| NodeLabError::step("the hub's kubelet", e);
    let archive = std::fs::read_dir(&tools)
        .map_err(|e| step(e.to_string()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kubelet-") && n.ends_with(".xz"))
        })
        .ok_or_else(|| step(format!("no kubelet archive in {}", tools.display())))?;
    let real = root.join("kubelet");
    let unpacked = std::process::Command::new("xz")
        .arg("-dc")
        .arg(&archive)
        .output()
        .map_err(|e| step(e.to_string()))?;
    if !unpacked.status.success() {
        return Err(step(format!("xz -dc {}", archive.display())));
    }
    std::fs::write(&real, &unpacked.stdout).map_err(|e| step(e.to_string()))?;
    let wrapper = root.join("kubelet-hub");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} --allowed-unsafe-sysctls=net.ipv4.ip_forward \"$@\"\n",
            real.display()
        ),
    )
    .map_err(|e| step(e.to_string()))?;
    use std::os::unix::fs::PermissionsExt as _;
    for file in [&real, &wrapper] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| step(e.to_string()))?;
    }
    Ok(wrapper)
}

/// Every cluster's control plane and two nodes, in parallel.
fn start_clusters(
    options: &NodeLabOptions,
    root: &Path,
    tar: &Path,
    hub_kubelet: &Path,
) -> Result<Vec<Cluster>, NodeLabError> {
    let clusters: Vec<Cluster> = options
        .clusters
        .iter()
        .map(|spec| {
            let dir = root.join(spec.id);
            Cluster {
                spec: *spec,
                kubeconfig: dir.join("cp/kubeconfig"),
                underlay_kubeconfig: dir.join("underlay.kubeconfig"),
                dir,
            }
        })
        .collect();
    std::thread::scope(|scope| {
        let started: Vec<_> = clusters
            .iter()
            .map(|cluster| scope.spawn(move || start_cluster(cluster, tar, hub_kubelet)))
            .collect();
        started
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(NodeLabError::step("start", "panicked")))
            })
            .collect::<Result<Vec<()>, _>>()
    })?;
    Ok(clusters)
}

fn start_cluster(cluster: &Cluster, tar: &Path, hub_kubelet: &Path) -> Result<(), NodeLabError> {
    let cp = cluster.dir.join("cp");
    let cp_str = cp.to_string_lossy().into_owned();
    kit::run(
        "kube-test-apiserver",
        &["up", &cp_str, "--name", cluster.spec.id],
        &[],
    )?;
    let tar = tar.to_string_lossy().into_owned();
    let kubelet = hub_kubelet.to_string_lossy().into_owned();
    for (index, (dir, node)) in ["gw", "wk"].iter().zip(cluster.nodes()).enumerate() {
        let node_dir = cluster.dir.join(dir).to_string_lossy().into_owned();
        let pod_cidr = format!("{}.{}.0/24", cluster.spec.pod_prefix, index + 1);
        let envs: Vec<(&str, &str)> = if cluster.spec.hub {
            vec![("KUBE_TEST_NODE_KUBELET_BIN", kubelet.as_str())]
        } else {
            Vec::new()
        };
        kit::run(
            "kube-test-node",
            &[
                "up",
                &node_dir,
                "--cluster",
                &cp_str,
                "--name",
                &node,
                "--pod-cidr",
                &pod_cidr,
                "--image",
                &tar,
                "--timeout",
                "180",
            ]
            .into_iter()
            .chain(
                (index == 0)
                    .then_some(["--label", GATEWAY_LABEL])
                    .into_iter()
                    .flatten(),
            )
            .collect::<Vec<_>>(),
            &envs,
        )?;
    }
    kit::underlay_kubeconfig(&cp, &cluster.underlay_kubeconfig)
}

/// `kubetun install` in every cluster, waiting for the installed pods to be Ready.
fn install_all(
    binaries: &Path,
    clusters: &[Cluster],
    out: &mut dyn Write,
) -> Result<(), NodeLabError> {
    let results: Vec<Result<(String, Duration), NodeLabError>> = std::thread::scope(|scope| {
        let tasks: Vec<_> = clusters
            .iter()
            .map(|cluster| scope.spawn(move || install(binaries, cluster)))
            .collect();
        tasks
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(NodeLabError::step("install", "panicked")))
            })
            .collect()
    });
    for result in results {
        let (line, _) = result?;
        say(out, &line);
    }
    Ok(())
}

fn install(binaries: &Path, cluster: &Cluster) -> Result<(String, Duration), NodeLabError> {
    let started = Instant::now();
    let kubeconfig = cluster.underlay_kubeconfig.to_string_lossy().into_owned();
    let mut args = vec![
        "install",
        "--kubeconfig",
        &kubeconfig,
        // No --cluster-id, as a new user runs it: the id comes from the kubeconfig's cluster
        // (kube-test-apiserver names it after the cluster).
        "--cluster-name",
        cluster.spec.name,
        "--image",
        IMAGE,
        "--gateway-node-selector",
        GATEWAY_LABEL,
        "--wait",
        "--timeout",
        "180s",
        // The lab checks every pod against every other across every link: open links. (A new
        // install's default, `exported`, is what the process lab's isolation phase checks.)
        "--isolation",
        "open",
    ];
    if cluster.spec.hub {
        args.extend(["--hub", "--hub-forwarding"]);
    }
    let output = std::process::Command::new(binaries.join("kubetun"))
        .args(&args)
        .output()
        .map_err(|e| NodeLabError::step(format!("kubetun install in {}", cluster.spec.id), e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        return Err(NodeLabError::step(
            format!("kubetun install in {}", cluster.spec.id),
            text,
        ));
    }
    let id_line = format!(
        "cluster id: {} (from the kubeconfig context's cluster",
        cluster.spec.id
    );
    if !text.contains(&id_line) {
        return Err(NodeLabError::step(
            format!("kubetun install in {}", cluster.spec.id),
            format!("the cluster id was not taken from the kubeconfig:\n{text}"),
        ));
    }
    let endpoint = text
        .lines()
        .rfind(|l| l.contains("endpoint"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    let took = started.elapsed();
    Ok((
        format!(
            "  kubetun install in {}: pods Ready in {:.1} s; {endpoint}",
            cluster.spec.name,
            took.as_secs_f64()
        ),
        took,
    ))
}

/// Removes the lab on real nodes below `state_dir` (every cluster directory found there):
/// its nodes, control planes and files. Nothing there: nothing to do.
pub fn down(state_dir: &Path, out: &mut dyn Write) -> Result<(), NodeLabError> {
    let root = nodes_dir(state_dir);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    for entry in entries.filter_map(Result::ok) {
        let cp = entry.path().join("cp");
        if !cp.is_dir() {
            continue;
        }
        let cp = cp.to_string_lossy().into_owned();
        let _ = kit::run("kube-test-node", &["cluster-down", &cp], &[]);
        let _ = kit::run("kube-test-apiserver", &["down", &cp], &[]);
        say(
            out,
            &format!(
                "  stopped the nodes and control plane of {}",
                entry.path().display()
            ),
        );
    }
    std::fs::remove_dir_all(&root).map_err(|e| NodeLabError::step("remove the state", e))?;
    Ok(())
}
