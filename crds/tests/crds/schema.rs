//! The generated CRDs: the committed YAML is current, the schema patterns accept what they
//! should and nothing else, the kubectl surface (printer columns, short names, categories,
//! status subresources, scope) is in place, and every example in `deploy/examples/` parses
//! into its Rust type and passes the schema's patterns and required fields.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kubetun_crds::{
    CIDR_PATTERN, Network, NetworkConfig, NetworkId, ShortcutConnection, TunnelEndpoint, all_crds,
    crds_yaml,
};
use regex::Regex;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn crd(kind: &str) -> CustomResourceDefinition {
    all_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"))
}

/// The OpenAPI schema of `kind` as JSON.
fn schema(kind: &str) -> Value {
    let crd = crd(kind);
    let schema = crd.spec.versions[0].schema.as_ref().unwrap();
    serde_json::to_value(schema.open_api_v3_schema.as_ref().unwrap()).unwrap()
}

fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(value, |v, key| {
        v.get(key)
            .unwrap_or_else(|| panic!("missing {key} in path {path:?}"))
    })
}

#[test]
fn committed_crds_yaml_is_current() {
    let path = repo_root().join("deploy/crds/kubetun.yaml");
    let committed = std::fs::read_to_string(&path).unwrap();
    let generated = crds_yaml().unwrap();
    assert!(
        committed == generated,
        "deploy/crds/kubetun.yaml is out of date with the Rust types; regenerate it with\n\
         \n    cargo run -p kubetun-crds --bin crdgen > deploy/crds/kubetun.yaml\n"
    );
}

#[test]
fn committed_multicluster_crds_yaml_is_current() {
    let path = repo_root().join("deploy/crds/multicluster.yaml");
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed == kubetun_crds::mcs_crds_yaml().unwrap(),
        "deploy/crds/multicluster.yaml is out of date with the Rust types; regenerate it with\n\
         \n    cargo run -p kubetun-crds --bin crdgen multicluster > deploy/crds/multicluster.yaml\n"
    );
}

const GOOD_CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "10.70.0.0/16",
    "192.168.1.0/24",
    "0.0.0.0/0",
    "255.255.255.255/32",
    "fd00::/8",
    "2001:db8::/32",
    "2001:db8:0:0:0:0:0:0/64",
    "::/0",
    "::1/128",
    "fe80::1:2/64",
];

const BAD_CIDRS: &[&str] = &[
    "",
    "10.0.0.0",
    "10.0.0.0/",
    "10.0.0.0/33",
    "10.0.0.0/08",
    "256.0.0.0/8",
    "10.0.0/8",
    "10.0.0.0.0/8",
    "010.0.0.0/8",
    " 10.0.0.0/8",
    "10.0.0.0/8 ",
    "10.0.0.0/8,10.1.0.0/16",
    "fd00::/129",
    "fd00:::/8",
    "2001:db8::1::/64",
    "12345::/16",
    "g::/16",
    "fe80::1%eth0/64",
    "hello",
];

fn check_cidr_regex(pattern: &str) {
    let re = Regex::new(pattern).unwrap();
    for good in GOOD_CIDRS {
        assert!(re.is_match(good), "{good:?} must be accepted");
    }
    for bad in BAD_CIDRS {
        assert!(!re.is_match(bad), "{bad:?} must be rejected");
    }
}

#[test]
fn cidr_pattern_accepts_cidrs_and_rejects_the_rest() {
    check_cidr_regex(CIDR_PATTERN);
    // The samples agree with what the controller's parser accepts.
    for good in GOOD_CIDRS {
        assert!(good.parse::<ipnet::IpNet>().is_ok(), "{good}");
    }
}

