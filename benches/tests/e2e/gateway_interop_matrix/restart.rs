//! The restart case of the interop matrix, and the count of the handshake initiations kubetun
//! sends (an nftables counter on its namespace's output), which the matrix's
//! kubetun-configured-first, kubetun-sends-first cells use too.
//!
//! kubetun and the peer are connected, the peer sends a steady ping train to kubetun's tunnel
//! address, kubetun's gateway is killed with SIGKILL (by PID) and started and configured
//! again at once exactly as before (same key, peer, addresses). The peer still sends on the
//! session of the killed process; the restarted gateway answers that with one handshake
//! initiation, so the train's outage stays about as long as the restart itself. From ping's
//! `-D` receive times: the gap (the last reply before the kill to the first reply from the
//! restarted gateway) and the time from the restart's start to that first reply.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Instant;

use kubetun_integration::netns::exec_in;

use super::*;

/// The longest the ping train's outage may last.
const GAP_BUDGET: Duration = Duration::from_secs(1);
/// The window after the restart in which kubetun may send at most one initiation.
const INITIATION_WINDOW: Duration = Duration::from_secs(4);
/// The interval of the ping train.
const TRAIN_INTERVAL: &str = "0.02";
/// How long the train runs at least before the kill (it may wait for [`TIMED`] longer).
const TRAIN_LEAD: Duration = Duration::from_millis(500);
/// How long the train runs after the restart's start; then it is stopped with SIGINT.
const TRAIN_TAIL: Duration = Duration::from_millis(4500);
/// The train's own bound (ping's `-w`, seconds), should it not be stopped.
const TRAIN_BOUND: &str = "30";

/// Counts the handshake initiations that leave an end's namespace from its listen port: an
/// nftables rule on the output hook matching a 148-byte UDP payload of message type 1.
/// Unlike the daemon's log it sees every initiation, whatever sent it (an apply, traffic
/// without a session, a retry timer, a data message on a lost session).
pub(super) struct Initiations {
    /// The namespace's name (the end itself is restarted meanwhile).
    ns: String,
}

impl Initiations {
    pub(super) fn install(end: &End) -> Self {
        let port = end.port.to_string();
        for command in [
            &["nft", "add", "table", "inet", "imx"][..],
            &[
                "nft",
                "add",
                "chain",
                "inet",
                "imx",
                "out",
                "{ type filter hook output priority 0 ; }",
            ],
            &[
                "nft", "add", "rule", "inet", "imx", "out", "udp", "sport", &port, "udp", "length",
                "156", "@th,64,8", "1", "counter",
            ],
        ] {
            end.ns
                .exec(command)
                .unwrap_or_else(|e| panic!("{}: {e}", end.ns.name()));
        }
        Self {
            ns: end.ns.name().to_owned(),
        }
    }

    /// The initiations counted so far.
    pub(super) fn count(&self) -> u64 {
        let listing = exec_in(&self.ns, &["nft", "list", "chain", "inet", "imx", "out"])
            .unwrap_or_else(|e| panic!("{}: {e}", self.ns));
        listing
            .split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter in `nft list chain`:\n{listing}"))
    }
}

/// How many lines of `end`'s daemon output contain `what`.
pub(super) fn log_lines(end: &End, what: &str) -> usize {
    std::fs::read_to_string(&end.out)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
}

fn sleep_until(t: SystemTime) {
    if let Ok(left) = t.duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
}

fn ms(secs: f64) -> String {
    format!("{:.1}ms", secs * 1e3)
}

