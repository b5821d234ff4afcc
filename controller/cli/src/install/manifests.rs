//! The objects `kubetun install` applies, made from the files of `deploy/` themselves
//! (embedded at build time), composed as `kubectl kustomize` composes them: the resources of
//! `deploy/kustomization.yaml` and `deploy/agent/kustomization.yaml`, and with `--ha` (or the
//! hub's IP forwarding) the patches of the components `deploy/ha`, `deploy/agent/ha` and
//! `deploy/hub`. Only the two patch forms those components use are implemented: strategic
//! merge patches (lists of named items merged by `name`, `$patch: delete`) and JSON patches
//! with `add`. A test renders `kubectl kustomize` of the same directories and compares.

use std::collections::BTreeMap;

use serde::Deserialize as _;
use serde_json::{Map, Value};

/// One file of `deploy/`, by its path relative to `deploy/`.
struct File {
    path: &'static str,
    text: &'static str,
}

/// Every file the kustomizations below refer to.
const FILES: &[File] = &[
    File {
        path: "kustomization.yaml",
        text: include_str!("../../../../deploy/kustomization.yaml"),
    },
    File {
        path: "namespace.yaml",
        text: include_str!("../../../../deploy/namespace.yaml"),
    },
    File {
        path: "crds/kubetun.yaml",
        text: include_str!("../../../../deploy/crds/kubetun.yaml"),
    },
    File {
        path: "crds/multicluster.yaml",
        text: include_str!("../../../../deploy/crds/multicluster.yaml"),
    },
    File {
        path: "rbac.yaml",
        text: include_str!("../../../../deploy/rbac.yaml"),
    },
    File {
        path: "config.yaml",
        text: include_str!("../../../../deploy/config.yaml"),
    },
    File {
        path: "gateway.yaml",
        text: include_str!("../../../../deploy/gateway.yaml"),
    },
    File {
        path: "agent/kustomization.yaml",
        text: include_str!("../../../../deploy/agent/kustomization.yaml"),
    },
    File {
        path: "agent/rbac.yaml",
        text: include_str!("../../../../deploy/agent/rbac.yaml"),
    },
    File {
        path: "agent/daemonset.yaml",
        text: include_str!("../../../../deploy/agent/daemonset.yaml"),
    },
    File {
        path: "ha/kustomization.yaml",
        text: include_str!("../../../../deploy/ha/kustomization.yaml"),
    },
    File {
        path: "ha/gateway-replicas.yaml",
        text: include_str!("../../../../deploy/ha/gateway-replicas.yaml"),
    },
    File {
        path: "agent/ha/kustomization.yaml",
        text: include_str!("../../../../deploy/agent/ha/kustomization.yaml"),
    },
    File {
        path: "hub/kustomization.yaml",
        text: include_str!("../../../../deploy/hub/kustomization.yaml"),
    },
];

/// The image every kubetun container of `deploy/` names.
pub const DEFAULT_IMAGE: &str = "ghcr.io/kubetun/kubetun:latest";
/// The controller's ConfigMap (`deploy/config.yaml`).
pub const CONFIG_MAP: &str = "kubetun-controller-config";
/// The kubetun pod's Deployment and Service (`deploy/gateway.yaml`).
pub const GATEWAY: &str = "kubetun-gateway";
/// The labels of the kubetun pod (the gateway Deployment's selector and the Service's).
pub const GATEWAY_POD_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "kubetun"),
    ("app.kubernetes.io/component", "gateway"),
];
/// The route agent's DaemonSet (`deploy/agent/daemonset.yaml`).
pub const AGENT: &str = "kubetun-route-agent";
/// Pod-template annotation with a hash of the ConfigMap's data: a changed setting rolls the
/// kubetun pod on the next install (the controller reads the ConfigMap only at start).
pub const CONFIG_HASH_ANNOTATION: &str = "net.kubetun.io/config-hash";

/// A malformed file of `deploy/` (a build of a broken tree; the tests catch it first).
#[derive(Debug, thiserror::Error)]
#[error("deploy/{path}: {reason}")]
pub struct ManifestError {
    path: String,
    reason: String,
}

