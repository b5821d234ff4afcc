//! Key rotation on real API servers: the seed lab with a kube-apiserver, etcd and
//! `kubetun-controller` per cluster; Rome's gateway key is rotated with `kubetun network
//! rotate-keys` while pods ping across Rome's direct link (to Europe), its hub-managed
//! shortcut (to Milan) and its hub-only pair (to Paris, through Europe) every 20 ms. Measures the longest silence between two echo replies
//! on each path per rotation (and, as the same-run baseline, without a rotation), asserts
//! the median stays within 1 s, and that afterwards no Secret of any cluster holds a replaced
//! private key. Also the interrupted rotation: a direct peer whose kubeconfig is missing keeps
//! its tunnel on the previous key, the command says what to do, and a rerun finishes the same
//! rotation. The services credentials stay as they were, and an export is fetched by name
//! afterwards. Needs root (namespaces, TUN) and the API-server binaries (`.ci/setup`).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::ListParams;
use kubetun_controller::keys;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_crds::TunnelEndpoint;
use kubetun_crds::contract::gateway_key;
use kubetun_integration::lab;
use kubetun_integration::lab::apiserver::{self, NAMESPACE};
use kubetun_integration::lab::services::fetch_by_name;
use kubetun_integration::lab::state::ClusterState;
use kubetun_integration::netns::command_in;

use crate::apiserver_lab;

use apiserver_lab::{EUROPE, MILAN, PARIS, ROME, admin, median, plane, pod_path};

const PREFIX: &str = "kr";
const ROTATIONS: usize = 5;
const GAP_LIMIT: Duration = Duration::from_secs(1);

/// Pings every 20 ms from one namespace and records when each echo reply arrived.
struct GapMonitor {
    child: Child,
    replies: Option<JoinHandle<Vec<f64>>>,
}

impl GapMonitor {
    fn start(ns: &str, addr: &str) -> Self {
        let mut child = command_in(ns, "ping")
            .args(["-n", "-D", "-i", "0.02", "-W", "1", "-w", "300", addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        let stdout = child.stdout.take().expect("stdout");
        let replies = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter(|line| line.contains("bytes from"))
                .filter_map(|line| {
                    let stamp = line.strip_prefix('[')?.split(']').next()?;
                    stamp.parse::<f64>().ok()
                })
                .collect()
        });
        Self {
            child,
            replies: Some(replies),
        }
    }

    /// Stops the pings; returns the longest time without a reply and the number of replies,
    /// and prints when (Unix time) the longest silence began.
    fn stop(mut self) -> (Duration, usize) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let _ = self.child.wait();
        let replies = self
            .replies
            .take()
            .expect("reader")
            .join()
            .expect("reader thread");
        let (longest, began) = replies
            .windows(2)
            .map(|pair| (pair[1] - pair[0], pair[0]))
            .fold((0.0_f64, 0.0_f64), |a, b| if b.0 > a.0 { b } else { a });
        assert!(replies.len() > 10, "the path carried almost no pings");
        if longest > 0.2 {
            println!("  (longest silence began at {began:.3})");
        }
        (Duration::from_secs_f64(longest), replies.len())
    }
}

impl Drop for GapMonitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unix time in seconds, to place a silence the monitors report.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn kubeconfig(cluster: &ClusterState) -> String {
    plane(cluster).kubeconfig.to_string_lossy().into_owned()
}

/// The private key (base64) in a cluster's key Secret.
async fn private_key(cluster: &ClusterState) -> String {
    let secrets: Api<Secret> = Api::namespaced(admin(cluster).await, NAMESPACE);
    let secret = secrets
        .get(gateway_key::SECRET_NAME)
        .await
        .expect("key Secret");
    keys::GatewayKeys::from_secret(&secret)
        .expect("keys")
        .current
        .private_base64()
}

/// The public key `viewer`'s TunnelEndpoint towards `peer` dials.
async fn dialled_key(viewer: &ClusterState, peer: &ClusterState) -> String {
    let tunnels: Api<TunnelEndpoint> = Api::namespaced(admin(viewer).await, NAMESPACE);
    tunnels
        .get(&peer.id)
        .await
        .expect("TunnelEndpoint")
        .spec
        .public_key
}

