//! `kubetun install` and `kubetun uninstall` on real API servers with Nodes made as a kubelet
//! would (spec.podCIDRs, InternalIP): detection printed, a fresh install, a re-install as an
//! upgrade that leaves the key Secret and the links alone, `--wait` timing out without a
//! kubelet, `--dry-run -o yaml` equal to `kubectl kustomize deploy/` (+ `deploy/agent/`, and
//! with `--ha` the components), overlaps refused, and uninstall refused with links and
//! leaving nothing behind with `--force`. The cluster's default isolation: `exported` on a
//! new install, kept by an upgrade, changed by `--isolation`, `open` for an install from
//! before the setting, a broken value refused.

use crate::realapi_support;

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::discovery::ApiResource;
use kubetun_cli::install::flags::SETTINGS_ANNOTATION;
use kubetun_cli::install::manifests::{self, CONFIG_HASH_ANNOTATION, CONFIG_MAP};
use kubetun_testenv::TestCluster;
use realapi_support::{kubetun, text};
use serde_json::{Value, json};

/// Nodes as a kubelet registers them: `(name, podCIDR, InternalIP)`.
async fn add_nodes(cluster: &TestCluster, nodes: &[(&str, &str, &str)]) {
    let api: Api<Node> = Api::all(cluster.client().await.unwrap());
    for (name, pod_cidr, ip) in nodes {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]},
        }))
        .unwrap();
        api.create(&PostParams::default(), &node).await.unwrap();
    }
    // The API server makes Service default/kubernetes shortly after it starts; a real
    // cluster has it.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(api.into_client(), "default");
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while services.get_opt("kubernetes").await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "no Service default/kubernetes");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn kubeconfig(cluster: &TestCluster) -> String {
    cluster.kubeconfig_path().to_str().unwrap().to_owned()
}

async fn install(cluster: &TestCluster, extra: &[&str]) -> std::process::Output {
    let path = kubeconfig(cluster);
    let mut args = vec!["install", "--kubeconfig", path.as_str()];
    args.extend_from_slice(extra);
    kubetun(&args).await
}

/// The controller's ConfigMap as `kubetun install` left it.
fn installed_config(cluster: &TestCluster) -> Value {
    let json = cluster
        .kubectl(&[
            "-n",
            "kubetun-system",
            "get",
            "configmap",
            CONFIG_MAP,
            "-o",
            "json",
        ])
        .unwrap();
    serde_json::from_str(&json).unwrap()
}

fn nc_resource() -> ApiResource {
    ApiResource {
        group: "net.kubetun.io".into(),
        version: "v1alpha1".into(),
        api_version: "net.kubetun.io/v1alpha1".into(),
        kind: "NetworkConfig".into(),
        plural: "networkconfigs".into(),
    }
}

