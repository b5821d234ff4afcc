//! One test cluster ([`TestCluster`]): its etcd and API server started, stopped, killed and
//! restarted, its kubeconfig and clients, and the entry points that skip without binaries.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::binaries::Assets;
use crate::error::{Error, io};
use crate::files::{append, tail, write_private_file};
use crate::pki::{self, ADMIN_USER};

/// Whether tests must fail instead of skipping when they cannot run (`CI=true`).
pub fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Starts a cluster for a test. When the binaries are missing, prints why and returns `None`,
/// or panics under `CI=true`, where a skipped test would hide a broken setup.
pub async fn cluster_or_skip(name: &str) -> Option<TestCluster> {
    match Assets::find() {
        Ok(assets) => Some(
            TestCluster::start(&assets, name)
                .await
                .unwrap_or_else(|e| panic!("cannot start API server {name}: {e}")),
        ),
        Err(e) if required() => panic!("CI=true and the real-API-server tier cannot run: {e}"),
        Err(e) => {
            eprintln!("skipping: this test needs a real API server: {e}");
            None
        }
    }
}

/// Starts several clusters in parallel (a start is mostly waiting), or `None` like
/// [`cluster_or_skip`].
pub async fn clusters_or_skip<const N: usize>(names: [&str; N]) -> Option<[TestCluster; N]> {
    let assets = match Assets::find() {
        Ok(assets) => assets,
        Err(e) if required() => panic!("CI=true and the real-API-server tier cannot run: {e}"),
        Err(e) => {
            eprintln!("skipping: this test needs real API servers: {e}");
            return None;
        }
    };
    let starts = names.map(|name| {
        let assets = assets.clone();
        let name = name.to_owned();
        tokio::spawn(async move { TestCluster::start(&assets, &name).await })
    });
    let mut clusters = Vec::with_capacity(N);
    for (start, name) in starts.into_iter().zip(names) {
        let cluster = start
            .await
            .expect("start task")
            .unwrap_or_else(|e| panic!("cannot start API server {name}: {e}"));
        clusters.push(cluster);
    }
    Some(clusters.try_into().expect("N clusters"))
}

/// What happens to the processes when the [`TestCluster`] value goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Stopped on drop, and by a watchdog when this process dies first (tests).
    Owned,
    /// Left running for the user (the lab); [`stop_dir`] stops them later.
    Detached,
}

/// One real control plane: etcd and kube-apiserver on 127.0.0.1 with their own CA.
#[derive(Debug)]
pub struct TestCluster {
    name: String,
    dir: PathBuf,
    _tempdir: Option<TempDirGuard>,
    assets: Assets,
    etcd_port: u16,
    etcd_peer_port: u16,
    apiserver_port: u16,
    /// `--service-cluster-ip-range`, kept across API-server restarts.
    service_cidr: String,
    etcd: Option<Process>,
    apiserver: Option<Process>,
    watchdog: Option<Child>,
    lifetime: Lifetime,
}

/// Removes a directory on drop (after the processes using it have stopped).
#[derive(Debug)]
struct TempDirGuard(PathBuf);

impl Drop for TempDirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ports, binaries and PIDs of a cluster, for [`TestCluster::attach`].
const LAYOUT_FILE: &str = "cluster.json";
/// How long a start may take before it fails with the logs' tails.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Service CIDR of a test cluster unless [`TestCluster::start_in`] is given another;
/// `kubernetes.default` is its first address.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

impl TestCluster {
    /// Starts a cluster in a fresh temporary directory, stopped when the value is dropped.
    pub async fn start(assets: &Assets, name: &str) -> Result<Self, Error> {
        let base = std::env::temp_dir().join(format!(
            "kubetun-apiserver-{name}-{}-{}",
            std::process::id(),
            unique_suffix()
        ));
        let guard = TempDirGuard(base.clone());
        let mut cluster =
            Self::start_in(assets, name, &base, Lifetime::Owned, SERVICE_CIDR).await?;
        cluster._tempdir = Some(guard);
        Ok(cluster)
    }

