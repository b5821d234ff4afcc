//! In-place address rewriting of raw IPv4/IPv6 packets at fixed offsets, with incremental
//! checksum updates, ICMP error translation and TCP MSS clamping.
//!
//! Parsing validates every offset before it is read, so arbitrary bytes never panic; anything
//! that cannot be rewritten correctly is reported as [`Malformed`].

use super::checksum::Delta;

/// The packet cannot be rewritten correctly (truncated, malformed or unsupported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Malformed;

/// Which address of a packet a translation rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Src,
    Dst,
}

impl Side {
    /// The address a quoted packet inside an ICMP error carries for the same remote host.
    fn reverse(self) -> Side {
        match self {
            Side::Src => Side::Dst,
            Side::Dst => Side::Src,
        }
    }
}

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_DCCP: u8 = 33;
const PROTO_ICMPV6: u8 = 58;
const PROTO_UDPLITE: u8 = 136;

const TCP_SYN: u8 = 0x02;
const TCP_OPT_END: u8 = 0;
const TCP_OPT_NOP: u8 = 1;
const TCP_OPT_MSS: u8 = 2;

#[inline]
fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

#[inline]
fn write_u16(buf: &mut [u8], at: usize, value: u16) {
    if let Some(bytes) = buf.get_mut(at..at + 2) {
        bytes.copy_from_slice(&value.to_be_bytes());
    }
}

/// Updates the 16-bit checksum at `at` by `delta`, returning the checksum's own change.
#[inline]
fn update_checksum(buf: &mut [u8], at: usize, delta: &Delta) -> Option<Delta> {
    let old = read_u16(buf, at)?;
    let new = delta.apply(old);
    write_u16(buf, at, new);
    let mut change = Delta::default();
    change.word(old, new);
    Some(change)
}

/// The L4 checksum at `at` of protocols with a pseudo-header; UDP's "no checksum" zero stays
/// zero and a computed zero is sent as `0xffff`. Returns the checksum's own change, or `None`
/// when the checksum is not within `l4`.
#[inline]
fn update_l4_checksum(l4: &mut [u8], protocol: u8, delta: &Delta) -> Option<Delta> {
    let at = match protocol {
        PROTO_TCP => 16,
        PROTO_UDP | PROTO_UDPLITE | PROTO_DCCP => 6,
        PROTO_ICMPV6 => 2,
        _ => return Some(Delta::default()),
    };
    let old = read_u16(l4, at)?;
    if protocol == PROTO_UDP && old == 0 {
        return Some(Delta::default());
    }
    let mut new = delta.apply(old);
    if protocol == PROTO_UDP && new == 0 {
        new = 0xffff;
    }
    write_u16(l4, at, new);
    let mut change = Delta::default();
    change.word(old, new);
    Some(change)
}

/// Clamps the MSS option of a TCP SYN to `limit`, recording the change in `delta`.
fn clamp_mss(tcp: &mut [u8], limit: u16, delta: &mut Delta) {
    if tcp.get(13).is_none_or(|flags| flags & TCP_SYN == 0) {
        return;
    }
    let header_len = usize::from(tcp[12] >> 4) * 4;
    let Some(options) = tcp.get_mut(20..header_len) else {
        return;
    };
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            TCP_OPT_END => return,
            TCP_OPT_NOP => i += 1,
            kind => {
                let Some(&len) = options.get(i + 1) else {
                    return;
                };
                let len = usize::from(len);
                if len < 2 || i + len > options.len() {
                    return;
                }
                if kind == TCP_OPT_MSS && len == 4 {
                    let Some(mss) = read_u16(options, i + 2) else {
                        return;
                    };
                    if mss > limit {
                        write_u16(options, i + 2, limit);
                        delta.word_at(20 + i + 2, mss, limit);
                    }
                    return;
                }
                i += len;
            }
        }
    }
}

