//! `kubetun-lab up [TOPOLOGY] | status [--json] | move-gateway CLUSTER NODE | cut-link A B |
//! heal-link A B | ha | down`:
//! clusters as network namespaces with a real kubetun gateway each, configured by the
//! controller's own IPAM and planner over gRPC; `ha` runs replicated gateways on a real API
//! server and fails their nodes. Needs root and /dev/net/tun.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::time::Duration;

use kubetun_lab::ha::{self, HaLab};
use kubetun_lab::topology::Topology;
use kubetun_lab::{self as lab, DEFAULT_STATE_DIR, LabOptions, services};

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
        /// Give every cluster a real control plane: a kube-apiserver (with etcd), kubetun
        /// installed with `kubetun install` and a kubetun-controller, linked with the kubetun
        /// CLI; prints a kubeconfig per cluster.
        /// Finds etcd and kube-apiserver like envtest (KUBEBUILDER_ASSETS,
        /// /usr/local/kubebuilder/bin, PATH).
        #[arg(long)]
        apiserver: bool,
        /// kubetun as deployed: every cluster of the seed's shape gets a control plane and two
        /// real nodes (containerd, kubelet, kube-proxy from shared/tools' kube-test-node),
        /// kubetun installed with `kubetun install` from the image this build makes, real
        /// workloads, links made with the CLI, every check from a pod off the gateway's node.
        /// Takes no TOPOLOGY.
        #[arg(long, conflicts_with_all = ["apiserver", "topology"])]
        nodes: bool,
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
    /// Replicated gateways on a real API server: cluster A with two gateway replicas (a
    /// Lease elects the active one, the other is a standby with the same state) and a pod on
    /// a third node, cluster B as the remote. Fails the active replica's node again and again
    /// and prints how long the lease took to move and how long a 20 ms ping train from B to
    /// A's pod stopped. Exits non-zero if an outage exceeds 2 s. Removes everything at the
    /// end (with --hold, after Ctrl-C). Finds etcd and kube-apiserver like `up --apiserver`.
    Ha {
        /// How many failovers.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        failovers: u32,
        /// How the active replica's node fails.
        #[arg(long, value_enum, default_value_t = FailureArg::Kill)]
        failure: FailureArg,
        /// Prefix of every namespace name.
        #[arg(long, default_value = "kha")]
        prefix: String,
        /// Keep the lab up after the failovers until Ctrl-C (inspect it with the printed
        /// kubeconfig: `kubectl get lease,events -n kubetun-system`).
        #[arg(long)]
        hold: bool,
    },
    /// Cut the direct path between two clusters (a shortcut): with `transit` in the
    /// topology their traffic goes through the hub at the same addresses until
    /// `heal-link`.
    CutLink {
        /// One cluster (e.g. Rome).
        a: String,
        /// The other (e.g. Milan).
        b: String,
    },
    /// Heal a cut direct path; traffic returns to it after 3 s of answered probes.
    HealLink { a: String, b: String },
    /// Remove the lab (also after a crash).
    Down,
    /// (Started by `up` in a lab namespace.) The services demo's backend: HTTP on LISTEN,
    /// answering with LABEL and the client's address.
    #[command(hide = true)]
    HttpServe {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        label: String,
    },
    /// (Started by `up` without API servers.) `clusterset.local` DNS on LISTEN from the table
    /// file the lab rewrites.
    #[command(hide = true)]
    ServeDns {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        table: PathBuf,
    },
    /// (Started by `up --apiserver`.) The kube-proxy stand-in: programs the cluster's derived
    /// Services into each NETNS.
    #[command(hide = true)]
    KubeProxy {
        #[arg(long)]
        kubeconfig: PathBuf,
        #[arg(long, required = true)]
        netns: Vec<String>,
        #[arg(long)]
        service_cidr: ipnet::Ipv4Net,
    },
}

