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

/// Makes the addresses on `ifname` go from `current` to `desired`, updating `current` step by
/// step so that a retry after a failure resumes where this one stopped.
pub async fn sync_addresses(
    ifname: &str,
    current: &mut Vec<IpNet>,
    desired: &[IpNet],
) -> io::Result<()> {
    let stale: Vec<IpNet> = current
        .iter()
        .filter(|a| !desired.contains(a))
        .copied()
        .collect();
    for address in stale {
        ip(&["address", "del", &address.to_string(), "dev", ifname]).await?;
        current.retain(|a| *a != address);
    }
    for address in desired
        .iter()
        .filter(|a| !current.contains(a))
        .copied()
        .collect::<Vec<_>>()
    {
        ip(&["address", "replace", &address.to_string(), "dev", ifname]).await?;
        current.push(address);
    }
    // The order is the desired one, so that an equal set compares equal.
    desired.clone_into(current);
    Ok(())
}

/// Makes the routes via `ifname` go from `current` to `desired`: one `ip -batch` for all
/// changes (a process per route cost about 10 ms each, seconds for a thousand peers). After a
/// failure `current` holds the routes the device really has, so a retry redoes only what failed.
pub async fn sync_routes(
    ifname: &str,
    current: &mut Vec<IpNet>,
    desired: Vec<IpNet>,
) -> io::Result<()> {
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
    if !commands.is_empty()
        && let Err(error) = ip_batch(&commands).await
    {
        *current = installed_routes(ifname).await.unwrap_or_default();
        return Err(error);
    }
    *current = desired;
    Ok(())
}

/// The routes via `ifname` in the main table that the kernel did not add by itself.
async fn installed_routes(ifname: &str) -> io::Result<Vec<IpNet>> {
    let mut routes = Vec::new();
    for family in ["-4", "-6"] {
        let output = Command::new("ip")
            .args([family, "route", "show", "dev", ifname])
            .output()
            .await?;
        routes.extend(parse_routes(&String::from_utf8_lossy(&output.stdout)));
    }
    Ok(routes)
}

/// The prefixes of `ip route show dev X` lines, skipping the kernel's own (`proto kernel`)
/// and route types without a plain prefix (`multicast ...`, `unreachable ...`).
fn parse_routes(text: &str) -> Vec<IpNet> {
    text.lines()
        .filter(|line| !line.contains("proto kernel"))
        .filter_map(|line| {
            let first = line.split_whitespace().next()?;
            first
                .parse::<IpNet>()
                .ok()
                .or_else(|| first.parse::<std::net::IpAddr>().ok().map(IpNet::from))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::parse_routes;

    #[test]
    fn route_listings_keep_ours_and_skip_the_kernels() {
        let text = "10.70.0.0/16 scope link \n\
                    10.77.0.0/24 proto kernel scope link src 10.77.0.1 \n\
                    192.0.2.9 scope link \n\
                    fd00:70::/64 metric 1024 pref medium\n\
                    fe80::/64 proto kernel metric 256 pref medium\n\
                    multicast ff00::/8 table local proto kernel metric 256 pref medium\n";
        let routes: Vec<String> = parse_routes(text).iter().map(ToString::to_string).collect();
        assert_eq!(routes, ["10.70.0.0/16", "192.0.2.9/32", "fd00:70::/64"]);
    }
}
