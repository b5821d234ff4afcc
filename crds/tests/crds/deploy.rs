//! The install manifests in `deploy/`: every document parses into its Kubernetes type, the
//! kustomization lists them all, RBAC covers every kubetun resource the controller touches,
//! and the pod is wired as documented (shared control socket, TUN device, probes, UDP port).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubetun_crds::{CIDR_PATTERN, GROUP, all_crds};
use regex::Regex;
use serde_json::Value;

const NAMESPACE: &str = "kubetun-system";
const SERVICE_ACCOUNT: &str = "kubetun-controller";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy")
}

/// Every document of the manifests kustomize installs, by kind.
fn manifests() -> BTreeMap<String, Vec<Value>> {
    let mut by_kind: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for file in kustomization_resources() {
        let text = std::fs::read_to_string(deploy_dir().join(&file)).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document).unwrap();
            let kind = value["kind"].as_str().unwrap().to_owned();
            by_kind.entry(kind).or_default().push(value);
        }
    }
    by_kind
}

fn kustomization_resources() -> Vec<String> {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    let value: Value = serde_yaml::from_str(&text).unwrap();
    value["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect()
}

fn named<T: serde::de::DeserializeOwned>(
    all: &BTreeMap<String, Vec<Value>>,
    kind: &str,
    name: &str,
) -> T {
    let doc = all[kind]
        .iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name}"));
    serde_json::from_value(doc.clone()).unwrap()
}

fn one<T: serde::de::DeserializeOwned>(all: &BTreeMap<String, Vec<Value>>, kind: &str) -> T {
    let docs = &all[kind];
    assert_eq!(docs.len(), 1, "exactly one {kind}");
    serde_json::from_value(docs[0].clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

#[test]
fn kustomization_installs_every_manifest_and_they_parse() {
    let listed: BTreeSet<String> = kustomization_resources().into_iter().collect();
    let mut on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    on_disk.insert("crds/kubetun.yaml".to_owned());
    on_disk.insert("crds/multicluster.yaml".to_owned());
    assert_eq!(listed, on_disk);

    let all = manifests();
    let _: Namespace = one(&all, "Namespace");
    let _: ServiceAccount = one(&all, "ServiceAccount");
    let _: ClusterRole = one(&all, "ClusterRole");
    let _: ClusterRoleBinding = one(&all, "ClusterRoleBinding");
    let _: Role = one(&all, "Role");
    let _: RoleBinding = one(&all, "RoleBinding");
    let _: ConfigMap = one(&all, "ConfigMap");
    let _: Deployment = one(&all, "Deployment");
    assert_eq!(all["Service"].len(), 2, "kubetun-gateway and kubetun-dns");
    assert_eq!(
        all["CustomResourceDefinition"].len(),
        all_crds().len() + kubetun_crds::mcs::mcs_crds().len()
    );
    for (kind, docs) in &all {
        for doc in docs {
            let namespaced = !matches!(
                kind.as_str(),
                "Namespace" | "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition"
            );
            let ns = doc["metadata"]["namespace"].as_str();
            assert_eq!(ns, namespaced.then_some(NAMESPACE), "{kind} namespace");
        }
    }
}

/// Verbs granted on `resource` of the kubetun group by `rules`.
fn granted(rules: &[PolicyRule], group: &str, resource: &str) -> BTreeSet<String> {
    rules
        .iter()
        .filter(|r| r.api_groups.iter().flatten().any(|g| g == group))
        .filter(|r| r.resources.iter().flatten().any(|res| res == resource))
        .flat_map(|r| r.verbs.iter().cloned())
        .collect()
}

fn verbs(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|v| (*v).to_owned()).collect()
}

#[test]
fn rbac_covers_what_the_controller_does_and_binds_the_service_account() {
    let all = manifests();
    let cluster_role: ClusterRole = one(&all, "ClusterRole");
    let role: Role = one(&all, "Role");
    let cluster_rules = cluster_role.rules.unwrap_or_default();
    let rules = role.rules.unwrap_or_default();

    // Cluster-wide: Networks everywhere, NetworkIds (cluster-scoped).
    assert_eq!(
        granted(&cluster_rules, GROUP, "networkids"),
        verbs(&["get", "list", "watch", "create", "delete"])
    );
    assert_eq!(
        granted(&cluster_rules, GROUP, "networks"),
        verbs(&["get", "list", "watch", "patch"])
    );
    assert_eq!(
        granted(&cluster_rules, GROUP, "networks/status"),
        verbs(&["patch"])
    );
    assert_eq!(
        granted(&cluster_rules, GROUP, "networks/finalizers"),
        verbs(&["update"])
    );

    // Every namespaced kubetun kind is readable and its status writable in the namespace.
    for crd in all_crds().iter().filter(|c| c.spec.scope == "Namespaced") {
        let plural = &crd.spec.names.plural;
        // Networks and ExportPolicies live in any namespace (cluster-wide rules); the
        // controller patches Networks (finalizer), ExportPolicies only through their status.
        let needed: &[&str] = if plural == "exportpolicies" {
            &["get", "list", "watch"]
        } else {
            &["get", "list", "watch", "patch"]
        };
        let (on_kind, on_status) = if plural == "networks" || plural == "exportpolicies" {
            (
                granted(&cluster_rules, GROUP, plural),
                granted(&cluster_rules, GROUP, &format!("{plural}/status")),
            )
        } else {
            (
                granted(&rules, GROUP, plural),
                granted(&rules, GROUP, &format!("{plural}/status")),
            )
        };
        assert!(on_kind.is_superset(&verbs(needed)), "{plural}: {on_kind:?}");
        let has_status = crd
            .spec
            .versions
            .iter()
            .any(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()));
        assert!(
            !has_status || on_status.contains("patch"),
            "{plural}/status"
        );
    }
    assert_eq!(
        granted(&cluster_rules, "events.k8s.io", "events"),
        verbs(&["create", "patch"])
    );
    // The shortcut operator watches its kubeconfig Secrets by label; the key rotation watches
    // the gateway key Secret and updates it when a rotation ends.
    assert_eq!(
        granted(&rules, "", "secrets"),
        verbs(&["get", "list", "watch", "create", "update", "delete"])
    );
    assert_eq!(
        granted(&rules, "", "configmaps"),
        verbs(&["get", "create", "patch"])
    );
    assert!(
        rules.iter().flat_map(|r| r.verbs.iter()).all(|v| v != "*"),
        "no wildcard verbs"
    );

    let cluster_binding: ClusterRoleBinding = one(&all, "ClusterRoleBinding");
    let binding: RoleBinding = one(&all, "RoleBinding");
    assert_eq!(
        cluster_binding.role_ref.name,
        cluster_role.metadata.name.unwrap()
    );
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    for subjects in [cluster_binding.subjects, binding.subjects] {
        let subject = &subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("ServiceAccount", SERVICE_ACCOUNT)
        );
        assert_eq!(subject.namespace.as_deref(), Some(NAMESPACE));
    }
}

