//! `deploy/` and the image stay in sync with the binaries, without building anything:
//!
//! - every environment variable a binary reads through clap (`env = "..."` in the gateway's
//!   and the controller's sources) is documented in `deploy/` (a manifest or a README);
//! - every `KUBETUN_*` variable a manifest sets (`env:`, the ConfigMap) is one a binary reads;
//! - every program a manifest starts (`command[0]`) is a binary of the workspace that
//!   `deploy/Dockerfile` builds and copies into the image, and every container uses one image;
//! - the Dockerfile takes its base images as build arguments (CI passes a local base).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the integration crate is inside the workspace")
        .to_path_buf()
}

/// Every file under `dir` (recursively) whose name ends with one of `suffixes`.
fn files_under(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if suffixes.iter().any(|s| path.to_string_lossy().ends_with(s)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The crates whose binaries the image ships (the CLI runs on the operator's machine).
const IMAGE_CRATES: [&str; 3] = ["gateway", "controller", "controller/agent"];
/// Every crate with a binary users download: the image's and the CLI.
const RELEASED_CRATES: [&str; 4] = [
    "gateway",
    "controller",
    "controller/agent",
    "controller/cli",
];

/// The names in `env = "NAME"` (clap attributes) of `text`.
fn clap_env_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("env = \"") {
        rest = &rest[at + "env = \"".len()..];
        if let Some(end) = rest.find('"') {
            let name = &rest[..end];
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                names.push(name.to_owned());
            }
            rest = &rest[end..];
        }
    }
    names
}

/// Variable name → the source files reading it, over the shipped binaries' crates.
fn variables_read() -> BTreeMap<String, BTreeSet<String>> {
    let root = repo_root();
    let mut read_by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for crate_dir in IMAGE_CRATES {
        for file in files_under(&root.join(crate_dir).join("src"), &[".rs"]) {
            for name in clap_env_names(&read(&file)) {
                let shown = file.strip_prefix(&root).unwrap_or(&file);
                read_by
                    .entry(name)
                    .or_default()
                    .insert(shown.display().to_string());
            }
        }
    }
    read_by
}

/// Every YAML document of the manifests under `deploy/`.
fn manifests() -> Vec<(PathBuf, serde_yaml::Value)> {
    use serde::Deserialize as _;
    let mut docs = Vec::new();
    for file in files_under(&repo_root().join("deploy"), &[".yaml", ".yml"]) {
        let text = read(&file);
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} is not YAML: {e}", file.display()));
            if !value.is_null() {
                docs.push((file.clone(), value));
            }
        }
    }
    docs
}

/// The containers (and init containers) of a Pod or of a workload's pod template.
fn containers(doc: &serde_yaml::Value) -> Vec<&serde_yaml::Value> {
    let spec = match doc.get("kind").and_then(serde_yaml::Value::as_str) {
        Some("Pod") => doc.get("spec"),
        _ => doc
            .get("spec")
            .and_then(|s| s.get("template"))
            .and_then(|t| t.get("spec")),
    };
    let Some(spec) = spec else {
        return Vec::new();
    };
    ["containers", "initContainers"]
        .iter()
        .filter_map(|key| spec.get(key).and_then(serde_yaml::Value::as_sequence))
        .flatten()
        .collect()
}

#[test]
fn clap_env_names_are_found_in_attributes() {
    let names = clap_env_names(
        "#[arg(long, env = \"KUBETUN_A\")]\n#[arg(env = \"lower\")]\nlet env = \"KUBETUN_B\";",
    );
    assert_eq!(names, ["KUBETUN_A", "KUBETUN_B"]);
}

