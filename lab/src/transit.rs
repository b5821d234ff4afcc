//! A shortcut's fallback through its hub, in the lab: cutting and healing the direct path
//! between two leaves (blackhole routes between their underlay addresses, both ways, so each
//! keeps reaching the hub), and the checks that traffic moves to the hub and back at the
//! same addresses.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use kubetun_controller::plumbing::gateway_client::GatewayClient;

use crate::checks::{self, Check};
use crate::error::LabError;
use crate::output::say;
use crate::state::{ClusterState, LabState};
use kubetun_testenv::netns;

/// How long both ends may take to notice a cut (5 probes at the 200 ms fallback interval,
/// plus slack).
const SWITCH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the return may take (3 s of answered probes, plus slack).
const RETURN_TIMEOUT: Duration = Duration::from_secs(15);

/// Cuts (`cut`) or heals the direct path between `a` and `b`.
pub fn set_link(a: &ClusterState, b: &ClusterState, cut: bool) -> Result<(), LabError> {
    for (from, to) in [(a, b), (b, a)] {
        let target = format!("{}/32", to.underlay_address);
        let verb = if cut { "replace" } else { "del" };
        let result = netns::exec_in(
            &from.namespace,
            &["ip", "route", verb, "blackhole", &target],
        );
        if cut {
            result?;
        }
    }
    Ok(())
}

/// `kubetun-lab cut-link A B` / `heal-link A B`.
pub fn cut_or_heal(
    state_dir: &Path,
    a: &str,
    b: &str,
    cut: bool,
    out: &mut dyn Write,
) -> Result<(), LabError> {
    let state = LabState::load(state_dir)?.ok_or_else(|| LabError::NotUp(state_dir.to_owned()))?;
    let find = |name: &str| {
        state
            .clusters
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| LabError::Usage(format!("the lab has no cluster {name:?}")))
    };
    let (ca, cb) = (find(a)?, find(b)?);
    if !ca.tunnel_endpoints.iter().any(|te| te.cluster.id == cb.id) {
        return Err(LabError::Usage(format!(
            "{} and {} are not linked directly",
            ca.name, cb.name
        )));
    }
    set_link(ca, cb, cut)?;
    let fallback = ca
        .tunnel_endpoints
        .iter()
        .find(|te| te.cluster.id == cb.id)
        .and_then(|te| te.fallback.as_ref())
        .map(|f| f.hub.name.clone());
    let line = match (cut, fallback) {
        (true, Some(hub)) => format!(
            "cut {} <-> {}: once both ends miss 5 probes (about 1 s) their traffic goes through {hub} at the same addresses; `kubetun-lab status` shows the path",
            ca.name, cb.name
        ),
        (true, None) => format!(
            "cut {} <-> {}: the link has no fallback, its traffic stops",
            ca.name, cb.name
        ),
        (false, _) => format!(
            "healed {} <-> {}: traffic returns to the direct path after 3 s of answered probes",
            ca.name, cb.name
        ),
    };
    say(out, &line);
    Ok(())
}

/// Whether `cluster`'s gateway sends `peer`'s views through their fallback.
fn failed_over(
    runtime: &tokio::runtime::Runtime,
    client: &GatewayClient,
    peer: &ClusterState,
) -> Option<bool> {
    let status = runtime.block_on(client.status()).ok()?;
    status
        .peers
        .iter()
        .find(|p| p.public_key == peer.public_key)
        .map(|p| p.failed_over)
}

/// Polls until both ends report `want` for each other; the time it took, or what is missing.
fn wait_both(
    runtime: &tokio::runtime::Runtime,
    ends: [(&ClusterState, &GatewayClient); 2],
    want: bool,
    timeout: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let pending: Vec<String> = [(0, 1), (1, 0)]
            .iter()
            .filter(|(i, j)| failed_over(runtime, ends[*i].1, ends[*j].0) != Some(want))
            .map(|(i, j)| format!("{} -> {}", ends[*i].0.name, ends[*j].0.name))
            .collect();
        if pending.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            return Err(format!("not within {timeout:?}: {}", pending.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Cuts the shortcut between `a` and `b`, checks that both move to the hub and that every
/// address still answers, heals it and checks the return.
pub(super) fn fallback_checks(
    runtime: &tokio::runtime::Runtime,
    a: (&ClusterState, &GatewayClient),
    b: (&ClusterState, &GatewayClient),
    hub: &ClusterState,
) -> Vec<Check> {
    let link = format!("{} <-> {}", a.0.name, b.0.name);
    let mut out = Vec::new();
    if let Err(error) = set_link(a.0, b.0, true) {
        out.push(Check::new(
            "fallback",
            format!("cut {link}"),
            Err(error.to_string()),
        ));
        return out;
    }
    let switched = wait_both(runtime, [a, b], true, SWITCH_TIMEOUT).map(|took| {
        format!(
            "both ends switched to {} {:.2} s after the cut",
            hub.name,
            took.as_secs_f64()
        )
    });
    out.push(Check::new(
        "fallback",
        format!("{link} cut: traffic moves to {}", hub.name),
        switched,
    ));
    out.extend(checks::ping_both_ways("fallback", a.0, b.0));
    let healed = set_link(a.0, b.0, false)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            wait_both(runtime, [a, b], false, RETURN_TIMEOUT).map(|took| {
                format!(
                    "back on the shortcut {:.2} s after the heal (3 s hold)",
                    took.as_secs_f64()
                )
            })
        });
    out.push(Check::new(
        "fallback",
        format!("{link} healed: traffic returns to the shortcut"),
        healed,
    ));
    out.extend(checks::ping_both_ways("healed", a.0, b.0));
    out
}