fn fail(path: &str, reason: impl Into<String>) -> ManifestError {
    ManifestError {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn file(path: &str) -> Result<&'static str, ManifestError> {
    FILES
        .iter()
        .find(|f| f.path == path)
        .map(|f| f.text)
        .ok_or_else(|| fail(path, "not embedded in the kubetun binary"))
}

/// The documents of a multi-document YAML text (empty ones, e.g. only comments, skipped).
pub fn documents(path: &str, text: &str) -> Result<Vec<Value>, ManifestError> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).map_err(|e| fail(path, e.to_string()))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// Which components to add to the plain install.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Components {
    /// `deploy/ha` and `deploy/agent/ha`: replicated gateways.
    pub ha: bool,
    /// `deploy/hub`: IP forwarding in the gateway pod (a hub with transit shortcuts).
    pub hub_forwarding: bool,
}

/// `deploy/` as `kubectl kustomize deploy/` and `kubectl kustomize deploy/agent/` render it,
/// with `components` added to both.
pub fn render(components: Components) -> Result<Vec<Value>, ManifestError> {
    let mut base = kustomize("")?;
    let mut agent = kustomize("agent/")?;
    if components.ha {
        apply_component("ha/", &mut base)?;
        apply_component("agent/ha/", &mut agent)?;
    }
    if components.hub_forwarding {
        apply_component("hub/", &mut base)?;
    }
    base.extend(agent);
    Ok(base)
}

/// Refuses a kustomization using a field this composition does not implement, so that a
/// change to `deploy/` cannot silently make `kubetun install` differ from kustomize.
fn only_known_fields(
    path: &str,
    kustomization: &[Value],
    known: &[&str],
) -> Result<(), ManifestError> {
    let fields = kustomization
        .first()
        .and_then(Value::as_object)
        .ok_or_else(|| fail(path, "not a kustomization"))?;
    match fields.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(fail(
            path,
            format!("`{unknown}` is not implemented by kubetun install (cli/install/manifests.rs)"),
        )),
        None => Ok(()),
    }
}

/// The resources of `<dir>kustomization.yaml`, in order.
fn kustomize(dir: &str) -> Result<Vec<Value>, ManifestError> {
    let path = format!("{dir}kustomization.yaml");
    let kustomization = documents(&path, file(&path)?)?;
    only_known_fields(&path, &kustomization, &["apiVersion", "kind", "resources"])?;
    let resources = kustomization
        .first()
        .and_then(|k| k.get("resources"))
        .and_then(Value::as_array)
        .ok_or_else(|| fail(&path, "no resources"))?;
    let mut out = Vec::new();
    for resource in resources {
        let name = resource
            .as_str()
            .ok_or_else(|| fail(&path, "a resource is not a file name"))?;
        let resource_path = format!("{dir}{name}");
        out.extend(documents(&resource_path, file(&resource_path)?)?);
    }
    Ok(out)
}

/// Applies the patches of the component `<dir>kustomization.yaml` to `objects`.
fn apply_component(dir: &str, objects: &mut Vec<Value>) -> Result<(), ManifestError> {
    let path = format!("{dir}kustomization.yaml");
    let component = documents(&path, file(&path)?)?;
    only_known_fields(&path, &component, &["apiVersion", "kind", "patches"])?;
    let patches = component
        .first()
        .and_then(|k| k.get("patches"))
        .and_then(Value::as_array)
        .ok_or_else(|| fail(&path, "no patches"))?;
    for entry in patches {
        let patch: Value = match (entry.get("path"), entry.get("patch")) {
            (Some(Value::String(file_name)), _) => {
                let patch_path = format!("{dir}{file_name}");
                documents(&patch_path, file(&patch_path)?)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| fail(&patch_path, "empty patch"))?
            }
            (_, Some(Value::String(text))) => documents(&path, text)?
                .into_iter()
                .next()
                .ok_or_else(|| fail(&path, "empty patch"))?,
            _ => return Err(fail(&path, "a patch without path or patch")),
        };
        // The target: given, or (a strategic merge patch) the patch's own kind and name.
        let target = entry.get("target").unwrap_or(&patch);
        let kind = target.get("kind").and_then(Value::as_str);
        let name = target
            .get("name")
            .or_else(|| target.pointer("/metadata/name"))
            .and_then(Value::as_str);
        let matches = |object: &Value| {
            kind.is_none_or(|k| object.get("kind").and_then(Value::as_str) == Some(k))
                && name.is_none_or(|n| {
                    object.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
                })
        };
        match &patch {
            Value::Array(operations) => {
                for object in objects.iter_mut().filter(|o| matches(o)) {
                    for operation in operations {
                        json_patch_add(object, operation).map_err(|e| fail(&path, e))?;
                    }
                }
            }
            Value::Object(map) if map.get("$patch").and_then(Value::as_str) == Some("delete") => {
                objects.retain(|o| !matches(o));
            }
            Value::Object(_) => {
                for object in objects.iter_mut().filter(|o| matches(o)) {
                    strategic_merge(object, &patch);
                }
            }
            _ => return Err(fail(&path, "a patch is neither a map nor a list")),
        }
    }
    Ok(())
}