/// kubetun's gateway killed and restarted under the peer's ping train.
pub(super) fn restart_case(peer: Implementation, family: Family) {
    let test = format!("{}::{}_restart", peer.name(), family.name());
    let Some(binaries) = require(&test, peer) else {
        return;
    };
    let id = format!("{}{}rs", peer.tag(), &family.name()[1..]);
    let mut bed = Bed::new(&binaries, &id, peer, family, &[]);
    let case = format!("{} restart", bed.label);
    let dir = bed.dir.path().to_owned();
    let mut failures = Failures::default();
    let configured = bed.configure(Who::Kubetun, None);
    let up = first_reply(&bed.peer.ns, KUBETUN_TUNNEL, configured, FIRST_REPLY_LIMIT);
    if up.is_none() {
        failures.fail("no tunnel before the restart".into());
        failures.finish(&case, &bed);
        return;
    }

    let train_out = dir.join("train.out");
    let mut train = NsChild::spawn(
        bed.peer
            .ns
            .command("ping")
            .args([
                "-D",
                "-n",
                "-i",
                TRAIN_INTERVAL,
                "-w",
                TRAIN_BOUND,
                KUBETUN_TUNNEL,
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&train_out).expect("train output"))
            .stderr(Stdio::null()),
    )
    .expect("start the ping train");
    let initiations = Initiations::install(&bed.kubetun);
    std::thread::sleep(TRAIN_LEAD);

    let timed = TIMED.lock().unwrap_or_else(PoisonError::into_inner);
    let before = initiations.count();
    let mut old = bed.kubetun.process.take().expect("kubetun runs");
    let killed_at = SystemTime::now();
    let status = old.kill_hard().expect("SIGKILL the gateway");
    drop(old);
    // The restarted gateway's output goes to a fresh file: keep the first run's.
    let first_out = dir.join(format!("{}.first.out", bed.kubetun.ifname));
    let _ = std::fs::rename(&bed.kubetun.out, &first_out);
    let restarted = SystemTime::now();
    start(&mut bed.kubetun, &binaries, &dir, &[]);
    // No reply can come from the new process before it serves its UAPI socket (it has no
    // key yet), and one of the killed process's in flight cannot come after it: the
    // boundary between the two.
    let serving = SystemTime::now();
    bed.kubetun
        .configure(&bed.peer, &bed.expected_endpoint(Who::Kubetun));
    let reconfigured = SystemTime::now();
    sleep_until(restarted + GAP_BUDGET);
    drop(timed);
    // Both sides' endpoints, and a handshake since the restart (it is at most a second old
    // now if the gap was within its budget; the check allows HANDSHAKE_SLACK).
    bed.check_wg_show(&mut failures);
    sleep_until(restarted + INITIATION_WINDOW);
    let initiated = initiations.count() - before;
    sleep_until(restarted + TRAIN_TAIL);
    // SIGINT by PID: ping stops and writes out what it buffered.
    let _ = std::process::Command::new("kill")
        .args(["-INT", &train.pid().to_string()])
        .status();
    let stopped = Instant::now() + Duration::from_secs(2);
    while train.is_running() && Instant::now() < stopped {
        std::thread::sleep(Duration::from_millis(20));
    }
    let train_stopped = !train.is_running();
    drop(train);

    let output = std::fs::read_to_string(&train_out).unwrap_or_default();
    let stamps: Vec<f64> = output
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let boundary = unix(serving);
    let last_before = stamps
        .iter()
        .copied()
        .filter(|&s| s < boundary)
        .reduce(f64::max);
    let first_after = stamps.iter().copied().find(|&s| s >= boundary);
    let gap = last_before.zip(first_after).map(|(b, a)| a - b);
    let after_restart = first_after.map(|a| a - unix(restarted));
    let reactive = log_lines(
        &bed.kubetun,
        "the peer sends on a session we do not have; initiating a handshake",
    );
    let on_apply = log_lines(&bed.kubetun, "handshakes initiated");
    let none = || "none".to_owned();
    report(&format!(
        "{case} gap={} first_reply_after_restart={} last_reply_before_kill={} \
         serving={} configured={} initiations_in_{}s={initiated} log_reactive={reactive} \
         log_on_apply={on_apply} replies={}",
        gap.map_or_else(none, ms),
        after_restart.map_or_else(none, ms),
        last_before.map_or_else(none, |b| format!("-{}", ms(unix(killed_at) - b))),
        ms(unix(serving) - unix(restarted)),
        ms(unix(reconfigured) - unix(restarted)),
        INITIATION_WINDOW.as_secs(),
        stamps.len(),
    ));

    failures.check(status.signal() == Some(libc::SIGKILL), || {
        format!("the gateway was not running when killed: {status}")
    });
    failures.check(train_stopped, || {
        "the ping train did not stop on SIGINT".into()
    });
    failures.check(last_before.is_some(), || {
        "no reply of the ping train before the kill".into()
    });
    failures.check(first_after.is_some(), || {
        format!("no reply from the restarted gateway within {TRAIN_TAIL:?} of the restart")
    });
    failures.check(gap.is_some_and(|g| g <= GAP_BUDGET.as_secs_f64()), || {
        format!(
            "the ping train's gap across the restart is {}, budget {GAP_BUDGET:?}",
            gap.map_or_else(none, ms)
        )
    });
    failures.check(initiated <= 1, || {
        format!(
            "kubetun sent {initiated} handshake initiations in the {INITIATION_WINDOW:?} after \
             the restart, at most one expected"
        )
    });
    failures.check(
        bed.kubetun
            .ns
            .wait_ping(PEER_TUNNEL, Duration::from_secs(3)),
        || "no reply to kubetun's ping after the restart".into(),
    );
    if !failures.0.is_empty() {
        let first_run = std::fs::read_to_string(&first_out).unwrap_or_default();
        let tail: Vec<&str> = first_run.lines().rev().take(10).collect();
        // The train around the kill.
        let from = unix(killed_at) - 0.1;
        let train: Vec<&str> = output
            .lines()
            .filter(|l| {
                l.strip_prefix('[')
                    .and_then(|l| l.split(']').next()?.parse::<f64>().ok())
                    .is_some_and(|s| s >= from)
            })
            .take(20)
            .collect();
        failures.fail(format!(
            "(context) killed at {:.6}, restarted {:.6}, serving {:.6}, configured {:.6}\n\
             --- the killed gateway's log:\n{}\n--- the ping train from 0.1 s before the kill:\n{}",
            unix(killed_at),
            unix(restarted),
            unix(serving),
            unix(reconfigured),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            train.join("\n"),
        ));
    }
    failures.finish(&case, &bed);
}