fn pod_spec(deployment: &Deployment) -> &PodSpec {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn container<'a>(deployment: &'a Deployment, name: &str) -> &'a Container {
    pod_spec(deployment)
        .containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} container"))
}

fn mount_path(c: &Container, volume: &str) -> Option<String> {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .map(|m| m.mount_path.clone())
}

fn port_number(c: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no port {name}"))
                .container_port
        }
    }
}

#[test]
fn the_pod_is_wired_as_documented() {
    let all = manifests();
    let deployment: Deployment = one(&all, "Deployment");
    let pod = pod_spec(&deployment);
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(1));

    let gateway = container(&deployment, "gateway");
    let controller = container(&deployment, "controller");
    assert_eq!(
        gateway.command.as_deref(),
        Some(&["kubetun-gateway".to_owned()][..])
    );
    assert_eq!(
        controller.command.as_deref(),
        Some(&["kubetun-controller".to_owned()][..])
    );

    let caps = gateway
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .unwrap();
    assert_eq!(caps.add.as_deref(), Some(&["NET_ADMIN".to_owned()][..]));
    assert_eq!(
        mount_path(gateway, "dev-net-tun").as_deref(),
        Some("/dev/net/tun")
    );
    let volumes = pod.volumes.as_ref().unwrap();
    let tun = volumes.iter().find(|v| v.name == "dev-net-tun").unwrap();
    let host_path = tun.host_path.as_ref().unwrap();
    assert_eq!(host_path.path, "/dev/net/tun");
    assert_eq!(host_path.type_.as_deref(), Some("CharDevice"));

    // The control socket directory is one emptyDir shared by both containers.
    let socket = volumes.iter().find(|v| v.name == "control-socket").unwrap();
    assert!(socket.empty_dir.is_some());
    assert_eq!(
        mount_path(gateway, "control-socket").as_deref(),
        Some("/var/run/kubetun")
    );
    assert_eq!(
        mount_path(controller, "control-socket").as_deref(),
        Some("/var/run/kubetun")
    );
    let env: BTreeMap<&str, Option<&str>> = controller
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    // The socket path is derived from the interface name on both sides; one ConfigMap key
    // names the interface for both containers.
    assert!(!env.contains_key("KUBETUN_GATEWAY_SOCKET"));
    assert!(env.contains_key("KUBETUN_NAMESPACE"));
    assert_eq!(env["KUBETUN_METRICS_ADDR"], Some("0.0.0.0:9587"));
    let interface_ref = |c: &Container| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "KUBETUN_GATEWAY_INTERFACE")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.config_map_key_ref.as_ref())
            .map(|r| (r.name.clone(), r.key.clone()))
    };
    let config_ref = Some((
        "kubetun-controller-config".to_owned(),
        "KUBETUN_GATEWAY_INTERFACE".to_owned(),
    ));
    assert_eq!(interface_ref(gateway), config_ref);
    let from_config_map = controller.env_from.iter().flatten().any(|e| {
        e.config_map_ref.as_ref().map(|r| r.name.as_str()) == Some("kubetun-controller-config")
    });
    assert!(from_config_map);

    // Probes on the gateway's HTTP port.
    let args = gateway.args.as_ref().unwrap().join(" ");
    assert!(
        args.starts_with("-f $(KUBETUN_GATEWAY_INTERFACE) "),
        "{args}"
    );
    assert!(args.contains("--metrics-addr 0.0.0.0:9586"), "{args}");
    for (probe, path) in [
        (gateway.readiness_probe.as_ref(), "/readyz"),
        (gateway.liveness_probe.as_ref(), "/healthz"),
    ] {
        let http = probe.unwrap().http_get.as_ref().unwrap();
        assert_eq!(http.path.as_deref(), Some(path));
        assert_eq!(port_number(gateway, &http.port), 9586);
    }

    // The Service forwards UDP to the gateway's WireGuard port and selects this pod.
    let service = named::<Service>(&all, "Service", "kubetun-gateway");
    let spec = service.spec.unwrap();
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("UDP"));
    assert_eq!(
        port_number(gateway, port.target_port.as_ref().unwrap()),
        51820
    );
    // kubetun-dns sends port 53, UDP and TCP, to the controller's DNS server on this pod.
    let dns = named::<Service>(&all, "Service", "kubetun-dns")
        .spec
        .unwrap();
    assert_eq!(dns.selector, spec.selector);
    for dns_port in dns.ports.unwrap() {
        assert_eq!(dns_port.port, 53);
        assert_eq!(
            port_number(controller, dns_port.target_port.as_ref().unwrap()),
            5353
        );
    }
    let pod_labels = deployment
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap();
    for (k, v) in spec.selector.unwrap() {
        assert_eq!(pod_labels.get(&k), Some(&v), "selector {k}");
    }
}

