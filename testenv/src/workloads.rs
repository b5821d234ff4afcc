//! Workloads on a test cluster: kube-controller-manager (Deployments → ReplicaSets → Pods,
//! EndpointSlices of Services, garbage collection, `default` ServiceAccounts) and
//! `fake-kubelet` (keeps a Node Ready, binds pods to it and marks them Running and Ready with
//! an IP from the cluster's pod CIDR; nothing runs in them). With both, a test's Deployment
//! and Service give the EndpointSlices a real cluster would.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::binaries::Assets;
use crate::cluster::TestCluster;
use crate::error::{Error, io};
use crate::files::append;

/// `fake-kubelet` beside this repository (`../shared/tools`), or `KUBETUN_FAKE_KUBELET`.
pub fn fake_kubelet() -> Result<PathBuf, Error> {
    let path = std::env::var_os("KUBETUN_FAKE_KUBELET")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/tools/fake-kubelet"
            ))
        });
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            binary: "fake-kubelet",
        })
    }
}

/// kube-controller-manager and fake-kubelet of one cluster; both stop when this is dropped.
#[derive(Debug)]
pub struct Workloads {
    children: Vec<Child>,
}

impl Drop for Workloads {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl TestCluster {
    /// Starts kube-controller-manager and fake-kubelet (pods get addresses from `pod_cidr`,
    /// on Node `node`). Logs go to the cluster's directory.
    pub fn start_workloads(&self, pod_cidr: &str, node: &str) -> Result<Workloads, Error> {
        let assets = Assets::find()?;
        let manager = assets
            .kube_controller_manager
            .clone()
            .ok_or(Error::MissingBinary {
                binary: "kube-controller-manager",
            })?;
        let kubectl = assets.kubectl()?.to_owned();
        let fake_kubelet = fake_kubelet()?;
        let kubeconfig = self.kubeconfig_path();
        let pki = self.dir().join("pki");
        let log = |name: &str| -> Result<(std::fs::File, std::fs::File), Error> {
            let out = append(&self.dir().join(name))?;
            let err = out.try_clone().map_err(io("cannot dup a log file"))?;
            Ok((out, err))
        };
        let mut workloads = Workloads {
            children: Vec::new(),
        };
        let (out, err) = log("kube-controller-manager.log")?;
        workloads.children.push(
            Command::new(&manager)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!(
                    "--service-account-private-key-file={}",
                    pki.join("sa.key").display()
                ))
                .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()))
                .args([
                    "--leader-elect=false",
                    "--controllers=*",
                    "--secure-port=0",
                    "--use-service-account-credentials=false",
                ])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(io(format!("cannot start {}", manager.display())))?,
        );
        // fake-kubelet calls `kubectl` by name.
        let mut path = kubectl
            .parent()
            .map(|p| p.as_os_str().to_owned())
            .unwrap_or_default();
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        let (out, err) = log("fake-kubelet.log")?;
        workloads.children.push(
            Command::new("python3")
                .arg(&fake_kubelet)
                .arg(&kubeconfig)
                .arg(pod_cidr)
                .args(["--node", node])
                .env("PATH", path)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(io("cannot start fake-kubelet (python3)"))?,
        );
        Ok(workloads)
    }
}
