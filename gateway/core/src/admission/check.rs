//! The two per-packet steps: [`Admissions::ingress`] judges a packet from a peer after the
//! remap rewrote its source to a view; [`Admissions::egress`] records the flow a packet
//! from the TUN device opens, before the remap rewrites its destination view.

use super::allowed::{Admissions, Endpoint, UNADMITTED, Verdict};
use super::flows::{FlowKey, FlowState, FlowTable};
use super::reasons::AdmissionDrop;
use super::tuple::{self, Kind, TcpFlags, Tuple};
use crate::clock::Now;
use crate::state::Isolation;

impl Admissions {
    /// Whether the packet (source a remote view, destination local) may reach the TUN
    /// device. A refused one is counted on its cluster and gets no answer.
    ///
    /// From a cluster without an admission, or an open one: yes. From an exported one:
    /// (a) a connection to one of its endpoints, from a source the endpoint's policies
    /// select if any names it; (b) an ICMP echo request to an endpoint's address, from a
    /// source one of its endpoints admits (so `ping` diagnoses an export; it reveals nothing
    /// a TCP connect would not); (c) the reply direction of a flow this cluster opened (the flow table);
    /// (d) an ICMP error quoting a packet we sent on an admitted flow, either a flow of the
    /// table or a reply from one of its endpoints (path MTU discovery depends on it);
    /// (e) transit: at a hub, a packet towards another remote cluster's view is the
    /// receiving leaf's to judge. Nothing else.
    #[inline]
    pub fn ingress(&self, flows: &FlowTable, packet: &[u8], now: Now) -> bool {
        if !self.exported {
            return true;
        }
        let Some(tuple) = tuple::parse(packet) else {
            return true; // the remap table accepted it: not reached
        };
        let Some(index) = self.cluster_of(tuple.v6, tuple.src) else {
            return true;
        };
        let Some(cluster) = self.clusters.get(index as usize) else {
            return true; // UNADMITTED
        };
        if cluster.isolation == Isolation::Open {
            return true;
        }
        if self.cluster_of(tuple.v6, tuple.dst).is_some() {
            return true; // transit
        }
        match self.judge(index, &tuple, flows, now) {
            Ok(()) => true,
            Err(reason) => {
                tracing::trace!(cluster = %cluster.name, reason = reason.as_str(), "admission drop");
                cluster.drops.count(reason);
                false
            }
        }
    }

    /// Rules (a) to (d) of [`Admissions::ingress`] for exported cluster `index`.
    #[inline]
    fn judge(
        &self,
        index: u32,
        t: &Tuple,
        flows: &FlowTable,
        now: Now,
    ) -> Result<(), AdmissionDrop> {
        match t.kind {
            Kind::Ports {
                protocol,
                src_port,
                dst_port,
                flags,
            } => {
                let verdict = self.admits(index, inbound(t, protocol, dst_port));
                if verdict == Verdict::Admitted {
                    return Ok(());
                }
                let key = reply_key(t, protocol, dst_port, src_port);
                let admitted = if tuple::is_tcp(protocol) {
                    flows.touch(&key, now, |state| inbound_tcp(state, flags))
                } else {
                    flows.touch(&key, now, |state| state)
                };
                if admitted {
                    return Ok(());
                }
                Err(self.refusal(index, verdict))
            }
            Kind::EchoRequest { .. } => match self.admits(index, inbound(t, 0, 0)) {
                Verdict::Admitted => Ok(()),
                verdict => Err(self.refusal(index, verdict)),
            },
            Kind::EchoReply { protocol, id } => flows
                .touch(&reply_key(t, protocol, id, 0), now, |state| state)
                .then_some(())
                .ok_or(AdmissionDrop::UnrelatedIcmp),
            Kind::IcmpError(Some(quoted)) => {
                let key = FlowKey {
                    v6: t.v6,
                    protocol: quoted.protocol,
                    local: quoted.src,
                    remote: quoted.dst,
                    local_port: quoted.src_port,
                    remote_port: quoted.dst_port,
                };
                // Or one of our endpoints' replies to a source it admits.
                let reply = Endpoint {
                    v6: t.v6,
                    address: quoted.src,
                    protocol: quoted.protocol,
                    port: quoted.src_port,
                    source: quoted.dst,
                };
                let ours = flows.contains(&key, now)
                    || (tuple::has_ports(quoted.protocol)
                        && self.admits(index, reply) == Verdict::Admitted);
                ours.then_some(()).ok_or(AdmissionDrop::UnrelatedIcmp)
            }
            Kind::IcmpError(None) | Kind::OtherIcmp => Err(AdmissionDrop::UnrelatedIcmp),
            Kind::Other => Err(AdmissionDrop::OtherProtocol),
            Kind::Fragment => Err(AdmissionDrop::Fragment),
            Kind::Malformed => Err(AdmissionDrop::Malformed),
        }
    }

