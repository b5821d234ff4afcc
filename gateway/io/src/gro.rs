//! GRO for TUN writes: the same-flow TCP and UDP packets of a batch are merged, in place,
//! into the first packet of their flow (the *head*), which then goes to the kernel as one
//! super-packet behind a virtio-net header that tells it how to segment it again (TSO/USO on
//! a TUN opened with `IFF_VNET_HDR`).
//!
//! Why not tun-rs's `send_multiple`: its GRO copies every TCP and UDP packet it looks at into
//! a fresh `Vec` before evaluating it, one `malloc`/`free` and a full copy per packet written
//! to the TUN device (the allocations seen in profiles of the gateway under load). This does
//! the same coalescing without allocating: the flow table is sized once for a batch.
//!
//! The rules are wireguard-go's: a packet joins its flow's head when it is the next one in
//! order (TCP: the next sequence number, same ACK number, only ACK/PSH flags, identical
//! options), its IP header matches the head's in the fields segmentation copies (IPv4 TOS,
//! TTL, DF; IPv6 traffic class, hop limit), it is no longer than the head's payload (a shorter
//! one or a PSH ends the flow), and both packets' transport checksums are valid — the kernel
//! computes the segments' checksums afresh, which must not turn a corrupted packet into a
//! valid one. Everything else is written as it is, behind an empty virtio header.

use super::buffer::PacketBuf;
use kubetun_remap::checksum::{fold, sum_words};
use tun_rs::ExpandBuffer;

/// Length of the virtio-net header in front of every packet written to an offload TUN.
pub const VIRTIO_HEADER_LEN: usize = tun_rs::VIRTIO_NET_HDR_LEN;
/// Most packets merged into one super-packet (the kernel's limit for UDP segmentation).
pub const MAX_SEGMENTS: u16 = 64;
/// Largest IP packet, and so largest super-packet.
const MAX_IP_LEN: usize = 65_535;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;
/// virtio-net header values (`include/uapi/linux/virtio_net.h`).
const VIRTIO_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_GSO_TCPV4: u8 = 1;
const VIRTIO_GSO_TCPV6: u8 = 4;
const VIRTIO_GSO_UDP_L4: u8 = 5;

/// What identifies a flow: addresses, ports, protocol and, for TCP, the ACK number (packets
/// with different ACKs carry different information and cannot merge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowKey {
    addresses: [u8; 32],
    ports: [u8; 4],
    ack: u32,
    proto: u8,
    v6: bool,
}

/// A packet that may be merged, as parsed.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    key: FlowKey,
    /// IP header length.
    ip_len: usize,
    /// TCP or UDP header length.
    l4_len: usize,
    payload: usize,
    seq: u32,
    psh: bool,
}

/// A flow of the current batch.
#[derive(Debug, Clone, Copy)]
struct Flow {
    key: FlowKey,
    /// Index of the head buffer.
    head: usize,
    ip_len: usize,
    l4_len: usize,
    /// Payload bytes of every merged packet but the last (the GSO segment size).
    segment: usize,
    /// Packets merged into the head, the head included.
    count: u16,
    next_seq: u32,
    /// Whether more packets may join.
    open: bool,
    /// Whether the head's checksum has been verified (once, when a first packet joins).
    head_checked: bool,
}

/// Merges the packets of a batch; keeps its tables between batches.
#[derive(Debug)]
pub struct Coalescer {
    flows: Vec<Flow>,
    writes: Vec<usize>,
}

impl Coalescer {
    /// Tables for batches of up to `batch` packets (they grow, once, if a batch is larger).
    pub fn new(batch: usize) -> Self {
        Self {
            flows: Vec::with_capacity(batch),
            writes: Vec::with_capacity(batch),
        }
    }

