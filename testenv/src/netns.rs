//! Network-namespace test fixtures: named namespaces, veth pairs and processes that are all
//! removed on drop, so a failing test leaves nothing behind.
//!
//! Everything here shells out to `ip` (iproute2): these are test and lab fixtures, not the data
//! plane, and `ip` is what an operator would type to reproduce a failure by hand.

use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::bin_path;

/// Failure of a namespace fixture operation.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// A command could not be started.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A daemon started but did not open its control socket in time (it was stopped).
    #[error("`{command}` did not open {socket} within {timeout:?}")]
    NotReady {
        /// The command line.
        command: String,
        /// The socket it should have opened.
        socket: String,
        /// How long it had.
        timeout: Duration,
    },
}

/// Result of a fixture operation.
pub type Result<T, E = NetnsError> = std::result::Result<T, E>;

/// True when the process runs as root (the owner of `/proc/self` is the effective uid).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Whether a root-only test can run. Returns `false` (after printing why) when it cannot;
/// under `CI=true` it panics instead, so CI never skips silently.
pub fn require_root(test: &str) -> bool {
    let missing = if !is_root() {
        Some("not running as root")
    } else if !std::path::Path::new("/dev/net/tun").exists() {
        Some("/dev/net/tun is missing")
    } else if !command_exists("ip") {
        Some("iproute2 (`ip`) is not installed")
    } else {
        None
    };
    match missing {
        None => true,
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: cannot run under CI: {reason}")
        }
        Some(reason) => {
            eprintln!(
                "SKIPPED {test}: {reason} (run as root to include it; CI=true makes this fatal)"
            );
            false
        }
    }
}

