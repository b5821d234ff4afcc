//! boringtun's timers on the time the tests pass in: handshake retries, rekey and session
//! expiry, which take 5 s to 3 min of real time.

use super::tests::{Gateway, at, connected, payloads, settle, side_a, side_b, udp};

/// Moves the clock by `seconds`.
fn advance(now_ms: &mut u64, seconds: u64) {
    *now_ms += seconds * 1000;
}

fn is_initiation(datagram: &[u8]) -> bool {
    datagram.len() == 148 && datagram[0] == 1
}

#[test]
fn an_unanswered_initiation_is_retried_after_the_rekey_timeout() {
    let mut now = 1_000_000;
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let first = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"x")], at(now));
    assert!(is_initiation(&first[0].1));
    advance(&mut now, 1);
    assert!(
        a.tick(at(now)).is_empty(),
        "no retry before REKEY_TIMEOUT (5 s)"
    );
    advance(&mut now, 5);
    let retry = a.tick(at(now));
    assert_eq!(retry.len(), 1);
    assert!(is_initiation(&retry[0].1));
}

#[test]
fn the_initiator_rekeys_after_two_minutes_of_sending() {
    let mut now = 1_000_000;
    let (mut a, mut b, _) = connected(0, at(now));
    advance(&mut now, 121);
    assert!(
        a.tick(at(now)).is_empty(),
        "nothing sent since the session began"
    );
    // Sending on a session older than REKEY_AFTER_TIME: the packet still goes out on it,
    // and the next tick starts a new handshake.
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"old key")], at(now));
    assert_eq!(
        b.receive(a.address, &payloads(&sent), at(now))
            .packets
            .len(),
        1
    );
    let rekey = a.tick(at(now));
    assert_eq!(rekey.len(), 1);
    assert!(is_initiation(&rekey[0].1));
    let (_, at_b) = settle(&mut a, &mut b, rekey, at(now));
    assert!(at_b.is_empty());
    assert_eq!(
        a.peer()
            .stats
            .handshakes
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(
        b.peer()
            .stats
            .handshakes
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    // Data flows on the new session, both ways.
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"new key")], at(now));
    assert_eq!(
        b.receive(a.address, &payloads(&sent), at(now))
            .packets
            .len(),
        1
    );
    let sent = b.send(vec![udp("10.20.0.7", "10.110.0.5", b"back")], at(now));
    assert_eq!(
        a.receive(b.address, &payloads(&sent), at(now))
            .packets
            .len(),
        1
    );
}

#[test]
fn a_session_expires_after_three_minutes() {
    let mut now = 1_000_000;
    let (mut a, mut b, _) = connected(0, at(now));
    let late = b.send(vec![udp("10.20.0.7", "10.110.0.5", b"late")], at(now));
    advance(&mut now, 181);
    assert!(a.tick(at(now)).is_empty());
    // REJECT_AFTER_TIME: the session's keys are gone, what was sent on it is refused ...
    let received = a.receive(b.address, &payloads(&late), at(now));
    assert!(received.packets.is_empty());
    assert_eq!(a.drop_count("rejected"), 1);
    // ... and new traffic waits for a new handshake.
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"again")], at(now));
    assert_eq!(sent.len(), 1);
    assert!(is_initiation(&sent[0].1));
    let (_, at_b) = settle(&mut a, &mut b, sent, at(now));
    assert_eq!(at_b.len(), 1, "delivered once the new session is up");
}