    /// Starts a cluster whose files live in `dir` (created; its old contents are replaced),
    /// allocating ClusterIPs from `service_cidr` (e.g. [`SERVICE_CIDR`]).
    pub async fn start_in(
        assets: &Assets,
        name: &str,
        dir: &Path,
        lifetime: Lifetime,
        service_cidr: &str,
    ) -> Result<Self, Error> {
        if dir.exists() {
            stop_dir(dir);
            std::fs::remove_dir_all(dir).map_err(io(format!("cannot clear {}", dir.display())))?;
        }
        std::fs::create_dir_all(dir.join("pki"))
            .map_err(io(format!("cannot create {}", dir.display())))?;
        let pki = pki::Pki::generate()?;
        pki.write(&dir.join("pki"))?;
        let mut cluster = Self {
            name: name.to_owned(),
            dir: dir.to_owned(),
            _tempdir: None,
            assets: assets.clone(),
            etcd_port: 0,
            etcd_peer_port: 0,
            apiserver_port: 0,
            service_cidr: service_cidr.to_owned(),
            etcd: None,
            apiserver: None,
            watchdog: None,
            lifetime,
        };
        cluster.start_etcd().await?;
        cluster.start_first_apiserver().await?;
        if lifetime == Lifetime::Owned {
            cluster.watchdog = Some(cluster.spawn_watchdog()?);
        }
        Ok(cluster)
    }

