//! The gateway-to-gateway connectivity check, pure core: the probe packet format and the
//! per-peer prober state machine. No IO; time is passed in as monotonic microseconds.
//!
//! A probe is an IPv4/UDP packet sent *through* a peer's WireGuard session like data, so an
//! answer proves the tunnel in both directions. A PING goes from [`PING_SOURCE`] to
//! [`PING_DESTINATION`], the PONG back the other way, both on UDP port [`PROBE_PORT`]; the
//! payload carries [`MAGIC`], a version, the kind, a sequence number and the sender's
//! timestamp (echoed, informational: the RTT comes from the prober's own record). Both
//! addresses lie in [`PROBE_PREFIX`] (IPv4 link-local), which the receiving gateway consumes
//! right after decryption and the sending gateway refuses from its TUN device, so local
//! traffic can never pose as a probe.
//!
//! The [`Prober`] numbers PINGs, matches PONGs against a window of recent sequence numbers
//! (wrapping arithmetic), ignores stale and duplicate PONGs, counts a probe lost once the next
//! one is due without an answer, and keeps the smoothed RTT and an RTT histogram.

use std::net::Ipv4Addr;

use crate::remap::checksum::{fold, sum_words};

/// Probe interval when the configuration leaves it 0.
pub const DEFAULT_INTERVAL_MS: u32 = 2000;
/// Smallest accepted interval: below it the probes are load, not a check.
pub const MIN_INTERVAL_MS: u32 = 100;
/// Largest accepted interval.
pub const MAX_INTERVAL_MS: u32 = 60_000;
/// Consecutive losses before a peer is unreachable when the configuration leaves it 0.
pub const DEFAULT_LOSS_THRESHOLD: u32 = 5;
/// Largest accepted loss threshold.
pub const MAX_LOSS_THRESHOLD: u32 = 100;

/// The reserved prefix of the probe addresses (IPv4 link-local, never routed).
pub const PROBE_PREFIX: (Ipv4Addr, u8) = (Ipv4Addr::new(169, 254, 90, 0), 30);
/// Source of a PING, destination of a PONG.
pub const PING_SOURCE: Ipv4Addr = Ipv4Addr::new(169, 254, 90, 1);
/// Destination of a PING, source of a PONG.
pub const PING_DESTINATION: Ipv4Addr = Ipv4Addr::new(169, 254, 90, 2);
/// UDP source and destination port of every probe.
pub const PROBE_PORT: u16 = 18_800;
/// First bytes of the payload.
pub const MAGIC: [u8; 4] = *b"KTCC";
/// Payload format version.
pub const VERSION: u8 = 1;

const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
const PAYLOAD: usize = 20;
/// Length of every probe packet.
pub const PROBE_LEN: usize = IPV4_HEADER + UDP_HEADER + PAYLOAD;
const TTL: u8 = 64;
const PROTO_UDP: u8 = 17;

/// Whether a probe asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// A request; a kubetun gateway answers it with a [`ProbeKind::Pong`].
    Ping,
    /// The answer, echoing the PING's sequence number and timestamp.
    Pong,
}

impl ProbeKind {
    const fn code(self) -> u8 {
        match self {
            ProbeKind::Ping => 1,
            ProbeKind::Pong => 2,
        }
    }

    const fn addresses(self) -> (Ipv4Addr, Ipv4Addr) {
        match self {
            ProbeKind::Ping => (PING_SOURCE, PING_DESTINATION),
            ProbeKind::Pong => (PING_DESTINATION, PING_SOURCE),
        }
    }
}

/// A decoded probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// PING or PONG.
    pub kind: ProbeKind,
    /// The PING's sequence number.
    pub seq: u32,
    /// The PING sender's timestamp (microseconds of its own clock), echoed by the PONG.
    pub timestamp_us: u64,
}

impl Probe {
    /// The PONG answering this PING.
    pub fn answer(self) -> Probe {
        Probe {
            kind: ProbeKind::Pong,
            ..self
        }
    }

