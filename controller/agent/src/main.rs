//! `kubetun-agent`: the per-node route agent (see `--help`), run by the DaemonSet of
//! `deploy/agent/`.

use anyhow::Context as _;
use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = kubetun_agent::AgentArgs::parse();
    kubetun_controller::plumbing::logging::init_daemon(false);
    kubetun_agent::run(args).await.context("route agent failed")
}