#[test]
fn controller_config_has_the_required_settings() {
    let config: ConfigMap = one(&manifests(), "ConfigMap");
    let data = config.data.unwrap();
    for key in [
        "KUBETUN_CLUSTER_ID",
        "KUBETUN_POD_CIDR",
        "KUBETUN_ENDPOINT_ADDRESS",
        "KUBETUN_GATEWAY_INTERFACE",
        "KUBETUN_MANAGE_ROUTES",
        "KUBETUN_HUB",
    ] {
        assert!(data.get(key).is_some_and(|v| !v.is_empty()), "{key}");
    }
    let cidr = Regex::new(CIDR_PATTERN).unwrap();
    for key in [
        "KUBETUN_POD_CIDR",
        "KUBETUN_SERVICE_CIDR",
        "KUBETUN_EXTERNAL_CIDR",
    ] {
        for value in data[key].split(',') {
            assert!(cidr.is_match(value), "{key}={value}");
        }
    }
    // Off unless this cluster is the hub.
    assert_eq!(data["KUBETUN_HUB"], "false");
    let min: u32 = data["KUBETUN_MIN_VNI"].parse().unwrap();
    let max: u32 = data["KUBETUN_MAX_VNI"].parse().unwrap();
    assert!(0 < min && min <= max && max < 1 << 24);
}
