//! `kubetun-bench`: iperf3 throughput of kubetun-gateway, wireguard-go and boringtun-cli over
//! the same tunnel between two network namespaces, with plain veth as the ceiling. Prints a
//! markdown table, optionally writes JSON and the results file section. Needs root.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use kubetun_benches::harness;
use kubetun_benches::latency::PingSettings;
use kubetun_benches::model::{BenchConfig, Test};
use kubetun_benches::report;
use kubetun_fixtures::implementations::{Binaries, Implementation};

#[derive(Debug, Parser)]
#[command(
    name = "kubetun-bench",
    version,
    about = "iperf3 throughput harness (network namespaces)"
)]
struct Args {
    /// Implementations to compare (veth is the ceiling).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "veth,kubetun,kubetun-busy-poll,wireguard-go,boringtun-cli"
    )]
    implementations: Vec<String>,
    /// Tests to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tcp-1,tcp-4,udp,udp-paced"
    )]
    tests: Vec<String>,
    /// Measured seconds per run (iperf3 -t).
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Warm-up seconds left out of each run (iperf3 -O).
    #[arg(long, default_value_t = 1)]
    omit: u32,
    /// Runs per cell.
    #[arg(long, default_value_t = 5)]
    repetitions: u32,
    /// UDP offered rate in bits/s (0: as fast as the sender can).
    #[arg(long, default_value_t = 0)]
    udp_bitrate: u64,
    /// The paced UDP test's offered rate in bits/s.
    #[arg(long, default_value_t = 1_000_000_000)]
    udp_paced_bitrate: u64,
    /// Echo requests per idle round-trip run (0: no latency runs).
    #[arg(long, default_value_t = 100)]
    ping_count: u32,
    /// Milliseconds between echo requests.
    #[arg(long, default_value_t = 20)]
    ping_interval_ms: u64,
    /// Tunnel MTU.
    #[arg(long, default_value_t = 1420)]
    mtu: u32,
    /// Outside CPU load (share of one core) above which a run is disturbed.
    #[arg(long, default_value_t = 0.10)]
    max_outside_load: f64,
    /// Extra attempts for a disturbed run.
    #[arg(long, default_value_t = 2)]
    retries: u32,
    /// Seconds to wait for the machine to go quiet before each run.
    #[arg(long, default_value_t = 30)]
    quiet_wait: u64,
    /// Stop starting runs after this many seconds and report what was measured (0: no limit).
    #[arg(long, default_value_t = 0)]
    time_budget: u64,
    /// Prefix of namespace and interface names.
    #[arg(long, default_value = "kb")]
    prefix: String,
    /// Directory for logs, sockets and installed tools [default: target/kubetun-bench].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// kubetun-gateway executable [default: next to this program, else PATH].
    #[arg(long)]
    kubetun_gateway: Option<PathBuf>,
    /// A second kubetun-gateway build measured as `kubetun-baseline` (e.g. the previous
    /// release, to compare two builds in one run).
    #[arg(long)]
    kubetun_baseline: Option<PathBuf>,
    /// wireguard-go executable [default: PATH].
    #[arg(long)]
    wireguard_go: Option<PathBuf>,
    /// boringtun-cli executable [default: tools/bin of the work dir, else PATH].
    #[arg(long)]
    boringtun_cli: Option<PathBuf>,
    /// Install boringtun-cli with `cargo install --locked` into the work dir's tools/ if missing.
    #[arg(long)]
    install_boringtun: bool,
    /// Write every run and the summary as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Replace the throughput section of this results file (e.g. benches/RESULTS.md).
    #[arg(long)]
    write_results: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kubetun-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    if !kubetun_testenv::netns::is_root() {
        bail!("the harness creates network namespaces and TUN devices: run it as root");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        bail!("/dev/net/tun is missing: load the tun module or give the container the device");
    }
    for tool in ["ip", "wg", "iperf3", "ping", "timeout"] {
        if !kubetun_testenv::netns::command_exists(tool) {
            bail!(
                "`{tool}` is not installed (iproute2, wireguard-tools, iperf3, iputils-ping, coreutils)"
            );
        }
    }
    let implementations = args
        .implementations
        .iter()
        .map(|name| {
            Implementation::from_name(name)
                .with_context(|| format!("unknown implementation {name:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tests = args
        .tests
        .iter()
        .map(|name| Test::from_name(name).with_context(|| format!("unknown test {name:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let work_dir = args
        .work_dir
        .unwrap_or_else(kubetun_fixtures::implementations::default_work_dir);
    let mut stdout = std::io::stdout();
    let (binaries, left_out) = kubetun_fixtures::implementations::locate_binaries(
        &implementations,
        Binaries {
            kubetun: args.kubetun_gateway,
            wireguard_go: args.wireguard_go,
            boringtun_cli: args.boringtun_cli,
            kubetun_baseline: args.kubetun_baseline,
        },
        &kubetun_fixtures::implementations::tools_dir(&work_dir),
        args.install_boringtun.then_some(Duration::from_secs(1200)),
        &mut stdout,
    );
    let config = BenchConfig {
        prefix: args.prefix,
        work_dir,
        implementations: implementations
            .into_iter()
            .filter(|i| !left_out.iter().any(|(l, _)| l == i))
            .collect(),
        tests,
        seconds: args.seconds,
        omit: args.omit,
        repetitions: args.repetitions,
        udp_bitrate: args.udp_bitrate,
        udp_paced_bitrate: args.udp_paced_bitrate,
        ping: PingSettings {
            count: args.ping_count,
            interval: Duration::from_millis(args.ping_interval_ms),
        },
        mtu: args.mtu,
        max_foreign_share: args.max_outside_load,
        retries: args.retries,
        quiet_wait: Duration::from_secs(args.quiet_wait),
        time_budget: (args.time_budget > 0).then(|| Duration::from_secs(args.time_budget)),
        binaries,
        left_out,
    };
    let stop =
        kubetun_benches::interrupt::stop_on_signal().context("installing signal handlers")?;
    let results = harness::run(&config, &stop, &mut stdout)?;
    let markdown = report::render_markdown(&results);
    println!("\n{markdown}");
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = args.write_results {
        report::update_results_file(&path, &markdown)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