    /// The cluster a [`Lifetime::Detached`] start left in `dir` (the lab's), to drive its
    /// API server from another process. Stays detached: dropping it stops nothing.
    pub fn attach(dir: &Path) -> Result<Self, Error> {
        let path = dir.join(LAYOUT_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(io(format!("cannot read {}", path.display())))?;
        let layout: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?;
        let port = |key: &str| {
            layout[key]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or_default()
        };
        let pid = |key: &str| {
            layout[key]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .map(|pid| Process { pid, child: None })
        };
        let binary = |key: &str| PathBuf::from(layout[key].as_str().unwrap_or_default());
        Ok(Self {
            name: layout["name"].as_str().unwrap_or_default().to_owned(),
            dir: dir.to_owned(),
            _tempdir: None,
            assets: Assets {
                etcd: binary("etcd"),
                kube_apiserver: binary("kubeApiserver"),
                kubectl: layout["kubectl"].as_str().map(PathBuf::from),
                kube_controller_manager: None,
            },
            etcd_port: port("etcdPort"),
            etcd_peer_port: port("etcdPeerPort"),
            apiserver_port: port("apiserverPort"),
            service_cidr: layout["serviceCidr"]
                .as_str()
                .unwrap_or(SERVICE_CIDR)
                .to_owned(),
            etcd: pid("etcdPid"),
            apiserver: pid("apiserverPid"),
            watchdog: None,
            lifetime: Lifetime::Detached,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory holding the cluster's logs, certificates, data and kubeconfig.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A kubeconfig for the admin (`system:masters`), certificates embedded.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub fn apiserver_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    pub fn apiserver_log(&self) -> PathBuf {
        self.dir.join("kube-apiserver.log")
    }

    /// A client acting as the admin.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_for(&self.kubeconfig_path()).await
    }

    /// Stops the API server (SIGTERM, or SIGKILL to simulate a crash); etcd keeps running.
    pub async fn stop_apiserver(&mut self, kill: bool) {
        if let Some(process) = self.apiserver.take() {
            process
                .stop(if kill {
                    Signal::SIGKILL
                } else {
                    Signal::SIGTERM
                })
                .await;
        }
        self.write_pids();
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the API server: while frozen it accepts
    /// connections (the kernel completes them) but answers nothing, as a server does that
    /// is starting or starved; thawed, it answers what waited, late.
    pub fn freeze_apiserver(&self, frozen: bool) {
        let Some(pid) = self
            .apiserver
            .as_ref()
            .and_then(|p| i32::try_from(p.pid).ok())
        else {
            return;
        };
        let signal = if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let _ = kill(Pid::from_raw(pid), signal);
    }

    /// Starts the API server again on the same port, certificates and data.
    pub async fn start_apiserver(&mut self) -> Result<(), Error> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        // Right after a kill the kernel may still hold the old listener's port for a moment.
        let mut attempts = 0;
        loop {
            match self.start_apiserver_once().await {
                Err(Error::Exited { log_tail, .. })
                    if attempts < 20 && log_tail.contains("address already in use") =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                result => return result,
            }
        }
    }

    /// The first start: on a port nobody holds. Another process may bind the port picked
    /// before the API server does; then it starts on another one (only a restart must keep
    /// its port).
    async fn start_first_apiserver(&mut self) -> Result<(), Error> {
        let mut attempts = 0;
        loop {
            self.apiserver_port = free_port()?;
            match self.start_apiserver_once().await {
                Err(Error::Exited { log_tail, .. })
                    if attempts < 5 && log_tail.contains("address already in use") =>
                {
                    attempts += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_apiserver_once(&mut self) -> Result<(), Error> {
        let log = self.apiserver_log();
        let stdout = append(&log)?;
        let stderr = stdout.try_clone().map_err(io("cannot dup a log file"))?;
        let child = Command::new(&self.assets.kube_apiserver)
            .args(self.apiserver_args())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(io(format!(
                "cannot run {}",
                self.assets.kube_apiserver.display()
            )))?;
        self.apiserver = Some(Process::spawned(child));
        self.write_pids();
        self.write_kubeconfig()?;
        let started = Instant::now();
        let client = self.client().await?;
        loop {
            if let Some(process) = self.apiserver.as_mut()
                && let Some(status) = process.exited()
            {
                self.apiserver = None;
                return Err(Error::Exited {
                    process: "kube-apiserver",
                    status,
                    log_tail: tail(&log),
                });
            }
            if apiserver_ready(&client).await {
                tracing::debug!(cluster = %self.name, elapsed = ?started.elapsed(), "kube-apiserver ready");
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::NotReady {
                    process: "kube-apiserver",
                    waited: started.elapsed(),
                    log_tail: tail(&log),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops and starts the API server (`kill`: SIGKILL, as a crash). Open watches end and
    /// resuming them from their last resourceVersion may get `410 Gone`.
    pub async fn restart_apiserver(&mut self, kill: bool) -> Result<(), Error> {
        self.stop_apiserver(kill).await;
        self.start_apiserver().await
    }

    /// Runs `kubectl` as the admin of this cluster; returns its stdout, or stderr as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let kubectl = self.assets.kubectl().map_err(|e| e.to_string())?;
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(self.kubeconfig_path())
            .args(args)
            .output()
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// A kubeconfig that acts as ServiceAccount `namespace/name` with a token from the
    /// TokenRequest API, so RBAC applies as it would to the pod using that account. The
    /// ServiceAccount must exist.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, Error> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client().await?, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let issued = accounts
            .create_token_request(name, &Default::default(), &request)
            .await?;
        let token = issued
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| Error::Kubeconfig("TokenRequest returned no token".into()))?;
        let path = self.dir.join(format!("kubeconfig-sa-{namespace}-{name}"));
        let user = serde_json::json!({ "token": token });
        write_private_file(
            &path,
            self.kubeconfig_yaml(&format!("system:serviceaccount:{namespace}:{name}"), user)
                .as_bytes(),
        )?;
        Ok(path)
    }

    /// Leaves the processes running after this value is gone ([`Lifetime::Detached`]).
    pub fn detach(mut self) {
        self.lifetime = Lifetime::Detached;
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        self._tempdir = None;
        self.etcd = None;
        self.apiserver = None;
    }

    async fn start_etcd(&mut self) -> Result<(), Error> {
        let log = self.dir.join("etcd.log");
        let mut last_error = None;
        for _ in 0..5 {
            self.etcd_port = free_port()?;
            self.etcd_peer_port = free_port()?;
            let stdout = append(&log)?;
            let stderr = stdout.try_clone().map_err(io("cannot dup a log file"))?;
            let client_url = format!("http://127.0.0.1:{}", self.etcd_port);
            let peer_url = format!("http://127.0.0.1:{}", self.etcd_peer_port);
            let child = Command::new(&self.assets.etcd)
                .arg("--name")
                .arg(&self.name)
                .arg("--data-dir")
                .arg(self.dir.join("etcd-data"))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .arg("--initial-cluster")
                .arg(format!("{}={peer_url}", self.name))
                .args(["--initial-cluster-state", "new", "--logger", "zap"])
                .args(["--log-outputs", "stderr", "--snapshot-count", "10000"])
                // Tests want throughput, not durability across power loss.
                .arg("--unsafe-no-fsync")
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .map_err(io(format!("cannot run {}", self.assets.etcd.display())))?;
            self.etcd = Some(Process::spawned(child));
            self.write_pids();
            match self.wait_etcd(&log).await {
                Ok(()) => return Ok(()),
                Err(e @ Error::Exited { .. }) if tail(&log).contains("address already in use") => {
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.expect("five tries"))
    }

    async fn wait_etcd(&mut self, log: &Path) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            if let Some(process) = self.etcd.as_mut()
                && let Some(status) = process.exited()
            {
                self.etcd = None;
                return Err(Error::Exited {
                    process: "etcd",
                    status,
                    log_tail: tail(log),
                });
            }
            if etcd_healthy(self.etcd_port).await {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::NotReady {
                    process: "etcd",
                    waited: started.elapsed(),
                    log_tail: tail(log),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn apiserver_args(&self) -> Vec<String> {
        let pki = self.dir.join("pki");
        let p = |f: &str| pki.join(f).display().to_string();
        let mut args = vec![
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", self.apiserver_port),
            format!("--cert-dir={}", pki.display()),
            format!("--tls-cert-file={}", p("server.crt")),
            format!("--tls-private-key-file={}", p("server.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            "--authorization-mode=RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-cluster-ip-range={}", self.service_cidr),
            "--allow-privileged=true".to_owned(),
            "--profiling=false".to_owned(),
            // The lease reconciler would publish Endpoints 127.0.0.1 for `kubernetes`, which
            // validation rejects every 10 s; nothing here routes to that Service.
            "--endpoint-reconciler-type=none".to_owned(),
            // A SIGTERM with open watches would otherwise hold the process for a minute.
            "--shutdown-watch-termination-grace-period=2s".to_owned(),
        ];
        if etcd_lacks_watch_list(&self.assets.etcd) {
            // Streaming lists need etcd >= 3.5 (RequestWatchProgress).
            args.push("--feature-gates=WatchList=false".to_owned());
        }
        args
    }

    fn write_kubeconfig(&self) -> Result<(), Error> {
        let pki = self.dir.join("pki");
        let read = |f: &str| std::fs::read(pki.join(f)).map_err(io(format!("cannot read {f}")));
        let user = serde_json::json!({
            "client-certificate-data": b64(&read("admin.crt")?),
            "client-key-data": b64(&read("admin.key")?),
        });
        write_private_file(
            &self.kubeconfig_path(),
            self.kubeconfig_yaml(ADMIN_USER, user).as_bytes(),
        )
    }

    fn kubeconfig_yaml(&self, user_name: &str, user: serde_json::Value) -> String {
        let ca = std::fs::read(self.dir.join("pki/ca.crt")).unwrap_or_default();
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {
                "server": self.apiserver_url(),
                "certificate-authority-data": b64(&ca),
            }}],
            "users": [{"name": user_name, "user": user}],
            "contexts": [{"name": self.name, "context": {
                "cluster": self.name, "user": user_name, "namespace": "default",
            }}],
            "current-context": self.name,
        });
        serde_yaml::to_string(&config).expect("a JSON value serializes as YAML")
    }

    /// `DIR/pids`: what [`stop_dir`] and the watchdog stop.
    fn write_pids(&self) {
        let mut pids = String::new();
        for process in [&self.etcd, &self.apiserver].into_iter().flatten() {
            let _ = writeln!(pids, "{}", process.pid);
        }
        let _ = std::fs::write(self.dir.join("pids"), pids);
        let layout = serde_json::json!({
            "name": self.name,
            "etcdPort": self.etcd_port,
            "etcdPeerPort": self.etcd_peer_port,
            "apiserverPort": self.apiserver_port,
            "serviceCidr": self.service_cidr,
            "etcd": self.assets.etcd,
            "kubeApiserver": self.assets.kube_apiserver,
            "kubectl": self.assets.kubectl,
            "etcdPid": self.etcd.as_ref().map(|p| p.pid),
            "apiserverPid": self.apiserver.as_ref().map(|p| p.pid),
        });
        let _ = std::fs::write(self.dir.join(LAYOUT_FILE), layout.to_string());
    }

    /// A shell that waits for this process to end and then kills whatever `DIR/pids` names,
    /// so a test that is killed or aborts leaves no API server behind.
    fn spawn_watchdog(&self) -> Result<Child, Error> {
        let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done; [ -r "$2" ] && kill -9 $(cat "$2") 2>/dev/null; exit 0"#;
        Command::new("sh")
            .args(["-c", script, "kubetun-apiserver-watchdog"])
            .arg(std::process::id().to_string())
            .arg(self.dir.join("pids"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("cannot start the watchdog shell"))
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if self.lifetime == Lifetime::Detached {
            return;
        }
        for process in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            process.stop_blocking(Signal::SIGTERM);
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// Stops the processes a [`Lifetime::Detached`] cluster in `dir` left running, waiting for
/// them to exit (SIGTERM, then SIGKILL after 10 s).
pub fn stop_dir(dir: &Path) {
    let Ok(pids) = std::fs::read_to_string(dir.join("pids")) else {
        return;
    };
    for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        // Only our own children's command lines mention the cluster directory.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()) {
            Process { pid, child: None }.stop_blocking(Signal::SIGTERM);
        }
    }
    let _ = std::fs::remove_file(dir.join("pids"));
}

/// Selects ring as the process's rustls provider unless one is set: with more than one
/// provider compiled in, rustls refuses to guess.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for the kubeconfig at `path`, with the generous timeouts a test wants.
pub async fn client_for(path: &Path) -> Result<kube::Client, Error> {
    install_tls_provider();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(kube::Client::try_from(config)?)
}

async fn apiserver_ready(client: &kube::Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    if client.request_text(request).await.is_err() {
        return false;
    }
    // /readyz does not wait for the system namespaces; everything else expects `default`.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    matches!(namespaces.get_opt("default").await, Ok(Some(_)))
}

async fn etcd_healthy(port: u16) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        std::io::Result::Ok(body.contains("\"health\":\"true\""))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .is_ok_and(|r| r.unwrap_or(false))
}

fn etcd_lacks_watch_list(etcd: &Path) -> bool {
    let Ok(out) = Command::new(etcd).arg("--version").output() else {
        return true;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or("0.0.0");
    let mut parts = version
        .trim()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) < (3, 5)
}

/// A free loopback port below Linux' ephemeral range (32768-60999): a port from that range
/// could be taken as the local port of some client connection while the API server is down,
/// and its restart on the same port would fail. A port is handed out once per process (etcd's
/// two ports and the API server's are picked before any of them binds, and a coarse clock
/// gives consecutive calls the same seed); across processes it is racy by nature, and the
/// first starts pick another port on a clash.
fn free_port() -> Result<u16, Error> {
    const PORTS: std::ops::Range<u32> = 20_000..32_000;
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let call = u32::try_from(unique_suffix() & 0xffff_ffff).unwrap_or(0);
    let mut seed = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().wrapping_mul(2_654_435_761)
        ^ call.wrapping_mul(0x9e37_79b9))
        | 1;
    for _ in 0..200 {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let port = u16::try_from(PORTS.start + seed % (PORTS.end - PORTS.start)).unwrap_or(20_000);
        if !handed_out.contains(&port)
            && TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok()
        {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(Error::Io {
        what: "no free loopback port in 20000-32000".into(),
        source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
    })
}

fn unique_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A process of the cluster: spawned here (and reaped here), or found again by PID
/// ([`TestCluster::attach`]).
#[derive(Debug)]
struct Process {
    pid: u32,
    child: Option<Child>,
}

impl Process {
    fn spawned(child: Child) -> Self {
        Self {
            pid: child.id(),
            child: Some(child),
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn gone(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => {
                // A zombie another parent has yet to reap is gone for our purposes.
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid));
                stat.map_or(true, |s| {
                    s.rsplit(") ")
                        .next()
                        .is_some_and(|rest| rest.starts_with('Z'))
                })
            }
        }
    }

    fn signal(&self, signal: Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    async fn stop(mut self, signal: Signal) {
        self.signal(signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.gone() {
            if Instant::now() > deadline {
                self.signal(Signal::SIGKILL);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stop_blocking(mut self, signal: Signal) {
        self.signal(signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.gone() {
            if Instant::now() > deadline {
                self.signal(Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