#[tokio::test]
async fn install_upgrade_and_uninstall() {
    kubetun_cli::install_tls_provider();
    let Some([cluster]) = kubetun_testenv::clusters_or_skip(["install"]).await else {
        return;
    };
    add_nodes(
        &cluster,
        &[
            ("node-a", "10.244.0.0/24", "192.168.10.11"),
            ("node-b", "10.244.1.0/24", "192.168.10.12"),
            ("node-c", "10.244.3.0/24", "192.168.11.13"),
        ],
    )
    .await;
    let client = cluster.client().await.unwrap();

    // A fresh install, the endpoint from the Service's NodePort.
    let started = Instant::now();
    let out = install(&cluster, &["--cluster-id", "rome", "--wait=false"]).await;
    let install_time = started.elapsed();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    eprintln!("kubetun install took {install_time:?}\n{stdout}");
    for expected in [
        "detected pod CIDR: 10.244.0.0/22 (covering prefix of the spec.podCIDRs of 3 Node(s)",
        "detected service CIDR: 10.96.0.0/12 (inferred: ClusterIP 10.96.0.1 of Service default/kubernetes",
        "detected node subnets: 192.168.10.0/23",
        "detected endpoint: 192.168.10.11:",
        "NodePort on the InternalIP of Node node-a",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in:\n{stdout}");
    }
    let config = installed_config(&cluster);
    assert_eq!(config["data"]["KUBETUN_CLUSTER_ID"], "rome");
    assert_eq!(config["data"]["KUBETUN_POD_CIDR"], "10.244.0.0/22");
    assert_eq!(config["data"]["KUBETUN_RESERVED"], "192.168.10.0/23");
    assert_eq!(config["data"]["KUBETUN_EXTERNAL_CIDR"], "");
    // A new install: its links admit only what is exported.
    assert_eq!(config["data"]["KUBETUN_ISOLATION"], "exported");
    assert!(
        stdout.contains("isolation: exported (the default of a new install"),
        "{stdout}"
    );
    let applied = every_object_present(&cluster, false).await;
    assert!(applied >= 15, "{applied} objects");

    // What the controller and the links made meanwhile: a key Secret and a NetworkConfig.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kubetun-system");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "kubetun-gateway-key"},
        "stringData": {"privateKey": "not-a-real-key", "publicKey": "pub"},
    }))
    .unwrap();
    let secret = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let ncs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "kubetun-system", &nc_resource());
    let example = std::fs::read_to_string(
        realapi_support::repo_root().join("deploy/examples/networkconfig.yaml"),
    )
    .unwrap();
    let mut nc: Value = manifests::documents("examples/networkconfig.yaml", &example)
        .unwrap()
        .remove(0);
    nc["metadata"]["namespace"] = json!("kubetun-system");
    let nc: DynamicObject = serde_json::from_value(nc).unwrap();
    let nc = ncs.create(&PostParams::default(), &nc).await.unwrap();

    // The load balancer got an address meanwhile.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "kubetun-system");
    services
        .patch_status(
            "kubetun-gateway",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.50"}]}}}),
            ),
        )
        .await
        .unwrap();

    // Re-install as an upgrade: a new image and a changed flag.
    let started = Instant::now();
    let out = install(
        &cluster,
        &[
            "--image",
            "registry.example/kubetun:v2",
            "--external-cidr",
            "10.70.0.0/16",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    eprintln!("the upgrade took {:?}", started.elapsed());
    assert!(
        text(&out.stdout).contains(
            "detected endpoint: 203.0.113.50:51820 (the load balancer ingress of Service \
             kubetun-gateway)"
        ),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains("cluster id: rome (the installed one)"),
        "{}",
        text(&out.stdout)
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), "kubetun-system")
        .get("kubetun-gateway")
        .await
        .unwrap();
    let pod = deployment.spec.unwrap().template;
    assert!(
        pod.spec
            .unwrap()
            .containers
            .iter()
            .all(|c| c.image.as_deref() == Some("registry.example/kubetun:v2"))
    );
    assert!(
        pod.metadata
            .unwrap()
            .annotations
            .unwrap()
            .contains_key(CONFIG_HASH_ANNOTATION)
    );
    let config = installed_config(&cluster);
    assert_eq!(config["data"]["KUBETUN_EXTERNAL_CIDR"], "10.70.0.0/16");
    assert_eq!(config["data"]["KUBETUN_ENDPOINT_ADDRESS"], "203.0.113.50");
    // The upgrade keeps the cluster's isolation and says so.
    assert_eq!(config["data"]["KUBETUN_ISOLATION"], "exported");
    assert!(
        text(&out.stdout)
            .contains("isolation: exported (the installed one; --isolation changes it)"),
        "{}",
        text(&out.stdout)
    );
    let secret_after = secrets.get("kubetun-gateway-key").await.unwrap();
    assert_eq!(
        secret_after.metadata.resource_version, secret.metadata.resource_version,
        "the key Secret was touched"
    );
    let nc_after = ncs.get(nc.metadata.name.as_deref().unwrap()).await.unwrap();
    assert_eq!(
        nc_after.metadata.resource_version, nc.metadata.resource_version,
        "the NetworkConfig was touched"
    );

    // --isolation changes it; an install from before the setting (no key) stays open.
    let out = install(&cluster, &["--isolation", "open"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("isolation: open (--isolation)"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        installed_config(&cluster)["data"]["KUBETUN_ISOLATION"],
        "open"
    );
    for (flags, wanted) in [
        (&[][..], "open"),
        (&["--isolation", "exported"][..], "exported"),
    ] {
        cluster
            .kubectl(&[
                "-n",
                "kubetun-system",
                "patch",
                "configmap",
                CONFIG_MAP,
                "--type=json",
                "-p",
                r#"[{"op": "remove", "path": "/data/KUBETUN_ISOLATION"}]"#,
            ])
            .unwrap();
        let out = install(&cluster, flags).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            installed_config(&cluster)["data"]["KUBETUN_ISOLATION"],
            wanted,
            "{flags:?}"
        );
        if flags.is_empty() {
            assert!(
                text(&out.stdout).contains("isolation: open (installed before isolation existed"),
                "{}",
                text(&out.stdout)
            );
        }
    }
    // A value the controller would refuse is refused here, with the way out.
    cluster
        .kubectl(&[
            "-n",
            "kubetun-system",
            "patch",
            "configmap",
            CONFIG_MAP,
            "--type=merge",
            "-p",
            r#"{"data": {"KUBETUN_ISOLATION": "closed"}}"#,
        ])
        .unwrap();
    let out = install(&cluster, &[]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("KUBETUN_ISOLATION: \"closed\"")
            && text(&out.stderr).contains("pass --isolation open or --isolation exported"),
        "{}",
        text(&out.stderr)
    );
    let out = install(&cluster, &["--isolation", "exported"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Switching to replicated gateways: the load-balanced Service goes (deploy/ha drops it).
    let out = install(&cluster, &["--ha", "--wait=false"]).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout
            .contains("deleted Service kubetun-system/kubetun-gateway (not part of this install)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("kept from the last install: --external-cidr, --image"),
        "{stdout}"
    );
    every_object_present(&cluster, true).await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), "kubetun-system")
        .get("kubetun-gateway")
        .await
        .unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert!(pod.host_network.unwrap_or_default());
    assert!(
        pod.containers
            .iter()
            .all(|c| c.image.as_deref() == Some("registry.example/kubetun:v2"))
    );

    // A different cluster id would break the links.
    let out = install(&cluster, &["--cluster-id", "milan"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("installed with cluster id \"rome\""),
        "{}",
        text(&out.stderr)
    );

    // --wait without a kubelet: a clear timeout, non-zero.
    let out = install(&cluster, &["--ha=false", "--wait", "--timeout", "2s"]).await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("timed out after 2s waiting for kubetun to be Ready (gateway Deployment: 0/1 replicas ready"), "{stderr}");
    assert!(
        text(&out.stdout).contains("… waiting:"),
        "{}",
        text(&out.stdout)
    );

    // A Network in a user's namespace with the controller's finalizer (its controller is
    // gone by the time uninstall removes it).
    let networks: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource {
            kind: "Network".into(),
            plural: "networks".into(),
            ..nc_resource()
        },
    );
    let network: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "net.kubetun.io/v1alpha1", "kind": "Network",
        "metadata": {"name": "payments", "finalizers": ["net.kubetun.io/network-id"]},
        "spec": {"prefixes": ["10.200.16.0/20"]},
    }))
    .unwrap();
    networks
        .create(&PostParams::default(), &network)
        .await
        .unwrap();

    // Uninstall: refused while the link exists, then forced.
    let path = kubeconfig(&cluster);
    let out = kubetun(&["uninstall", "--kubeconfig", &path]).await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("refusing to uninstall while links exist: NetworkConfig kubetun-system/"),
        "{stderr}"
    );
    assert!(
        ncs.get_opt(nc.metadata.name.as_deref().unwrap())
            .await
            .unwrap()
            .is_some()
    );
    let out = kubetun(&["uninstall", "--kubeconfig", &path, "--force"]).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        !stdout.contains("not-a-real-key") && !stdout.contains("privateKey"),
        "{stdout}"
    );
    assert!(
        stdout.contains("deleted Network default/payments"),
        "{stdout}"
    );
    nothing_left(&cluster).await;
}

