//! `kubetun`: the kubetun command line. Thin: parses flags and dispatches to the
//! `kubetun_cli` modules, which do the work and print.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kubetun_cli as cli;

#[derive(Debug, Parser)]
#[command(
    name = "kubetun",
    version,
    about = "Multi-cluster networking with a userspace WireGuard gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One variant per subcommand group, each owning its flags in `cli::<group>`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Talk to a gateway's control socket directly: apply a state file, show its status.
    Gateway(cli::gateway::GatewayArgs),
    /// Link two clusters directly: connect, disconnect, reset, status.
    Network(cli::network::NetworkArgs),
    /// Manage leaf-to-leaf shortcuts from the hub: create, delete, list.
    Shortcut(cli::shortcut::ShortcutArgs),
    /// Check every hop of a link (resources, gateway, handshake, remap tables, MTU, route
    /// agent) and name the first broken one.
    Diagnose(cli::diagnose::DiagnoseArgs),
    /// Offer Services to the linked clusters (the MCS API): export, unexport, list.
    Service(cli::service::ServiceArgs),
    /// Install kubetun into a cluster (or upgrade it): detect its ranges, apply deploy/.
    Install(cli::install::InstallArgs),
    /// Remove everything kubetun installed and created from a cluster.
    Uninstall(cli::install::UninstallArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    kubetun_controller::plumbing::logging::init_cli();

    let result: anyhow::Result<()> = match Cli::parse().command {
        Command::Gateway(args) => cli::gateway::run(args).await.map_err(Into::into),
        Command::Network(args) => cli::network::run(args).await.map_err(Into::into),
        Command::Shortcut(args) => cli::shortcut::run(args).await.map_err(Into::into),
        Command::Diagnose(args) => cli::diagnose::run(args).await.map_err(Into::into),
        Command::Service(args) => cli::service::run(args).await.map_err(Into::into),
        Command::Install(args) => cli::install::run_install(args).await.map_err(Into::into),
        Command::Uninstall(args) => cli::install::run_uninstall(args).await.map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