    /// The IPv4/UDP packet of this probe, checksums filled in.
    pub fn encode(&self) -> [u8; PROBE_LEN] {
        let mut packet = [0u8; PROBE_LEN];
        let (source, destination) = self.kind.addresses();
        let ip = &mut packet[..IPV4_HEADER];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(PROBE_LEN as u16).to_be_bytes());
        ip[6] = 0x40; // don't fragment
        ip[8] = TTL;
        ip[9] = PROTO_UDP;
        ip[12..16].copy_from_slice(&source.octets());
        ip[16..20].copy_from_slice(&destination.octets());
        let checksum = !fold(sum_words(ip, 0));
        ip[10..12].copy_from_slice(&checksum.to_be_bytes());

        let payload = &mut packet[IPV4_HEADER + UDP_HEADER..];
        payload[..4].copy_from_slice(&MAGIC);
        payload[4] = VERSION;
        payload[5] = self.kind.code();
        payload[8..12].copy_from_slice(&self.seq.to_be_bytes());
        payload[12..20].copy_from_slice(&self.timestamp_us.to_be_bytes());

        let udp = &mut packet[IPV4_HEADER..IPV4_HEADER + UDP_HEADER];
        udp[0..2].copy_from_slice(&PROBE_PORT.to_be_bytes());
        udp[2..4].copy_from_slice(&PROBE_PORT.to_be_bytes());
        udp[4..6].copy_from_slice(&((UDP_HEADER + PAYLOAD) as u16).to_be_bytes());
        let checksum = udp_checksum(&packet);
        packet[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&checksum.to_be_bytes());
        packet
    }
}

/// True when `packet` is IPv4 and addressed to the probe prefix: such a packet is a probe's
/// business and never user traffic (dropped when read from the TUN device, consumed when
/// decrypted). Reads one byte and four.
pub fn is_probe_destination(packet: &[u8]) -> bool {
    if packet.len() < IPV4_HEADER || packet[0] >> 4 != 4 {
        return false;
    }
    let destination = u32::from_be_bytes([packet[16], packet[17], packet[18], packet[19]]);
    let (prefix, len) = PROBE_PREFIX;
    let mask = u32::MAX << (32 - u32::from(len));
    destination & mask == u32::from(prefix)
}

/// Decodes a probe. Accepts only the exact form [`Probe::encode`] writes: its IPv4 header
/// fields, the probe addresses of its kind, UDP on [`PROBE_PORT`] both ways,
/// valid IPv4 and UDP checksums (a zero UDP checksum means none), [`MAGIC`] and [`VERSION`].
pub fn parse(packet: &[u8]) -> Option<Probe> {
    if packet.len() != PROBE_LEN {
        return None;
    }
    let ip = &packet[..IPV4_HEADER];
    // Version 4, no options, no TOS, the exact length, ID 0, DF only, TTL 64, UDP.
    let well_formed_ip = ip[..2] == [0x45, 0]
        && usize::from(u16::from_be_bytes([ip[2], ip[3]])) == PROBE_LEN
        && ip[4..9] == [0, 0, 0x40, 0, TTL]
        && ip[9] == PROTO_UDP
        && fold(sum_words(ip, 0)) == 0xffff;
    if !well_formed_ip {
        return None;
    }
    let payload = &packet[IPV4_HEADER + UDP_HEADER..];
    if payload[..4] != MAGIC || payload[4] != VERSION || payload[6..8] != [0, 0] {
        return None;
    }
    let kind = match payload[5] {
        1 => ProbeKind::Ping,
        2 => ProbeKind::Pong,
        _ => return None,
    };
    let (source, destination) = kind.addresses();
    if ip[12..16] != source.octets() || ip[16..20] != destination.octets() {
        return None;
    }
    let udp = &packet[IPV4_HEADER..IPV4_HEADER + UDP_HEADER];
    let port = PROBE_PORT.to_be_bytes();
    let udp_checksum_field = u16::from_be_bytes([udp[6], udp[7]]);
    if udp[0..2] != port
        || udp[2..4] != port
        || usize::from(u16::from_be_bytes([udp[4], udp[5]])) != UDP_HEADER + PAYLOAD
        || (udp_checksum_field != 0 && udp_checksum(packet) != 0)
    {
        return None;
    }
    Some(Probe {
        kind,
        seq: u32::from_be_bytes([payload[8], payload[9], payload[10], payload[11]]),
        timestamp_us: u64::from_be_bytes(payload[12..20].try_into().ok()?),
    })
}