#[test]
fn cidr_fields_carry_the_cidr_pattern() {
    let cidr_fields: &[(&str, &[&str])] = &[
        (
            "NetworkConfig",
            &[
                "properties",
                "spec",
                "properties",
                "podCidrs",
                "items",
                "pattern",
            ],
        ),
        (
            "NetworkConfig",
            &[
                "properties",
                "spec",
                "properties",
                "externalCidrs",
                "items",
                "pattern",
            ],
        ),
        (
            "TunnelEndpoint",
            &[
                "properties",
                "spec",
                "properties",
                "localPodCidrs",
                "items",
                "properties",
                "real",
                "pattern",
            ],
        ),
        (
            "TunnelEndpoint",
            &[
                "properties",
                "spec",
                "properties",
                "remoteExternalCidrs",
                "items",
                "properties",
                "view",
                "pattern",
            ],
        ),
        (
            "TunnelEndpoint",
            &[
                "properties",
                "spec",
                "properties",
                "allowedPrefixes",
                "items",
                "pattern",
            ],
        ),
        (
            "Network",
            &[
                "properties",
                "spec",
                "properties",
                "prefixes",
                "items",
                "pattern",
            ],
        ),
        (
            "Network",
            &[
                "properties",
                "spec",
                "properties",
                "peerings",
                "items",
                "properties",
                "prefixes",
                "items",
                "pattern",
            ],
        ),
    ];
    for (kind, path) in cidr_fields {
        let schema = schema(kind);
        check_cidr_regex(at(&schema, path).as_str().unwrap());
    }
}

#[test]
fn every_schema_pattern_compiles() {
    fn walk(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(p)) = map.get("pattern") {
                    found.push(p.clone());
                }
                map.values().for_each(|v| walk(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut patterns = Vec::new();
    for crd in all_crds() {
        walk(&serde_json::to_value(&crd).unwrap(), &mut patterns);
    }
    assert!(patterns.len() > 10);
    for pattern in patterns {
        Regex::new(&pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
    }
}

#[test]
fn requested_network_id_must_be_canonical_decimal() {
    let network = schema("Network");
    let pattern = at(
        &network,
        &["properties", "spec", "properties", "id", "pattern"],
    );
    let re = Regex::new(pattern.as_str().unwrap()).unwrap();
    for good in ["1", "200", "4242", "16777215"] {
        assert!(re.is_match(good), "{good}");
    }
    for bad in ["", "0", "0200", "+200", "-5", "2e3", "123456789", " 200"] {
        assert!(!re.is_match(bad), "{bad:?}");
    }
}

#[test]
fn immutability_and_name_rules_are_declared() {
    let network = serde_json::to_string(&schema("Network")).unwrap();
    assert!(network.contains("spec.id cannot change once set"));
    let nid = serde_json::to_string(&schema("NetworkID")).unwrap();
    assert!(nid.contains("claimRef is immutable"));
    assert!(nid.contains(r"self.metadata.name.matches('^[1-9][0-9]{0,7}$')"));
}

#[test]
fn peerings_are_list_maps_keyed_by_name() {
    let network = schema("Network");
    for path in [
        ["properties", "spec", "properties", "peerings"],
        ["properties", "status", "properties", "peerings"],
    ] {
        let peerings = at(&network, &path);
        assert_eq!(peerings["x-kubernetes-list-type"], "map", "{path:?}");
        assert_eq!(
            peerings["x-kubernetes-list-map-keys"],
            serde_json::json!(["name"])
        );
        let required = peerings["items"]["required"].as_array().unwrap();
        assert!(
            required.contains(&Value::from("name")),
            "list map keys must be required"
        );
    }
}

#[test]
fn kubectl_surface_is_complete() {
    let expected: &[(&str, &str, &str, &[&str])] = &[
        (
            "NetworkConfig",
            "Namespaced",
            "nc",
            &["Source", "Destination", "Endpoint", "Processed", "Age"],
        ),
        (
            "TunnelEndpoint",
            "Namespaced",
            "te",
            &[
                "Peer",
                "Endpoint",
                "Status",
                "Latency",
                "Via",
                "Isolation",
                "Age",
            ],
        ),
        (
            "ShortcutConnection",
            "Namespaced",
            "ksc",
            &["Left", "Right", "Phase", "Age"],
        ),
        (
            "Network",
            "Namespaced",
            "knet",
            &["ID", "Cluster", "Phase", "Age"],
        ),
        (
            "NetworkID",
            "Cluster",
            "nid",
            &["Network", "Namespace", "Age"],
        ),
        (
            "ExportedService",
            "Namespaced",
            "kexp",
            &["Namespace", "Service", "Type", "Age"],
        ),
        (
            "ExportPolicy",
            "Namespaced",
            "kxp",
            &["Service", "Valid", "Selected", "Age"],
        ),
        ("ClientIdentity", "Namespaced", "kci", &["Exporter", "Age"]),
    ];
    assert_eq!(all_crds().len(), expected.len());
    for (kind, scope, short, columns) in expected {
        let crd = crd(kind);
        assert_eq!(crd.spec.group, "net.kubetun.io");
        assert_eq!(&crd.spec.scope, scope, "{kind}");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&[short.to_string()][..]),
            "{kind}"
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["kubetun".to_owned()][..]),
            "{kind}"
        );
        let version = &crd.spec.versions[0];
        assert!(version.served && version.storage, "{kind}");
        let names: Vec<&str> = version
            .additional_printer_columns
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(&names, columns, "{kind} printer columns");
        let has_status = version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some());
        assert_eq!(
            has_status,
            !matches!(*kind, "NetworkID" | "ExportedService" | "ClientIdentity"),
            "{kind} status subresource"
        );
    }
}

