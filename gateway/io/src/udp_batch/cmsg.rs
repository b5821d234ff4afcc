//! The control messages of the UDP sockets: what a received message says (its `UDP_GRO`
//! segment size, the local address it arrived at) and what an outgoing one asks for (a
//! `UDP_SEGMENT` size, the source address to send from).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kubetun_gateway_core::endpoint::LocalAddr;

/// `SOL_UDP` socket option: the segment size of a GSO send.
pub(super) const UDP_SEGMENT: libc::c_int = 103;
/// `SOL_UDP` socket option and control message: receive coalesced datagrams.
pub(super) const UDP_GRO: libc::c_int = 104;
/// Room for the control messages of one message: a `UDP_GRO`/`UDP_SEGMENT` size
/// (`CMSG_SPACE(4)`: 24 bytes on 64-bit Linux) and an `in6_pktinfo` (`CMSG_SPACE(20)`: 40),
/// with margin.
pub(super) const CONTROL_LEN: usize = 128;

/// A control-message buffer aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(super) struct Control(pub(super) [u8; CONTROL_LEN]);

/// What a received message's control data says.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct ReceivedControl {
    /// The `UDP_GRO` segment size.
    pub(super) gro_segment: Option<usize>,
    /// The local address from `IP_PKTINFO` / `IPV6_PKTINFO`.
    pub(super) local: Option<LocalAddr>,
}

/// Reads the control messages the receive options ask for out of a received message.
pub(super) fn received_control(msg: &libc::msghdr) -> ReceivedControl {
    let mut control = ReceivedControl::default();
    // SAFETY: `msg` was filled by `recvmmsg`: `msg_control`/`msg_controllen` describe the
    // control bytes the kernel wrote into our buffer, which the CMSG macros walk within
    // bounds; each payload is read unaligned as the type its level and type say it is, and
    // only when its length covers that type.
    #[allow(unsafe_code)]
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            let header = &*cmsg;
            let data = libc::CMSG_DATA(cmsg);
            let payload = (header.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            match (header.cmsg_level, header.cmsg_type) {
                (libc::SOL_UDP, UDP_GRO) if payload >= size_of::<libc::c_int>() => {
                    let size = data.cast::<libc::c_int>().read_unaligned();
                    control.gro_segment = usize::try_from(size).ok().filter(|size| *size > 0);
                }
                (libc::IPPROTO_IP, libc::IP_PKTINFO)
                    if payload >= size_of::<libc::in_pktinfo>() =>
                {
                    let info = data.cast::<libc::in_pktinfo>().read_unaligned();
                    control.local = Some(LocalAddr {
                        ip: IpAddr::V4(Ipv4Addr::from(info.ipi_spec_dst.s_addr.to_ne_bytes())),
                        ifindex: u32::try_from(info.ipi_ifindex).unwrap_or(0),
                    });
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                    if payload >= size_of::<libc::in6_pktinfo>() =>
                {
                    let info = data.cast::<libc::in6_pktinfo>().read_unaligned();
                    control.local = Some(LocalAddr {
                        ip: IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)),
                        ifindex: info.ipi6_ifindex,
                    });
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    control
}

/// Writes the control messages of one outgoing message into `control` and attaches them to
/// `msg`: a `UDP_SEGMENT` size for a GSO message, and the source address to send from.
pub(super) fn set_control(
    msg: &mut libc::msghdr,
    control: &mut Control,
    segment: Option<usize>,
    source: Option<LocalAddr>,
) {
    let mut writer = ControlWriter { control, used: 0 };
    if let Some(segment) = segment {
        let segment = u16::try_from(segment).unwrap_or(u16::MAX);
        writer.push(libc::SOL_UDP, UDP_SEGMENT, segment);
    }
    match source.map(|local| (local.ip, local.send_ifindex())) {
        Some((IpAddr::V4(ip), ifindex)) => writer.push(
            libc::IPPROTO_IP,
            libc::IP_PKTINFO,
            libc::in_pktinfo {
                ipi_ifindex: libc::c_int::try_from(ifindex).unwrap_or(0),
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from_ne_bytes(ip.octets()),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            },
        ),
        Some((IpAddr::V6(ip), ifindex)) => writer.push(
            libc::IPPROTO_IPV6,
            libc::IPV6_PKTINFO,
            libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: ip.octets(),
                },
                ipi6_ifindex: ifindex,
            },
        ),
        None => {}
    }
    let used = writer.used;
    if used > 0 {
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = used as _;
    } else {
        msg.msg_control = std::ptr::null_mut();
        msg.msg_controllen = 0;
    }
}

/// Appends control messages to a [`Control`] buffer.
struct ControlWriter<'a> {
    control: &'a mut Control,
    used: usize,
}

impl ControlWriter<'_> {
    /// Appends one control message carrying `value`.
    ///
    /// # Panics
    /// If it does not fit (a bug: [`CONTROL_LEN`] holds every combination we send).
    fn push<T: Copy>(&mut self, level: libc::c_int, kind: libc::c_int, value: T) {
        let len = size_of::<T>() as libc::c_uint;
        // SAFETY: CMSG_SPACE and CMSG_LEN are pure arithmetic.
        #[allow(unsafe_code)]
        let (space, cmsg_len) = unsafe { (libc::CMSG_SPACE(len) as usize, libc::CMSG_LEN(len)) };
        assert!(
            self.used + space <= CONTROL_LEN,
            "control messages overflow"
        );
        // SAFETY: the buffer is 8-aligned and `used` is a sum of CMSG_SPACE values (multiples
        // of the `cmsghdr` alignment), so the header is aligned; header and payload lie within
        // the `space` bytes checked above; the payload is written unaligned.
        #[allow(unsafe_code)]
        unsafe {
            let cmsg = self
                .control
                .0
                .as_mut_ptr()
                .add(self.used)
                .cast::<libc::cmsghdr>();
            (*cmsg).cmsg_level = level;
            (*cmsg).cmsg_type = kind;
            (*cmsg).cmsg_len = cmsg_len as _;
            libc::CMSG_DATA(cmsg).cast::<T>().write_unaligned(value);
        }
        self.used += space;
    }
}