/// The UDP checksum over the pseudo-header and the datagram as it is in `packet` (0 for a
/// packet whose checksum field is already right). An all-zero result is sent as 0xffff.
fn udp_checksum(packet: &[u8]) -> u16 {
    let udp = &packet[IPV4_HEADER..];
    let pseudo = sum_words(&packet[12..20], u64::from(PROTO_UDP) + udp.len() as u64);
    let checksum = !fold(sum_words(udp, pseudo));
    if checksum == 0 && packet[IPV4_HEADER + 6..IPV4_HEADER + 8] == [0, 0] {
        0xffff
    } else {
        checksum
    }
}

/// Validated settings of the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnCheckConfig {
    /// Milliseconds between probes.
    pub interval_ms: u32,
    /// Consecutive unanswered probes that make a peer unreachable.
    pub loss_threshold: u32,
    /// Milliseconds between probes of a peer whose views have fallbacks.
    pub fallback_interval_ms: u32,
}

impl Default for ConnCheckConfig {
    fn default() -> Self {
        Self {
            interval_ms: DEFAULT_INTERVAL_MS,
            loss_threshold: DEFAULT_LOSS_THRESHOLD,
            fallback_interval_ms: DEFAULT_INTERVAL_MS,
        }
    }
}

impl ConnCheckConfig {
    /// The settings of one peer: `interval_ms` is [`Self::fallback_interval_ms`] for a peer
    /// whose views have fallbacks (`backed_up`).
    pub fn for_peer(self, backed_up: bool) -> Self {
        if backed_up {
            Self {
                interval_ms: self.fallback_interval_ms,
                ..self
            }
        } else {
            self
        }
    }

    /// The shortest interval any peer is probed at.
    pub fn shortest_interval_ms(&self) -> u32 {
        self.interval_ms.min(self.fallback_interval_ms)
    }

    /// The interval in microseconds.
    pub fn interval_us(&self) -> u64 {
        u64::from(self.interval_ms) * 1000
    }

    /// "2 s", "200 ms", "1.5 s": the interval as people write it.
    pub fn interval_text(&self) -> String {
        let ms = self.interval_ms;
        if ms.is_multiple_of(1000) {
            format!("{} s", ms / 1000)
        } else if ms > 1000 {
            format!("{} s", f64::from(ms) / 1000.0)
        } else {
            format!("{ms} ms")
        }
    }
}

/// Upper bounds of the RTT histogram buckets in microseconds, 50 µs to 1 s; one more bucket
/// counts everything slower.
pub const RTT_BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// RTT samples by bucket (not cumulative) and their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RttHistogram {
    /// One count per [`RTT_BUCKETS_US`] bound, then the overflow bucket.
    pub counts: [u64; RTT_BUCKETS_US.len() + 1],
    /// Sum of every sample, microseconds.
    pub sum_us: u64,
}