/// True when `program` is found on `PATH`.
pub fn command_exists(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Runs a command to completion; an unsuccessful exit is an error carrying its stderr.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let command = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetnsError::Spawn {
            command: command.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(NetnsError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Runs `ip <args>` in the current namespace.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = run(Command::new("ip").args(args))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A named network namespace, deleted (with everything in it) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` (removing a stale one of that name first) with `lo` up.
    pub fn new(name: &str) -> Result<Self> {
        delete_netns(name);
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
        };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        command_in(&self.name, program)
    }

    /// Runs `args` inside the namespace to completion and returns its stdout.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        exec_in(&self.name, args)
    }

    /// Runs `args` inside the namespace and reports only whether it succeeded.
    pub fn succeeds(&self, args: &[&str]) -> bool {
        self.exec(args).is_ok()
    }

    /// Starts `args` inside the namespace; the process is stopped when the handle drops.
    pub fn spawn(&self, args: &[&str]) -> Result<NsChild> {
        let (program, rest) = args.split_first().expect("spawn needs a program");
        let mut cmd = self.command(program);
        cmd.args(rest).stdin(Stdio::null());
        NsChild::spawn(&mut cmd)
    }

    /// Pings `addr` from this namespace (`count` packets, 1 s deadline each); true on replies.
    pub fn ping(&self, addr: &str, count: u32) -> bool {
        ping_from(&self.name, addr, count)
    }

    /// Pings `addr` until it answers or `timeout` passes; true when it answered.
    pub fn wait_ping(&self, addr: &str, timeout: Duration) -> bool {
        wait_ping_from(&self.name, addr, timeout)
    }
}

/// A command that runs `program` inside the namespace named `ns`. The functions taking a
/// name serve namespaces this process does not own (a lab built by an earlier process).
pub fn command_in(ns: &str, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, program]);
    cmd
}

/// Runs `args` inside namespace `ns` to completion and returns its stdout.
pub fn exec_in(ns: &str, args: &[&str]) -> Result<String> {
    let (program, rest) = args.split_first().expect("exec needs a program");
    let out = run(command_in(ns, program).args(rest))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Pings `addr` from namespace `ns` (`count` packets, 1 s deadline each); true on replies.
pub fn ping_from(ns: &str, addr: &str, count: u32) -> bool {
    let count = count.to_string();
    exec_in(
        ns,
        &["ping", "-c", &count, "-i", "0.2", "-W", "1", "-q", addr],
    )
    .is_ok()
}

/// Pings `addr` from namespace `ns` until it answers or `timeout` passes.
pub fn wait_ping_from(ns: &str, addr: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ping_from(ns, addr, 1) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete_netns(&self.name);
    }
}

/// The names of the existing namespaces that start with `prefix` and a dash.
pub fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    let start = format!("{prefix}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&start))
        .map(str::to_owned)
        .collect()
}

/// Deletes namespace `name` if it exists, first stopping every process still inside it.
pub fn delete_netns(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).output();
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .output();
}

/// Creates a veth pair `a_if` (in `a`) <-> `b_if` (in `b`), both up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    ip(&[
        "link",
        "add",
        a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    a.exec(&["ip", "link", "set", a_if, "up"])?;
    b.exec(&["ip", "link", "set", b_if, "up"])?;
    Ok(())
}

/// A child process stopped on drop: SIGTERM, then SIGKILL after two seconds, by PID.
#[derive(Debug)]
pub struct NsChild {
    child: Child,
}

impl NsChild {
    /// Spawns `cmd` (stdout and stderr inherited unless the caller redirected them).
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let command = describe(cmd);
        let child = cmd
            .spawn()
            .map_err(|source| NetnsError::Spawn { command, source })?;
        Ok(Self { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, no cleanup (what a crash or an OOM kill does), and reaps it.
    pub fn kill_hard(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.kill()?;
        self.child.wait()
    }

    /// Stops the process (SIGTERM, SIGKILL after a grace period) and reaps it.
    pub fn stop(&mut self) {
        if !self.is_running() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .output();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NsChild {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `kubetun-gateway -f <ifname> --grpc-socket <socket>` in the namespace named `ns` at log
/// level `rust_log`, its stderr appended to `log`; add arguments, then [`spawn_gateway`] it.
pub fn gateway_command(
    ns: &str,
    ifname: &str,
    grpc_socket: &std::path::Path,
    log: &std::path::Path,
    rust_log: &str,
) -> Result<Command> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| NetnsError::Spawn {
            command: format!("open {}", log.display()),
            source,
        })?;
    let mut cmd = command_in(ns, &bin_path("kubetun-gateway").to_string_lossy());
    cmd.args(["-f", ifname, "--grpc-socket"])
        .arg(grpc_socket)
        .env("RUST_LOG", rust_log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    Ok(cmd)
}

/// Spawns a [`gateway_command`] and waits up to `timeout` for its control socket `socket`;
/// a gateway that does not open it is stopped and reported.
pub fn spawn_gateway(
    cmd: &mut Command,
    socket: &std::path::Path,
    timeout: Duration,
) -> Result<NsChild> {
    let mut child = NsChild::spawn(cmd)?;
    if wait_for_path(socket, timeout) {
        return Ok(child);
    }
    child.stop();
    Err(NetnsError::NotReady {
        command: describe(cmd),
        socket: socket.display().to_string(),
        timeout,
    })
}

/// Removes the socket a killed earlier run left at `path` (one of the test's own interface
/// names), so that [`wait_for_path`] waits for the new daemon's instead of finding it.
pub fn remove_stale_socket(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
}

/// Waits until `path` exists (a socket a daemon creates when ready) or `timeout` passes.
pub fn wait_for_path(path: &std::path::Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

impl Netns {
    /// Keeps the namespace after this handle drops, for fixtures that outlive the process
    /// (the lab); returns its name. Remove it later with [`delete_netns`].
    pub fn into_persistent(self) -> String {
        let mut this = std::mem::ManuallyDrop::new(self);
        std::mem::take(&mut this.name)
    }
}

/// Runs `work` on a fresh thread that has entered namespace `ns` and returns its result. Sockets
/// the closure opens (a netlink connection, a listener) live in that namespace, so in-process
/// code can be tested against a namespace's kernel state.
pub fn run_in<T: Send>(ns: &Netns, work: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    run_in_named(ns.name(), work)
}

/// [`run_in`] for a namespace known by name only.
pub fn run_in_named<T: Send>(ns: &str, work: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    let namespace = std::fs::File::open(format!("/run/netns/{ns}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                Ok(work())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
