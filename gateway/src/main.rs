//! `kubetun-gateway [-f] <ifname>`: creates the TUN interface `<ifname>`, serves the WireGuard
//! UAPI on `/var/run/wireguard/<ifname>.sock`, the gRPC control API on
//! `/var/run/kubetun/<ifname>.grpc.sock`, and optionally Prometheus metrics.
//!
//! Like wireguard-go, it detaches by default: the process re-executes itself with `-f` in a
//! new process group (stdin on /dev/null, stderr kept if `RUST_LOG` is set, stdout a pipe back
//! to the launcher) and exits 0 once the child reports on that pipe that its sockets are
//! bound, or non-zero with the child's own error if the child fails first. With `-f` it stays
//! in the foreground. SIGTERM or SIGINT shut it down cleanly (exit 0): the sockets are
//! removed and the TUN device disappears; so does deleting the UAPI socket file, which is how
//! wireguard-go is told to stop. If the TUN device is deleted or fails, it exits 1 and says so.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use kubetun_gateway::device::Device;
use kubetun_gateway::io_options::IoOptions;
use kubetun_gateway::peercred::PeerPolicy;
use kubetun_gateway::uapi::server::{SOCKET_DIR, UapiServer, socket_path};
use kubetun_gateway::{caps, grpc, metrics};
use tokio::signal::unix::{SignalKind, signal};

/// How long the detaching parent waits for the child to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Set by the launcher in the child's environment: report readiness or failure on stdout.
const NOTIFY_ENV: &str = "KUBETUN_GATEWAY_NOTIFY_STDOUT";
/// The line the child writes on stdout once it serves.
const READY_LINE: &str = "ready";

#[derive(Debug, Parser)]
#[command(
    name = "kubetun-gateway",
    version,
    about = "Userspace WireGuard gateway with 1:1 prefix remapping"
)]
struct Args {
    /// Stay in the foreground instead of detaching.
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Directory of the WireGuard UAPI socket (`<dir>/<ifname>.sock`).
    #[arg(long, default_value = SOCKET_DIR, env = "KUBETUN_UAPI_DIR")]
    uapi_dir: PathBuf,
    /// Path of the gRPC control socket [default: /var/run/kubetun/<ifname>.grpc.sock].
    #[arg(long, env = "KUBETUN_GRPC_SOCKET")]
    grpc_socket: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 127.0.0.1:9586).
    #[arg(long, env = "KUBETUN_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Also admit this uid on the control sockets (besides root and the gateway's own user);
    /// repeatable.
    #[arg(
        long = "allow-uid",
        value_name = "UID",
        env = "KUBETUN_ALLOW_UIDS",
        value_delimiter = ','
    )]
    allow_uids: Vec<u32>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Poll mode, for latency: one thread runs everything and polls the TUN device and the
    /// sockets without ever sleeping, so no packet waits for a thread wake-up. Costs one core
    /// all the time, and the data path then has one thread.
    #[arg(long, env = "KUBETUN_BUSY_POLL")]
    busy_poll: bool,
    /// Start on standby: one replica of several, active only once its controller holds the
    /// cluster's gateway lease (gRPC `Hold`). A replica that restarts then never sends
    /// before it knows it may.
    #[arg(long, env = "KUBETUN_STANDBY")]
    standby: bool,
    /// The TUN interface to create.
    ifname: String,
    /// Data-path I/O techniques (each can be switched off to measure it).
    #[command(flatten)]
    io: IoArgs,
}

