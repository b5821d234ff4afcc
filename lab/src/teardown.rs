//! Removing a lab, whether it is complete, half-built or left behind by a crash.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::LabError;
use crate::output::say;
use crate::state::LabState;
use crate::{apiserver, checks, fabric, services};
use kubetun_testenv::netns;

/// Runs [`down`] on `state_dir` when dropped, also during a panic: a lab that a failed test
/// or program built does not outlive it.
#[derive(Debug)]
pub struct DownOnDrop(pub PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = down(&self.0, &mut std::io::sink());
    }
}

/// Removes the lab recorded in `state_dir`: stops each gateway by PID, deletes the
/// namespaces by name (stopping anything left inside), removes sockets and the state file.
/// Without a state file there is nothing to do.
pub fn down(state_dir: &Path, out: &mut dyn Write) -> Result<(), LabError> {
    let Some(state) = LabState::load(state_dir)? else {
        say(
            out,
            &format!("no lab state in {}: nothing to remove", state_dir.display()),
        );
        return Ok(());
    };
    for cluster in &state.clusters {
        if let Some(pid) = cluster.pid
            && fabric::stop_gateway(pid)
        {
            say(
                out,
                &format!("  stopped {} gateway (pid {pid})", cluster.name),
            );
        }
        for socket in [&cluster.grpc_socket, &cluster.uapi_socket] {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(plane) = &cluster.control_plane {
            apiserver::stop(plane);
            if plane.dns_addr.is_some() {
                // It would go with its peer's namespace, but only once the kernel gets to it.
                let _ = netns::ip(&["link", "del", &cluster.dns_link()]);
            }
            let _ = std::fs::remove_dir_all(&plane.dir);
            let _ = std::fs::remove_file(&plane.controller_log);
            say(
                out,
                &format!("  stopped {} API server and controller", cluster.name),
            );
        }
    }
    let _ = std::fs::remove_dir(state_dir.join("apiserver"));
    for name in state.namespaces.iter().rev() {
        netns::delete_netns(name);
        services::remove_resolver(name);
    }
    say(
        out,
        &format!("  deleted {} namespaces", state.namespaces.len()),
    );
    remove_files(state_dir, &state);
    LabState::remove(state_dir)?;
    // The directory goes too when nothing else is in it.
    let _ = std::fs::remove_dir(state_dir);
    Ok(())
}

/// Removes the gateway logs and keys and iperf3 reports the lab wrote into its state
/// directory.
fn remove_files(state_dir: &Path, state: &LabState) {
    for cluster in &state.clusters {
        let _ = std::fs::remove_file(&cluster.log);
        for file in services::files_of(&cluster.id) {
            let _ = std::fs::remove_file(state_dir.join(file));
        }
        if !cluster.key_file.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&cluster.key_file);
        }
    }
    let reports = state
        .clusters
        .iter()
        .flat_map(|c| c.externals.iter())
        .map(|m| state_dir.join(checks::iperf_log_name(&m.namespace)));
    for report in reports {
        let _ = std::fs::remove_file(report);
    }
}

/// Removes a half-built lab when `up` fails or panics.
pub(super) struct Teardown {
    state_dir: Option<PathBuf>,
}

impl Teardown {
    pub(super) fn armed(state_dir: &Path) -> Self {
        Self {
            state_dir: Some(state_dir.to_owned()),
        }
    }

    pub(super) fn disarm(&mut self) {
        self.state_dir = None;
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(dir) = self.state_dir.take() {
            let _ = down(&dir, &mut std::io::sink());
        }
    }
}