/// Rewrites the L4 part of a packet (not a later fragment) after its address changed by
/// `addr_delta` (pseudo-header); clamps the MSS of SYNs. ICMP is handled by the callers.
fn rewrite_transport(
    l4: &mut [u8],
    protocol: u8,
    addr_delta: &Delta,
    mss_limit: Option<u16>,
) -> Result<(), Malformed> {
    match protocol {
        PROTO_TCP => {
            let header_len = l4
                .get(12)
                .map(|b| usize::from(b >> 4) * 4)
                .ok_or(Malformed)?;
            if header_len < 20 || header_len > l4.len() {
                return Err(Malformed);
            }
            let mut delta = *addr_delta;
            if let Some(limit) = mss_limit {
                clamp_mss(l4, limit, &mut delta);
            }
            update_l4_checksum(l4, protocol, &delta).ok_or(Malformed)?;
        }
        PROTO_UDP | PROTO_UDPLITE | PROTO_DCCP => {
            update_l4_checksum(l4, protocol, addr_delta).ok_or(Malformed)?;
        }
        _ => {}
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// IPv4

/// The facts of a valid IPv4 header that rewriting needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ipv4Meta {
    header_len: usize,
    total_len: usize,
    protocol: u8,
    first_fragment: bool,
}

impl Ipv4Meta {
    /// Validates the IPv4 header of `pkt` (version, IHL and total length within the buffer).
    #[inline]
    pub(crate) fn parse(pkt: &[u8]) -> Result<Self, Malformed> {
        let header = pkt.get(..20).ok_or(Malformed)?;
        let header_len = usize::from(header[0] & 0x0f) * 4;
        let total_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        if header[0] >> 4 != 4 || header_len < 20 || total_len < header_len || total_len > pkt.len()
        {
            return Err(Malformed);
        }
        let fragment_offset = u16::from_be_bytes([header[6], header[7]]) & 0x1fff;
        Ok(Self {
            header_len,
            total_len,
            protocol: header[9],
            first_fragment: fragment_offset == 0,
        })
    }
}

#[inline]
pub(crate) fn addr_v4(pkt: &[u8], side: Side) -> u32 {
    let at = if side == Side::Src { 12 } else { 16 };
    pkt.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

#[inline]
fn set_addr_v4(pkt: &mut [u8], side: Side, addr: u32) {
    let at = if side == Side::Src { 12 } else { 16 };
    if let Some(bytes) = pkt.get_mut(at..at + 4) {
        bytes.copy_from_slice(&addr.to_be_bytes());
    }
}

/// ICMPv4 types that quote the offending packet.
fn is_icmpv4_error(kind: u8) -> bool {
    matches!(kind, 3 | 4 | 5 | 11 | 12)
}

/// Rewrites the `side` address of a parsed IPv4 packet to `new`; inside ICMP errors the quoted
/// packet's opposite address is mapped by `quoted` (left alone when it returns `None`).
pub(crate) fn rewrite_v4(
    pkt: &mut [u8],
    meta: &Ipv4Meta,
    side: Side,
    new: u32,
    quoted: impl Fn(u32) -> Option<u32>,
    mss_limit: Option<u16>,
) -> Result<(), Malformed> {
    let pkt = &mut pkt[..meta.total_len];
    let mut addr_delta = Delta::default();
    addr_delta.addr_v4(addr_v4(pkt, side), new);
    if !addr_delta.is_empty() {
        set_addr_v4(pkt, side, new);
        update_checksum(pkt, 10, &addr_delta).ok_or(Malformed)?;
    }
    if !meta.first_fragment {
        return Ok(());
    }
    let l4 = &mut pkt[meta.header_len..];
    if meta.protocol == PROTO_ICMP {
        // No pseudo-header: only the quoted packet of an error changes the ICMP checksum.
        let kind = *l4.first().ok_or(Malformed)?;
        if l4.len() < 8 {
            return Err(Malformed);
        }
        if is_icmpv4_error(kind) {
            let change = rewrite_quoted_v4(&mut l4[8..], side.reverse(), quoted)?;
            update_checksum(l4, 2, &change).ok_or(Malformed)?;
        }
        return Ok(());
    }
    rewrite_transport(l4, meta.protocol, &addr_delta, mss_limit)
}

/// Translates the packet quoted in an ICMPv4 error; returns the change of its bytes. Every
/// changed field sits at an even offset of the ICMP message, so the change adds up directly.
fn rewrite_quoted_v4(
    quoted_pkt: &mut [u8],
    side: Side,
    map: impl Fn(u32) -> Option<u32>,
) -> Result<Delta, Malformed> {
    let header = quoted_pkt.get(..20).ok_or(Malformed)?;
    let header_len = usize::from(header[0] & 0x0f) * 4;
    if header[0] >> 4 != 4 || header_len < 20 || header_len > quoted_pkt.len() {
        return Err(Malformed);
    }
    let protocol = header[9];
    let first_fragment = u16::from_be_bytes([header[6], header[7]]) & 0x1fff == 0;
    let old = addr_v4(quoted_pkt, side);
    let Some(new) = map(old).filter(|&new| new != old) else {
        return Ok(Delta::default());
    };

    let mut addr_delta = Delta::default();
    addr_delta.addr_v4(old, new);
    let mut change = addr_delta;
    set_addr_v4(quoted_pkt, side, new);
    change.merge(update_checksum(quoted_pkt, 10, &addr_delta).ok_or(Malformed)?);
    if first_fragment {
        let l4 = &mut quoted_pkt[header_len..];
        // Only 8 bytes of L4 are guaranteed to be quoted; fix the checksum when it is there.
        if let Some(l4_change) = update_l4_checksum(l4, protocol, &addr_delta) {
            change.merge(l4_change);
        }
    }
    Ok(change)
}

// ---------------------------------------------------------------------------------------------
// IPv6

const EXT_HOP_BY_HOP: u8 = 0;
const EXT_ROUTING: u8 = 43;
const EXT_FRAGMENT: u8 = 44;
const EXT_DEST_OPTS: u8 = 60;
const NO_NEXT_HEADER: u8 = 59;

/// The facts of a valid IPv6 packet that rewriting needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ipv6Meta {
    end: usize,
    /// The upper-layer protocol and its offset; `None` for later fragments and "no next header".
    transport: Option<(u8, usize)>,
}

impl Ipv6Meta {
    /// Validates the fixed header and walks the extension headers of `pkt`.
    #[inline]
    pub(crate) fn parse(pkt: &[u8]) -> Result<Self, Malformed> {
        let header = pkt.get(..40).ok_or(Malformed)?;
        if header[0] >> 4 != 6 {
            return Err(Malformed);
        }
        let end = 40 + usize::from(u16::from_be_bytes([header[4], header[5]]));
        let pkt = pkt.get(..end).ok_or(Malformed)?;
        Ok(Self {
            end,
            transport: walk_extensions(pkt, header[6], 40)?,
        })
    }
}

/// Follows the extension header chain from `next` at `offset` to the upper-layer header.
/// Headers whose rewriting would need more than the fixed addresses (a routing header with
/// segments left, AH, mobility, HIP, shim6, experiments) are unsupported.
#[inline]
fn walk_extensions(
    pkt: &[u8],
    mut next: u8,
    mut offset: usize,
) -> Result<Option<(u8, usize)>, Malformed> {
    loop {
        match next {
            EXT_HOP_BY_HOP | EXT_DEST_OPTS | EXT_ROUTING => {
                let header = pkt.get(offset..offset + 8).ok_or(Malformed)?;
                if next == EXT_ROUTING && header[3] != 0 {
                    return Err(Malformed);
                }
                next = header[0];
                offset += (usize::from(header[1]) + 1) * 8;
            }
            EXT_FRAGMENT => {
                let header = pkt.get(offset..offset + 8).ok_or(Malformed)?;
                next = header[0];
                offset += 8;
                if u16::from_be_bytes([header[2], header[3]]) >> 3 != 0 {
                    return Ok(None);
                }
            }
            NO_NEXT_HEADER => return Ok(None),
            51 | 135 | 139 | 140 | 253 | 254 => return Err(Malformed),
            protocol => {
                return if offset <= pkt.len() {
                    Ok(Some((protocol, offset)))
                } else {
                    Err(Malformed)
                };
            }
        }
    }
}

#[inline]
pub(crate) fn addr_v6(pkt: &[u8], side: Side) -> u128 {
    let at = if side == Side::Src { 8 } else { 24 };
    pkt.get(at..at + 16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u128::from_be_bytes)
}

#[inline]
fn set_addr_v6(pkt: &mut [u8], side: Side, addr: u128) {
    let at = if side == Side::Src { 8 } else { 24 };
    if let Some(bytes) = pkt.get_mut(at..at + 16) {
        bytes.copy_from_slice(&addr.to_be_bytes());
    }
}

/// Rewrites the `side` address of a parsed IPv6 packet to `new`; inside ICMPv6 errors the
/// quoted packet's opposite address is mapped by `quoted` (left alone when it returns `None`).
pub(crate) fn rewrite_v6(
    pkt: &mut [u8],
    meta: &Ipv6Meta,
    side: Side,
    new: u128,
    quoted: impl Fn(u128) -> Option<u128>,
    mss_limit: Option<u16>,
) -> Result<(), Malformed> {
    let pkt = &mut pkt[..meta.end];
    let mut addr_delta = Delta::default();
    addr_delta.addr_v6(addr_v6(pkt, side), new);
    set_addr_v6(pkt, side, new);
    let Some((protocol, offset)) = meta.transport else {
        return Ok(());
    };
    let l4 = &mut pkt[offset..];
    if protocol == PROTO_ICMPV6 {
        let kind = *l4.first().ok_or(Malformed)?;
        if l4.len() < 8 {
            return Err(Malformed);
        }
        let mut delta = addr_delta;
        if kind < 128 {
            delta.merge(rewrite_quoted_v6(&mut l4[8..], side.reverse(), quoted)?);
        }
        update_checksum(l4, 2, &delta).ok_or(Malformed)?;
        return Ok(());
    }
    rewrite_transport(l4, protocol, &addr_delta, mss_limit)
}

/// Translates the packet quoted in an ICMPv6 error; returns the change of its bytes.
fn rewrite_quoted_v6(
    quoted_pkt: &mut [u8],
    side: Side,
    map: impl Fn(u128) -> Option<u128>,
) -> Result<Delta, Malformed> {
    let header = quoted_pkt.get(..40).ok_or(Malformed)?;
    if header[0] >> 4 != 6 {
        return Err(Malformed);
    }
    let first_next = header[6];
    let old = addr_v6(quoted_pkt, side);
    let Some(new) = map(old).filter(|&new| new != old) else {
        return Ok(Delta::default());
    };
    let mut addr_delta = Delta::default();
    addr_delta.addr_v6(old, new);
    let mut change = addr_delta;
    set_addr_v6(quoted_pkt, side, new);
    // The quote may end anywhere: fix the L4 checksum only when it was quoted.
    if let Ok(Some((protocol, offset))) = walk_extensions(quoted_pkt, first_next, 40)
        && let Some(l4_change) =
            update_l4_checksum(&mut quoted_pkt[offset..], protocol, &addr_delta)
    {
        change.merge(l4_change);
    }
    Ok(change)
}