    /// Records the flow the packet (source local, destination a remote view) opens when its
    /// cluster has an admission, open ones included (so a switch to exported keeps the
    /// flows already open). False when it must be dropped: a new flow towards an exported
    /// cluster with the table full (counted on the cluster); towards an open one the packet
    /// goes unrecorded (counted in the table's `full`).
    ///
    /// What opens a flow: a TCP SYN (without ACK); a UDP or SCTP datagram that is not a
    /// reply from an endpoint exported to the cluster (its source is that endpoint); an
    /// ICMP echo request. Other TCP segments refresh their flow (FIN or RST shorten it) and
    /// create none: a connection the peer opened is not ours.
    #[inline]
    pub fn egress(&self, flows: &FlowTable, packet: &[u8], now: Now) -> bool {
        if !self.any {
            return true;
        }
        let Some(t) = tuple::parse(packet) else {
            return true;
        };
        let Some(index) = self.cluster_of(t.v6, t.dst) else {
            return true;
        };
        if index == UNADMITTED || self.cluster_of(t.v6, t.src).is_some() {
            return true; // no admission, or transit
        }
        let Some(cluster) = self.clusters.get(index as usize) else {
            return true;
        };
        let exported = cluster.isolation == Isolation::Exported;
        let recorded = match t.kind {
            Kind::Ports {
                protocol,
                src_port,
                dst_port,
                flags,
            } => {
                let key = reply_key(&swap(&t), protocol, src_port, dst_port);
                if tuple::is_tcp(protocol) {
                    if !flags.opens() {
                        flows.touch(&key, now, |state| outbound_tcp(state, flags));
                        return true;
                    }
                    flows.record(&key, FlowState::SynSent, now)
                } else if exported
                    && self.admits(index, outbound_reply(&t, protocol, src_port))
                        == Verdict::Admitted
                {
                    return true; // a reply of the export
                } else {
                    flows.record(&key, FlowState::Other, now)
                }
            }
            Kind::EchoRequest { protocol, id } => flows.record(
                &reply_key(&swap(&t), protocol, id, 0),
                FlowState::Other,
                now,
            ),
            _ => return true,
        };
        if recorded || !exported {
            return true;
        }
        tracing::trace!(cluster = %cluster.name, "flow table full");
        cluster.drops.count(AdmissionDrop::FlowTableFull);
        false
    }
}

impl Admissions {
    /// The reason to refuse a packet that `verdict` did not admit (and no flow admitted),
    /// counted on the policy guarding the endpoint if that is why.
    #[inline]
    fn refusal(&self, index: u32, verdict: Verdict) -> AdmissionDrop {
        match verdict {
            Verdict::NotSelected(group) => {
                self.count_policy_drop(index, group);
                AdmissionDrop::NotSelected
            }
            _ => AdmissionDrop::NotExported,
        }
    }
}

/// The endpoint an inbound packet opens (its destination) and its source.
#[inline]
fn inbound(t: &Tuple, protocol: u8, port: u16) -> Endpoint {
    Endpoint {
        v6: t.v6,
        address: t.dst,
        protocol,
        port,
        source: t.src,
    }
}

/// The endpoint an outbound packet would be the reply of (its source) and the remote it
/// answers.
#[inline]
fn outbound_reply(t: &Tuple, protocol: u8, port: u16) -> Endpoint {
    Endpoint {
        v6: t.v6,
        address: t.src,
        protocol,
        port,
        source: t.dst,
    }
}

/// The flow key of a packet whose destination is local (a reply): local = destination.
#[inline]
fn reply_key(t: &Tuple, protocol: u8, local_port: u16, remote_port: u16) -> FlowKey {
    FlowKey {
        v6: t.v6,
        protocol,
        local: t.dst,
        remote: t.src,
        local_port,
        remote_port,
    }
}

/// The tuple with source and destination exchanged.
#[inline]
fn swap(t: &Tuple) -> Tuple {
    Tuple {
        src: t.dst,
        dst: t.src,
        ..*t
    }
}

/// A TCP flow's next state on a segment from the peer.
fn inbound_tcp(state: FlowState, flags: TcpFlags) -> FlowState {
    match state {
        _ if flags.ends() => FlowState::Closing,
        FlowState::SynSent | FlowState::Other => FlowState::Established,
        other => other,
    }
}

/// A TCP flow's next state on a segment of ours (not a SYN).
fn outbound_tcp(state: FlowState, flags: TcpFlags) -> FlowState {
    if flags.ends() {
        FlowState::Closing
    } else {
        state
    }
}
