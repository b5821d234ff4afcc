//! What admission reads of a packet: its addresses and, by protocol, its ports, its ICMP echo
//! id, or the packet an ICMP error quotes. Parsing validates every offset; nothing panics on
//! arbitrary bytes.

const ICMP: u8 = 1;
const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMPV6: u8 = 58;
const SCTP: u8 = 132;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// A packet's addresses and what it carries. IPv4 addresses are held in the low 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuple {
    pub v6: bool,
    pub src: u128,
    pub dst: u128,
    pub kind: Kind,
}

/// What a packet carries, as far as admission cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// TCP, UDP or SCTP (ports in the same place).
    Ports {
        protocol: u8,
        src_port: u16,
        dst_port: u16,
        /// TCP's flags; 0 for the others.
        flags: TcpFlags,
    },
    /// ICMP or ICMPv6 echo request.
    EchoRequest { protocol: u8, id: u16 },
    /// ICMP or ICMPv6 echo reply.
    EchoReply { protocol: u8, id: u16 },
    /// An ICMP or ICMPv6 error (unreachable, packet too big, time exceeded, parameter
    /// problem) and the packet it quotes; `None` when the quote cannot be read.
    IcmpError(Option<Quoted>),
    /// Any other ICMP message (redirect, timestamp, router or neighbour discovery, ...).
    OtherIcmp,
    /// A protocol without ports admission tracks (GRE, ESP, UDP-Lite, ...).
    Other,
    /// A later fragment: no transport header.
    Fragment,
    /// The transport header is cut short.
    Malformed,
}

/// TCP flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct TcpFlags(pub u8);

impl TcpFlags {
    /// A SYN without ACK: a connection being opened.
    pub fn opens(self) -> bool {
        self.0 & (TCP_SYN | TCP_ACK) == TCP_SYN
    }
    /// FIN or RST: the connection is ending.
    pub fn ends(self) -> bool {
        self.0 & (TCP_FIN | TCP_RST) != 0
    }
}

/// The packet an ICMP error quotes (one this side sent): its addresses, protocol and ports,
/// an echo request's id as its source port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quoted {
    pub src: u128,
    pub dst: u128,
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// Whether `protocol` is one whose ports admission tracks.
pub(crate) fn has_ports(protocol: u8) -> bool {
    matches!(protocol, TCP | UDP | SCTP)
}

/// Whether `protocol` is TCP.
pub(crate) fn is_tcp(protocol: u8) -> bool {
    protocol == TCP
}

/// Reads `packet`'s tuple; `None` when it is not a whole IP header.
#[inline]
pub(crate) fn parse(packet: &[u8]) -> Option<Tuple> {
    match packet.first()? >> 4 {
        4 => parse_v4(packet),
        6 => parse_v6(packet),
        _ => None,
    }
}

fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

fn read_v4(buf: &[u8], at: usize) -> Option<u128> {
    let bytes: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
    Some(u128::from(u32::from_be_bytes(bytes)))
}

fn read_v6(buf: &[u8], at: usize) -> Option<u128> {
    let bytes: [u8; 16] = buf.get(at..at + 16)?.try_into().ok()?;
    Some(u128::from_be_bytes(bytes))
}

/// The IPv4 header's length, protocol and whether it is a first fragment.
fn v4_header(packet: &[u8]) -> Option<(usize, u8, bool)> {
    let header = packet.get(..20)?;
    let len = usize::from(header[0] & 0x0f) * 4;
    if len < 20 || packet.len() < len {
        return None;
    }
    let offset = u16::from_be_bytes([header[6], header[7]]) & 0x1fff;
    Some((len, header[9], offset == 0))
}

fn parse_v4(packet: &[u8]) -> Option<Tuple> {
    let (len, protocol, first) = v4_header(packet)?;
    let (src, dst) = (read_v4(packet, 12)?, read_v4(packet, 16)?);
    let kind = if first {
        transport(protocol, &packet[len..], false)
    } else {
        Kind::Fragment
    };
    Some(Tuple {
        v6: false,
        src,
        dst,
        kind,
    })
}