/// Switches of the batched I/O techniques; all are on by default.
#[derive(Debug, clap::Args)]
struct IoArgs {
    /// Open the TUN device without virtio-net offloads (no TSO/USO reads, no GRO writes).
    #[arg(long, env = "KUBETUN_NO_TUN_OFFLOAD")]
    no_tun_offload: bool,
    /// Send every UDP datagram on its own instead of in GSO messages.
    #[arg(long, env = "KUBETUN_NO_UDP_GSO")]
    no_udp_gso: bool,
    /// Receive without UDP GRO.
    #[arg(long, env = "KUBETUN_NO_UDP_GRO")]
    no_udp_gro: bool,
    /// Most packets per batch (1 turns batching off).
    #[arg(
        long,
        env = "KUBETUN_BATCH_SIZE",
        default_value_t = kubetun_gateway::io_options::DEFAULT_BATCH_SIZE as u16,
        value_parser = clap::value_parser!(u16).range(1..=128)
    )]
    batch_size: u16,
    /// Data-path queues: with N > 1 the TUN device is opened multi-queue and each UDP
    /// family gets N SO_REUSEPORT sockets, each queue and socket read by its own task, so
    /// flows and peers are encrypted and decrypted on several cores. 1 is one TUN queue and
    /// one socket per family. With --busy-poll all queues share its one thread.
    #[arg(
        long,
        env = "KUBETUN_QUEUES",
        default_value_t = kubetun_gateway::io_options::DEFAULT_QUEUES as u16,
        value_parser = clap::value_parser!(u16).range(1..=kubetun_gateway::io_options::MAX_QUEUES as i64)
    )]
    queues: u16,
    /// Microseconds the data path keeps polling after it handled packets before its thread
    /// sleeps (e.g. 200): the answer to what it just sent is then read without a thread
    /// wake-up (tens of µs each on a virtual machine). Costs at most this much CPU per burst
    /// of traffic and nothing when the link is idle, but the gateway then runs on one thread
    /// (with --queues 1; more queues keep a thread per core and no window). 0 (the default):
    /// a multi-threaded runtime whose threads sleep at once.
    #[arg(
        long,
        env = "KUBETUN_SPIN_WINDOW_US",
        default_value_t = 0,
        value_parser = clap::value_parser!(u32).range(0..=10_000)
    )]
    spin_window_us: u32,
    /// Threads one peer's long run of packets (16 and more) is encrypted or decrypted on,
    /// the data-path task's own included: a single peer then uses several cores. 0 (the
    /// default): half the cores, so none beside the task below four cores; 1: none.
    #[arg(
        long,
        env = "KUBETUN_CRYPTO_WORKERS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u16).range(0..=16)
    )]
    crypto_workers: u16,
    /// Slots of the flow table: the connections this cluster's pods opened towards remote
    /// clusters, whose replies an exported link admits (12 bytes each, allocated at start;
    /// new flows towards an exported cluster are dropped once their buckets are full, which
    /// begins at about 60 % of the slots).
    #[arg(
        long,
        env = "KUBETUN_FLOW_TABLE_SIZE",
        default_value_t = kubetun_gateway_core::admission::flows::DEFAULT_CAPACITY as u32,
        value_parser = clap::value_parser!(u32).range(16..=kubetun_gateway_core::admission::flows::MAX_CAPACITY as i64)
    )]
    flow_table_size: u32,
}

impl IoArgs {
    fn options(&self) -> IoOptions {
        IoOptions {
            tun_offload: !self.no_tun_offload,
            udp_gso: !self.no_udp_gso,
            udp_gro: !self.no_udp_gro,
            batch_size: usize::from(self.batch_size),
            queues: usize::from(self.queues),
            spin_window: Duration::from_micros(u64::from(self.spin_window_us)),
            crypto_workers: usize::from(self.crypto_workers),
            flow_table_size: self.flow_table_size as usize,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.ifname.is_empty() || args.ifname.len() > 15 || args.ifname.contains('/') {
        bail!("invalid interface name {:?}", args.ifname);
    }
    if !args.foreground {
        return detach(&args);
    }
    let notify = std::env::var_os(NOTIFY_ENV).is_some();
    let result = foreground(args, notify);
    if notify && let Err(error) = &result {
        // The launcher relays this line as its own error; if it is gone, there is no one to tell.
        let _ = writeln!(std::io::stdout(), "{error:#}");
    }
    result
}

fn foreground(mut args: Args, notify: bool) -> anyhow::Result<()> {
    init_tracing(args.log_json);
    // Before any thread exists: every thread inherits the reduced sets.
    let kept = caps::restrict_to(caps::RUNTIME).context("dropping capabilities")?;
    tracing::debug!(
        permitted = format_args!("{:#x}", kept.permitted),
        "capabilities restricted"
    );
    if args.busy_poll {
        // Poll mode spins for ever already.
        args.io.spin_window_us = 0;
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?
            .block_on(async {
                tokio::spawn(busy_poll());
                run(args, notify).await
            });
    }
    // The spin window needs one thread polling every data-path descriptor (see
    // `device::spin`); several queues are for several cores, and get no window.
    if args.io.spin_window_us > 0 && args.io.queues == 1 {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?
            .block_on(run(args, notify));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(run(args, notify))
}

/// Keeps the (single-threaded) runtime from ever parking: a yielded task makes the scheduler
/// poll the I/O driver without a timeout before running it again, so readiness is picked up
/// within microseconds instead of after a thread wake-up (tens of µs on a virtual machine).
async fn busy_poll() {
    loop {
        tokio::task::yield_now().await;
    }
}

fn init_tracing(json: bool) {
    // A bare level in RUST_LOG is kubetun's own; libraries (tonic, h2, hyper, ...) log below
    // WARN only when named (`RUST_LOG=debug,h2=debug`), see `log_filter`.
    let (filter, problem) = kubetun_gateway::log_filter::from_env(
        "RUST_LOG",
        tracing_subscriber::filter::LevelFilter::INFO,
    );
    // Colour only on a terminal: a log file or a pod log gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    if let Some(problem) = problem {
        tracing::warn!("{problem}");
    }
}

/// Re-executes this binary with `-f` detached and waits until it reports that it serves.
/// The report comes over a pipe on the child's stdout rather than by probing the UAPI socket:
/// a socket of another live gateway with the same interface name would look like success.
fn detach(args: &Args) -> anyhow::Result<()> {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the executable")?;
    let mut child_args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    child_args.insert(0, "-f".into());
    let stderr = if std::env::var_os("RUST_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    };
    let (report, report_writer) = std::io::pipe().context("creating the startup pipe")?;
    let mut child = Command::new(exe)
        .args(child_args)
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(report_writer)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .context("starting the gateway process")?;
    // The read blocks, so it runs on its own thread and the wait has a deadline.
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(report).lines() {
            let Ok(line) = line else { break };
            let ready = line == READY_LINE;
            if lines_tx.send(Some(line)).is_err() || ready {
                return;
            }
        }
        let _ = lines_tx.send(None);
    });
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut reason = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(Some(line)) if line == READY_LINE => return Ok(()),
            Ok(Some(line)) => reason.push(line),
            Ok(None) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().context("waiting for the gateway process")?;
                if reason.is_empty() {
                    bail!("the gateway exited during startup ({status}); run with -f to see why");
                }
                bail!("{} ({status})", reason.join("; "));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let uapi = socket_path(&args.uapi_dir, &args.ifname);
                bail!("the gateway did not open {} in time", uapi.display());
            }
        }
    }
}

