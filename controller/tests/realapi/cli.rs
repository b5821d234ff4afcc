//! The binaries against a real API server: `kubetun network reset` after an outage (its
//! error names the flag it needs, is one plain line, and it waits for finalizers or says
//! truthfully what still terminates), and `kubetun-controller` started the way deploy/ starts
//! it (settings from the applied ConfigMap, `--kubeconfig`, gateway socket derived from the
//! interface name, metrics off by default, no hub operator unless `--hub`).

use crate::realapi_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kubetun_crds::contract::link::{
    FINALIZER, MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL, PEER_LABEL, ROLE_LABEL, ROLE_REMOTE,
};
use kubetun_crds::{NetworkConfig, NetworkConfigSpec, ShortcutConnection};
use realapi_support::{NAMESPACE, kubetun, text, unreachable_kubeconfig};

fn assert_plain_error(stderr: &str) {
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes off a terminal: {stderr:?}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one error line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
}

#[tokio::test]
async fn reset_after_an_outage_names_its_flag_and_waits_for_the_finalizer() {
    let Some([rome]) = realapi_support::clusters(["rome"]).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let milan_gone = unreachable_kubeconfig(dir.path());
    let rome_k = rome.kubeconfig_path();
    let mut leaf =
        realapi_support::Leaf::start(&rome, "rome", "10.202.0.0/16", "10.70.0.0/16").await;
    // Milan's NetworkConfig as the connector left it, held by the IPAM finalizer; then the
    // controller goes down (the outage).
    let configs: Api<NetworkConfig> = Api::namespaced(rome.client().await.unwrap(), NAMESPACE);
    let nc = NetworkConfig {
        metadata: ObjectMeta {
            name: Some("from-milan".into()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_CONNECTOR.to_owned()),
                (ROLE_LABEL.to_owned(), ROLE_REMOTE.to_owned()),
                (PEER_LABEL.to_owned(), "milan".to_owned()),
            ])),
            finalizers: Some(vec![FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: NetworkConfigSpec {
            source_cluster: kubetun_crds::ClusterRef {
                id: "milan".into(),
                name: "milan".into(),
            },
            destination_cluster: kubetun_crds::ClusterRef {
                id: "rome".into(),
                name: "rome".into(),
            },
            pod_cidrs: vec!["10.203.0.0/16".into()],
            endpoint: kubetun_crds::Endpoint {
                address: "milan.example".into(),
                port: 51820,
            },
            public_key: "mGyVC0dQnFOeV6nXsqMSFBJvnIm0ZNMuEb6jUgWbhVI=".into(),
            ..NetworkConfigSpec::default()
        },
        status: None,
    };
    configs.create(&PostParams::default(), &nc).await.unwrap();
    leaf.stop_controller();

    let args = |extra: &[&str]| {
        let mut v = vec![
            "network".to_owned(),
            "reset".to_owned(),
            "--kubeconfig".to_owned(),
            rome_k.display().to_string(),
            "--remote-kubeconfig".to_owned(),
            milan_gone.display().to_string(),
        ];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let run = |a: Vec<String>| async move {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        kubetun(&refs).await
    };

    // Milan cannot be read: the error says which flag supplies its id.
    let out = run(args(&[])).await;
    assert!(!out.status.success());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_plain_error(&stderr);
    assert!(stderr.contains("--remote-cluster-id"), "{stderr}");
    assert!(!stdout.contains("(local) (local)"), "{stdout}");
    assert!(!stdout.contains('\u{1b}'), "{stdout:?}");

    // With the id: deletion requested, but the finalizer holds it; the CLI says so.
    let out = run(args(&["--remote-cluster-id", "milan", "--timeout", "2s"])).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert_plain_error(&stderr);
    assert!(
        stderr.contains("still terminating")
            && stderr.contains("NetworkConfig kubetun-system/from-milan")
            && stderr.contains(FINALIZER),
        "{stderr}"
    );
    assert!(!stdout.contains("deleted"), "{stdout}");
    assert!(
        configs
            .get_opt("from-milan")
            .await
            .unwrap()
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // The controller comes back while reset waits: it returns once the object is gone.
    let started = Instant::now();
    let restart = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        leaf.run_controller();
    };
    let (out, ()) = tokio::join!(
        run(args(&["--remote-cluster-id", "milan", "--timeout", "30s"])),
        restart
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("removed NetworkConfig kubetun-system/from-milan"),
        "{stdout}"
    );
    assert!(configs.get_opt("from-milan").await.unwrap().is_none());
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// Runs `kubetun-controller` with `env` and `args`; the child is killed on drop.
fn controller(env: &BTreeMap<String, String>, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kubetun-controller"))
        .args(args)
        .env_clear()
        .envs(env)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn controller_starts_as_deployed_from_the_config_map() {
    let Some([cluster]) = realapi_support::clusters(["deployed"]).await else {
        return;
    };
    let root = realapi_support::repo_root();
    cluster
        .kubectl(&[
            "apply",
            "-f",
            root.join("deploy/config.yaml").to_str().unwrap(),
        ])
        .unwrap();
    let client = cluster.client().await.unwrap();
    let config: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let mut env: BTreeMap<String, String> = config
        .get("kubetun-controller-config")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(env["KUBETUN_MANAGE_ROUTES"], "true");
    assert_eq!(env["KUBETUN_HUB"], "false");
    // On this host, not in a pod: DNS on a free port.
    env.insert("KUBETUN_DNS_ADDR".into(), "127.0.0.1:0".into());
    // Another interface name than kubetun0: the socket follows it by construction.
    let interface = format!("kt{}", std::process::id() % 100_000);
    env.insert("KUBETUN_GATEWAY_INTERFACE".into(), interface.clone());
    let socket = kubetun_gateway::socket_paths::grpc_socket_path(&interface);
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let gateway = kubetun_controller_testing::FakeGateway::start_at(&socket)
        .await
        .unwrap();

    let kubeconfig = cluster.kubeconfig_path();
    let kubeconfig = kubeconfig.to_str().unwrap();
    let mut first = controller(&env, &["--kubeconfig", kubeconfig]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while gateway.current().is_none() {
        assert!(
            Instant::now() < deadline,
            "the controller never applied to {}",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let applied = gateway.current().unwrap();
    assert!(
        applied.interface.unwrap().manage_routes,
        "KUBETUN_MANAGE_ROUTES from the ConfigMap"
    );

    // Not the hub: a ShortcutConnection stays untouched (no finalizer).
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(client.clone(), NAMESPACE);
    let example = root.join("deploy/examples/shortcutconnection.yaml");
    cluster
        .kubectl(&["apply", "-f", example.to_str().unwrap()])
        .unwrap();
    // A second controller on the same host starts (metrics are off by default) ...
    let mut second = controller(&env, &["--kubeconfig", kubeconfig]);
    // ... and one told to use a taken port fails, naming the flag.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let third = controller(&env, &["--kubeconfig", kubeconfig, "--metrics-addr", &port]);
    let third = tokio::time::timeout(Duration::from_secs(20), third.wait_with_output())
        .await
        .expect("a controller whose metrics port is taken exits")
        .unwrap();
    assert!(!third.status.success());
    let stderr = text(&third.stderr);
    assert!(
        stderr.contains("--metrics-addr") && stderr.contains(&port),
        "{stderr}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second controller runs"
    );
    let sc = shortcuts.list(&Default::default()).await.unwrap().items;
    assert_eq!(sc.len(), 1);
    assert!(
        sc[0].finalizers().is_empty(),
        "only the hub runs the shortcut operator"
    );

    // Graceful stop; the log says once how to stop, and a normal start is no news.
    for child in [&mut first, &mut second] {
        let pid = child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(sent.unwrap().success());
    }
    let out = tokio::time::timeout(Duration::from_secs(20), first.wait_with_output())
        .await
        .expect("SIGTERM stops the controller")
        .unwrap();
    let log = text(&out.stdout) + &text(&out.stderr);
    assert!(!log.contains('\u{1b}'), "no colour into a pipe");
    assert_eq!(log.matches("ctrl+c").count(), 1, "{log}");
    assert!(!log.contains("another state"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
    let _ = std::fs::remove_file(&socket);
    drop(gateway);

    // With --hub the operator takes the ShortcutConnection (finalizer added).
    let mut hub = controller(&env, &["--kubeconfig", kubeconfig, "--hub", "--no-gateway"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sc = shortcuts.list(&Default::default()).await.unwrap().items;
        if !sc[0].finalizers().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hub never took the ShortcutConnection"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = hub.start_kill();
    let _ = shortcuts
        .patch(
            &sc[0].name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
}