impl RttHistogram {
    /// Adds one sample.
    pub fn observe(&mut self, rtt_us: u64) {
        let bucket = RTT_BUCKETS_US
            .iter()
            .position(|bound| rtt_us <= *bound)
            .unwrap_or(RTT_BUCKETS_US.len());
        self.counts[bucket] += 1;
        self.sum_us = self.sum_us.saturating_add(rtt_us);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// How many recent PINGs a PONG can still be matched against.
const WINDOW: usize = 16;

/// What a PONG did to the prober.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PongOutcome {
    /// The answer to the latest PING: an RTT sample.
    Rtt(u64),
    /// The answer to an older PING still in the window, newer than any answered so far, or
    /// to one that waited for a handshake: it proves the peer reachable but is no RTT sample.
    Late,
    /// A duplicate, an answer to a PING older than the last answered or outside the window,
    /// or to a PING never sent: ignored.
    Stale,
}

/// `a` comes after `b` in wrapping sequence space.
fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The connectivity check state of one peer.
#[derive(Debug, Clone)]
pub struct Prober {
    next_seq: u32,
    /// Send times of recent PINGs by `seq % WINDOW`.
    sent: [Option<(u32, u64)>; WINDOW],
    last_sent: Option<(u32, u64)>,
    last_answered: Option<u32>,
    /// The latest PING is neither answered nor counted lost yet.
    in_flight: bool,
    /// The latest PING waited for a handshake: its answer is no RTT sample.
    delayed: Option<u32>,
    consecutive_losses: u32,
    srtt_us: Option<u64>,
    last_rtt_us: Option<u64>,
    last_reply_us: Option<u64>,
    probes_sent: u64,
    probes_lost: u64,
    histogram: RttHistogram,
    /// Reachability as of the last [`Prober::reachability_change`].
    reported_unreachable: bool,
}

/// A reading of a [`Prober`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProberReading {
    /// Probes unanswered since the last reply.
    pub consecutive_losses: u32,
    /// Smoothed RTT, microseconds.
    pub srtt_us: Option<u64>,
    /// RTT of the last answer to the latest PING, microseconds.
    pub last_rtt_us: Option<u64>,
    /// When the last reply arrived (the prober's clock).
    pub last_reply_us: Option<u64>,
    /// PINGs sent.
    pub probes_sent: u64,
    /// PINGs counted lost.
    pub probes_lost: u64,
    /// RTT samples.
    pub histogram: RttHistogram,
}

impl Prober {
    /// A prober whose first PING carries `initial_seq` (random in the shell, so that PONGs
    /// meant for an earlier prober of the same peer are unlikely to match).
    pub fn new(initial_seq: u32) -> Self {
        Self {
            next_seq: initial_seq,
            sent: [None; WINDOW],
            last_sent: None,
            last_answered: None,
            in_flight: false,
            delayed: None,
            consecutive_losses: 0,
            srtt_us: None,
            last_rtt_us: None,
            last_reply_us: None,
            probes_sent: 0,
            probes_lost: 0,
            histogram: RttHistogram::default(),
            reported_unreachable: false,
        }
    }

    /// Whether a PING is due at `now_us` for a peer probed every `interval_us`, in rounds
    /// every `round_us` (a round early by less than half of one is not early).
    pub fn is_due(&self, now_us: u64, interval_us: u64, round_us: u64) -> bool {
        self.last_sent.is_none_or(|(_, at)| {
            now_us.saturating_sub(at).saturating_add(round_us / 2) >= interval_us
        })
    }

    /// A PING is due at `now_us`: the previous one, if still unanswered, is counted lost, and
    /// the PING to send is returned. After a pause of more than two intervals (the check was
    /// off, the peer had no endpoint) the loss run starts over instead: nothing was probed.
    pub fn next_ping(&mut self, now_us: u64, interval_us: u64) -> Probe {
        let paused = self
            .last_sent
            .is_some_and(|(_, at)| now_us.saturating_sub(at) > interval_us.saturating_mul(2));
        if paused {
            self.in_flight = false;
            self.consecutive_losses = 0;
        } else if self.in_flight {
            self.consecutive_losses = self.consecutive_losses.saturating_add(1);
            self.probes_lost += 1;
        }
        let seq = self.next_seq;
        self.next_seq = seq.wrapping_add(1);
        self.sent[seq as usize % WINDOW] = Some((seq, now_us));
        self.last_sent = Some((seq, now_us));
        self.in_flight = true;
        self.probes_sent += 1;
        Probe {
            kind: ProbeKind::Ping,
            seq,
            timestamp_us: now_us,
        }
    }