    /// Merges what can be merged among `bufs`, whose packets start at `offset` (at least
    /// [`VIRTIO_HEADER_LEN`]), and writes every written packet's virtio header just before
    /// it. UDP packets are merged only with `udp` (the device has USO). Afterwards
    /// [`Coalescer::writes`] lists the buffers to write, in order, each from
    /// `offset - VIRTIO_HEADER_LEN`; the others were merged into one of them.
    pub fn coalesce(&mut self, bufs: &mut [PacketBuf], offset: usize, udp: bool) {
        assert!(offset >= VIRTIO_HEADER_LEN, "no room for the virtio header");
        self.flows.clear();
        self.writes.clear();
        for index in 0..bufs.len() {
            let header = offset - VIRTIO_HEADER_LEN;
            bufs[index].as_mut()[header..offset].fill(0);
            let Some(packet) = bufs[index].as_ref().get(offset..) else {
                self.writes.push(index);
                continue;
            };
            let Some(candidate) = parse(packet, udp) else {
                self.writes.push(index);
                continue;
            };
            match self.try_join(bufs, offset, index, &candidate) {
                Join::Merged => continue,
                Join::Alone => {
                    self.writes.push(index);
                    continue;
                }
                Join::NewFlow => {}
            }
            // The head of a new flow (later packets with its key join this one; a head
            // with a bad checksum is found out when the first one tries).
            self.writes.push(index);
            self.flows.push(Flow {
                key: candidate.key,
                head: index,
                ip_len: candidate.ip_len,
                l4_len: candidate.l4_len,
                segment: candidate.payload,
                count: 1,
                next_seq: candidate.seq.wrapping_add(candidate.payload as u32),
                open: !candidate.psh,
                head_checked: false,
            });
        }
        for flow in &self.flows {
            if flow.count > 1 {
                finish_super_packet(bufs[flow.head].as_mut(), offset, flow);
            }
        }
    }

    /// The buffers to write after [`Coalescer::coalesce`], in order.
    pub fn writes(&self) -> &[usize] {
        &self.writes
    }

    /// Merges packet `index` into the latest flow with its key if it may join.
    fn try_join(
        &mut self,
        bufs: &mut [PacketBuf],
        offset: usize,
        index: usize,
        candidate: &Candidate,
    ) -> Join {
        let Some(flow) = self.flows.iter_mut().rev().find(|f| f.key == candidate.key) else {
            return Join::NewFlow;
        };
        let (before, after) = bufs.split_at_mut(index);
        let head = &mut before[flow.head];
        let packet = &after[0].as_ref()[offset..];
        let head_packet = &head.as_ref()[offset..];
        let headers = candidate.ip_len + candidate.l4_len;
        let fits = flow.open
            && flow.count < MAX_SEGMENTS
            && candidate.ip_len == flow.ip_len
            && candidate.l4_len == flow.l4_len
            && candidate.payload <= flow.segment
            && head_packet.len() + candidate.payload <= MAX_IP_LEN
            && ip_headers_match(head_packet, packet)
            && (candidate.key.proto != PROTO_TCP
                || (candidate.seq == flow.next_seq
                    && head_packet[flow.ip_len + 20..headers]
                        == packet[candidate.ip_len + 20..headers]));
        if !fits {
            return Join::NewFlow;
        }
        if !flow.head_checked {
            flow.head_checked = true;
            if !l4_checksum_valid(head_packet, flow.ip_len, candidate.key) {
                flow.open = false;
                return Join::NewFlow;
            }
        }
        if !l4_checksum_valid(packet, candidate.ip_len, candidate.key) {
            // Written as it is, and nothing joins it; the flow stays open for the next.
            return Join::Alone;
        }
        head.buf_extend_from_slice(&packet[headers..]);
        flow.count += 1;
        flow.next_seq = flow.next_seq.wrapping_add(candidate.payload as u32);
        if candidate.payload < flow.segment || candidate.psh {
            flow.open = false;
        }
        Join::Merged
    }
}

/// What became of a packet offered to its flow.
enum Join {
    /// Merged into the head.
    Merged,
    /// Written alone: its checksum is bad.
    Alone,
    /// It starts a flow of its own.
    NewFlow,
}

/// Parses a TCP or UDP packet that may be merged: IPv4 without options or fragmentation, or
/// IPv6 without extension headers; TCP with only ACK (and PSH) set, or UDP (with `udp`); a
/// non-empty payload; lengths consistent with the buffer.
fn parse(packet: &[u8], udp: bool) -> Option<Candidate> {
    let mut key = FlowKey {
        addresses: [0; 32],
        ports: [0; 4],
        ack: 0,
        proto: 0,
        v6: false,
    };
    let ip_len = match packet.first()? >> 4 {
        4 => {
            let header = packet.get(..20)?;
            let total = usize::from(u16::from_be_bytes([header[2], header[3]]));
            let fragment = header[6] & 0x20 != 0 || (header[6] & 0x1f) != 0 || header[7] != 0;
            if header[0] != 0x45 || total != packet.len() || fragment {
                return None;
            }
            key.proto = header[9];
            key.addresses[..8].copy_from_slice(&header[12..20]);
            20
        }
        6 => {
            let header = packet.get(..40)?;
            let payload = usize::from(u16::from_be_bytes([header[4], header[5]]));
            if payload != packet.len() - 40 {
                return None;
            }
            key.proto = header[6];
            key.v6 = true;
            key.addresses.copy_from_slice(&header[8..40]);
            40
        }
        _ => return None,
    };
    let l4 = &packet[ip_len..];
    key.ports.copy_from_slice(l4.get(..4)?);
    let (l4_len, seq, psh) = match key.proto {
        PROTO_TCP => {
            let header = l4.get(..20)?;
            let len = usize::from(header[12] >> 4) * 4;
            let flags = header[13];
            if len < 20 || l4.len() < len || flags & !TCP_PSH != TCP_ACK {
                return None;
            }
            key.ack = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
            let seq = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            (len, seq, flags & TCP_PSH != 0)
        }
        PROTO_UDP if udp => {
            let header = l4.get(..8)?;
            if usize::from(u16::from_be_bytes([header[4], header[5]])) != l4.len() {
                return None;
            }
            (8, 0, false)
        }
        _ => return None,
    };
    let payload = l4.len() - l4_len;
    (payload > 0).then_some(Candidate {
        key,
        ip_len,
        l4_len,
        payload,
        seq,
        psh,
    })
}

