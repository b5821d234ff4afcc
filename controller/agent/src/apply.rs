//! Applying the agent's desired state to the kernel: [`converge`] on it, or [`cleanup`]
//! everything tagged as the agent's.

use crate::diff::{Change, diff, teardown};
use crate::netlink::{Kernel, NetlinkError};
use crate::plan::DesiredState;

/// Makes the kernel hold exactly `desired` of the agent's tagged state; returns what changed.
pub async fn converge(
    kernel: &Kernel,
    desired: &DesiredState,
) -> Result<Vec<Change>, NetlinkError> {
    let observed = kernel.observe().await?;
    let changes = diff(&observed, desired);
    kernel.apply(&changes).await?;
    Ok(changes)
}

/// Removes everything tagged as the agent's; returns what was removed.
pub async fn cleanup(kernel: &Kernel) -> Result<Vec<Change>, NetlinkError> {
    let observed = kernel.observe().await?;
    let changes = teardown(&observed);
    kernel.apply(&changes).await?;
    Ok(changes)
}
