//! Linking the lab on real nodes as a user does, and its checks, all from the client pod on the
//! node that does not run its cluster's gateway (so the route agents' routes carry the
//! traffic): ping and HTTP to both of the peer's `web` pods at this cluster's view of their
//! addresses (the server answers with the client address it sees, which must be its own
//! cluster's view of the client), over the direct links, the shortcut and the hub-only pair;
//! `web` by its `clusterset.local` name (the cluster DNS's stub zone to kubetun DNS, the
//! ClusterSetIP balanced by the real kube-proxy over Milan's and Paris's endpoints), then
//! unexported from Paris; and the Rome–Milan shortcut cut in the underlay and healed under a
//! ping train, with the traffic moving to the hub and back.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde_json::Value;

use super::cluster::{Cluster, NodeLabError};
use super::{kit, workloads};
use crate::checks::Check;
use crate::output::say;

const QUICK: Duration = Duration::from_secs(20);

fn kubetun(binaries: &Path, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(binaries.join("kubetun"))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn underlay(cluster: &Cluster) -> String {
    cluster.underlay_kubeconfig.to_string_lossy().into_owned()
}

fn hub(clusters: &[Cluster]) -> Option<&Cluster> {
    clusters.iter().find(|c| c.spec.hub)
}

fn by_id<'a>(clusters: &'a [Cluster], id: &str) -> Option<&'a Cluster> {
    clusters.iter().find(|c| c.spec.id == id)
}

/// The pairs the lab links besides the hub's direct links: (left, right, hub only).
const SHORTCUTS: [(&str, &str, bool); 2] = [("rome", "milan", false), ("rome", "paris", true)];

/// Links the clusters (the hub to each leaf, then the shortcuts; without a hub, the first
/// cluster to each other one), deploys the workloads and exports `web` from every leaf but
/// the first.
pub fn link(
    binaries: &Path,
    clusters: &[Cluster],
    out: &mut dyn Write,
    checks: &mut Vec<Check>,
) -> Result<(), NodeLabError> {
    let center = hub(clusters).unwrap_or(&clusters[0]);
    for leaf in clusters.iter().filter(|c| c.spec.id != center.spec.id) {
        let started = Instant::now();
        let outcome = kubetun(
            binaries,
            &[
                "network",
                "connect",
                "--kubeconfig",
                &underlay(center),
                "--remote-kubeconfig",
                &underlay(leaf),
                "--wait",
                "--timeout",
                "120s",
            ],
        )
        .map(|_| format!("connected in {:.1} s", started.elapsed().as_secs_f64()));
        checks.push(Check::new(
            "links",
            format!(
                "kubetun network connect {} <-> {}",
                center.spec.id, leaf.spec.id
            ),
            outcome,
        ));
    }
    if let Some(hub) = hub(clusters) {
        for (left, right, hub_only) in SHORTCUTS {
            let (Some(l), Some(r)) = (by_id(clusters, left), by_id(clusters, right)) else {
                continue;
            };
            let started = Instant::now();
            let mut args = vec![
                "shortcut".to_owned(),
                "create".into(),
                format!("{left}-{right}"),
                "--kubeconfig".into(),
                underlay(hub),
                "--left-name".into(),
                left.into(),
                "--left-kubeconfig".into(),
                underlay(l),
                "--right-name".into(),
                right.into(),
                "--right-kubeconfig".into(),
                underlay(r),
                "--wait".into(),
                "--timeout".into(),
                "120s".into(),
            ];
            args.push(if hub_only { "--hub-only" } else { "--transit" }.into());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let outcome = kubetun(binaries, &args)
                .map(|_| format!("connected in {:.1} s", started.elapsed().as_secs_f64()));
            checks.push(Check::new(
                "shortcuts",
                format!(
                    "kubetun shortcut create {left} <-> {right}{}",
                    if hub_only {
                        " --hub-only"
                    } else {
                        " --transit"
                    }
                ),
                outcome,
            ));
        }
    }
    for cluster in clusters {
        kit::apply(&cluster.kubeconfig, &workloads::web(cluster.spec.id))?;
        kit::apply(&cluster.kubeconfig, &workloads::clusterset_stub_zone())?;
        let gateway_node = gateway_node(cluster)?;
        let client_node = cluster
            .nodes()
            .into_iter()
            .find(|n| *n != gateway_node)
            .unwrap_or(gateway_node.clone());
        kit::apply(&cluster.kubeconfig, &workloads::client(&client_node))?;
        say(
            out,
            &format!(
                "  {}: gateway on {gateway_node}, client pod on {client_node}",
                cluster.spec.name
            ),
        );
    }
    for cluster in clusters {
        kit::kubectl(
            &cluster.kubeconfig,
            &[
                "wait",
                "--for=condition=Ready",
                "pod",
                "--all",
                "--timeout=90s",
            ],
            Duration::from_secs(100),
        )
        .map_err(|e| NodeLabError::step(format!("workloads of {}", cluster.spec.id), e))?;
    }
    for cluster in exporters(clusters) {
        kit::apply(&cluster.kubeconfig, &workloads::export())?;
    }
    Ok(())
}

