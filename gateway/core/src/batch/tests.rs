use std::net::{Ipv4Addr, SocketAddr};

use super::*;

const WG_DATAGRAM: usize = 1452;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// A datagram whose bytes encode its sequence number.
fn datagram(sequence: u32, len: usize) -> Vec<u8> {
    let mut bytes = vec![(sequence % 251) as u8; len];
    bytes[..4].copy_from_slice(&sequence.to_le_bytes());
    bytes
}

fn message_shapes(batch: &SendBatch) -> Vec<(SocketAddr, usize, usize, usize)> {
    batch
        .messages
        .iter()
        .map(|m| (m.dest.remote, m.segment, m.count, m.len))
        .collect()
}

#[test]
fn equal_sizes_to_one_endpoint_share_a_message_and_a_short_tail_closes_it() {
    let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
    for sequence in 0..10 {
        assert!(batch.push(addr(1), &datagram(sequence, 1000)));
    }
    assert!(batch.push(addr(1), &datagram(10, 500)));
    assert!(batch.push(addr(1), &datagram(11, 1000)));
    assert!(batch.push(addr(2), &datagram(12, 1000)));
    assert!(batch.push(addr(2), &datagram(13, 1200)));
    assert_eq!(
        message_shapes(&batch),
        [
            (addr(1), 1000, 11, 10_500),
            (addr(1), 1000, 1, 1000),
            (addr(2), 1000, 1, 1000),
            (addr(2), 1200, 1, 1200),
        ]
    );
    assert_eq!(batch.len(), 14);
}

#[test]
fn a_message_stops_at_the_segment_and_payload_limits() {
    let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
    for sequence in 0..46 {
        assert!(batch.push(addr(1), &datagram(sequence, WG_DATAGRAM)));
    }
    // 45 × 1452 = 65 340 bytes fit below 65 507; the 46th does not.
    assert_eq!(
        message_shapes(&batch),
        [
            (addr(1), WG_DATAGRAM, 45, 45 * WG_DATAGRAM),
            (addr(1), WG_DATAGRAM, 1, WG_DATAGRAM)
        ]
    );
    let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
    for sequence in 0..70 {
        assert!(batch.push(addr(1), &datagram(sequence, 100)));
    }
    assert_eq!(
        message_shapes(&batch),
        [
            (addr(1), 100, MAX_GSO_SEGMENTS, 6400),
            (addr(1), 100, 6, 600)
        ]
    );
}

#[test]
fn the_batch_refuses_datagrams_beyond_its_capacity() {
    let mut batch = SendBatch::new(3, 4000);
    assert!(batch.push(addr(1), &[0; 1500]));
    assert!(batch.push(addr(1), &[0; 1500]));
    assert!(!batch.push(addr(1), &[0; 1500]), "out of bytes");
    assert!(batch.push(addr(1), &[0; 1000]));
    assert!(!batch.push(addr(1), &[0; 1]), "out of datagram slots");
    batch.clear();
    assert!(batch.is_empty());
    assert!(batch.push(addr(1), &[0; 1500]));
}

#[test]
fn splitting_keeps_every_datagram_in_order() {
    let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
    let lens = [1000, 1000, 1000, 400, 1000, 1000, 700, 700];
    let dests = [1, 1, 1, 1, 1, 2, 2, 2];
    for (sequence, (len, dest)) in lens.iter().zip(dests).enumerate() {
        assert!(batch.push(addr(dest), &datagram(sequence as u32, *len)));
    }
    assert_eq!(batch.messages(), 4);
    batch.split_from(1);
    let shapes = message_shapes(&batch);
    assert_eq!(shapes.len(), 1 + 1 + 1 + 2);
    assert_eq!(shapes[0], (addr(1), 1000, 4, 3400));
    assert_eq!(
        shapes[1..],
        [
            (addr(1), 1000, 1, 1000),
            (addr(2), 1000, 1, 1000),
            (addr(2), 700, 1, 700),
            (addr(2), 700, 1, 700),
        ]
    );
    let starts: Vec<usize> = batch.messages.iter().map(|m| m.start).collect();
    assert_eq!(starts, [0, 3400, 4400, 5400, 6100]);
}