async fn run(args: Args, notify: bool) -> anyhow::Result<()> {
    let device =
        Device::create_with(&args.ifname, args.io.options()).context("creating the device")?;
    if args.standby {
        device.hold(std::time::Duration::ZERO);
    }
    let uapi_path = socket_path(&args.uapi_dir, &args.ifname);
    let grpc_path = args
        .grpc_socket
        .clone()
        .unwrap_or_else(|| kubetun_gateway::socket_paths::grpc_socket_path(&args.ifname));
    let (grpc_listener, grpc_file) = grpc::bind(&grpc_path)
        .await
        .with_context(|| format!("binding {}", grpc_path.display()))?;
    let uapi = UapiServer::bind(&uapi_path)
        .await
        .with_context(|| format!("binding {}", uapi_path.display()))?;
    tracing::info!(
        interface = %args.ifname,
        uapi = %uapi.path().display(),
        grpc = %grpc_path.display(),
        "gateway started"
    );

    if notify {
        let _ = writeln!(std::io::stdout(), "{READY_LINE}");
    }

    let policy = PeerPolicy::for_this_process().allowing(args.allow_uids.iter().copied());
    let mut uapi_task = tokio::spawn(uapi.serve(Arc::clone(&device), policy.clone()));
    let mut servers = vec![tokio::spawn({
        let device = Arc::clone(&device);
        async move {
            if let Err(error) = grpc::serve(grpc_listener, grpc_file, device, policy).await {
                tracing::error!(%error, "gRPC server failed");
            }
        }
    })];
    if let Some(addr) = args.metrics_addr {
        let device = Arc::clone(&device);
        servers.push(tokio::spawn(async move {
            if let Err(error) = metrics::serve(addr, device).await {
                tracing::error!(%error, "metrics server failed");
            }
        }));
    }

    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut failure = None;
    let mut uapi_done = false;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
        _ = interrupt.recv() => tracing::info!("SIGINT received"),
        reason = &mut uapi_task => {
            uapi_done = true;
            let reason = reason.unwrap_or_else(|error| format!("the UAPI server failed: {error}"));
            tracing::info!(%reason, "shutting down");
        }
        _ = device.stopped() => {
            let reason = format!(
                "the TUN device {} was deleted or failed; the gateway cannot carry traffic",
                args.ifname
            );
            tracing::error!(%reason, "shutting down");
            failure = Some(reason);
        }
    }
    if !uapi_done {
        uapi_task.abort();
        let _ = uapi_task.await;
    }
    for server in &servers {
        server.abort();
    }
    for server in servers {
        let _ = server.await;
    }
    device.shutdown().await;
    drop(device);
    tracing::info!("gateway stopped");
    match failure {
        Some(reason) => bail!(reason),
        None => Ok(()),
    }
}