#[test]
fn every_variable_the_binaries_read_is_documented_in_deploy() {
    let read_by = variables_read();
    assert!(
        read_by.len() > 20 && read_by.contains_key("KUBETUN_CLUSTER_ID"),
        "the scan found too few variables: {read_by:?}"
    );
    let docs: String = files_under(&repo_root().join("deploy"), &[".yaml", ".md"])
        .iter()
        .map(|f| read(f))
        .collect();
    let missing: Vec<String> = read_by
        .iter()
        .filter(|(name, _)| !docs.contains(name.as_str()))
        .map(|(name, files)| format!("{name} (read in {})", join(files)))
        .collect();
    assert!(
        missing.is_empty(),
        "not documented under deploy/ (add them to deploy/README.md's table or a manifest):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_variable_the_manifests_set_is_read_by_a_binary() {
    let read_by = variables_read();
    let mut set = BTreeSet::new();
    for (file, doc) in manifests() {
        let shown = file.display().to_string();
        if doc.get("kind").and_then(serde_yaml::Value::as_str) == Some("ConfigMap")
            && let Some(data) = doc.get("data").and_then(serde_yaml::Value::as_mapping)
        {
            for key in data.keys().filter_map(serde_yaml::Value::as_str) {
                set.insert((key.to_owned(), shown.clone()));
            }
        }
        for container in containers(&doc) {
            let env = container
                .get("env")
                .and_then(serde_yaml::Value::as_sequence);
            for var in env.into_iter().flatten() {
                if let Some(name) = var.get("name").and_then(serde_yaml::Value::as_str) {
                    set.insert((name.to_owned(), shown.clone()));
                }
            }
        }
    }
    assert!(
        set.iter()
            .any(|(name, _)| name == "KUBETUN_GATEWAY_INTERFACE"),
        "the scan found no variables in the manifests: {set:?}"
    );
    let unknown: Vec<String> = set
        .iter()
        .filter(|(name, _)| name.starts_with("KUBETUN_") && !read_by.contains_key(name))
        .map(|(name, file)| format!("{name} in {file}"))
        .collect();
    assert!(
        unknown.is_empty(),
        "the manifests set variables no binary reads:\n  {}",
        unknown.join("\n  ")
    );
}

#[test]
fn every_program_the_manifests_start_is_built_into_the_image() {
    let root = repo_root();
    let dockerfile = read(&root.join("deploy/Dockerfile"));
    // The binaries of the workspace: `[[bin]] name = "..."` of the shipped crates.
    let mut workspace_bins = BTreeSet::new();
    for crate_dir in IMAGE_CRATES {
        let text = read(&root.join(crate_dir).join("Cargo.toml"));
        let value: toml_lite::Doc = toml_lite::parse(&text);
        workspace_bins.extend(value.bin_names);
    }
    assert!(
        workspace_bins.contains("kubetun-gateway"),
        "{workspace_bins:?}"
    );

    let mut programs = BTreeMap::<String, BTreeSet<String>>::new();
    let mut images = BTreeSet::new();
    for (file, doc) in manifests() {
        for container in containers(&doc) {
            if let Some(image) = container.get("image").and_then(serde_yaml::Value::as_str) {
                images.insert(image.to_owned());
            }
            let program = container
                .get("command")
                .and_then(|c| c.get(0))
                .and_then(serde_yaml::Value::as_str);
            if let Some(program) = program {
                programs
                    .entry(program.to_owned())
                    .or_default()
                    .insert(file.display().to_string());
            }
        }
    }
    assert!(
        programs.contains_key("kubetun-gateway") && programs.contains_key("kubetun-controller"),
        "the scan found too few programs: {programs:?}"
    );
    assert_eq!(
        images.len(),
        1,
        "every container should run the one kubetun image: {images:?}"
    );
    for (program, files) in &programs {
        assert!(
            workspace_bins.contains(program),
            "{program} (started in {}) is not a binary of the workspace",
            join(files)
        );
        assert!(
            dockerfile.contains(&format!("--bin {program}")),
            "deploy/Dockerfile does not build {program} (started in {})",
            join(files)
        );
        assert!(
            dockerfile.contains(&format!("target/release/{program} ")),
            "deploy/Dockerfile does not copy {program} into the image (started in {})",
            join(files)
        );
    }
}

/// The programs the shipped binaries start by name (`Command::new("...")`).
fn external_tools() -> BTreeSet<String> {
    let root = repo_root();
    let mut tools = BTreeSet::new();
    for crate_dir in IMAGE_CRATES {
        for file in files_under(&root.join(crate_dir).join("src"), &[".rs"]) {
            let text = read(&file);
            let mut rest = text.as_str();
            while let Some(at) = rest.find("Command::new(\"") {
                rest = &rest[at + "Command::new(\"".len()..];
                if let Some(end) = rest.find('"') {
                    tools.insert(rest[..end].to_owned());
                    rest = &rest[end..];
                }
            }
        }
    }
    tools
}

#[test]
fn every_tool_the_binaries_run_is_in_the_image() {
    let tools = external_tools();
    assert!(tools.contains("ip"), "the gateway runs `ip`: {tools:?}");
    let dockerfile = read(&repo_root().join("deploy/Dockerfile"));
    let copy_line = dockerfile
        .lines()
        .find(|l| l.contains("/rootfs/usr/bin/"))
        .expect("deploy/Dockerfile copies tools into /rootfs/usr/bin/");
    for tool in &tools {
        assert!(
            copy_line.contains(&format!("/{tool} ")),
            "the gateway or controller runs `{tool}`, which deploy/Dockerfile does not copy \
             into the image: {copy_line}"
        );
    }
}

#[test]
fn the_dockerfile_takes_its_bases_and_binaries_as_build_arguments() {
    let dockerfile = read(&repo_root().join("deploy/Dockerfile"));
    for line in ["ARG BUILDER=", "ARG BASE=", "ARG BINARIES=", "FROM ${BASE}"] {
        assert!(
            dockerfile.lines().any(|l| l.starts_with(line)),
            "deploy/Dockerfile has no line starting with {line:?}"
        );
    }
    assert!(
        dockerfile.contains("AS with-source-binaries")
            && dockerfile.contains("AS with-context-binaries")
    );
}

/// Cargo resets `strip` to its default (debuginfo only) for a package with its own
/// `[profile.release.package.<name>]` section, so the binary of such a package shipped with
/// its symbol tables (2.5 MB of the controller) until the section said `strip` again.
#[test]
fn every_shipped_binary_is_stripped_in_release() {
    let root = repo_root();
    let workspace = read(&root.join("Cargo.toml"));
    let mut checked = 0;
    for crate_dir in RELEASED_CRATES {
        let manifest = toml_lite::parse(&read(&root.join(crate_dir).join("Cargo.toml")));
        assert!(
            !manifest.bin_names.is_empty(),
            "{crate_dir}/Cargo.toml builds no binary"
        );
        let package = &manifest.package_name;
        let header = format!("[profile.release.package.{package}]");
        let Some(at) = workspace.find(&header) else {
            continue; // the release profile's own `strip` applies
        };
        let section = workspace[at + header.len()..]
            .split("\n[")
            .next()
            .unwrap_or_default();
        assert!(
            section
                .lines()
                .any(|line| line.trim() == r#"strip = "symbols""#),
            "Cargo.toml: {header} must set strip = \"symbols\" (an override resets it), \
             or {package}'s release binary keeps its symbols"
        );
        checked += 1;
    }
    assert!(
        checked > 0,
        "no binary package has a release override to check"
    );
}

fn join(files: &BTreeSet<String>) -> String {
    files.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// Just enough TOML for the `name` keys of `[package]` and `[[bin]]` tables (no TOML parser in
/// the dependencies).
mod toml_lite {
    use std::collections::BTreeSet;

    pub struct Doc {
        pub package_name: String,
        pub bin_names: BTreeSet<String>,
    }

    pub fn parse(text: &str) -> Doc {
        let mut doc = Doc {
            package_name: String::new(),
            bin_names: BTreeSet::new(),
        };
        let mut section = "";
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
            } else if let Some(value) = line.strip_prefix("name")
                && let Some(value) = value.trim_start().strip_prefix('=')
            {
                let name = value.trim().trim_matches('"').to_owned();
                match section {
                    "[package]" => doc.package_name = name,
                    "[[bin]]" => {
                        doc.bin_names.insert(name);
                    }
                    _ => {}
                }
            }
        }
        doc
    }
}

/// Copies `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("list dir") {
        let path = entry.expect("entry").path();
        let target = to.join(path.file_name().expect("file name"));
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// `deploy/` copied to a temporary directory with `component` enabled in each of
/// `kustomizations` (paths under `deploy/`), and a builder of a directory of that copy with
/// `kubectl kustomize`. `None` (after saying why) without kubectl outside CI.
fn with_component(
    component: &str,
    kustomizations: &[&str],
) -> Option<(tempfile::TempDir, impl Fn(&Path) -> String)> {
    let kubectl = match kubetun_testenv::Assets::find() {
        Ok(assets) => assets.kubectl().expect("kubectl").to_path_buf(),
        Err(e) => {
            assert!(!kubetun_testenv::required(), "CI=true: {e}");
            eprintln!("skipping: {e}");
            return None;
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    copy_tree(&repo_root().join("deploy"), dir.path());
    for kustomization in kustomizations {
        let path = dir.path().join(kustomization);
        let text = read(&path) + &format!("components:\n  - {component}\n");
        std::fs::write(&path, text).expect("write");
    }
    let build = move |dir: &Path| {
        let out = std::process::Command::new(&kubectl)
            .arg("kustomize")
            .arg(dir)
            .output()
            .expect("kubectl kustomize");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    Some((dir, build))
}

fn documents(yaml: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect()
}

/// The hub component (`deploy/hub`) turns on IP forwarding in the gateway pod's network
/// namespace (what the hub needs to carry leaf-to-leaf traffic) and keeps the rest of the
/// pod's security context.
#[test]
fn the_hub_component_enables_forwarding() {
    let Some((dir, build)) = with_component("hub", &["kustomization.yaml"]) else {
        return;
    };
    let docs = documents(&build(dir.path()));
    let deployment = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .expect("the Deployment");
    let context = &deployment["spec"]["template"]["spec"]["securityContext"];
    let sysctls: Vec<(&str, &str)> = context["sysctls"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s["name"].as_str()?, s["value"].as_str()?)))
        .collect();
    assert_eq!(sysctls, [("net.ipv4.ip_forward", "1")]);
    assert_eq!(
        context["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
}

/// The replicated-gateway components (`deploy/ha`, `deploy/agent/ha`), enabled as the README
/// says, build with kustomize into two standby-started replicas on the host network, no load
/// balancer, and agents that follow the Lease.
#[test]
fn the_replicated_gateway_components_build() {
    let Some((dir, build)) =
        with_component("ha", &["kustomization.yaml", "agent/kustomization.yaml"])
    else {
        return;
    };
    let docs = documents(&build(dir.path()));
    let kind = |doc: &serde_yaml::Value| doc["kind"].as_str().unwrap_or_default().to_owned();
    assert!(
        !docs.iter().any(|d| kind(d) == "Service"),
        "no load balancer in front of both"
    );
    let deployment = docs
        .iter()
        .find(|d| kind(d) == "Deployment")
        .expect("the Deployment");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(2));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
    let env_names = |container: &str| -> Vec<String> {
        containers(deployment)
            .into_iter()
            .find(|c| c["name"].as_str() == Some(container))
            .and_then(|c| c["env"].as_sequence())
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str().map(str::to_owned))
            .collect()
    };
    assert!(env_names("gateway").contains(&"KUBETUN_STANDBY".to_owned()));
    for name in [
        "KUBETUN_REPLICA",
        "KUBETUN_NODE_IP",
        "KUBETUN_ENDPOINT_ADDRESS",
    ] {
        assert!(env_names("controller").contains(&name.to_owned()), "{name}");
    }
    assert!(build(&dir.path().join("agent")).contains("name: KUBETUN_GATEWAY_LEASE"));
}