/// Every object of the plain install (or with `ha`) exists; returns how many.
async fn every_object_present(cluster: &TestCluster, ha: bool) -> usize {
    let objects = manifests::render(manifests::Components {
        ha,
        hub_forwarding: false,
    })
    .unwrap();
    for object in &objects {
        let (_, kind, namespace, name) = manifests::identity(object);
        let mut args = vec!["get", kind.as_str(), name.as_str(), "-o", "name"];
        if !namespace.is_empty() {
            args.extend(["-n", namespace.as_str()]);
        }
        cluster
            .kubectl(&args)
            .unwrap_or_else(|e| panic!("{kind} {name} missing: {e}"));
    }
    objects.len()
}

/// Nothing of kubetun is left: every kind it could have created, listed.
async fn nothing_left(cluster: &TestCluster) {
    let all_sets = [false, true].into_iter().flat_map(|ha| {
        manifests::render(manifests::Components {
            ha,
            hub_forwarding: true,
        })
        .unwrap()
    });
    for object in all_sets {
        let (_, kind, namespace, name) = manifests::identity(&object);
        let mut args = vec![
            "get",
            kind.as_str(),
            name.as_str(),
            "-o",
            "jsonpath={.status.phase}",
        ];
        if !namespace.is_empty() {
            args.extend(["-n", namespace.as_str()]);
        }
        match cluster.kubectl(&args) {
            Err(e) => assert!(e.contains("NotFound"), "{kind} {name}: {e}"),
            // No namespace controller runs beside a bare API server: the namespace stays
            // Terminating with nothing in it.
            Ok(phase) if kind == "Namespace" => assert_eq!(phase, "Terminating"),
            Ok(_) => panic!("{kind} {namespace}/{name} is left"),
        }
    }
    for kind in [
        "secrets",
        "configmaps",
        "leases",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "services",
        "deployments",
        "daemonsets",
    ] {
        let left = cluster
            .kubectl(&["-n", "kubetun-system", "get", kind, "-o", "name"])
            .unwrap();
        assert!(left.trim().is_empty(), "{kind} left: {left}");
    }
    let crds = cluster.kubectl(&["get", "crd", "-o", "name"]).unwrap();
    assert!(!crds.contains("kubetun"), "{crds}");
    let labelled = cluster
        .kubectl(&[
            "get",
            "clusterroles,clusterrolebindings",
            "-l",
            "app.kubernetes.io/name=kubetun",
            "-o",
            "name",
        ])
        .unwrap();
    assert!(labelled.trim().is_empty(), "{labelled}");
}

