//! Why admission refused a packet, and the per-cluster counters of those refusals.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a packet of (or towards) an exported cluster was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionDrop {
    /// A connection (TCP, UDP, SCTP) or an ICMP echo request to an address and port not
    /// exported to the cluster, that is not the reply of a flow this cluster opened either.
    NotExported,
    /// A connection or echo request to an exported endpoint whose policies do not select the
    /// source pod.
    NotSelected,
    /// An ICMP error quoting a packet of no admitted flow, an echo reply to no echo request
    /// of ours, or another ICMP message (redirect, timestamp, ...).
    UnrelatedIcmp,
    /// A protocol admission does not track (neither TCP, UDP, SCTP nor ICMP).
    OtherProtocol,
    /// A later fragment: it has no ports to judge (the first fragment carries them; the
    /// tunnel clamps TCP's MSS, so only large UDP datagrams fragment).
    Fragment,
    /// A transport header cut short.
    Malformed,
    /// Outbound: a new flow towards the cluster found the flow table full (as conntrack,
    /// the packet is dropped, since its replies could not be admitted).
    FlowTableFull,
}

impl AdmissionDrop {
    /// Every reason, in counter order.
    pub const ALL: [AdmissionDrop; 7] = [
        AdmissionDrop::NotExported,
        AdmissionDrop::NotSelected,
        AdmissionDrop::UnrelatedIcmp,
        AdmissionDrop::OtherProtocol,
        AdmissionDrop::Fragment,
        AdmissionDrop::Malformed,
        AdmissionDrop::FlowTableFull,
    ];

    /// The snake_case name in the status and the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            AdmissionDrop::NotExported => "not_exported",
            AdmissionDrop::NotSelected => "not_selected",
            AdmissionDrop::UnrelatedIcmp => "unrelated_icmp",
            AdmissionDrop::OtherProtocol => "other_protocol",
            AdmissionDrop::Fragment => "fragment",
            AdmissionDrop::Malformed => "malformed",
            AdmissionDrop::FlowTableFull => "flow_table_full",
        }
    }
}

/// One cluster's refusals by reason (relaxed atomics). Kept across applies while the
/// cluster has an admission.
#[derive(Debug, Default)]
pub struct ClusterDrops {
    counters: [AtomicU64; AdmissionDrop::ALL.len()],
}

impl ClusterDrops {
    /// Counts one packet refused for `reason`.
    #[inline]
    pub fn count(&self, reason: AdmissionDrop) {
        self.counters[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The count of `reason`.
    pub fn get(&self, reason: AdmissionDrop) -> u64 {
        self.counters[reason as usize].load(Ordering::Relaxed)
    }

    /// `(reason, count)` for every reason, zeros included.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        AdmissionDrop::ALL
            .iter()
            .map(|reason| (reason.as_str(), self.get(*reason)))
            .collect()
    }
}