/// Checks `value` against the parts of `schema` the examples exercise: required properties,
/// string patterns, enums, and numeric ranges, recursively.
fn schema_errors(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let pattern = schema.get("pattern").and_then(Value::as_str);
    if let (Some(pattern), Some(s)) = (pattern, value.as_str())
        && !Regex::new(pattern).unwrap().is_match(s)
    {
        errors.push(format!("{path}: {s:?} does not match {pattern}"));
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !value.is_null()
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: {value} is not one of {allowed:?}"));
    }
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Some(n) = value.as_f64()
        && (bound("minimum").is_some_and(|min| n < min)
            || bound("maximum").is_some_and(|max| n > max))
    {
        errors.push(format!("{path}: {n} is out of range"));
    }
    if let Some(object) = value.as_object() {
        for required in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = required.as_str().unwrap();
            if !object.contains_key(key) {
                errors.push(format!("{path}: missing required {key}"));
            }
        }
        if let Some(properties) = schema.get("properties") {
            for (key, child) in object {
                if let Some(child_schema) = properties.get(key) {
                    schema_errors(child, child_schema, &format!("{path}.{key}"), errors);
                }
            }
        }
    }
    if let (Some(items), Some(item_schema)) = (value.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            schema_errors(item, item_schema, &format!("{path}[{i}]"), errors);
        }
    }
}

#[test]
fn examples_parse_into_their_types_and_pass_the_schema() {
    let dir = repo_root().join("deploy/examples");
    let mut kinds_seen = std::collections::BTreeSet::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document).unwrap();
            let kind = value["kind"].as_str().unwrap().to_owned();
            let name = format!("{} {kind}", file.display());
            let parsed = match kind.as_str() {
                "NetworkConfig" => serde_json::from_value::<NetworkConfig>(value.clone()).map(drop),
                "TunnelEndpoint" => {
                    serde_json::from_value::<TunnelEndpoint>(value.clone()).map(drop)
                }
                "ShortcutConnection" => {
                    serde_json::from_value::<ShortcutConnection>(value.clone()).map(drop)
                }
                "Network" => serde_json::from_value::<Network>(value.clone()).map(drop),
                "NetworkID" => serde_json::from_value::<NetworkId>(value.clone()).map(drop),
                other => panic!("{name}: unexpected kind {other}"),
            };
            parsed.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(value["apiVersion"], "net.kubetun.io/v1alpha1", "{name}");
            let mut errors = Vec::new();
            schema_errors(&value, &schema(&kind), &kind, &mut errors);
            assert!(errors.is_empty(), "{name}: {errors:#?}");
            kinds_seen.insert(kind);
        }
    }
    // ExportedServices and ClientIdentities are written by kubetun (from ServiceExports, from
    // an exporter's policies), never by users: an example would be an object the controller
    // deletes. An ExportPolicy lives next to its Service in a users' namespace: its example is
    // the README's (`readme_export_policy_parses_and_passes_the_schema`).
    let all_kinds: std::collections::BTreeSet<String> = all_crds()
        .into_iter()
        .map(|c| c.spec.names.kind)
        .filter(|kind| {
            !["ExportedService", "ClientIdentity", "ExportPolicy"].contains(&kind.as_str())
        })
        .collect();
    assert_eq!(
        kinds_seen, all_kinds,
        "every kind users write has an example"
    );
}

