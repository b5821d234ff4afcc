//! The user paths on real API servers: the seed lab with a kube-apiserver, etcd and
//! `kubetun-controller` (as its ServiceAccount, with deploy/'s RBAC) per cluster, linked with
//! the `kubetun` CLI; then the faults a real control plane sees — API-server restarts,
//! `kill -9` of a gateway and of a controller — and the CLI's shortcut and disconnect.
//! Every phase measures how long until traffic or reconciliation is back and prints it.
//! Needs root (namespaces, TUN) and the API-server binaries (`.ci/setup` installs them).

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kubetun_crds::{Network, NetworkSpec};
use kubetun_integration::lab;
use kubetun_integration::lab::apiserver::{self, NAMESPACE};
use kubetun_integration::lab::state::ClusterState;
use kubetun_integration::netns::{bin_path, command_in};
use kubetun_testenv::TestCluster;

use crate::apiserver_lab;

use apiserver_lab::{EUROPE, MILAN, PARIS, ROME, admin, median, plane, pod_path, state};

const PREFIX: &str = "ra";

/// Continuous pings (every 20 ms) from one namespace; counts what came back.
struct PingMonitor {
    child: Child,
}

impl PingMonitor {
    fn start(ns: &str, addr: &str) -> Self {
        let child = command_in(ns, "ping")
            .args(["-n", "-q", "-i", "0.02", "-W", "1", "-w", "120", addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        Self { child }
    }

    /// Stops the pings; returns (sent, received).
    fn stop(mut self) -> (u64, u64) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().expect("true"))
            .wait_with_output()
            .expect("ping output");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_else(|| panic!("no ping summary in {text}"));
        let numbers: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        (numbers[0], numbers[1])
    }
}

