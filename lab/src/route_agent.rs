//! The route agent run in-process inside a node's network namespace: one pass (plan, then
//! converge) as the `kubetun-agent` DaemonSet makes on each watch event, and the agent's
//! tagged state read back. The lab's multi-node clusters use it after every apply and move;
//! so do the multi-node fixtures of the tests.

use std::net::IpAddr;

use kubetun_agent::converge;
use kubetun_agent::diff::{Change, ObservedState};
use kubetun_agent::netlink::{Kernel, NetlinkError};
use kubetun_agent::plan::{AgentSettings, Attachment, Node, PlanInput, RoutePlanError, plan};
use kubetun_crds::TunnelEndpointSpec;
use kubetun_testenv::netns::{self, NetnsError};

/// Why the route agent could not run in a node's namespace (or a multi-node fixture could
/// not be built).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A namespace command failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Entering a namespace or starting a runtime failed.
    #[error("entering a namespace: {0}")]
    Enter(#[from] std::io::Error),
    /// The agent's kernel access failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The agent could not plan.
    #[error(transparent)]
    Plan(#[from] RoutePlanError),
}

/// One agent pass (plan, then converge) in the namespace named `ns`, the host network of node
/// `local`, with the gateway on the node at `gateway_ip`; the applied changes.
pub fn converge_node(
    ns: &str,
    local: &Node,
    nodes: &[Node],
    gateway_ip: IpAddr,
    attachment: Attachment,
    endpoints: &[TunnelEndpointSpec],
) -> Result<Vec<Change>, AgentError> {
    in_namespace(ns, async move |kernel: Kernel| {
        let underlay_mtu = kernel.underlay(local.ip).await?.mtu;
        let desired = plan(&PlanInput {
            settings: kernel.settings(),
            attachment,
            local,
            underlay_mtu,
            gateway_ip,
            gateway_pod_ip: None,
            nodes,
            endpoints,
        })?;
        Ok(converge(&kernel, &desired).await?)
    })
}

/// The agent's tagged state in the namespace named `ns`.
pub fn observe_node(ns: &str) -> Result<ObservedState, AgentError> {
    in_namespace(ns, async |kernel: Kernel| Ok(kernel.observe().await?))
}

/// Runs `work` with an agent kernel handle inside the namespace named `ns`.
pub fn in_namespace<T: Send>(
    ns: &str,
    work: impl AsyncFnOnce(Kernel) -> Result<T, AgentError> + Send,
) -> Result<T, AgentError> {
    netns::run_in_named(ns, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let kernel = Kernel::connect(AgentSettings::default())?;
            work(kernel).await
        })
    })?
}