#[test]
fn schema_check_catches_a_bad_example() {
    let mut value = serde_json::json!({
        "apiVersion": "net.kubetun.io/v1alpha1",
        "kind": "Network",
        "metadata": {"name": "x"},
        "spec": {"prefixes": ["10.0.0.0/33"], "peerings": [{"networkRef": {"name": "y"}}]},
    });
    let mut errors = Vec::new();
    schema_errors(&value, &schema("Network"), "Network", &mut errors);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    value["spec"] = serde_json::json!({"prefixes": ["10.0.0.0/16"]});
    errors.clear();
    schema_errors(&value, &schema("Network"), "Network", &mut errors);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// `kubectl explain` and schema-driven editors show the title: it names the kind, also where
/// the Rust type is cased differently (`NetworkId` for kind `NetworkID`).
#[test]
fn schema_titles_name_the_kind() {
    for crd in all_crds() {
        let kind = &crd.spec.names.kind;
        assert_eq!(
            schema(kind)["title"],
            Value::from(kind.as_str()),
            "title of {kind}"
        );
    }
}

/// The MCS types spell what they share with a Service as a Service does (`clientIP`), which
/// the conformance suite compares field by field, and still read what kubetun wrote before
/// (`clientIp`, kept by peers that were not upgraded yet).
#[test]
fn session_affinity_settings_are_spelled_as_on_a_service() {
    use kubetun_crds::mcs::{ClientIpConfig, SessionAffinityConfig};
    let config = SessionAffinityConfig {
        client_ip: Some(ClientIpConfig {
            timeout_seconds: Some(10),
        }),
    };
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"clientIP": {"timeoutSeconds": 10}})
    );
    let service: k8s_openapi::api::core::v1::SessionAffinityConfig =
        serde_json::from_value(json).unwrap();
    assert_eq!(service.client_ip.and_then(|c| c.timeout_seconds), Some(10));
    let old: SessionAffinityConfig =
        serde_json::from_value(serde_json::json!({"clientIp": {"timeoutSeconds": 10}})).unwrap();
    assert_eq!(old, config);
    let import = &mcs_schema("ServiceImport")["properties"]["spec"]["properties"];
    for field in [
        "internalTrafficPolicy",
        "trafficDistribution",
        "sessionAffinityConfig",
    ] {
        assert!(import.get(field).is_some(), "ServiceImport lacks {field}");
    }
    assert!(
        import["sessionAffinityConfig"]["properties"]
            .get("clientIP")
            .is_some()
    );
}

fn mcs_schema(kind: &str) -> Value {
    let crd = kubetun_crds::mcs::mcs_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    let version = crd.spec.versions.iter().find(|v| v.storage).unwrap();
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn readme_export_policy_parses_and_passes_the_schema() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let block = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains("kind: ExportPolicy"))
        .expect("the README shows an ExportPolicy");
    let value: Value = serde_yaml::from_str(block).unwrap();
    serde_json::from_value::<kubetun_crds::ExportPolicy>(value.clone()).unwrap();
    let mut errors = Vec::new();
    schema_errors(&value, &schema("ExportPolicy"), "ExportPolicy", &mut errors);
    assert!(errors.is_empty(), "{errors:#?}");
}
