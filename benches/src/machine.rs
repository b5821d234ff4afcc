//! The machine and software a run was measured on: CPU model, cores, hypervisor, kernel, date
//! and the versions of iperf3 and each daemon.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

use kubetun_fixtures::implementations::{Binaries, Implementation};

/// What a result was measured on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// CPU model (lscpu "Model name").
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Hypervisor vendor, if virtualised.
    pub hypervisor: Option<String>,
    /// Kernel release.
    pub kernel: String,
    /// When the run started (UTC).
    pub date: String,
    /// iperf3 version line.
    pub iperf3: String,
    /// Version line of each daemon.
    pub daemons: Vec<(Implementation, String)>,
}

impl Machine {
    /// Collects the facts of this machine.
    pub fn detect(binaries: &Binaries) -> Self {
        let lscpu = command_output("lscpu", &[]);
        let field = |name: &str| lscpu_field(&lscpu, name);
        let daemons = Implementation::ALL
            .into_iter()
            // The same executable as kubetun.
            .filter(|i| {
                !matches!(
                    i,
                    Implementation::KubetunBusyPoll | Implementation::KubetunMq
                )
            })
            .filter_map(|i| binaries.of(i).map(|path| (i, version_of(path))))
            .collect();
        Self {
            cpu_model: field("Model name").unwrap_or_else(|| "unknown CPU".to_owned()),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            hypervisor: field("Hypervisor vendor"),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|k| k.trim().to_owned())
                .unwrap_or_default(),
            date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
                .trim()
                .to_owned(),
            iperf3: first_line(&command_output("iperf3", &["--version"])),
            daemons,
        }
    }

    /// One line for the results file.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} CPUs{}), Linux {}",
            self.cpu_model,
            self.cpus,
            self.hypervisor
                .as_ref()
                .map_or_else(String::new, |h| format!(", {h} guest")),
            self.kernel
        )
    }
}

/// The value of `name:` in lscpu output.
pub fn lscpu_field(lscpu: &str, name: &str) -> Option<String> {
    lscpu.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_owned())
    })
}

fn version_of(binary: &Path) -> String {
    let output = command_output(&binary.to_string_lossy(), &["--version"]);
    let line = first_line(&output);
    if line.is_empty() {
        "version unknown".to_owned()
    } else {
        line
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            text
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lscpu_fields() {
        let lscpu = "Architecture:  x86_64\nModel name:    AMD EPYC\nHypervisor vendor:  KVM\n";
        assert_eq!(
            lscpu_field(lscpu, "Model name").as_deref(),
            Some("AMD EPYC")
        );
        assert_eq!(
            lscpu_field(lscpu, "Hypervisor vendor").as_deref(),
            Some("KVM")
        );
        assert_eq!(lscpu_field(lscpu, "Flags"), None);
    }

    #[test]
    fn describes_the_machine() {
        let machine = Machine {
            cpu_model: "AMD EPYC".into(),
            cpus: 2,
            hypervisor: Some("KVM".into()),
            kernel: "6.18.44".into(),
            date: "2026-11-22 00:40 UTC".into(),
            iperf3: "iperf 3.12".into(),
            daemons: vec![],
        };
        assert_eq!(
            machine.describe(),
            "AMD EPYC (2 CPUs, KVM guest), Linux 6.18.44"
        );
    }
}