/// Runs `kubetun network rotate-keys` for Rome in a thread (the pings go on meanwhile).
fn rotate(rome: &ClusterState, remotes: &[&ClusterState]) -> Result<serde_json::Value, String> {
    let mut args = vec![
        "network".to_owned(),
        "rotate-keys".to_owned(),
        "--kubeconfig".to_owned(),
        kubeconfig(rome),
        "--wait".to_owned(),
        "--timeout".to_owned(),
        "60s".to_owned(),
        "-o".to_owned(),
        "json".to_owned(),
    ];
    for remote in remotes {
        args.push("--remote-kubeconfig".to_owned());
        args.push(kubeconfig(remote));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match apiserver::kubetun(&args) {
        Ok(out) => Ok(serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))),
        Err(error) => Err(error.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_keys_keeps_traffic_and_leaves_no_old_key() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !apiserver_lab::can_run("key_rotation::rotating_keys_keeps_traffic_and_leaves_no_old_key") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("lab");
    let _down = lab::DownOnDrop(dir.clone());
    let lab = apiserver_lab::up_seed_lab(PREFIX, &dir).await;
    let (europe, rome, milan, paris) = (
        &lab.clusters[EUROPE],
        &lab.clusters[ROME],
        &lab.clusters[MILAN],
        &lab.clusters[PARIS],
    );
    let paths = [
        ("rome -> europe (direct)", pod_path(rome, europe)),
        ("rome -> milan (shortcut)", pod_path(rome, milan)),
        ("rome -> paris (through europe)", pod_path(rome, paris)),
    ];

    // The same-run baseline: the longest silence between replies without a rotation.
    let monitors: Vec<GapMonitor> = paths
        .iter()
        .map(|(_, (ns, addr))| GapMonitor::start(ns, addr))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for ((name, _), monitor) in paths.iter().zip(monitors) {
        let (gap, replies) = monitor.stop();
        println!("baseline {name}: longest gap {gap:.3?} over {replies} replies (3 s)");
    }

    let credentials_before = services_credentials(rome).await;
    assert_eq!(credentials_before.len(), 3, "{credentials_before:?}");

    let mut replaced = Vec::new();
    let mut gaps: Vec<Vec<Duration>> = vec![Vec::new(); paths.len()];
    for round in 0..ROTATIONS {
        let old_private = private_key(rome).await;
        let monitors: Vec<GapMonitor> = paths
            .iter()
            .map(|(_, (ns, addr))| GapMonitor::start(ns, addr))
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = std::time::Instant::now();
        let report = {
            let rome = rome.clone();
            let europe = europe.clone();
            tokio::task::spawn_blocking(move || rotate(&rome, &[&europe]))
                .await
                .expect("rotate task")
                .unwrap_or_else(|e| panic!("rotate-keys: {e}"))
        };
        let took = started.elapsed();
        println!(
            "rotation {round}: rotate-keys ran from {:.3} to {:.3}",
            unix_now() - took.as_secs_f64(),
            unix_now()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (i, ((name, _), monitor)) in paths.iter().zip(monitors).enumerate() {
            let (gap, replies) = monitor.stop();
            println!("rotation {round} {name}: longest gap {gap:.3?} ({replies} replies)");
            gaps[i].push(gap);
        }
        println!("rotation {round}: rotate-keys --wait returned after {took:.2?}");

        let new_public = report["publicKey"].as_str().expect("publicKey").to_owned();
        assert_eq!(report["complete"], true, "{report:#}");
        assert_eq!(report["resumed"], false, "{report:#}");
        assert_ne!(report["previousPublicKey"], report["publicKey"]);
        let peers = report["peers"].as_array().expect("peers");
        assert_eq!(peers.len(), 3, "{report:#}");
        for (peer, propagation) in [
            (&europe.id, "direct"),
            (&milan.id, "hub"),
            (&paris.id, "hub"),
        ] {
            let entry = peers
                .iter()
                .find(|p| p["peerId"] == peer.as_str())
                .unwrap_or_else(|| panic!("{peer} in {report:#}"));
            assert_eq!(entry["propagation"], propagation, "{report:#}");
            assert_eq!(entry["moved"], true, "{report:#}");
        }
        let printed = report.to_string();
        let new_private = private_key(rome).await;
        assert!(!printed.contains(&old_private) && !printed.contains(&new_private));
        assert_ne!(new_private, old_private);
        for viewer in [europe, milan, paris] {
            assert_eq!(dialled_key(viewer, rome).await, new_public, "{}", viewer.id);
        }
        let info = ClusterInfo::load(&admin(rome).await, NAMESPACE)
            .await
            .expect("cluster info");
        assert_eq!(info.public_key, new_public);
        replaced.push(old_private);
    }
    for (i, (name, _)) in paths.iter().enumerate() {
        let typical = median(gaps[i].clone());
        println!(
            "key rotation {name}: longest gap per rotation {:.3?}, median {typical:.3?}",
            gaps[i]
        );
        assert!(
            typical <= GAP_LIMIT,
            "{name}: median gap {typical:?} over {:?}",
            gaps[i]
        );
    }

    // Interrupted: without Europe's kubeconfig the direct link cannot learn the key. The
    // command says so; Europe's tunnel stays up on the previous key; the shortcut moves.
    let old_private = private_key(rome).await;
    let monitors: Vec<GapMonitor> = paths
        .iter()
        .map(|(_, (ns, addr))| GapMonitor::start(ns, addr))
        .collect();
    println!("interrupted rotation at {:.3}", unix_now());
    let error = {
        let rome = rome.clone();
        tokio::task::spawn_blocking(move || rotate(&rome, &[]))
            .await
            .expect("rotate task")
            .expect_err("a direct peer without kubeconfig fails the run")
    };
    println!("interrupted rotation: {error}");
    assert!(
        error.contains(&europe.id) && error.contains("--remote-kubeconfig"),
        "{error}"
    );
    assert!(!error.contains(&old_private));
    let rome_secrets: Api<Secret> = Api::namespaced(admin(rome).await, NAMESPACE);
    let secret = rome_secrets
        .get(gateway_key::SECRET_NAME)
        .await
        .expect("Secret");
    let pending = keys::GatewayKeys::from_secret(&secret).expect("keys");
    assert_eq!(
        pending
            .previous
            .as_ref()
            .map(keys::GatewayKey::private_base64),
        Some(old_private.clone()),
        "the rotation stays in progress while Europe has the old key"
    );
    let new_public = pending.current.public_base64().to_owned();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_ne!(dialled_key(europe, rome).await, new_public);
    assert_eq!(dialled_key(milan, rome).await, new_public);

    println!("resuming at {:.3}", unix_now());
    let resumed = {
        let rome = rome.clone();
        let europe = europe.clone();
        tokio::task::spawn_blocking(move || rotate(&rome, &[&europe]))
            .await
            .expect("rotate task")
            .unwrap_or_else(|e| panic!("resumed rotate-keys: {e}"))
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    for ((name, _), monitor) in paths.iter().zip(monitors) {
        let (gap, replies) = monitor.stop();
        println!(
            "interrupted and resumed rotation {name}: longest gap {gap:.3?} ({replies} replies)"
        );
        assert!(gap <= GAP_LIMIT, "{name}: gap {gap:?}");
    }
    assert_eq!(resumed["resumed"], true, "{resumed:#}");
    assert_eq!(resumed["complete"], true, "{resumed:#}");
    assert_eq!(
        resumed["publicKey"],
        new_public.as_str(),
        "the same rotation"
    );
    assert_eq!(dialled_key(europe, rome).await, new_public);
    replaced.push(old_private);

    // No replaced private key in any Secret of any cluster, in any namespace.
    for cluster in [europe, rome, milan, paris] {
        let secrets: Api<Secret> = Api::all(admin(cluster).await);
        let all = secrets.list(&ListParams::default()).await.expect("Secrets");
        assert!(!all.items.is_empty());
        for secret in &all.items {
            let values = secret
                .data
                .iter()
                .flatten()
                .map(|(_, v)| String::from_utf8_lossy(&v.0).into_owned())
                .chain(secret.string_data.iter().flatten().map(|(_, v)| v.clone()));
            for value in values {
                for old in &replaced {
                    assert!(
                        !value.contains(old.as_str()),
                        "a replaced private key is still in Secret {}/{} of {}",
                        secret.metadata.namespace.as_deref().unwrap_or(""),
                        secret.metadata.name.as_deref().unwrap_or(""),
                        cluster.id
                    );
                }
            }
        }
        println!(
            "{}: {} Secrets checked, none holds one of the {} replaced keys",
            cluster.id,
            all.items.len(),
            replaced.len()
        );
    }

    // The services credentials are not the tunnel's keys: rotation leaves them as they were,
    // and a Service Milan exports now is fetched by name from Rome's pod.
    assert_eq!(services_credentials(rome).await, credentials_before);
    apiserver::kubetun(&[
        "service",
        "export",
        "web",
        "-n",
        "demo",
        "--kubeconfig",
        &kubeconfig(milan),
    ])
    .expect("export");
    let pod = rome.pods[0].namespace.clone();
    let answered = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let out = fetch_by_name(&pod, "web.demo.svc.clusterset.local").expect("curl");
            let body = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() || std::time::Instant::now() > deadline {
                break body;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .expect("fetch task");
    assert!(answered.starts_with("web in Milan"), "{answered:?}");
}

/// Rome's credentials for reading its peers' exports: Secret name → resourceVersion.
async fn services_credentials(rome: &ClusterState) -> Vec<(String, String)> {
    let secrets: Api<Secret> = Api::namespaced(admin(rome).await, NAMESPACE);
    let mut found: Vec<(String, String)> = secrets
        .list(&ListParams::default().labels("net.kubetun.io/services-of"))
        .await
        .expect("Secrets")
        .items
        .into_iter()
        .map(|s| {
            (
                s.metadata.name.unwrap_or_default(),
                s.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect();
    found.sort();
    found
}