    /// A PONG for `seq` arrived at `now_us`.
    pub fn on_pong(&mut self, seq: u32, now_us: u64) -> PongOutcome {
        let Some((last_seq, _)) = self.last_sent else {
            return PongOutcome::Stale;
        };
        let fresh = self
            .last_answered
            .is_none_or(|answered| newer(seq, answered));
        let sent = !newer(seq, last_seq);
        let in_window = self.sent[seq as usize % WINDOW].filter(|(s, _)| *s == seq);
        let (true, true, Some((_, sent_at))) = (fresh, sent, in_window) else {
            return PongOutcome::Stale;
        };
        self.last_answered = Some(seq);
        self.consecutive_losses = 0;
        self.last_reply_us = Some(now_us);
        if seq != last_seq {
            return PongOutcome::Late;
        }
        self.in_flight = false;
        if self.delayed == Some(seq) {
            return PongOutcome::Late;
        }
        let rtt = now_us.saturating_sub(sent_at);
        self.last_rtt_us = Some(rtt);
        // RFC 6298: SRTT <- 7/8 SRTT + 1/8 R, the first sample taken as is.
        self.srtt_us = Some(match self.srtt_us {
            None => rtt,
            Some(srtt) => srtt - srtt / 8 + rtt / 8,
        });
        self.histogram.observe(rtt);
        PongOutcome::Rtt(rtt)
    }

    /// The PING `seq` did not leave at once but waits for a handshake (the peer had no
    /// session): its answer proves reachability but its RTT would include the handshake.
    pub fn delayed(&mut self, seq: u32) {
        self.delayed = Some(seq);
    }

    /// True once `threshold` probes in a row went unanswered.
    pub fn is_unreachable(&self, threshold: u32) -> bool {
        self.consecutive_losses >= threshold
    }

    /// `Some(unreachable)` when reachability under `threshold` changed since the last call
    /// (the shell logs transitions, not every probe).
    pub fn reachability_change(&mut self, threshold: u32) -> Option<bool> {
        let unreachable = self.is_unreachable(threshold);
        (unreachable != self.reported_unreachable).then(|| {
            self.reported_unreachable = unreachable;
            unreachable
        })
    }

    /// Unanswered probes in a row.
    pub fn consecutive_losses(&self) -> u32 {
        self.consecutive_losses
    }