/// How `kubetun-lab ha` fails a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FailureArg {
    /// kill -9 of the node's gateway, controller and route agent (the node dies).
    Kill,
    /// kill -9 of the node's gateway and route agent; the controller lives on.
    KillGateway,
    /// SIGTERM to the node's controller, as in a rolling update: it hands the lease over.
    Stop,
    /// The node's links go down and its API server connection breaks; everything runs on.
    Cut,
    /// The node's controller is frozen (SIGSTOP) while its gateway runs on, connected.
    Freeze,
}

impl From<FailureArg> for ha::Failure {
    fn from(arg: FailureArg) -> Self {
        match arg {
            FailureArg::Kill => Self::Kill,
            FailureArg::KillGateway => Self::KillGateway,
            FailureArg::Stop => Self::Stop,
            FailureArg::Cut => Self::Cut,
            FailureArg::Freeze => Self::Freeze,
        }
    }
}

/// The HA goal: traffic resumes within this after the active node fails.
const HA_GOAL: Duration = Duration::from_secs(2);

fn run_ha(
    state_dir: &std::path::Path,
    failovers: u32,
    failure: ha::Failure,
    prefix: &str,
    hold: bool,
) -> anyhow::Result<ExitCode> {
    let assets = kubetun_testenv::Assets::find().context("the HA lab needs a real API server")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = state_dir.join("ha");
    runtime.block_on(async {
        println!("starting cluster A (API server, 3 nodes, 2 gateway replicas) and cluster B");
        let mut lab = HaLab::up(&assets, &dir, prefix).await?;
        println!(
            "up; A's kubeconfig: {}; logs in {}",
            lab.kubeconfig().display(),
            dir.display()
        );
        let mut missed = 0;
        for round in 1..=failovers {
            let report = lab.failover(failure).await?;
            let verdict = if report.outage <= HA_GOAL {
                "ok"
            } else {
                missed += 1;
                "OVER THE GOAL"
            };
            println!(
                "failover {round}: node-{} failed ({failure:?}), node-{} took over: lease moved after {} ms, traffic stopped for {} ms ({verdict})",
                report.failed + 1,
                report.took_over + 1,
                report.lease_moved.as_millis(),
                report.outage.as_millis(),
            );
        }
        if hold {
            println!("holding; Ctrl-C removes the lab");
            tokio::signal::ctrl_c().await?;
        }
        lab.down();
        println!(
            "{} of {failovers} failovers within {} s",
            failovers - missed,
            HA_GOAL.as_secs()
        );
        Ok(if missed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
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
            nodes,
        } => {
            if nodes {
                let options = kubetun_lab::nodes::NodeLabOptions {
                    state_dir: args.state_dir,
                    binaries: sibling_dir(),
                    clusters: kubetun_lab::nodes::SEED.to_vec(),
                };
                let report = kubetun_lab::nodes::up(&options, &mut stdout)?;
                for (what, took) in &report.timings {
                    println!("  {what}: {:.1} s", took.as_secs_f64());
                }
                return Ok(if report.passed() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
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
        Command::Ha {
            failovers,
            failure,
            prefix,
            hold,
        } => run_ha(&args.state_dir, failovers, failure.into(), &prefix, hold),
        Command::CutLink { a, b } => {
            lab::cut_or_heal(&args.state_dir, &a, &b, true, &mut stdout)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::HealLink { a, b } => {
            lab::cut_or_heal(&args.state_dir, &a, &b, false, &mut stdout)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Down => {
            kubetun_lab::nodes::down(&args.state_dir, &mut stdout)?;
            lab::down(&args.state_dir, &mut stdout)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::HttpServe { listen, label } => {
            services::standins::serve_http(listen, &label)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ServeDns { listen, table } => {
            services::standins::serve_dns(listen, &table)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::KubeProxy {
            kubeconfig,
            netns,
            service_cidr,
        } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let client = kubetun_testenv::client_for(&kubeconfig)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", kubeconfig.display()))?;
                services::proxy::follow(client, service_cidr, &netns).await?;
                anyhow::Ok(ExitCode::SUCCESS)
            })
        }
    }
}

/// The directory of this program: the other binaries of the same build are there.
fn sibling_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from))
        .unwrap_or_default()
}