impl Drop for PingMonitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Time until the first echo reply from `addr` (pings every 20 ms), or `None` after `limit`.
/// ping exits at once while no route to `addr` exists (a gateway restarting, a peer not yet
/// configured), so it is started again until the limit.
fn first_reply(ns: &str, addr: &str, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let remaining = limit.saturating_sub(started.elapsed());
        let mut child = command_in(ns, "ping")
            .args(["-n", "-i", "0.02", "-W", "1"])
            .arg("-w")
            .arg(remaining.as_secs().max(1).to_string())
            .arg(addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        let stdout = child.stdout.take().expect("stdout");
        let found = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("bytes from"));
        let elapsed = started.elapsed();
        let _ = child.kill();
        let _ = child.wait();
        if found {
            return Some(elapsed);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Creates a Network and returns how long until its controller wrote its ID, counted from
/// when the API server accepted it (right after a restart it may answer 429 for a moment).
async fn network_reconciled(client: &kube::Client, name: &str, limit: Duration) -> Duration {
    let networks: Api<Network> = Api::namespaced(client.clone(), NAMESPACE);
    let started = Instant::now();
    let network = Network::new(name, NetworkSpec::default());
    let deadline = started + limit;
    loop {
        match networks.create(&PostParams::default(), &network).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => break,
            // Right after a restart the storage may still be initialising (429).
            Err(e) if Instant::now() > deadline => panic!("create Network {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let accepted = started.elapsed();
    let started = Instant::now();
    if accepted > Duration::from_millis(200) {
        println!("  (Network {name} accepted {accepted:.2?} after the API server was ready)");
    }
    loop {
        if let Ok(Some(n)) = networks.get_opt(name).await
            && n.status.as_ref().is_some_and(|s| s.id.is_some())
        {
            return started.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "Network {name} got no ID within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn log_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// The lines logged at info and above after line `from_line` (RUST_LOG may add debug ones).
fn log_since(path: &Path, from_line: usize) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .skip(from_line)
        .filter(|line| !line.contains(" DEBUG ") && !line.contains(" TRACE "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_lab_on_real_apiservers_survives_faults() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !apiserver_lab::can_run("real_apiservers::seed_lab_on_real_apiservers_survives_faults") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("lab");
    let _down = lab::DownOnDrop(dir.clone());
    let lab = apiserver_lab::up_seed_lab(PREFIX, &dir).await;
    let (rome, milan, europe, paris) = (
        &lab.clusters[ROME],
        &lab.clusters[MILAN],
        &lab.clusters[EUROPE],
        &lab.clusters[PARIS],
    );

    printer_columns_through_the_table_api(rome).await;
    rbac_is_enough_and_no_more(rome).await;

    // API-server restarts: the data plane does not notice, the controller says once that it
    // is blind and once that it is back, stays quiet meanwhile, and reconciles a change made
    // right after the restart within 5 s.
    let (ns, addr) = pod_path(rome, milan);
    let mut recoveries = Vec::new();
    for round in 0..5 {
        let log = &plane(rome).controller_log;
        let before = log_lines(log);
        let pings = PingMonitor::start(&ns, &addr);
        let mut server = TestCluster::attach(&plane(rome).dir).expect("attach");
        let outage = Instant::now();
        server
            .restart_apiserver(round % 2 == 0)
            .await
            .expect("restart");
        let down_for = outage.elapsed();
        let took = network_reconciled(
            &admin(rome).await,
            &format!("after-restart-{round}"),
            Duration::from_secs(10),
        )
        .await;
        // The line saying the API server is back comes once every watch stayed healthy for a
        // second.
        let settled = Instant::now() + Duration::from_secs(8);
        while Instant::now() < settled
            && !log_since(log, before)
                .iter()
                .any(|l| l.contains("API server reachable again"))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (sent, received) = pings.stop();
        recoveries.push(took);
        let lines = log_since(log, before);
        for line in &lines {
            println!("  | {line}");
        }
        println!(
            "API-server restart {round} ({}): down {down_for:.1?}, Network reconciled {took:.2?} after; pings {received}/{sent}; controller logged {} lines",
            if round % 2 == 0 { "SIGKILL" } else { "SIGTERM" },
            lines.len()
        );
        assert!(took <= Duration::from_secs(5), "reconciled after {took:?}");
        // The last echo may still be in flight when ping is stopped.
        assert!(
            received + 1 >= sent,
            "the data plane lost pings during the restart"
        );
        let budget = down_for.as_secs() as usize + 2;
        assert!(
            lines.len() <= budget + 2,
            "at most ~1 log line per second while the API server was away ({down_for:?}); got:\n{}",
            lines.join("\n")
        );
        let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
        let (blind, back) = (
            count("API server unreachable"),
            count("API server reachable again"),
        );
        if round % 2 == 0 {
            // A killed API server breaks every watch: the outage is named once, and its end.
            assert_eq!(
                (blind, back),
                (1, 1),
                "one line when blind, one when back:\n{}",
                lines.join("\n")
            );
        } else {
            // A graceful restart may end the watches cleanly and be back before any relist
            // fails: an outage no watch saw is not reported, one that was is named once.
            assert!(
                blind == back && blind <= 1,
                "at most one line when blind, and one when back for it:\n{}",
                lines.join("\n")
            );
        }
    }
    println!(
        "API-server restart: Network reconciled after the restart, median of 5: {:.2?} ({recoveries:.2?})",
        median(recoveries.clone())
    );

    // kill -9 of a gateway: its controller re-applies the state to the new process. Rome's
    // own, then the hub's, which alone carries Rome <-> Paris.
    for (index, what, (ns, addr)) in [
        (ROME, "Rome's gateway", (ns.clone(), addr.clone())),
        (
            EUROPE,
            "the hub's gateway (Rome -> Paris)",
            pod_path(rome, paris),
        ),
    ] {
        let cluster = &lab.clusters[index];
        restart_gateway_hard(&dir, index, cluster);
        let back = first_reply(&ns, &addr, Duration::from_secs(30));
        println!("kill -9 of {what}: first reply {back:.2?} after the new process started");
        let back = back.unwrap_or_else(|| {
            panic!(
                "traffic did not resume after the restart of {what}; controller log:\n{}",
                kubetun_integration::lab::fabric::log_tail(&plane(cluster).controller_log, 10)
            )
        });
        assert!(
            back <= Duration::from_secs(5),
            "{what}: traffic resumed after {back:?}"
        );
    }

    // Shortcut delete and create on the hub: time to first packet, and when --wait returns.
    let shortcut = format!("{}-{}", rome.id, milan.id);
    let hub_kubeconfig = plane(europe).kubeconfig.to_string_lossy().into_owned();
    let delete_shortcut = || {
        apiserver::kubetun(&[
            "shortcut",
            "delete",
            &shortcut,
            "--kubeconfig",
            &hub_kubeconfig,
            "--wait",
        ])
        .expect("shortcut delete")
    };
    delete_shortcut();
    assert!(
        first_reply(&ns, &addr, Duration::from_secs(2)).is_none(),
        "no path between the leaves without the shortcut"
    );
    let mut times = Vec::new();
    for round in 0..3 {
        let started = Instant::now();
        let probe = {
            let (ns, addr) = (ns.clone(), addr.clone());
            std::thread::spawn(move || first_reply(&ns, &addr, Duration::from_secs(30)))
        };
        apiserver::shortcut(europe, rome, milan, Some("--transit")).expect("shortcut create");
        let returned = started.elapsed();
        let first = probe.join().expect("probe").unwrap_or_else(|| {
            panic!(
                "no traffic over the new shortcut; rome's controller log:\n{}",
                kubetun_integration::lab::fabric::log_tail(&plane(rome).controller_log, 10)
            )
        });
        println!(
            "shortcut create {round}: first packet {first:.2?}, --wait returned {returned:.2?}"
        );
        times.push(first);
        if round < 2 {
            delete_shortcut();
        }
    }
    let first = median(times);
    println!("shortcut create: first packet median {first:.2?}");
    assert!(
        first <= Duration::from_secs(2),
        "first packet after {first:?}"
    );

    // kill -9 of the controller: the gateway keeps forwarding, the new process takes over.
    let pings = PingMonitor::start(&ns, &addr);
    let pid = plane(rome).controller_pid.expect("pid");
    assert!(apiserver::stop_controller(
        pid,
        nix::sys::signal::Signal::SIGKILL
    ));
    let restarted = Instant::now();
    let new_pid = apiserver::start_controller(plane(rome)).expect("restart controller");
    // Recorded, so the lab's teardown stops the new process too.
    let mut lab_state = state(&dir);
    if let Some(plane) = lab_state.clusters[ROME].control_plane.as_mut() {
        plane.controller_pid = Some(new_pid);
    }
    lab_state.save(&dir).expect("save");
    let took = network_reconciled(
        &admin(rome).await,
        "after-controller-kill",
        Duration::from_secs(20),
    )
    .await;
    let (sent, received) = pings.stop();
    println!(
        "controller kill -9: new process reconciled a Network {:.2?} after its start; pings {received}/{sent}",
        restarted.elapsed().min(took)
    );
    // The last echo may still be in flight when ping is stopped.
    assert!(
        received + 1 >= sent,
        "the data plane lost pings while the controller was down"
    );

    // Disconnect Europe <-> Rome from the CLI: both sides' objects go, traffic stops.
    let (ens, eaddr) = pod_path(europe, rome);
    assert!(first_reply(&ens, &eaddr, Duration::from_secs(5)).is_some());
    apiserver::kubetun(&[
        "network",
        "disconnect",
        "--kubeconfig",
        &plane(europe).kubeconfig.to_string_lossy(),
        "--remote-kubeconfig",
        &plane(rome).kubeconfig.to_string_lossy(),
        "--wait",
    ])
    .expect("disconnect");
    for (cluster, peer) in [(europe, rome), (rome, europe)] {
        let configs: Api<kubetun_crds::NetworkConfig> =
            Api::namespaced(admin(cluster).await, NAMESPACE);
        let left: Vec<String> = configs
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter_map(|nc| nc.metadata.name)
            .filter(|name| name.ends_with(&peer.id))
            .collect();
        assert!(left.is_empty(), "{} still holds {left:?}", cluster.name);
    }
    assert!(
        first_reply(&ens, &eaddr, Duration::from_secs(2)).is_none(),
        "traffic stopped after disconnect"
    );
    // Europe <-> Milan is untouched.
    let (mns, maddr) = pod_path(europe, milan);
    assert!(first_reply(&mns, &maddr, Duration::from_secs(5)).is_some());
}

/// Kills the gateway of `cluster` (lab index `index`) with SIGKILL and starts a new one, as a
/// kubelet would; its controller must bring it back to the desired state.
fn restart_gateway_hard(dir: &Path, index: usize, cluster: &ClusterState) {
    let gateway_pid = cluster.pid.expect("gateway pid");
    Command::new("kill")
        .args(["-KILL", &gateway_pid.to_string()])
        .status()
        .expect("kill");
    std::thread::sleep(Duration::from_millis(200));
    let _ = std::fs::remove_file(&cluster.grpc_socket);
    let new_gateway =
        kubetun_integration::lab::fabric::start_gateway(cluster, &bin_path("kubetun-gateway"))
            .expect("restart gateway");
    let mut lab_state = state(dir);
    lab_state.clusters[index].pid = Some(new_gateway);
    lab_state.save(dir).expect("save");
}

/// The printer columns as kubectl reads them: the Table API of a TunnelEndpoint list.
async fn printer_columns_through_the_table_api(cluster: &ClusterState) {
    let client = admin(cluster).await;
    let request = http::Request::get(format!(
        "/apis/net.kubetun.io/v1alpha1/namespaces/{NAMESPACE}/tunnelendpoints"
    ))
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .body(Vec::new())
    .expect("request");
    let table: serde_json::Value =
        serde_json::from_str(&client.request_text(request).await.expect("table")).expect("json");
    assert_eq!(table["kind"], "Table", "{table}");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for wanted in ["Name", "Peer", "Endpoint", "Status", "Via", "Age"] {
        assert!(columns.contains(&wanted), "column {wanted} in {columns:?}");
    }
    let status = columns.iter().position(|c| *c == "Status").expect("Status");
    let rows = table["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), cluster.tunnel_endpoints.len(), "{table}");
    let (peer, via) = (
        columns.iter().position(|c| *c == "Peer").expect("Peer"),
        columns.iter().position(|c| *c == "Via").expect("Via"),
    );
    for row in rows {
        assert_eq!(row["cells"][status], "Connected", "{row}");
        // Rome reaches Paris only through Europe, the others over their own tunnels.
        let through = if row["cells"][peer] == "paris" {
            "europe"
        } else {
            ""
        };
        // (an absent value is a null cell)
        assert_eq!(row["cells"][via].as_str().unwrap_or(""), through, "{row}");
    }
    let printed = kubetun_testenv::TestCluster::attach(&plane(cluster).dir)
        .expect("attach")
        .kubectl(&["get", "tunnelendpoints", "-n", NAMESPACE]);
    if let Ok(printed) = printed {
        assert!(printed.contains("Connected"), "{printed}");
    }
}

/// The controller ran the whole lab as its ServiceAccount; the same identity may not read
/// Secrets elsewhere or delete namespaces.
async fn rbac_is_enough_and_no_more(cluster: &ClusterState) {
    let client = kubetun_testenv::client_for(&plane(cluster).controller_kubeconfig)
        .await
        .expect("controller client");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("the controller may not list kube-system Secrets: {other:?}"),
    }
    let namespaces: Api<Namespace> = Api::all(client);
    match namespaces.delete("default", &Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("the controller may not delete namespaces: {other:?}"),
    }
}

/// `kubectl apply -k deploy/` and `-k deploy/agent/` as a user runs them: the server accepts
/// every manifest (schemas, RBAC, the Deployment and DaemonSet), and a second apply changes
/// nothing.
#[tokio::test]
async fn deploy_applies_with_kubectl_kustomize() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let Some(cluster) = kubetun_testenv::cluster_or_skip("deploy").await else {
        return;
    };
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    for dir in [deploy.to_owned(), format!("{deploy}/agent")] {
        let applied = cluster
            .kubectl(&["apply", "--server-side", "-k", &dir])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(applied.contains("serverside-applied"), "{applied}");
        let again = cluster
            .kubectl(&["apply", "--server-side", "-k", &dir])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !again.contains("configured"),
            "a second apply is a no-op:\n{again}"
        );
    }
    let crds = cluster
        .kubectl(&["get", "crd", "-o", "name"])
        .expect("get crd");
    for plural in [
        "networkconfigs",
        "tunnelendpoints",
        "shortcutconnections",
        "networks",
        "networkids",
    ] {
        assert!(crds.contains(&format!("{plural}.net.kubetun.io")), "{crds}");
    }
}