/// The clusters that export `web`: every leaf but the first (Milan and Paris).
fn exporters(clusters: &[Cluster]) -> Vec<&Cluster> {
    clusters.iter().filter(|c| !c.spec.hub).skip(1).collect()
}

fn json(kubeconfig: &Path, args: &[&str]) -> Result<Value, String> {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", "json"]);
    let text = kit::kubectl(kubeconfig, &all, QUICK)?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// The node the cluster's gateway pod runs on.
fn gateway_node(cluster: &Cluster) -> Result<String, NodeLabError> {
    let pods = json(
        &cluster.kubeconfig,
        &[
            "get",
            "pods",
            "-n",
            "kubetun-system",
            "-l",
            "app.kubernetes.io/component=gateway",
        ],
    )
    .map_err(|e| NodeLabError::step("find the gateway pod", e))?;
    pods["items"][0]["spec"]["nodeName"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| NodeLabError::step("find the gateway pod", "no gateway pod"))
}

/// `cluster`'s view of `peer`'s pod CIDRs: (real, view).
fn views(cluster: &Cluster, peer: &str) -> Result<Vec<(Ipv4Net, Ipv4Net)>, String> {
    let te = json(
        &cluster.kubeconfig,
        &["get", "tunnelendpoints", "-n", "kubetun-system", peer],
    )?;
    Ok(te["spec"]["remotePodCidrs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some((
                m["real"].as_str()?.parse().ok()?,
                m["view"].as_str()?.parse().ok()?,
            ))
        })
        .collect())
}

fn view_of(address: Ipv4Addr, views: &[(Ipv4Net, Ipv4Net)]) -> Option<Ipv4Addr> {
    views
        .iter()
        .find(|(real, _)| real.contains(&address))
        .map(|(real, view)| {
            Ipv4Addr::from(
                u32::from(address) - u32::from(real.network()) + u32::from(view.network()),
            )
        })
}

/// The addresses of `cluster`'s `app=web` pods, and its client pod's.
fn pod_ips(cluster: &Cluster) -> Result<(Vec<Ipv4Addr>, Ipv4Addr), String> {
    let pods = json(
        &cluster.kubeconfig,
        &["get", "pods", "-n", workloads::NAMESPACE],
    )?;
    let mut web = Vec::new();
    let mut client = None;
    for pod in pods["items"].as_array().into_iter().flatten() {
        let Some(ip) = pod["status"]["podIP"].as_str().and_then(|a| a.parse().ok()) else {
            continue;
        };
        match pod["metadata"]["name"].as_str() {
            Some("client") => client = Some(ip),
            _ if pod["metadata"]["labels"]["app"] == "web" => web.push(ip),
            _ => {}
        }
    }
    web.sort();
    Ok((web, client.ok_or("no client pod")?))
}

