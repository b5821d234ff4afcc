//! Host-side configuration of the TUN interface: its addresses and the routes of the view
//! prefixes. Uses the `ip` tool from iproute2.

use std::io;

use ipnet::IpNet;
use tokio::process::Command;

/// Runs `ip <args>` and fails with its stderr if it exits non-zero.
async fn ip(args: &[&str]) -> io::Result<()> {
    let output = Command::new("ip").args(args).output().await?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Makes the addresses on `ifname` go from `current` to `desired`.
pub async fn sync_addresses(ifname: &str, current: &[IpNet], desired: &[IpNet]) -> io::Result<()> {
    for address in current.iter().filter(|a| !desired.contains(a)) {
        ip(&["address", "del", &address.to_string(), "dev", ifname]).await?;
    }
    for address in desired.iter().filter(|a| !current.contains(a)) {
        ip(&["address", "replace", &address.to_string(), "dev", ifname]).await?;
    }
    Ok(())
}

/// Makes the routes via `ifname` go from `current` to `desired`.
pub async fn sync_routes(ifname: &str, current: &[IpNet], desired: &[IpNet]) -> io::Result<()> {
    // Sets, not `contains` on the slices: the lists can hold 100 000 prefixes.
    let current_set: std::collections::HashSet<&IpNet> = current.iter().collect();
    let desired_set: std::collections::HashSet<&IpNet> = desired.iter().collect();
    for prefix in current.iter().filter(|p| !desired_set.contains(p)) {
        ip(&["route", "del", &prefix.to_string(), "dev", ifname]).await?;
    }
    for prefix in desired.iter().filter(|p| !current_set.contains(p)) {
        ip(&["route", "replace", &prefix.to_string(), "dev", ifname]).await?;
    }
    Ok(())
}