/// One RFC 6902 operation; `add` is all the components use.
fn json_patch_add(object: &mut Value, operation: &Value) -> Result<(), String> {
    let op = operation.get("op").and_then(Value::as_str);
    let path = operation.get("path").and_then(Value::as_str).unwrap_or("");
    let value = operation.get("value").cloned().unwrap_or(Value::Null);
    if op != Some("add") {
        return Err(format!(
            "JSON patch operation {op:?} is not supported (only add)"
        ));
    }
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("bad JSON patch path {path:?}"))?;
    let parent = object
        .pointer_mut(parent)
        .ok_or_else(|| format!("JSON patch path {path:?}: {parent:?} does not exist"))?;
    match parent {
        Value::Array(items) if last == "-" => items.push(value),
        Value::Array(items) => {
            let index: usize = last.parse().map_err(|_| format!("bad index in {path:?}"))?;
            if index > items.len() {
                return Err(format!("index out of range in {path:?}"));
            }
            items.insert(index, value);
        }
        Value::Object(map) => {
            map.insert(last.replace("~1", "/").replace("~0", "~"), value);
        }
        _ => return Err(format!("JSON patch path {path:?}: parent is a scalar")),
    }
    Ok(())
}

/// A strategic merge patch as the components use it: maps merged key by key, lists of named
/// maps (containers, env) merged by `name` (new items first, as kustomize puts them), other lists replaced.
fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                match target.get_mut(key) {
                    Some(existing) if !value.is_null() => strategic_merge(existing, value),
                    Some(_) => {
                        target.remove(key);
                    }
                    None => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(target), Value::Array(patch)) if patch.iter().all(named) => {
            let mut added = Vec::new();
            for item in patch {
                let name = item.get("name");
                match target.iter_mut().find(|t| t.get("name") == name) {
                    Some(existing) => strategic_merge(existing, item),
                    None => added.push(item.clone()),
                }
            }
            // kustomize (kyaml) puts the patch's new items first.
            added.append(target);
            *target = added;
        }
        (target, patch) => *target = patch.clone(),
    }
}

fn named(item: &Value) -> bool {
    item.get("name").is_some_and(Value::is_string)
}

/// `(apiVersion, kind, namespace, name)` of an object, its identity on the API server.
pub fn identity(object: &Value) -> (String, String, String, String) {
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (
        text("/apiVersion"),
        text("/kind"),
        text("/metadata/namespace"),
        text("/metadata/name"),
    )
}