    /// The counters and measurements.
    pub fn reading(&self) -> ProberReading {
        ProberReading {
            consecutive_losses: self.consecutive_losses,
            srtt_us: self.srtt_us,
            last_rtt_us: self.last_rtt_us,
            last_reply_us: self.last_reply_us,
            probes_sent: self.probes_sent,
            probes_lost: self.probes_lost,
            histogram: self.histogram.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INTERVAL: u64 = 2_000_000;

    fn ping(seq: u32) -> Probe {
        Probe {
            kind: ProbeKind::Ping,
            seq,
            timestamp_us: 123_456_789,
        }
    }

    #[test]
    fn probes_round_trip_and_are_valid_ipv4_udp() {
        for probe in [ping(7), ping(u32::MAX).answer()] {
            let packet = probe.encode();
            assert_eq!(parse(&packet), Some(probe));
            assert!(is_probe_destination(&packet));
            // etherparse, the independent oracle, agrees on the headers and checksums.
            let parsed = etherparse::SlicedPacket::from_ip(&packet).expect("valid IP packet");
            let Some(etherparse::NetSlice::Ipv4(ip)) = parsed.net else {
                panic!("not IPv4")
            };
            let header = ip.header().to_header();
            assert_eq!(header.calc_header_checksum(), header.header_checksum);
            let Some(etherparse::TransportSlice::Udp(udp)) = parsed.transport else {
                panic!("not UDP")
            };
            let expected = udp
                .to_header()
                .calc_checksum_ipv4(&header, udp.payload())
                .expect("checksum");
            assert_eq!(udp.checksum(), expected);
            assert_eq!(udp.destination_port(), PROBE_PORT);
        }
        let request = ping(1).encode();
        assert_eq!(request[16..20], PING_DESTINATION.octets());
        assert_eq!(ping(1).answer().encode()[16..20], PING_SOURCE.octets());
    }

    #[test]
    fn parser_rejects_near_misses() {
        let good = ping(42).encode();
        assert!(parse(&good[..PROBE_LEN - 1]).is_none(), "truncated");
        let mut longer = good.to_vec();
        longer.push(0);
        assert!(parse(&longer).is_none(), "padded");
        // Every single flipped bit is caught by a field check or a checksum.
        for byte in 0..PROBE_LEN {
            for bit in 0..8 {
                let mut bad = good;
                bad[byte] ^= 1 << bit;
                assert!(parse(&bad).is_none(), "bit {bit} of byte {byte}");
            }
        }
        // A PING with PONG addresses (addresses swapped, checksums fixed up) is refused.
        let mut swapped = ping(42).answer().encode();
        swapped[IPV4_HEADER + UDP_HEADER + 5] = ProbeKind::Ping.code();
        swapped[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&[0, 0]);
        assert!(parse(&swapped).is_none());
        // A zero UDP checksum means "none" and is accepted.
        let mut unchecked = good;
        unchecked[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&[0, 0]);
        assert_eq!(parse(&unchecked), Some(ping(42)));
    }

    #[test]
    fn probe_destination_is_the_reserved_prefix_only() {
        let mut packet = ping(1).encode();
        for last in 0..=3 {
            packet[19] = last;
            assert!(is_probe_destination(&packet), "169.254.90.{last}");
        }
        packet[19] = 4;
        assert!(!is_probe_destination(&packet));
        packet[19] = 2;
        packet[18] = 91;
        assert!(!is_probe_destination(&packet));
        assert!(!is_probe_destination(&[0x60; 40]), "IPv6");
        assert!(!is_probe_destination(&[0x45; 10]), "short");
    }

    #[test]
    fn rtt_comes_from_the_answer_to_the_latest_ping() {
        let mut prober = Prober::new(10);
        let first = prober.next_ping(1_000, INTERVAL);
        assert_eq!(first.seq, 10);
        assert_eq!(prober.on_pong(10, 1_350), PongOutcome::Rtt(350));
        let reading = prober.reading();
        assert_eq!(reading.srtt_us, Some(350));
        assert_eq!(reading.last_rtt_us, Some(350));
        assert_eq!(reading.last_reply_us, Some(1_350));
        assert_eq!(reading.histogram.count(), 1);
        assert_eq!(reading.histogram.counts[3], 1, "250 < 350 <= 500 µs");

        prober.next_ping(1_000 + INTERVAL, INTERVAL);
        assert_eq!(
            prober.on_pong(11, 1_000 + INTERVAL + 1_150),
            PongOutcome::Rtt(1_150)
        );
        // 350 - 350/8 + 1150/8 = 450
        assert_eq!(prober.reading().srtt_us, Some(450));
        assert_eq!(prober.reading().histogram.sum_us, 1_500);
        assert_eq!(prober.reading().consecutive_losses, 0);
        assert_eq!(prober.reading().probes_lost, 0);
    }

    #[test]
    fn losses_count_up_to_unreachable_and_a_pong_recovers() {
        let mut prober = Prober::new(0);
        let mut now = 0;
        let mut last = 0;
        for _ in 0..6 {
            last = prober.next_ping(now, INTERVAL).seq;
            now += INTERVAL;
        }
        // Six PINGs, five of them past their interval.
        assert_eq!(prober.reading().consecutive_losses, 5);
        assert_eq!(prober.reading().probes_lost, 5);
        assert_eq!(prober.reading().probes_sent, 6);
        assert!(prober.is_unreachable(5));
        assert!(!prober.is_unreachable(6));

        assert_eq!(prober.reachability_change(5), Some(true));
        assert_eq!(prober.reachability_change(5), None, "reported once");
        assert!(matches!(prober.on_pong(last, now), PongOutcome::Rtt(_)));
        assert_eq!(prober.reachability_change(5), Some(false));
        assert!(!prober.is_unreachable(1));
        assert_eq!(prober.reading().probes_lost, 5, "lost stays counted");
    }

    #[test]
    fn a_late_answer_proves_reachability_without_an_rtt_sample() {
        let mut prober = Prober::new(100);
        prober.next_ping(0, INTERVAL);
        prober.next_ping(INTERVAL, INTERVAL);
        prober.next_ping(2 * INTERVAL, INTERVAL);
        assert_eq!(prober.reading().consecutive_losses, 2);
        assert_eq!(prober.on_pong(100, 2 * INTERVAL + 5), PongOutcome::Late);
        assert_eq!(prober.reading().consecutive_losses, 0);
        assert_eq!(prober.reading().srtt_us, None);
        assert_eq!(prober.reading().histogram.count(), 0);
        // 102 is still in flight and answers normally.
        assert_eq!(
            prober.on_pong(102, 2 * INTERVAL + 700),
            PongOutcome::Rtt(700)
        );
    }

    #[test]
    fn a_ping_that_waited_for_a_handshake_is_no_rtt_sample() {
        let mut prober = Prober::new(0);
        prober.next_ping(0, INTERVAL);
        prober.delayed(0);
        assert_eq!(prober.on_pong(0, 9_000), PongOutcome::Late);
        assert_eq!(prober.reading().srtt_us, None);
        assert_eq!(prober.reading().last_reply_us, Some(9_000));
        // Answered: not counted lost at the next PING, which samples normally.
        prober.next_ping(INTERVAL, INTERVAL);
        assert_eq!(prober.reading().probes_lost, 0);
        assert_eq!(prober.on_pong(1, INTERVAL + 300), PongOutcome::Rtt(300));
        assert_eq!(prober.reading().srtt_us, Some(300));
    }

    #[test]
    fn stale_duplicate_and_unsent_pongs_are_ignored() {
        let mut prober = Prober::new(5);
        assert_eq!(prober.on_pong(5, 10), PongOutcome::Stale, "nothing sent");
        prober.next_ping(0, INTERVAL);
        prober.next_ping(INTERVAL, INTERVAL);
        assert_eq!(prober.on_pong(6, INTERVAL + 400), PongOutcome::Rtt(400));
        assert_eq!(prober.on_pong(6, INTERVAL + 500), PongOutcome::Stale, "dup");
        assert_eq!(
            prober.on_pong(5, INTERVAL + 600),
            PongOutcome::Stale,
            "older"
        );
        assert_eq!(
            prober.on_pong(7, INTERVAL + 700),
            PongOutcome::Stale,
            "unsent"
        );
        assert_eq!(
            prober.on_pong(4, INTERVAL + 800),
            PongOutcome::Stale,
            "before"
        );
        assert_eq!(prober.reading().histogram.count(), 1);
        assert_eq!(prober.reading().srtt_us, Some(400));

        // A PONG older than the window is stale even when nothing newer was answered.
        let mut prober = Prober::new(0);
        for i in 0..(WINDOW as u64 + 2) {
            prober.next_ping(i * INTERVAL, INTERVAL);
        }
        assert_eq!(prober.on_pong(0, 0), PongOutcome::Stale);
        assert_eq!(prober.on_pong(1, 0), PongOutcome::Stale);
        assert_eq!(prober.on_pong(2, 0), PongOutcome::Late);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut prober = Prober::new(u32::MAX - 1);
        let mut now = 0;
        for expected in [u32::MAX - 1, u32::MAX, 0, 1] {
            let probe = prober.next_ping(now, INTERVAL);
            assert_eq!(probe.seq, expected);
            assert_eq!(prober.on_pong(expected, now + 90), PongOutcome::Rtt(90));
            now += INTERVAL;
        }
        // Answers from before the wrap are now old.
        assert_eq!(prober.on_pong(u32::MAX, now), PongOutcome::Stale);
        assert_eq!(prober.on_pong(u32::MAX - 1, now), PongOutcome::Stale);
        assert_eq!(prober.reading().histogram.count(), 4);
    }

    #[test]
    fn a_pause_restarts_the_loss_run() {
        let mut prober = Prober::new(0);
        prober.next_ping(0, INTERVAL);
        prober.next_ping(INTERVAL, INTERVAL);
        assert_eq!(prober.reading().consecutive_losses, 1);
        prober.next_ping(10 * INTERVAL, INTERVAL);
        assert_eq!(prober.reading().consecutive_losses, 0);
        assert_eq!(prober.reading().probes_lost, 1);
    }

    #[test]
    fn a_backed_up_peer_is_probed_on_its_own_interval_in_shorter_rounds() {
        let config = ConnCheckConfig {
            interval_ms: 2000,
            loss_threshold: 5,
            fallback_interval_ms: 200,
        };
        assert_eq!(config.for_peer(false), config);
        assert_eq!(config.for_peer(true).interval_ms, 200);
        assert_eq!(config.shortest_interval_ms(), 200);

        // Rounds every 200 ms, a few hundred µs late or early: a 2 s peer is due every
        // tenth round, not the eleventh.
        let (round, interval) = (200_000, 2_000_000);
        let mut prober = Prober::new(1);
        assert!(prober.is_due(0, interval, round), "never probed");
        prober.next_ping(0, interval);
        let due: Vec<u64> = (1..=20u64)
            .map(|n| n * round - 300 + (n % 2) * 600)
            .filter(|&at| {
                let due = prober.is_due(at, interval, round);
                if due {
                    prober.next_ping(at, interval);
                }
                due
            })
            .map(|at| (at + 300) / round)
            .collect();
        assert_eq!(due, [10, 20]);
    }

    #[test]
    fn interval_text() {
        let text = |interval_ms| {
            ConnCheckConfig {
                interval_ms,
                loss_threshold: 5,
                fallback_interval_ms: interval_ms,
            }
            .interval_text()
        };
        assert_eq!(text(2000), "2 s");
        assert_eq!(text(200), "200 ms");
        assert_eq!(text(1500), "1.5 s");
    }

    proptest! {
        #[test]
        fn parser_never_panics_and_accepts_only_well_formed_probes(
            bytes in proptest::collection::vec(any::<u8>(), 0..96)
        ) {
            if let Some(probe) = parse(&bytes) {
                // Anything accepted is exactly what the encoder writes (up to a zero UDP
                // checksum, which means "none").
                let mut canonical = probe.encode();
                if bytes[IPV4_HEADER + 6..IPV4_HEADER + 8] == [0, 0] {
                    canonical[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&[0, 0]);
                }
                prop_assert_eq!(&bytes[..], &canonical[..]);
            }
            let _ = is_probe_destination(&bytes);
        }

        #[test]
        fn mutated_probes_parse_only_as_themselves(
            seq in any::<u32>(),
            timestamp_us in any::<u64>(),
            pong in any::<bool>(),
            flips in proptest::collection::vec((0..PROBE_LEN, any::<u8>()), 0..4),
        ) {
            let probe = Probe { kind: if pong { ProbeKind::Pong } else { ProbeKind::Ping }, seq, timestamp_us };
            let mut packet = probe.encode();
            prop_assert_eq!(parse(&packet), Some(probe));
            for (index, value) in flips {
                packet[index] = value;
            }
            if let Some(parsed) = parse(&packet) {
                let mut canonical = parsed.encode();
                if packet[IPV4_HEADER + 6..IPV4_HEADER + 8] == [0, 0] {
                    canonical[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&[0, 0]);
                }
                prop_assert_eq!(packet, canonical);
            }
        }

        #[test]
        fn the_prober_never_panics_and_losses_never_exceed_sent(
            events in proptest::collection::vec((any::<bool>(), any::<u32>(), 0u64..5_000_000), 0..64),
            initial in any::<u32>(),
        ) {
            let mut prober = Prober::new(initial);
            let mut now = 0u64;
            for (send, seq_offset, advance) in events {
                now += advance;
                if send {
                    prober.next_ping(now, INTERVAL);
                } else {
                    prober.on_pong(initial.wrapping_add(seq_offset % 80), now);
                }
                let reading = prober.reading();
                prop_assert!(reading.probes_lost <= reading.probes_sent);
                prop_assert!(u64::from(reading.consecutive_losses) <= reading.probes_sent);
            }
        }
    }
}
