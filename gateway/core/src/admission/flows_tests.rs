use std::sync::Arc;

use super::*;

fn at(secs: u64) -> Now {
    Now {
        unix_ms: 0,
        mono_us: secs * 1_000_000,
    }
}

fn key(protocol: u8, local_port: u16) -> FlowKey {
    FlowKey {
        v6: false,
        protocol,
        local: 0x0a00_0005,
        remote: 0x0a44_0007,
        local_port,
        remote_port: 80,
    }
}

#[test]
fn capacity_is_rounded_up_to_whole_buckets_and_zero_holds_nothing() {
    assert_eq!(FlowTable::new(65_536).capacity(), 65_536);
    assert_eq!(FlowTable::new(100).capacity(), 128);
    assert_eq!(FlowTable::new(1).capacity(), 16);
    let none = FlowTable::new(0);
    assert_eq!(none.capacity(), 0);
    assert!(!none.record(&key(17, 1), FlowState::Other, at(1)));
    assert!(!none.contains(&key(17, 1), at(1)));
    assert_eq!(none.full(), 1);
}

#[test]
fn each_protocol_expires_after_its_idle_timeout() {
    let table = FlowTable::new(1024);
    let t = Timeouts::default();
    let (udp, icmp, syn) = (key(17, 1000), key(1, 7), key(6, 2000));
    assert!(table.record(&udp, FlowState::Other, at(100)));
    assert!(table.record(&icmp, FlowState::Other, at(100)));
    assert!(table.record(&syn, FlowState::SynSent, at(100)));
    let end = |timeout: u32| 100 + u64::from(timeout);
    assert!(table.contains(&udp, at(end(t.udp) - 1)));
    assert!(!table.contains(&udp, at(end(t.udp))));
    assert!(table.contains(&icmp, at(end(t.icmp) - 1)));
    assert!(!table.contains(&icmp, at(end(t.icmp))));
    // An unanswered SYN is gone after the short timeout.
    assert!(table.contains(&syn, at(end(t.tcp_syn_sent) - 1)));
    assert!(!table.contains(&syn, at(end(t.tcp_syn_sent))));
    assert_eq!(table.in_use(at(100)), 3);
    assert_eq!(table.in_use(at(end(t.udp))), 0);
}

#[test]
fn an_established_tcp_flow_lives_two_hours_and_a_fin_shortens_it() {
    let table = FlowTable::new(1024);
    let flow = key(6, 3000);
    assert!(table.record(&flow, FlowState::SynSent, at(10)));
    // The SYN-ACK.
    assert!(table.touch(&flow, at(11), |_| FlowState::Established));
    assert!(table.contains(&flow, at(11 + 7199)));
    assert!(table.touch(&flow, at(5000), |s| s));
    assert_eq!(table.state(&flow, at(5000)), Some(FlowState::Established));
    assert!(table.touch(&flow, at(6000), |_| FlowState::Closing));
    assert!(table.contains(&flow, at(6009)));
    assert!(!table.contains(&flow, at(6010)));
    // Expired: a touch finds nothing and revives nothing.
    assert!(!table.touch(&flow, at(6010), |s| s));
    assert!(!table.contains(&flow, at(6010)));
}

#[test]
fn a_refresh_within_the_same_second_writes_nothing() {
    let expiry = AtomicU32::new(0);
    refresh(&expiry, 100 << 2 | 2);
    assert_eq!(expiry.load(Ordering::Relaxed), 100 << 2 | 2);
    refresh(&expiry, 100 << 2 | 2);
    // Backwards in the same state: not written.
    refresh(&expiry, 99 << 2 | 2);
    assert_eq!(expiry.load(Ordering::Relaxed), 100 << 2 | 2);
    // A state change is written even when it shortens the expiry.
    refresh(&expiry, 50 << 2 | 3);
    assert_eq!(expiry.load(Ordering::Relaxed), 50 << 2 | 3);
}

#[test]
fn a_full_table_refuses_new_flows_counts_them_and_reuses_expired_slots() {
    // Two buckets: every flow can go to either, so 16 slots in all.
    let table = FlowTable::new(16);
    assert_eq!(table.capacity(), 16);
    for port in 0..16 {
        assert!(
            table.record(&key(17, port), FlowState::Other, at(0)),
            "slot {port}"
        );
    }
    assert_eq!(table.in_use(at(0)), 16);
    assert!(!table.record(&key(17, 100), FlowState::Other, at(1)));
    assert_eq!(table.full(), 1);
    // A flow already held is refreshed, not refused.
    assert!(table.record(&key(17, 3), FlowState::Other, at(1)));
    // Once they expired, their slots take new flows in place.
    for port in 100..116 {
        assert!(
            table.record(&key(17, port), FlowState::Other, at(200)),
            "reuse {port}"
        );
    }
    assert_eq!(table.in_use(at(200)), 16);
    assert!(!table.contains(&key(17, 3), at(200)));
    assert_eq!(table.full(), 1);
}

#[test]
fn two_threads_inserting_and_looking_up_lose_no_flow() {
    let table = Arc::new(FlowTable::new(65_536));
    let threads: Vec<_> = (0..2u16)
        .map(|thread| {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                for port in 0..10_000u16 {
                    let mut flow = key(17, port);
                    flow.remote_port = thread;
                    assert!(table.record(&flow, FlowState::Other, at(1)));
                    // The other thread's flows so far, looked up while it inserts.
                    let mut other = flow;
                    other.remote_port = 1 - thread;
                    let _ = table.contains(&other, at(1));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("thread");
    }
    for thread in 0..2u16 {
        for port in 0..10_000u16 {
            let mut flow = key(17, port);
            flow.remote_port = thread;
            assert!(table.contains(&flow, at(2)), "flow {thread}/{port} lost");
        }
    }
    assert_eq!(table.in_use(at(2)), 20_000);
    assert_eq!(table.full(), 0);
}

#[test]
fn two_bucket_choices_take_flows_up_to_half_the_capacity_without_a_refusal() {
    let table = FlowTable::new(65_536);
    for flow in 0..32_768u32 {
        let mut key = key(17, flow as u16);
        key.remote_port = (flow >> 16) as u16 + 1;
        assert!(table.record(&key, FlowState::Other, at(1)), "flow {flow}");
    }
    assert_eq!(table.full(), 0);
    assert_eq!(table.in_use(at(1)), 32_768);
}
