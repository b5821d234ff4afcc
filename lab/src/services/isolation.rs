//! What the isolation checks of the services demo observe: an HTTP fetch by address from any
//! lab namespace, whether an address answers at all, and the refusals an exporter's gateway
//! counted for one cluster.

use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kubetun_controller::gateway_api::StatusResponse;
use kubetun_testenv::netns;

/// `timeout`'s exit status when the command ran out of time.
const TIMED_OUT: i32 = 124;

/// `curl http://<addr>:<port>/` from namespace `ns`: the body, or why there is none.
pub(super) fn fetch_address(ns: &str, addr: Ipv4Addr, port: u16) -> Result<String, String> {
    let output = netns::command_in(ns, "curl")
        .args([
            "-sS",
            "--noproxy",
            "*",
            // A lab's round trip is a millisecond: a short timeout keeps the polls that
            // time a change fine-grained.
            "--connect-timeout",
            "0.3",
            "--max-time",
            "2",
        ])
        .arg(format!("http://{addr}:{port}/"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

/// Polls [`fetch_address`] until its outcome is `answered` or `limit` passes (the last
/// outcome). The time is when the first fetch with that outcome began: a refused fetch ends
/// only at its timeout, which says nothing about when the refusal began.
pub(super) fn fetch_until(
    ns: &str,
    addr: Ipv4Addr,
    port: u16,
    answered: bool,
    limit: Duration,
) -> Result<Duration, Result<String, String>> {
    let started = Instant::now();
    loop {
        let began = started.elapsed();
        let fetched = fetch_address(ns, addr, port);
        if fetched.is_ok() == answered {
            return Ok(began);
        }
        if started.elapsed() > limit {
            return Err(fetched);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Packets from cluster `cluster` that the gateway reporting `status` refused, every reason.
pub(super) fn refusals(status: &StatusResponse, cluster: &str) -> u64 {
    status
        .admissions
        .iter()
        .filter(|a| a.cluster == cluster)
        .flat_map(|a| a.drops.values())
        .sum()
}

/// Whether anything comes back from `addr` to `ns`: an echo reply, or an answer to a TCP
/// connection to `port` (accepted, or refused by the host: a refusal is an answer too; only
/// silence is not). One try each, bounded.
pub(super) fn answers(ns: &str, addr: Ipv4Addr, port: u16) -> bool {
    let pinged = netns::ping_from(ns, &addr.to_string(), 1);
    let connected = netns::command_in(ns, "timeout")
        .args(["1", "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/{addr}/{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.code() != Some(TIMED_OUT));
    pinged || connected
}
