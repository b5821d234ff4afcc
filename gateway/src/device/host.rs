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

/// Makes the routes via `ifname` go from `current` to `desired`: one `ip -batch` for all
/// changes (a process per route cost about 10 ms each, seconds for a thousand peers).
pub async fn sync_routes(ifname: &str, current: &[IpNet], desired: &[IpNet]) -> io::Result<()> {
    // Sets, not `contains` on the slices: the lists can hold 100 000 prefixes.
    let current_set: std::collections::HashSet<&IpNet> = current.iter().collect();
    let desired_set: std::collections::HashSet<&IpNet> = desired.iter().collect();
    let mut commands = String::new();
    for prefix in current.iter().filter(|p| !desired_set.contains(p)) {
        commands.push_str(&format!("route del {prefix} dev {ifname}\n"));
    }
    for prefix in desired.iter().filter(|p| !current_set.contains(p)) {
        commands.push_str(&format!("route replace {prefix} dev {ifname}\n"));
    }
    if commands.is_empty() {
        return Ok(());
    }
    ip_batch(&commands).await
}

/// Runs `ip -force -batch -` on `commands` (one per line): every command runs (a route already
/// gone does not keep the others from being added), and any error fails the whole.
async fn ip_batch(commands: &str) -> io::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(commands.as_bytes()).await?;
    }
    let output = child.wait_with_output().await?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip -batch: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