/// Whether two packets' IP headers agree in the fields every segment of a super-packet
/// inherits from its head.
fn ip_headers_match(head: &[u8], packet: &[u8]) -> bool {
    if head[0] >> 4 == 6 {
        // Version, traffic class, hop limit.
        head[0] == packet[0] && head[1] >> 4 == packet[1] >> 4 && head[7] == packet[7]
    } else {
        // TOS, DF and reserved bits, TTL.
        head[1] == packet[1] && head[6] >> 5 == packet[6] >> 5 && head[8] == packet[8]
    }
}

/// The pseudo-header sum of a transport segment of `l4_len` bytes.
fn pseudo_header_sum(key: FlowKey, l4_len: usize) -> u64 {
    let addresses = if key.v6 {
        &key.addresses[..]
    } else {
        &key.addresses[..8]
    };
    sum_words(addresses, u64::from(key.proto) + l4_len as u64)
}

/// Whether the TCP or UDP checksum of `packet` is valid (an IPv4 UDP checksum of zero means
/// none was computed, which is valid).
fn l4_checksum_valid(packet: &[u8], ip_len: usize, key: FlowKey) -> bool {
    let l4 = &packet[ip_len..];
    if key.proto == PROTO_UDP && !key.v6 && l4[6] == 0 && l4[7] == 0 {
        return true;
    }
    fold(sum_words(l4, pseudo_header_sum(key, l4.len()))) == 0xffff
}

/// Turns a head with merged packets into a super-packet: IP and UDP lengths, the IPv4
/// header checksum, the pseudo-header sum in the transport checksum (the kernel adds the
/// rest per segment), and the virtio header that asks for segmentation.
fn finish_super_packet(buf: &mut [u8], offset: usize, flow: &Flow) {
    let (header, packet) = buf.split_at_mut(offset);
    let total = packet.len();
    let ip_len = flow.ip_len;
    if flow.key.v6 {
        packet[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
    } else {
        packet[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        packet[10..12].fill(0);
        let checksum = !fold(sum_words(&packet[..20], 0));
        packet[10..12].copy_from_slice(&checksum.to_be_bytes());
    }
    let l4_total = total - ip_len;
    let (gso_type, checksum_offset) = if flow.key.proto == PROTO_TCP {
        let gso = if flow.key.v6 {
            VIRTIO_GSO_TCPV6
        } else {
            VIRTIO_GSO_TCPV4
        };
        (gso, 16)
    } else {
        packet[ip_len + 4..ip_len + 6].copy_from_slice(&(l4_total as u16).to_be_bytes());
        (VIRTIO_GSO_UDP_L4, 6)
    };
    let partial = fold(pseudo_header_sum(flow.key, l4_total));
    let at = ip_len + checksum_offset;
    packet[at..at + 2].copy_from_slice(&partial.to_be_bytes());
    // The virtio-net header, in the host's byte order: flags, gso_type, hdr_len, gso_size,
    // csum_start, csum_offset.
    let virtio = &mut header[offset - VIRTIO_HEADER_LEN..];
    virtio[0] = VIRTIO_F_NEEDS_CSUM;
    virtio[1] = gso_type;
    virtio[2..4].copy_from_slice(&((ip_len + flow.l4_len) as u16).to_ne_bytes());
    virtio[4..6].copy_from_slice(&(flow.segment as u16).to_ne_bytes());
    virtio[6..8].copy_from_slice(&(ip_len as u16).to_ne_bytes());
    virtio[8..10].copy_from_slice(&(checksum_offset as u16).to_ne_bytes());
}

#[cfg(test)]
mod tests;
