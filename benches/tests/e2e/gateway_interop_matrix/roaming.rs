//! The roaming case of the interop matrix: the peer's underlay address changes and kubetun's
//! endpoint follows.

use super::*;

/// The peer's underlay address changes (a new address added, the old one removed) and the
/// peer sends from the new one: kubetun's endpoint follows and traffic goes on both ways.
pub(super) fn roaming_case(peer: Implementation, family: Family) {
    let test = format!("{}::{}_roaming", peer.name(), family.name());
    let Some(binaries) = require(&test, peer) else {
        return;
    };
    let id = format!("{}{}rm", peer.tag(), &family.name()[1..]);
    // boringtun-cli's default connected socket keeps the source address of its first
    // handshake for good (it cannot roam at all); unconnected it sends from the new address.
    let peer_args: &[&str] = if peer == Implementation::BoringtunCli {
        &["--disable-connected-udp"]
    } else {
        &[]
    };
    let mut bed = Bed::new(&binaries, &id, peer, family, peer_args);
    let [_, old, _, new] = family.addresses();
    let case = format!("{} roaming {old}→{new}", bed.label);
    let mut failures = Failures::default();
    let configured = bed.configure(Who::Kubetun, None);
    let reply = first_reply(&bed.peer.ns, KUBETUN_TUNNEL, configured, FIRST_REPLY_LIMIT);
    failures.check(reply.is_some(), || {
        "no tunnel before the address changed".into()
    });

    bed.peer.add_underlay(new, family);
    let old_cidr = format!("{old}/{}", family.prefix_len());
    bed.peer
        .ip(&["address", "del", &old_cidr, "dev", UNDERLAY_IF]);
    bed.peer.underlay = new.to_owned();
    if peer == Implementation::WireguardGo && family == Family::V4 {
        // wireguard-go sends from the address its peer's packets arrived at; when that
        // address is gone an IPv4 send fails with ENETUNREACH, which (unlike EINVAL) it does
        // not retry from another source. Setting the endpoint again forgets the source.
        let endpoint = family.endpoint(&bed.kubetun.underlay, KUBETUN_PORT);
        bed.peer.wg(&[
            "set",
            &bed.peer.ifname,
            "peer",
            bed.kubetun.key.public_base64(),
            "endpoint",
            &endpoint,
        ]);
    }
    let moved = SystemTime::now();
    let resumed = first_reply(&bed.peer.ns, KUBETUN_TUNNEL, moved, ROAM_LIMIT);
    let endpoint = bed.kubetun.peer_endpoint();
    report(&format!(
        "{case} first_reply={} resumed={} kubetun_endpoint={endpoint}",
        show(reply, FIRST_REPLY_LIMIT),
        show(resumed, ROAM_LIMIT)
    ));
    failures.check(resumed.is_some(), || {
        format!("no reply within {ROAM_LIMIT:?} from the new address")
    });
    failures.check(
        bed.kubetun
            .ns
            .wait_ping(PEER_TUNNEL, Duration::from_secs(3)),
        || "kubetun's traffic to the peer did not continue".into(),
    );
    bed.check_wg_show(&mut failures);
    failures.finish(&case, &bed);
}