/// `kubectl kustomize` of a kustomization in a temporary directory next to nothing: the
/// given resources and components, as paths relative to it.
fn kustomize(cluster: &TestCluster, resources: &[&str], components: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let root = realapi_support::repo_root();
    let up = "../".repeat(dir.path().components().count() - 1);
    let rel = |p: &str| format!("{up}{}", root.join(p).strip_prefix("/").unwrap().display());
    let kustomization = json!({
        "resources": resources.iter().map(|r| rel(r)).collect::<Vec<_>>(),
        "components": components.iter().map(|c| rel(c)).collect::<Vec<_>>(),
    });
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        kustomization.to_string(),
    )
    .unwrap();
    let yaml = cluster
        .kubectl(&["kustomize", dir.path().to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{e}"));
    manifests::documents("kustomize", &yaml).unwrap()
}

fn by_identity(objects: Vec<Value>) -> BTreeMap<(String, String, String, String), Value> {
    objects
        .into_iter()
        .map(|o| (manifests::identity(&o), o))
        .collect()
}

/// Install's dry run against kustomize's rendering of the same directories, object by object,
/// after taking the config values and the config hash from install's side.
fn compare(install: Vec<Value>, mut kustomized: Vec<Value>) {
    let install = by_identity(install);
    for object in &mut kustomized {
        let (_, kind, _, name) = manifests::identity(object);
        if kind == "ConfigMap" && name == CONFIG_MAP {
            let filled = install.get(&manifests::identity(object)).unwrap()["data"].clone();
            for (key, value) in filled.as_object().unwrap() {
                object["data"][key] = value.clone();
            }
        }
    }
    let mut install = install;
    for object in install.values_mut() {
        if let Some(Value::Object(annotations)) = object.pointer_mut("/metadata/annotations") {
            annotations.remove(SETTINGS_ANNOTATION);
            if annotations.is_empty() {
                object["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("annotations");
            }
        }
        if let Some(Value::Object(annotations)) =
            object.pointer_mut("/spec/template/metadata/annotations")
        {
            annotations.remove(CONFIG_HASH_ANNOTATION);
            if annotations.is_empty() {
                object["spec"]["template"]["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("annotations");
            }
        }
    }
    let kustomized = by_identity(kustomized);
    assert_eq!(
        install.keys().collect::<Vec<_>>(),
        kustomized.keys().collect::<Vec<_>>(),
        "different objects"
    );
    for (id, object) in &install {
        let (mut ours, mut theirs) = (object.clone(), kustomized[id].clone());
        integral_numbers(&mut ours);
        integral_numbers(&mut theirs);
        if ours != theirs {
            let (ours, theirs) = (
                serde_yaml::to_string(&ours).unwrap(),
                serde_yaml::to_string(&theirs).unwrap(),
            );
            let first = ours
                .lines()
                .zip(theirs.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let window = |text: &str| {
                text.lines()
                    .skip(first.saturating_sub(3))
                    .take(8)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            panic!(
                "{id:?} differs at line {first}:\n--- install\n{}\n--- kustomize\n{}",
                window(&ours),
                window(&theirs)
            );
        }
    }
}

/// `65535.0` and `65535` are one number to the API server (kustomize writes the latter).
fn integral_numbers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                #[allow(clippy::cast_possible_truncation)]
                let int = f as i64;
                *value = Value::from(int);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

#[tokio::test]
async fn dry_run_equals_kustomize_and_overlaps_are_refused() {
    kubetun_cli::install_tls_provider();
    let Some([cluster]) = kubetun_testenv::clusters_or_skip(["dryrun"]).await else {
        return;
    };
    if let Err(e) = cluster.kubectl(&["version", "--client"]) {
        assert!(
            !kubetun_testenv::required(),
            "CI=true and kubectl cannot run: {e}"
        );
        eprintln!("skipping: this test needs kubectl: {e}");
        return;
    }
    add_nodes(&cluster, &[("node-a", "10.244.0.0/24", "192.168.10.11")]).await;

    for (ha, flags, components) in [
        (false, vec![], vec![]),
        (true, vec!["--ha"], vec!["deploy/ha"]),
        (false, vec!["--hub", "--hub-forwarding"], vec!["deploy/hub"]),
    ] {
        let mut args = vec![
            "--dry-run",
            "-o",
            "yaml",
            "--cluster-id",
            "paris",
            "--endpoint-address",
            "203.0.113.7",
        ];
        args.extend(flags);
        let out = install(&cluster, &args).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("detected pod CIDR: 10.244.0.0/24"),
            "{}",
            text(&out.stderr)
        );
        let rendered = manifests::documents("dry-run", &text(&out.stdout)).unwrap();
        // A new cluster: the manifests say exported, and why is on stderr.
        let config = rendered
            .iter()
            .find(|o| {
                manifests::identity(o).1 == "ConfigMap" && manifests::identity(o).3 == CONFIG_MAP
            })
            .unwrap();
        assert_eq!(config["data"]["KUBETUN_ISOLATION"], "exported");
        assert!(
            text(&out.stderr).contains("isolation: exported (the default of a new install"),
            "{}",
            text(&out.stderr)
        );
        let mut expected = kustomize(&cluster, &["deploy"], &components);
        let agent_components: Vec<&str> = if ha { vec!["deploy/agent/ha"] } else { vec![] };
        expected.extend(kustomize(&cluster, &["deploy/agent"], &agent_components));
        compare(rendered, expected);
    }
    // --isolation shows in the manifests.
    let out = install(
        &cluster,
        &[
            "--dry-run",
            "--cluster-id",
            "paris",
            "--endpoint-address",
            "203.0.113.7",
            "--isolation",
            "open",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("KUBETUN_ISOLATION: open"),
        "{}",
        text(&out.stdout)
    );
    // A dry run applies nothing.
    assert!(
        cluster
            .kubectl(&["get", "namespace", "kubetun-system"])
            .is_err()
    );

    // The pod CIDR overlapping the service CIDR, and the node subnet.
    for (pod_cidr, other) in [
        ("10.96.0.0/16", "the service CIDR 10.96.0.0/12"),
        ("192.168.0.0/16", "the node subnet 192.168.10.0/24"),
    ] {
        let out = install(
            &cluster,
            &[
                "--cluster-id",
                "paris",
                "--endpoint-address",
                "203.0.113.7",
                "--pod-cidr",
                pod_cidr,
            ],
        )
        .await;
        assert!(!out.status.success());
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "error: cannot install: the pod CIDR {pod_cidr} overlaps {other}"
            )),
            "{stderr}"
        );
    }
    assert!(
        cluster
            .kubectl(&["get", "namespace", "kubetun-system"])
            .is_err()
    );
}

#[tokio::test]
async fn another_implementations_mcs_crds_are_used_as_they_are_and_kept() {
    kubetun_cli::install_tls_provider();
    let Some([cluster]) = kubetun_testenv::clusters_or_skip(["mcs"]).await else {
        return;
    };
    add_nodes(&cluster, &[("node-a", "10.244.0.0/24", "192.168.10.11")]).await;
    // Another implementation (here: kubectl) installed the MCS API first.
    let crds = realapi_support::repo_root().join("deploy/crds/multicluster.yaml");
    cluster
        .kubectl(&["apply", "-f", crds.to_str().unwrap()])
        .unwrap();
    let managers = || {
        cluster
            .kubectl(&[
                "get",
                "crd",
                "serviceexports.multicluster.x-k8s.io",
                "-o",
                "jsonpath={.metadata.managedFields[*].manager}",
            ])
            .unwrap()
    };
    let before = managers();
    let out = install(
        &cluster,
        &["--cluster-id", "oslo", "--endpoint-address", "203.0.113.9"],
    )
    .await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("using the Multi-Cluster Services API CRDs the cluster has"),
        "{stdout}"
    );
    assert_eq!(
        managers(),
        before,
        "kubetun install leaves them as they are"
    );
    let path = kubeconfig(&cluster);
    let out = kubetun(&["uninstall", "--kubeconfig", &path, "--force"]).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("kept CustomResourceDefinition"), "{stdout}");
    for crd in [
        "serviceexports.multicluster.x-k8s.io",
        "serviceimports.multicluster.x-k8s.io",
    ] {
        assert!(
            cluster.kubectl(&["get", "crd", crd]).is_ok(),
            "{crd} was deleted"
        );
    }
}