fn exec(cluster: &Cluster, command: &str) -> Result<String, String> {
    kit::kubectl(
        &cluster.kubeconfig,
        &[
            "exec",
            "-n",
            workloads::NAMESPACE,
            "client",
            "--",
            "sh",
            "-c",
            command,
        ],
        QUICK,
    )
}

/// Ping and HTTP from `a`'s client to each of `b`'s web pods at `a`'s view of them; the
/// server must see the client at `b`'s view of it.
fn pair(phase: &str, a: &Cluster, b: &Cluster, checks: &mut Vec<Check>) {
    let prepared = (|| {
        let (web, _) = pod_ips(b)?;
        let (_, client) = pod_ips(a)?;
        Ok::<_, String>((web, client, views(a, b.spec.id)?, views(b, a.spec.id)?))
    })();
    let (web, client, a_views, b_views) = match prepared {
        Ok(p) => p,
        Err(e) => {
            checks.push(Check::new(
                phase,
                format!("{} -> {}", a.spec.id, b.spec.id),
                Err(e),
            ));
            return;
        }
    };
    let seen = view_of(client, &b_views);
    for target in web {
        let Some(address) = view_of(target, &a_views) else {
            checks.push(Check::new(
                phase,
                format!("{} -> {} pod {target}", a.spec.id, b.spec.id),
                Err(format!("{target} has no view in {}", a.spec.id)),
            ));
            continue;
        };
        let ping = exec(a, &format!("ping -c 3 -W 2 {address}")).and_then(|out| {
            out.lines()
                .find(|l| l.contains("packets received"))
                .filter(|l| !l.contains(" 0 packets received"))
                .map(|l| l.trim().to_owned())
                .ok_or(out)
        });
        checks.push(Check::new(
            phase,
            format!(
                "ping {} client -> {} web {target} at {address}",
                a.spec.id, b.spec.id
            ),
            ping,
        ));
        let expected = format!(
            "{} {target} sees {}",
            b.spec.id,
            seen.map_or("?".into(), |s| s.to_string())
        );
        let http =
            exec(a, &format!("wget -qO- http://{address}:8080/cgi-bin/who")).and_then(|body| {
                // busybox httpd names an IPv4 client as an IPv4-mapped IPv6 address.
                let body = body.trim().replace("[::ffff:", "").replace(']', "");
                if body == expected {
                    Ok(body)
                } else {
                    Err(format!("answered {body:?}, expected {expected:?}"))
                }
            });
        checks.push(Check::new(
            phase,
            format!(
                "HTTP {} client -> {} web {target} at {address} (the server sees the client at its own view)",
                a.spec.id, b.spec.id
            ),
            http,
        ));
    }
}

