//! `kubetun-lab up [TOPOLOGY] | status [--json] | move-gateway CLUSTER NODE | down`: clusters as
//! network namespaces with a real kubetun gateway each, configured by the controller's own IPAM
//! and planner over gRPC. Needs root and /dev/net/tun.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kubetun_integration::lab::{self, DEFAULT_STATE_DIR, LabOptions};
use kubetun_integration::topology::Topology;

#[derive(Debug, Parser)]
#[command(
    name = "kubetun-lab",
    version,
    about = "kubetun clusters as network namespaces"
)]
struct Args {
    /// Directory of the lab's state file, sockets and logs.
    #[arg(long, global = true, default_value = DEFAULT_STATE_DIR, env = "KUBETUN_LAB_STATE_DIR")]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build the topology (the seed Europe/Rome/Milan one by default), link it, check it and
    /// print every cluster's remap table. Exits non-zero if a check fails.
    Up {
        /// A topology YAML file (see examples/seed.yaml); default: the seed topology.
        topology: Option<PathBuf>,
        /// Prefix of every namespace and interface name; with its own --state-dir, a second
        /// lab can run next to the default one.
        #[arg(long, default_value = "")]
        prefix: String,
        /// The kubetun-gateway binary [default: next to this program, else on PATH].
        #[arg(long, env = "KUBETUN_GATEWAY")]
        gateway: Option<PathBuf>,
        /// Seconds of each iperf3 check (0 skips them).
        #[arg(long, default_value_t = 3)]
        iperf_seconds: u32,
        /// Give every cluster a real control plane: a kube-apiserver (with etcd) and a
        /// kubetun-controller, linked with the kubetun CLI; prints a kubeconfig per cluster.
        /// Finds etcd and kube-apiserver like envtest (KUBEBUILDER_ASSETS,
        /// /usr/local/kubebuilder/bin, PATH).
        #[arg(long)]
        apiserver: bool,
    },
    /// Show every cluster's peers, CIDRs and views, addresses and link state.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Move the gateway of a multi-node cluster to another node (same key and state; the
    /// underlay endpoint moves along), re-converge the route agents and check the cluster's
    /// links again. Exits non-zero if a check fails.
    MoveGateway {
        /// The cluster (e.g. Paris).
        cluster: String,
        /// The node to move to, numbered from 1 (node2 is 2).
        #[arg(value_parser = clap::value_parser!(u8).range(1..))]
        node: u8,
    },
    /// Remove the lab (also after a crash).
    Down,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("kubetun-lab: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout();
    match args.command {
        Command::Up {
            topology,
            prefix,
            gateway,
            iperf_seconds,
            apiserver,
        } => {
            let topology = match topology {
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    Topology::from_yaml(&text).with_context(|| format!("{}", path.display()))?
                }
                None => Topology::seed(),
            };
            let options = LabOptions {
                topology,
                prefix,
                state_dir: args.state_dir,
                gateway_binary: gateway.unwrap_or_else(lab::default_gateway_binary),
                iperf_seconds,
                apiserver,
            };
            let report = lab::up(&options, &mut stdout)?;
            Ok(if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Status { json } => {
            let status = lab::status(&args.state_dir)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", lab::render_status(&status));
            }
            let all_connected = status
                .clusters
                .iter()
                .all(|c| c.running && c.peers.iter().all(|p| p.state == "Connected"));
            Ok(if all_connected {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::MoveGateway { cluster, node } => {
            let checks = lab::move_gateway(
                &args.state_dir,
                &cluster,
                usize::from(node - 1),
                &mut stdout,
            )?;
            Ok(if checks.iter().all(|c| c.passed) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Down => {
            lab::down(&args.state_dir, &mut stdout)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
