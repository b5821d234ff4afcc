//! Per-reason drop counters shared by all data-path tasks (relaxed atomics, no locks).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::remap;

/// Why the device itself (as opposed to the remap table) dropped a packet or datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceDrop {
    /// A datagram that is not a well-formed WireGuard message.
    InvalidDatagram,
    /// A response, cookie or data message for a receiver index we do not know.
    UnknownReceiver,
    /// A handshake initiation from a public key that is not a peer.
    UnknownInitiator,
    /// boringtun rejected the message (bad MAC, tag, counter, replay, no session, ...).
    Rejected,
    /// A handshake arrived while the rate limiter demanded a cookie.
    UnderLoad,
    /// A handshake message found the handshake queue full (a flood) and was not processed.
    HandshakeQueueFull,
    /// A packet for a peer whose endpoint is unknown.
    NoEndpoint,
    /// A packet arrived or was routed while the interface has no private key.
    NoPrivateKey,
    /// A TUN read that could not be split into packets (a malformed offload header).
    TunRead,
    /// Writing to the TUN device failed.
    TunWrite,
    /// Sending a datagram failed.
    UdpSend,
    /// A packet from the TUN device addressed to the connectivity probe prefix.
    ProbeAddress,
    /// A packet or datagram read while this replica is on standby (another one holds the
    /// gateway lease).
    Standby,
}

impl DeviceDrop {
    /// Every reason, in counter order.
    pub const ALL: [DeviceDrop; 13] = [
        DeviceDrop::InvalidDatagram,
        DeviceDrop::UnknownReceiver,
        DeviceDrop::UnknownInitiator,
        DeviceDrop::Rejected,
        DeviceDrop::UnderLoad,
        DeviceDrop::HandshakeQueueFull,
        DeviceDrop::NoEndpoint,
        DeviceDrop::NoPrivateKey,
        DeviceDrop::TunRead,
        DeviceDrop::TunWrite,
        DeviceDrop::UdpSend,
        DeviceDrop::ProbeAddress,
        DeviceDrop::Standby,
    ];

    /// The snake_case metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceDrop::InvalidDatagram => "invalid_datagram",
            DeviceDrop::UnknownReceiver => "unknown_receiver",
            DeviceDrop::UnknownInitiator => "unknown_initiator",
            DeviceDrop::Rejected => "rejected",
            DeviceDrop::UnderLoad => "under_load",
            DeviceDrop::HandshakeQueueFull => "handshake_queue_full",
            DeviceDrop::NoEndpoint => "no_endpoint",
            DeviceDrop::NoPrivateKey => "no_private_key",
            DeviceDrop::TunRead => "tun_read",
            DeviceDrop::TunWrite => "tun_write",
            DeviceDrop::UdpSend => "udp_send",
            DeviceDrop::ProbeAddress => "probe_address",
            DeviceDrop::Standby => "standby",
        }
    }
}

const REMAP_REASONS: usize = remap::DropReason::ALL.len();
const TOTAL: usize = REMAP_REASONS + DeviceDrop::ALL.len();

/// Counters for every drop reason, remap and device alike.
#[derive(Debug, Default)]
pub struct Drops {
    counters: [AtomicU64; TOTAL],
}

impl Drops {
    /// Counts one packet dropped by the remap table.
    pub fn remap(&self, reason: remap::DropReason) {
        self.remap_many(reason, 1);
    }

    /// Counts `count` packets dropped by the remap table for the same reason.
    pub fn remap_many(&self, reason: remap::DropReason, count: u64) {
        let index = remap::DropReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        if count > 0 {
            self.counters[index].fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Counts one packet dropped by the device.
    pub fn device(&self, reason: DeviceDrop) {
        self.device_many(reason, 1);
    }

    /// Counts `count` packets dropped by the device for the same reason.
    pub fn device_many(&self, reason: DeviceDrop, count: u64) {
        if count > 0 {
            self.counters[REMAP_REASONS + reason as usize].fetch_add(count, Ordering::Relaxed);
        }
    }

    /// `(reason, count)` for every reason, including zeros.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let names = remap::DropReason::ALL
            .iter()
            .map(|r| r.as_str())
            .chain(DeviceDrop::ALL.iter().map(|r| r.as_str()));
        names
            .zip(self.counters.iter())
            .map(|(name, counter)| (name, counter.load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason() {
        let drops = Drops::default();
        drops.remap(remap::DropReason::SourceNotAllowed);
        drops.remap(remap::DropReason::SourceNotAllowed);
        drops.device(DeviceDrop::UdpSend);
        let counts: std::collections::HashMap<_, _> = drops.snapshot().into_iter().collect();
        assert_eq!(counts["source_not_allowed"], 2);
        assert_eq!(counts["udp_send"], 1);
        assert_eq!(counts["no_route"], 0);
        assert_eq!(counts.len(), TOTAL);
    }
}