/// Which clusters answer `count` requests to `web` by its `clusterset.local` name from
/// `from`'s client.
fn by_name(from: &Cluster, count: usize) -> Result<Vec<String>, String> {
    let mut answers = Vec::new();
    for _ in 0..count {
        let body = exec(
            from,
            "wget -qO- http://web.default.svc.clusterset.local/cgi-bin/who",
        )?;
        answers.push(
            body.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    answers.sort();
    answers.dedup();
    Ok(answers)
}

/// Waits up to `within` until exactly the clusters `wanted` (sorted) answer 12 requests to
/// `web` by name from `from`'s client; how long that took.
fn answered_by(from: &Cluster, wanted: &[String], within: Duration) -> Result<Duration, String> {
    until(within, || {
        let answered = by_name(from, 12)?;
        (answered == wanted)
            .then_some(())
            .ok_or(format!("answered by {answered:?}, expected {wanted:?}"))
    })
}

/// Waits up to `within` until `check` passes; how long that took, or its last failure.
fn until(
    within: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        match check() {
            Ok(()) => return Ok(started.elapsed()),
            Err(e) if started.elapsed() > within => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// Every check after linking.
pub fn run_all(
    binaries: &Path,
    clusters: &[Cluster],
    out: &mut dyn Write,
    checks: &mut Vec<Check>,
) -> Result<(), NodeLabError> {
    let center = hub(clusters).unwrap_or(&clusters[0]);
    say(
        out,
        "checks (from each cluster's client pod, off the gateway's node):",
    );
    for leaf in clusters.iter().filter(|c| c.spec.id != center.spec.id) {
        pair("links", center, leaf, checks);
        pair("links", leaf, center, checks);
    }
    if hub(clusters).is_some() {
        for (left, right, hub_only) in SHORTCUTS {
            let (Some(l), Some(r)) = (by_id(clusters, left), by_id(clusters, right)) else {
                continue;
            };
            let phase = if hub_only { "hub transit" } else { "shortcuts" };
            pair(phase, l, r, checks);
            pair(phase, r, l, checks);
        }
    }
    let exporters = exporters(clusters);
    let Some(client) = clusters.iter().find(|c| !c.spec.hub) else {
        return Ok(());
    };
    let mut wanted: Vec<String> = exporters.iter().map(|c| c.spec.id.to_owned()).collect();
    wanted.sort();
    let started = Instant::now();
    let outcome = answered_by(client, &wanted, Duration::from_secs(30))
    .map(|took| {
        format!(
            "12 requests answered by {} ({:.1} s after the exports, {:.1} s until every exporter answered)",
            wanted.join(" and "),
            started.elapsed().as_secs_f64(),
            took.as_secs_f64()
        )
    });
    checks.push(Check::new(
        "services",
        format!(
            "{} client -> web.default.svc.clusterset.local (cluster DNS stub zone -> kubetun DNS, ClusterSetIP by kube-proxy)",
            client.spec.id
        ),
        outcome,
    ));
    fallback(binaries, clusters, checks);
    if let Some(last) = exporters.last().filter(|_| exporters.len() > 1) {
        let _ = kit::kubectl(
            &last.kubeconfig,
            &["delete", "serviceexport", "web", "-n", workloads::NAMESPACE],
            QUICK,
        );
        let remaining: Vec<String> = exporters[..exporters.len() - 1]
            .iter()
            .map(|c| c.spec.id.to_owned())
            .collect();
        let outcome = answered_by(client, &remaining, Duration::from_secs(20)).map(|took| {
            format!(
                "only {remaining:?} answer, {:.1} s after the unexport",
                took.as_secs_f64()
            )
        });
        checks.push(Check::new(
            "services",
            format!("web unexported in {}: its endpoints leave", last.spec.id),
            outcome,
        ));
    }
    Ok(())
}

/// UDP between two clusters' underlay addresses dropped in the shared underlay namespace
/// while this lives (a cut link between their gateway nodes); the rules go on drop.
struct Cut {
    rules: Vec<[String; 6]>,
}

impl Cut {
    /// Drops UDP between cluster slots `a` and `b`: from a router's uplink 172.28.S.0/24
    /// (where a cluster's outgoing traffic is masqueraded) to the other's nodes 172.30.S.0/24
    /// (its gateway's load balancer address) and to the other's uplink (where the replies to
    /// its masqueraded traffic go), both ways.
    fn new(a: u8, b: u8) -> Result<Self, String> {
        let mut cut = Self { rules: Vec::new() };
        for (from, to) in [(a, b), (b, a)] {
            for net in [30, 28] {
                let rule = [
                    format!("172.28.{from}.0/24"),
                    format!("172.{net}.{to}.0/24"),
                    "udp".into(),
                    "DROP".into(),
                    "kubetun-lab-cut".into(),
                    String::new(),
                ];
                underlay_iptables("-I", &rule)?;
                cut.rules.push(rule);
            }
        }
        Ok(cut)
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        for rule in &self.rules {
            let _ = underlay_iptables("-D", rule);
        }
    }
}

fn underlay_iptables(op: &str, rule: &[String; 6]) -> Result<(), String> {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", "nk-underlay", "iptables", op, "FORWARD"])
        .args(["-s", &rule[0], "-d", &rule[1], "-p", &rule[2]])
        .args(["-m", "comment", "--comment", &rule[4], "-j", &rule[3]])
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

/// The path the hub reports for `left` seeing `right` (`direct` or `hub`), from the PATH
/// column of `kubetun shortcut list` (`direct since …`, `via hub since …`).
fn path(binaries: &Path, hub: &Cluster, left: &str, right: &str) -> Option<&'static str> {
    let listed = kubetun(
        binaries,
        &["shortcut", "list", "--kubeconfig", &underlay(hub)],
    )
    .ok()?;
    listed.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 4 || words[0] != left || words[1] != right || words[2] != "pod" {
            return None;
        }
        if line.contains("via hub") {
            Some("hub")
        } else if line.contains("direct") {
            Some("direct")
        } else {
            None
        }
    })
}

/// The Rome–Milan shortcut cut between the gateway nodes and healed under a ping train
/// (every 200 ms) from Rome's client to a Milan pod: traffic moves to the hub and back.
fn fallback(binaries: &Path, clusters: &[Cluster], checks: &mut Vec<Check>) {
    let (Some(hub), Some(rome), Some(milan)) = (
        hub(clusters),
        by_id(clusters, "rome"),
        by_id(clusters, "milan"),
    ) else {
        return;
    };
    let outcome = (|| {
        let (web, _) = pod_ips(milan)?;
        let target = *web.last().ok_or("no Milan pod")?;
        let address = view_of(target, &views(rome, "milan")?).ok_or("no view of Milan")?;
        let slots = (
            kit::cluster_slot(&rome.dir.join("cp")).map_err(|e| e.to_string())?,
            kit::cluster_slot(&milan.dir.join("cp")).map_err(|e| e.to_string())?,
        );
        let kubectl = kubetun_testenv::Assets::find()
            .map_err(|e| e.to_string())?
            .kubectl()
            .map_err(|e| e.to_string())?
            .to_owned();
        // 100 pings, 20 s: the cut 3 s in, the heal once the hub carries it.
        let train = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&rome.kubeconfig)
            .args(["exec", "-n", workloads::NAMESPACE, "client", "--", "ping"])
            .args(["-i", "0.2", "-c", "100", "-W", "1", &address.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_secs(3));
        let cut = Cut::new(slots.0, slots.1)?;
        let to_hub = until(Duration::from_secs(10), || {
            (path(binaries, hub, "rome", "milan") == Some("hub"))
                .then_some(())
                .ok_or("the path did not move to the hub".into())
        });
        std::thread::sleep(Duration::from_secs(3));
        drop(cut);
        let back = until(Duration::from_secs(12), || {
            (path(binaries, hub, "rome", "milan") == Some("direct"))
                .then_some(())
                .ok_or("the path did not return to direct".into())
        });
        let output = train.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        let mut seqs: Vec<u32> = text
            .lines()
            .filter_map(|l| {
                l.split("seq=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        let longest = seqs.windows(2).map(|w| w[1] - w[0] - 1).max().unwrap_or(0);
        let (to_hub, back) = (to_hub?, back?);
        let lost = 100 - seqs.len().min(100);
        if seqs.len() < 90 {
            return Err(format!(
                "{lost} of 100 pings lost (longest gap {longest} pings) through cut and heal"
            ));
        }
        Ok(format!(
            "path to the hub {:.1} s after the cut, back to direct {:.1} s after the heal; {lost} of 100 pings (every 200 ms) lost, longest gap {:.1} s",
            to_hub.as_secs_f64(),
            back.as_secs_f64(),
            f64::from(longest) * 0.2
        ))
    })();
    checks.push(Check::new(
        "fallback",
        "rome <-> milan shortcut cut between the gateway nodes, then healed, under a ping train"
            .into(),
        outcome,
    ));
}
