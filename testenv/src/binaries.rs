//! Where the programs are: the control plane's ([`Assets`]) and the workspace's own, the
//! binaries cargo built next to the running executable (tests run from
//! `target/<profile>/deps/`), so that a test of one crate can run another crate's program
//! (`CARGO_BIN_EXE_*` only names the own crate's).

use std::path::{Path, PathBuf};

use crate::error::Error;

/// The binaries a test cluster runs.
#[derive(Debug, Clone)]
pub struct Assets {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    /// Optional: only tests that drive `kubectl` as a user would need it.
    pub kubectl: Option<PathBuf>,
    /// Optional: only tests with workloads ([`crate::TestCluster::start_workloads`]) need it.
    pub kube_controller_manager: Option<PathBuf>,
}

/// envtest's default asset directory, used when `KUBEBUILDER_ASSETS` is not set.
pub const DEFAULT_ASSETS_DIR: &str = "/usr/local/kubebuilder/bin";

impl Assets {
    /// Looks in `KUBEBUILDER_ASSETS`, then [`DEFAULT_ASSETS_DIR`], then `PATH`, per binary.
    pub fn find() -> Result<Self, Error> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(assets) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|v| !v.is_empty()) {
            dirs.push(assets.into());
        }
        dirs.push(DEFAULT_ASSETS_DIR.into());
        if let Some(path) = std::env::var_os("PATH") {
            dirs.extend(std::env::split_paths(&path));
        }
        let find = |name: &str| {
            dirs.iter()
                .map(|dir| dir.join(name))
                .find(|candidate| is_executable(candidate))
        };
        Ok(Self {
            etcd: find("etcd").ok_or(Error::MissingBinary { binary: "etcd" })?,
            kube_apiserver: find("kube-apiserver").ok_or(Error::MissingBinary {
                binary: "kube-apiserver",
            })?,
            kubectl: find("kubectl"),
            kube_controller_manager: find("kube-controller-manager"),
        })
    }

    /// `kubectl`, or the reason it cannot be found.
    pub fn kubectl(&self) -> Result<&Path, Error> {
        self.kubectl
            .as_deref()
            .ok_or(Error::MissingBinary { binary: "kubectl" })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A workspace binary (e.g. `kubetun-gateway`) in the target directory that holds the running
/// executable, else on `PATH`, else the bare name.
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from(name));
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let sibling = dir.join(name);
    if sibling.is_file() {
        return sibling;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or(sibling)
}

/// [`sibling_binary`], which must exist: a missing one is an error naming the command that
/// builds it (`cargo test` builds a package's binaries only for that package's own
/// integration tests, so a program run from another crate's test must be built beforehand).
pub fn workspace_program(name: &str) -> Result<PathBuf, Error> {
    let path = sibling_binary(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingProgram {
            path,
            package: package_of(name),
        })
    }
}

/// [`workspace_program`] for tests: a missing program fails the test with its error.
pub fn bin_path(name: &str) -> PathBuf {
    workspace_program(name).unwrap_or_else(|e| panic!("{e}"))
}

/// The package that builds binary `bin`.
fn package_of(bin: &str) -> &'static str {
    match bin {
        "kubetun-gateway" => "kubetun-gateway",
        "kubetun-controller" => "kubetun-controller",
        "kubetun-agent" => "kubetun-agent",
        "kubetun" => "kubetun-cli",
        _ => "kubetun-lab",
    }
}