/// The upper-layer protocol and its offset past IPv6's extension headers, `None` for a
/// later fragment or no upper layer; `Err` when the chain is cut short.
fn v6_transport(packet: &[u8]) -> Result<Option<(u8, usize)>, ()> {
    let (mut next, mut at) = (*packet.get(6).ok_or(())?, 40);
    loop {
        match next {
            0 | 43 | 60 => {
                let header = packet.get(at..at + 8).ok_or(())?;
                next = header[0];
                at += (usize::from(header[1]) + 1) * 8;
            }
            44 => {
                let header = packet.get(at..at + 8).ok_or(())?;
                if u16::from_be_bytes([header[2], header[3]]) >> 3 != 0 {
                    return Ok(None);
                }
                next = header[0];
                at += 8;
            }
            59 => return Ok(None),
            protocol => return Ok(Some((protocol, at))),
        }
    }
}

fn parse_v6(packet: &[u8]) -> Option<Tuple> {
    let (src, dst) = (read_v6(packet, 8)?, read_v6(packet, 24)?);
    let kind = match v6_transport(packet) {
        Ok(Some((protocol, at))) => match packet.get(at..) {
            Some(l4) => transport(protocol, l4, true),
            None => Kind::Malformed,
        },
        Ok(None) => Kind::Fragment,
        Err(()) => Kind::Malformed,
    };
    Some(Tuple {
        v6: true,
        src,
        dst,
        kind,
    })
}

/// What the transport header `l4` of `protocol` carries.
fn transport(protocol: u8, l4: &[u8], v6: bool) -> Kind {
    match protocol {
        TCP | UDP | SCTP => {
            let (Some(src_port), Some(dst_port)) = (read_u16(l4, 0), read_u16(l4, 2)) else {
                return Kind::Malformed;
            };
            let flags = if protocol == TCP {
                match l4.get(13) {
                    Some(flags) => TcpFlags(*flags),
                    None => return Kind::Malformed,
                }
            } else {
                TcpFlags::default()
            };
            Kind::Ports {
                protocol,
                src_port,
                dst_port,
                flags,
            }
        }
        ICMP if !v6 => icmp(protocol, l4, [8, 0], &[3, 11, 12]),
        ICMPV6 if v6 => icmp(protocol, l4, [128, 129], &[1, 2, 3, 4]),
        _ => Kind::Other,
    }
}

/// An ICMP message of either family: `echo` is (request, reply), `errors` the error types.
fn icmp(protocol: u8, l4: &[u8], echo: [u8; 2], errors: &[u8]) -> Kind {
    let Some(&kind) = l4.first() else {
        return Kind::Malformed;
    };
    if kind == echo[0] || kind == echo[1] {
        let Some(id) = read_u16(l4, 4) else {
            return Kind::Malformed;
        };
        return if kind == echo[0] {
            Kind::EchoRequest { protocol, id }
        } else {
            Kind::EchoReply { protocol, id }
        };
    }
    if errors.contains(&kind) {
        return Kind::IcmpError(
            l4.get(8..)
                .and_then(|quote| quoted(quote, protocol == ICMPV6)),
        );
    }
    Kind::OtherIcmp
}

/// The packet an ICMP error quotes (its header and at least 8 bytes beyond).
fn quoted(quote: &[u8], v6: bool) -> Option<Quoted> {
    let (src, dst, protocol, l4) = if v6 {
        if quote.first()? >> 4 != 6 {
            return None;
        }
        let (protocol, at) = v6_transport(quote).ok()??;
        (
            read_v6(quote, 8)?,
            read_v6(quote, 24)?,
            protocol,
            quote.get(at..)?,
        )
    } else {
        if quote.first()? >> 4 != 4 {
            return None;
        }
        let (len, protocol, first) = v4_header(quote)?;
        if !first {
            return None;
        }
        (
            read_v4(quote, 12)?,
            read_v4(quote, 16)?,
            protocol,
            &quote[len..],
        )
    };
    let (src_port, dst_port) = match protocol {
        TCP | UDP | SCTP => (read_u16(l4, 0)?, read_u16(l4, 2)?),
        // An echo request this side sent: its id stands for the source port.
        ICMP if !v6 && *l4.first()? == 8 => (read_u16(l4, 4)?, 0),
        ICMPV6 if v6 && *l4.first()? == 128 => (read_u16(l4, 4)?, 0),
        _ => return None,
    };
    Some(Quoted {
        src,
        dst,
        protocol,
        src_port,
        dst_port,
    })
}
