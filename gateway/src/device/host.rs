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
    for prefix in current.iter().filter(|p| !desired.contains(p)) {
        ip(&["route", "del", &prefix.to_string(), "dev", ifname]).await?;
    }
    for prefix in desired.iter().filter(|p| !current.contains(p)) {
        ip(&["route", "replace", &prefix.to_string(), "dev", ifname]).await?;
    }
    Ok(())
}