/// Fills in what install detected: the ConfigMap's `data` entries and the record of the
/// flags given (an annotation), the image of every kubetun container, and the config hash
/// on the kubetun pod's template.
pub fn configure(
    objects: &mut [Value],
    settings: &BTreeMap<String, String>,
    image: &str,
    recorded_flags: &str,
) {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64; // FNV-1a over the final data
    for object in objects.iter_mut() {
        let (_, kind, _, name) = identity(object);
        if kind == "ConfigMap" && name == CONFIG_MAP {
            object["metadata"]["annotations"] = serde_json::json!({
                super::flags::SETTINGS_ANNOTATION: recorded_flags,
            });
        }
        if kind == "ConfigMap"
            && name == CONFIG_MAP
            && let Some(Value::Object(data)) = object.get_mut("data")
        {
            for (key, value) in settings {
                data.insert(key.clone(), Value::String(value.clone()));
            }
            for (key, value) in data.iter() {
                for byte in key
                    .bytes()
                    .chain([0])
                    .chain(value.as_str().unwrap_or("").bytes())
                    .chain([0])
                {
                    hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
        if matches!(kind.as_str(), "Deployment" | "DaemonSet")
            && let Some(Value::Array(containers)) =
                object.pointer_mut("/spec/template/spec/containers")
        {
            for container in containers {
                if container.get("image").and_then(Value::as_str) == Some(DEFAULT_IMAGE) {
                    container["image"] = Value::String(image.to_owned());
                }
            }
        }
    }
    for object in objects.iter_mut() {
        let (_, kind, _, name) = identity(object);
        if kind == "Deployment"
            && name == GATEWAY
            && let Some(Value::Object(metadata)) = object.pointer_mut("/spec/template/metadata")
        {
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(annotations) = annotations {
                annotations.insert(
                    CONFIG_HASH_ANNOTATION.to_owned(),
                    Value::String(format!("{hash:016x}")),
                );
            }
        }
    }
}

/// Whether `object` is a Deployment of kubetun pods: the gateway Deployment, which `--ha`
/// (`deploy/ha`) makes the replicated gateways. Not the route agent DaemonSet.
fn runs_gateway_pods(object: &Value) -> bool {
    object.get("kind").and_then(Value::as_str) == Some("Deployment")
        && GATEWAY_POD_LABELS.iter().all(|(key, value)| {
            object
                .pointer("/spec/template/metadata/labels")
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
                == Some(value)
        })
}

/// `--gateway-node-selector`: adds `node_selector` to the `nodeSelector` of the pod template
/// of every Deployment of kubetun pods (merged with any there, the flag's values winning).
/// The route agents stay on every node. An empty selector changes nothing.
pub fn place_gateway(objects: &mut [Value], node_selector: &BTreeMap<String, String>) {
    if node_selector.is_empty() {
        return;
    }
    for object in objects.iter_mut().filter(|o| runs_gateway_pods(o)) {
        let Some(Value::Object(spec)) = object.pointer_mut("/spec/template/spec") else {
            continue;
        };
        let selector = spec
            .entry("nodeSelector")
            .or_insert_with(|| Value::Object(Map::new()));
        if !selector.is_object() {
            *selector = Value::Object(Map::new());
        }
        if let Value::Object(selector) = selector {
            for (key, value) in node_selector {
                selector.insert(key.clone(), Value::String(value.clone()));
            }
        }
    }
}

/// Multi-document YAML, one document per object, as `kubectl apply -f -` reads it.
pub fn to_yaml(objects: &[Value]) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(object)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_install_holds_every_file_of_both_kustomizations() {
        let objects = render(Components::default()).unwrap();
        let kinds: Vec<String> = objects.iter().map(|o| identity(o).1).collect();
        for kind in [
            "Namespace",
            "CustomResourceDefinition",
            "ConfigMap",
            "Deployment",
            "Service",
            "DaemonSet",
        ] {
            assert!(kinds.iter().any(|k| k == kind), "{kind} missing: {kinds:?}");
        }
    }

    /// The base users apply by hand is a new install: it says `exported`, as `kubetun
    /// install` does on a new cluster; and what install configures lands in the YAML.
    #[test]
    fn the_base_config_is_a_new_install_and_the_isolation_reaches_the_yaml() {
        use super::super::isolation::{ISOLATION_KEY, NEW_INSTALL};
        let config_of = |objects: &[Value]| {
            objects
                .iter()
                .find(|o| identity(o).1 == "ConfigMap" && identity(o).3 == CONFIG_MAP)
                .cloned()
                .unwrap()
        };
        let mut objects = render(Components::default()).unwrap();
        assert_eq!(
            config_of(&objects)["data"][ISOLATION_KEY],
            NEW_INSTALL.as_str()
        );
        let data = BTreeMap::from([(ISOLATION_KEY.to_owned(), "open".to_owned())]);
        configure(&mut objects, &data, DEFAULT_IMAGE, "{}");
        assert_eq!(config_of(&objects)["data"][ISOLATION_KEY], "open");
        let yaml = to_yaml(&objects).unwrap();
        assert!(yaml.contains("KUBETUN_ISOLATION: open"), "{yaml}");
    }

    #[test]
    fn ha_drops_the_service_and_merges_the_replica_settings() {
        let objects = render(Components {
            ha: true,
            hub_forwarding: false,
        })
        .unwrap();
        assert!(!objects.iter().any(|o| identity(o).1 == "Service"));
        let deployment = objects
            .iter()
            .find(|o| identity(o).1 == "Deployment")
            .unwrap();
        assert_eq!(deployment.pointer("/spec/replicas"), Some(&Value::from(2)));
        let gateway_env = deployment
            .pointer("/spec/template/spec/containers/0/env")
            .unwrap();
        assert!(
            gateway_env.to_string().contains("KUBETUN_STANDBY"),
            "{gateway_env}"
        );
        assert!(
            gateway_env
                .to_string()
                .contains("KUBETUN_GATEWAY_INTERFACE"),
            "{gateway_env}"
        );
        let agent = objects
            .iter()
            .find(|o| identity(o).1 == "DaemonSet")
            .unwrap();
        assert!(agent.to_string().contains("KUBETUN_GATEWAY_LEASE"));
    }

    fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn every_set_of_components() -> Vec<Components> {
        [false, true]
            .into_iter()
            .flat_map(|ha| [false, true].map(|hub_forwarding| Components { ha, hub_forwarding }))
            .collect()
    }

    #[test]
    fn the_gateway_node_selector_lands_on_the_gateway_pods_only() {
        let wanted = selector(&[("kubetun.io/gateway", "true"), ("zone", "")]);
        for components in every_set_of_components() {
            let plain = render(components).unwrap();
            let mut placed = plain.clone();
            place_gateway(&mut placed, &wanted);
            let mut changed = 0;
            for (before, after) in plain.iter().zip(&placed) {
                let (_, kind, _, name) = identity(after);
                if kind == "Deployment" && name == GATEWAY {
                    changed += 1;
                    assert_eq!(
                        after.pointer("/spec/template/spec/nodeSelector"),
                        Some(&serde_json::json!({"kubetun.io/gateway": "true", "zone": ""})),
                        "{components:?}"
                    );
                    // Nothing else of the Deployment changes.
                    let mut without = after.clone();
                    without["spec"]["template"]["spec"]
                        .as_object_mut()
                        .unwrap()
                        .remove("nodeSelector");
                    assert_eq!(&without, before, "{components:?}");
                } else {
                    assert_eq!(after, before, "{kind} {name} changed ({components:?})");
                }
            }
            assert_eq!(changed, 1, "{components:?}");
            let agent = placed
                .iter()
                .find(|o| identity(o).1 == "DaemonSet" && identity(o).3 == AGENT)
                .unwrap();
            assert_eq!(agent.pointer("/spec/template/spec/nodeSelector"), None);
        }
    }

    #[test]
    fn the_replicated_gateways_get_the_selector_beside_their_anti_affinity() {
        let mut objects = render(Components {
            ha: true,
            hub_forwarding: false,
        })
        .unwrap();
        place_gateway(&mut objects, &selector(&[("kubetun.io/gateway", "true")]));
        let gateway = objects
            .iter()
            .find(|o| identity(o).1 == "Deployment" && identity(o).3 == GATEWAY)
            .unwrap();
        assert_eq!(gateway.pointer("/spec/replicas"), Some(&Value::from(2)));
        assert!(gateway.pointer("/spec/template/spec/affinity").is_some());
        assert_eq!(
            gateway.pointer("/spec/template/spec/nodeSelector/kubetun.io~1gateway"),
            Some(&Value::from("true"))
        );
    }

    #[test]
    fn the_gateway_node_selector_merges_with_one_there() {
        let mut objects = render(Components::default()).unwrap();
        let gateway = objects
            .iter_mut()
            .find(|o| identity(o).1 == "Deployment" && identity(o).3 == GATEWAY)
            .unwrap();
        gateway["spec"]["template"]["spec"]["nodeSelector"] =
            serde_json::json!({"kubernetes.io/os": "linux", "zone": "a"});
        place_gateway(&mut objects, &selector(&[("zone", "b"), ("edge", "1")]));
        let gateway = objects
            .iter()
            .find(|o| identity(o).1 == "Deployment" && identity(o).3 == GATEWAY)
            .unwrap();
        assert_eq!(
            gateway.pointer("/spec/template/spec/nodeSelector"),
            Some(&serde_json::json!({"kubernetes.io/os": "linux", "zone": "b", "edge": "1"}))
        );
    }

    #[test]
    fn no_gateway_node_selector_leaves_the_manifests_byte_identical() {
        let data = BTreeMap::from([("KUBETUN_CLUSTER_ID".to_owned(), "rome".to_owned())]);
        for components in every_set_of_components() {
            let mut plain = render(components).unwrap();
            configure(&mut plain, &data, DEFAULT_IMAGE, "{}");
            let mut placed = render(components).unwrap();
            place_gateway(&mut placed, &BTreeMap::new());
            configure(&mut placed, &data, DEFAULT_IMAGE, "{}");
            assert_eq!(to_yaml(&placed).unwrap(), to_yaml(&plain).unwrap());
            assert!(!to_yaml(&placed).unwrap().contains("nodeSelector"));
        }
    }
}
