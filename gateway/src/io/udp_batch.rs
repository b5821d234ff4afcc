//! Batched UDP I/O for the WireGuard sockets.
//!
//! - Receive: one `recvmmsg` fills up to [`MAX_BATCH`] messages. With UDP GRO the kernel
//!   coalesces consecutive datagrams of one flow into one message of up to 64 KiB and reports
//!   the segment size in a `UDP_GRO` control message; [`RecvBatch::datagrams`] splits them
//!   again, so callers always see single WireGuard datagrams.
//! - Send: [`SendBatch`] is an arena the caller encrypts into directly. Consecutive datagrams
//!   to one endpoint of one size (only the last may be shorter) form one message that leaves
//!   with a `UDP_SEGMENT` (GSO) control message, at most [`MAX_GSO_SEGMENTS`] segments and
//!   [`MAX_UDP_PAYLOAD`] bytes, the rules of wireguard-go's `coalesceMessages`. One `sendmmsg`
//!   sends every message of the batch.
//! - Features are probed per socket ([`UdpOffload::configure`]). GSO is switched off for good
//!   when the kernel answers a segmented send with `EIO` (the egress device cannot checksum),
//!   and the pending messages are re-sent one datagram each; a segmented message refused as
//!   too large for the path is split the same way without disabling GSO.
//!
//! - Sticky sources: each received datagram carries the local address it arrived at
//!   (`IP_PKTINFO`, `IPV6_PKTINFO`), and each message to an [`Endpoint`] with a local address
//!   leaves from it. A local address that is gone (the kernel refuses the send) is dropped
//!   from the message, which is sent again with the kernel's choice.
//!
//! Nothing here allocates after construction. The `unsafe` blocks are the libc calls and the
//! reinterpretation of the socket addresses and control messages they fill in.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::Interest;
use tokio::net::UdpSocket;

use self::cmsg::{CONTROL_LEN, Control, UDP_GRO, UDP_SEGMENT, received_control, set_control};
use super::endpoint::{Endpoint, LocalAddr};

/// Most messages handled by one `recvmmsg` or `sendmmsg` call.
pub const MAX_BATCH: usize = 128;
/// Most segments in one GSO send (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Largest UDP payload of one message (65535 − 20 − 8), which bounds a GSO send's total.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Receive buffer per message: a GRO message can carry up to 64 KiB, and a shorter buffer
/// would truncate it.
pub const RECV_BUFFER_LEN: usize = 65_536;
/// Storage for an IPv4 or IPv6 socket address as the kernel reads and writes it.
#[derive(Clone, Copy)]
#[repr(C)]
union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawAddr {
    const EMPTY: RawAddr = RawAddr {
        v6: libc::sockaddr_in6 {
            sin6_family: 0,
            sin6_port: 0,
            sin6_flowinfo: 0,
            sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
            sin6_scope_id: 0,
        },
    };

    fn encode(addr: SocketAddr) -> (RawAddr, libc::socklen_t) {
        match addr {
            SocketAddr::V4(addr) => (
                RawAddr {
                    v4: libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: addr.port().to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from_ne_bytes(addr.ip().octets()),
                        },
                        sin_zero: [0; 8],
                    },
                },
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            SocketAddr::V6(addr) => (
                RawAddr {
                    v6: libc::sockaddr_in6 {
                        sin6_family: libc::AF_INET6 as libc::sa_family_t,
                        sin6_port: addr.port().to_be(),
                        sin6_flowinfo: addr.flowinfo().to_be(),
                        sin6_addr: libc::in6_addr {
                            s6_addr: addr.ip().octets(),
                        },
                        sin6_scope_id: addr.scope_id(),
                    },
                },
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }

    fn decode(&self, len: libc::socklen_t) -> Option<SocketAddr> {
        // SAFETY: both variants are plain integers, so any bytes are a valid value of either;
        // the family field, common to both, says which one the kernel wrote, and `len` that
        // it wrote all of it.
        #[allow(unsafe_code)]
        let (family, v4, v6) = unsafe { (self.v4.sin_family, self.v4, self.v6) };
        match libc::c_int::from(family) {
            libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(v4.sin_addr.s_addr.to_ne_bytes()),
                    u16::from_be(v4.sin_port),
                )))
            }
            libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(v6.sin6_addr.s6_addr),
                    u16::from_be(v6.sin6_port),
                    u32::from_be(v6.sin6_flowinfo),
                    v6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// The offloads in use on one socket. Shared by every task that sends on the socket, since
/// disabling GSO after an `EIO` concerns them all.
#[derive(Debug)]
pub struct UdpOffload {
    gso: AtomicBool,
    gro: bool,
}

impl UdpOffload {
    /// Enables what is wanted and supported on `socket`: GSO if the kernel knows
    /// `UDP_SEGMENT` (probed with `getsockopt`, as wireguard-go does), GRO by setting
    /// `UDP_GRO`. A socket with GRO on must only be read through [`RecvBatch`], whose buffers
    /// hold coalesced messages.
    pub fn configure(socket: &impl AsFd, want_gso: bool, want_gro: bool) -> Self {
        let fd = socket.as_fd();
        let gso = want_gso && getsockopt_udp(fd, UDP_SEGMENT).is_ok();
        let gro = want_gro && setsockopt_udp(fd, UDP_GRO, 1).is_ok();
        tracing::debug!(gso, gro, "UDP offloads");
        Self {
            gso: AtomicBool::new(gso),
            gro,
        }
    }

    /// No offloads: every datagram is its own message.
    pub fn none() -> Self {
        Self {
            gso: AtomicBool::new(false),
            gro: false,
        }
    }

    /// Whether sends may be segmented by the kernel.
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether the socket delivers coalesced datagrams.
    pub fn gro(&self) -> bool {
        self.gro
    }

    fn disable_gso(&self) {
        if self.gso.swap(false, Ordering::Relaxed) {
            tracing::warn!("UDP GSO send failed with EIO; continuing without GSO");
        }
    }
}

fn getsockopt_udp(fd: BorrowedFd<'_>, option: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a live descriptor; `value` and `len` are live locals, `len` holding the
    // exact size of `value`.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_UDP,
            option,
            (&raw mut value).cast(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn setsockopt_udp(fd: BorrowedFd<'_>, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, option, value)
}

fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor; the value is a live c_int whose size is passed.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            option,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What one received message holds.
#[derive(Debug, Clone, Copy)]
struct RecvMeta {
    source: Option<SocketAddr>,
    /// Our address the message was sent to, when the kernel said.
    local: Option<LocalAddr>,
    len: usize,
    /// The GRO segment size; equal to `len` for a single datagram.
    segment: usize,
}

/// Buffers for receiving up to `messages` messages per call.
pub struct RecvBatch {
    data: Box<[u8]>,
    names: Box<[RawAddr]>,
    controls: Box<[Control]>,
    metas: Box<[RecvMeta]>,
    filled: usize,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("messages", &self.metas.len())
            .field("filled", &self.filled)
            .finish()
    }
}

/// One received WireGuard datagram.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    pub source: SocketAddr,
    /// Our address it was sent to, when known.
    pub local: Option<LocalAddr>,
    pub bytes: &'a [u8],
    /// Where it sits in its batch, to find it again with [`RecvBatch::get`].
    pub position: Position,
}

impl Datagram<'_> {
    /// Where a reply goes: back to the source, from the address the datagram arrived at.
    pub fn reply_to(&self) -> Endpoint {
        Endpoint::reply(self.source, self.local)
    }
}

/// The place of a datagram in a [`RecvBatch`]: lets a caller keep a compact list of
/// datagrams (e.g. to group them by peer) without borrowing the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    start: u32,
    len: u32,
    message: u32,
}

impl RecvBatch {
    /// Room for `messages` messages (1..=[`MAX_BATCH`]) of [`RECV_BUFFER_LEN`] bytes each.
    pub fn new(messages: usize) -> Self {
        let messages = messages.clamp(1, MAX_BATCH);
        let empty = RecvMeta {
            source: None,
            local: None,
            len: 0,
            segment: 0,
        };
        Self {
            data: vec![0u8; messages * RECV_BUFFER_LEN].into_boxed_slice(),
            names: vec![RawAddr::EMPTY; messages].into_boxed_slice(),
            controls: vec![Control([0; CONTROL_LEN]); messages].into_boxed_slice(),
            metas: vec![empty; messages].into_boxed_slice(),
            filled: 0,
        }
    }

    /// Receives what is queued on `fd` without blocking: `Err(WouldBlock)` when nothing is.
    /// Returns the number of messages; with GRO one message can carry many datagrams.
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.filled = 0;
        let count = self.metas.len();
        // SAFETY: `iovec` and `mmsghdr` are plain C structs of integers and raw pointers, for
        // which all-zero bytes are a valid (empty) value.
        #[allow(unsafe_code)]
        let (mut iovecs, mut headers): (
            [libc::iovec; MAX_BATCH],
            [libc::mmsghdr; MAX_BATCH],
        ) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let buffers = self.data.chunks_mut(RECV_BUFFER_LEN);
        let slots = iovecs
            .iter_mut()
            .zip(headers.iter_mut())
            .zip(buffers)
            .zip(self.names.iter_mut().zip(self.controls.iter_mut()));
        for (((iovec, header), buffer), (name, control)) in slots {
            iovec.iov_base = buffer.as_mut_ptr().cast();
            iovec.iov_len = buffer.len();
            let msg = &mut header.msg_hdr;
            msg.msg_name = (name as *mut RawAddr).cast();
            msg.msg_namelen = size_of::<RawAddr>() as libc::socklen_t;
            msg.msg_iov = iovec;
            msg.msg_iovlen = 1;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = CONTROL_LEN as _;
        }
        let received = loop {
            // SAFETY: the first `count` headers point at live, exclusively borrowed buffers of
            // `self` (data, names, controls) and at `iovecs`, all outliving the call, with
            // their true lengths.
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::recvmmsg(
                    fd.as_raw_fd(),
                    headers.as_mut_ptr(),
                    count as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if rc >= 0 {
                break rc as usize;
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        };
        for (index, header) in headers[..received].iter().enumerate() {
            let msg = &header.msg_hdr;
            let len = header.msg_len as usize;
            let truncated = msg.msg_flags & libc::MSG_TRUNC != 0;
            let source = if truncated {
                None
            } else {
                self.names[index].decode(msg.msg_namelen)
            };
            let control = received_control(msg);
            let segment = control.gro_segment.unwrap_or(len).min(len);
            self.metas[index] = RecvMeta {
                source,
                local: control.local,
                len,
                segment,
            };
        }
        self.filled = received;
        Ok(received)
    }

    /// Waits until `socket` is readable and receives (see [`RecvBatch::recv`]).
    pub async fn recv_from(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        socket
            .async_io(Interest::READABLE, || self.recv(socket.as_fd()))
            .await
    }

    /// The datagrams of the last receive, in arrival order, coalesced messages split at their
    /// segment size. Truncated messages and unknown source families are left out.
    pub fn datagrams(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.metas[..self.filled]
            .iter()
            .enumerate()
            .filter_map(|(message, meta)| Some((message, meta.source?, meta)))
            .flat_map(move |(message, source, meta)| {
                let local = meta.local;
                let base = message * RECV_BUFFER_LEN;
                let segment = meta.segment.max(1);
                (0..meta.len).step_by(segment).map(move |offset| {
                    let len = segment.min(meta.len - offset);
                    let start = base + offset;
                    Datagram {
                        source,
                        local,
                        bytes: &self.data[start..start + len],
                        position: Position {
                            start: start as u32,
                            len: len as u32,
                            message: message as u32,
                        },
                    }
                })
            })
    }

    /// The datagram at `position` of the last receive.
    ///
    /// # Panics
    /// If `position` does not come from the last receive of this batch.
    pub fn get(&self, position: Position) -> Datagram<'_> {
        let start = position.start as usize;
        let meta = &self.metas[..self.filled][position.message as usize];
        let source = meta.source.expect("position of a received datagram");
        Datagram {
            source,
            local: meta.local,
            bytes: &self.data[start..start + position.len as usize],
            position,
        }
    }

    /// Forgets the last receive.
    pub fn clear(&mut self) {
        self.filled = 0;
    }

    /// Adds `datagram` from `source` as the next message, as a receive would (without GRO);
    /// `false` (nothing added) when every message is in use or it is longer than a message.
    /// Lets the data-path core be driven without a socket.
    pub fn push(&mut self, source: SocketAddr, datagram: &[u8]) -> bool {
        self.push_to(source, None, datagram)
    }

    /// [`Self::push`] of a datagram that arrived at our address `local`.
    pub fn push_to(
        &mut self,
        source: SocketAddr,
        local: Option<LocalAddr>,
        datagram: &[u8],
    ) -> bool {
        if self.filled == self.metas.len() || datagram.len() > RECV_BUFFER_LEN {
            return false;
        }
        let start = self.filled * RECV_BUFFER_LEN;
        self.data[start..start + datagram.len()].copy_from_slice(datagram);
        self.metas[self.filled] = RecvMeta {
            source: Some(source),
            local,
            len: datagram.len(),
            segment: datagram.len(),
        };
        self.filled += 1;
        true
    }

    /// How many messages the last receive left out: truncated, or with a source of an
    /// unknown family.
    pub fn rejected(&self) -> usize {
        self.metas[..self.filled]
            .iter()
            .filter(|meta| meta.source.is_none())
            .count()
    }
}

/// Asks the kernel to report, with every datagram received on `fd`, the local address it
/// was sent to (`IP_PKTINFO` on IPv4, `IPV6_RECVPKTINFO` on IPv6 sockets).
pub fn receive_local_addresses(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<()> {
    let (level, option) = if ipv6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO)
    } else {
        (libc::IPPROTO_IP, libc::IP_PKTINFO)
    };
    setsockopt_int(fd, level, option, 1)
}

/// One outgoing message: `count` datagrams to `dest`, contiguous in the arena, each
/// `segment` bytes except possibly the last.
#[derive(Debug, Clone, Copy)]
struct Message {
    dest: Endpoint,
    start: usize,
    len: usize,
    segment: usize,
    count: usize,
    /// Whether more datagrams may join (no shorter tail yet).
    open: bool,
}

/// The result of a flush.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendReport {
    /// Datagrams the kernel accepted.
    pub sent: usize,
    /// Datagrams dropped because their message failed.
    pub failed: usize,
    /// `sendmmsg` calls made.
    pub calls: usize,
    /// Messages whose local address was no longer ours: they left from the kernel's choice
    /// instead. The peer's next datagram pins its endpoint to where it arrived.
    pub unpinned: usize,
}

/// An arena of outgoing datagrams, coalesced into GSO messages as they are committed.
pub struct SendBatch {
    data: Box<[u8]>,
    used: usize,
    messages: Vec<Message>,
    max_datagrams: usize,
    datagrams: usize,
    /// First message not yet handed to the kernel.
    cursor: usize,
    report: SendReport,
    last_error: Option<io::Error>,
    /// Control messages, one buffer per message of a `sendmmsg` (messages never outnumber
    /// datagrams); made once, rewritten per send.
    controls: Box<[Control]>,
}

impl std::fmt::Debug for SendBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("datagrams", &self.datagrams)
            .field("messages", &self.messages.len())
            .field("bytes", &self.used)
            .finish()
    }
}

impl SendBatch {
    /// Room for `max_datagrams` datagrams (1..=[`MAX_BATCH`]) totalling `bytes`.
    pub fn new(max_datagrams: usize, bytes: usize) -> Self {
        let max_datagrams = max_datagrams.clamp(1, MAX_BATCH);
        Self {
            data: vec![0u8; bytes].into_boxed_slice(),
            used: 0,
            messages: Vec::with_capacity(max_datagrams),
            max_datagrams,
            datagrams: 0,
            cursor: 0,
            report: SendReport::default(),
            last_error: None,
            controls: vec![Control([0; CONTROL_LEN]); max_datagrams].into_boxed_slice(),
        }
    }

    /// Datagrams waiting to be sent.
    pub fn len(&self) -> usize {
        self.datagrams
    }

    /// Whether nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// Messages the waiting datagrams form (what one `sendmmsg` would carry with GSO).
    pub fn messages(&self) -> usize {
        self.messages.len()
    }

    /// Writable space for the next datagram if at least `needed` bytes and a datagram slot
    /// are free; `None` means flush first. Write the datagram at the start of the returned
    /// slice, then [`SendBatch::commit`] it.
    pub fn space(&mut self, needed: usize) -> Option<&mut [u8]> {
        if self.datagrams == self.max_datagrams || self.data.len() - self.used < needed {
            return None;
        }
        Some(&mut self.data[self.used..])
    }

    /// Adds the `len` bytes just written at the start of [`SendBatch::space`] as a datagram
    /// to `dest`, joining the previous message when GSO may carry both.
    pub fn commit(&mut self, dest: Endpoint, len: usize) {
        assert!(
            self.datagrams < self.max_datagrams && len <= self.data.len() - self.used,
            "commit without space"
        );
        let start = self.used;
        self.used += len;
        self.datagrams += 1;
        if let Some(last) = self.messages.last_mut()
            && last.open
            && last.dest == dest
            && len <= last.segment
            && last.count < MAX_GSO_SEGMENTS
            && last.len + len <= MAX_UDP_PAYLOAD
        {
            last.len += len;
            last.count += 1;
            last.open = len == last.segment;
            return;
        }
        self.messages.push(Message {
            dest,
            start,
            len,
            segment: len,
            count: 1,
            open: len > 0,
        });
    }

    /// Copies `datagram` in and commits it; `false` (nothing added) when the batch is full.
    pub fn push(&mut self, dest: impl Into<Endpoint>, datagram: &[u8]) -> bool {
        let Some(space) = self.space(datagram.len()) else {
            return false;
        };
        space[..datagram.len()].copy_from_slice(datagram);
        self.commit(dest.into(), datagram.len());
        true
    }

    /// Sends what is pending on `fd` without blocking. `Err(WouldBlock)` means the socket
    /// buffer is full: wait for writability and call again, it resumes where it stopped. A
    /// message the kernel refuses for another reason is dropped and counted; when everything
    /// has been handed over the batch is empty again and the report is returned.
    pub fn send(&mut self, fd: BorrowedFd<'_>, offload: &UdpOffload) -> io::Result<SendReport> {
        if !offload.gso() {
            self.split_from(self.cursor);
        }
        while self.cursor < self.messages.len() {
            let pending = &self.messages[self.cursor..];
            let count = pending.len().min(MAX_BATCH);
            let mut names = [RawAddr::EMPTY; MAX_BATCH];
            // SAFETY: as in `RecvBatch::recv`, all-zero bytes are a valid value of these
            // plain C structs.
            #[allow(unsafe_code)]
            let (mut iovecs, mut headers): (
                [libc::iovec; MAX_BATCH],
                [libc::mmsghdr; MAX_BATCH],
            ) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
            for (index, message) in pending[..count].iter().enumerate() {
                let (name, name_len) = RawAddr::encode(message.dest.remote);
                names[index] = name;
                let bytes = &self.data[message.start..message.start + message.len];
                iovecs[index].iov_base = bytes.as_ptr().cast_mut().cast();
                iovecs[index].iov_len = bytes.len();
                let msg = &mut headers[index].msg_hdr;
                msg.msg_name = (&raw mut names[index]).cast();
                msg.msg_namelen = name_len;
                msg.msg_iov = &raw mut iovecs[index];
                msg.msg_iovlen = 1;
                let segment = (message.count > 1).then_some(message.segment);
                set_control(msg, &mut self.controls[index], segment, message.dest.local);
            }
            // SAFETY: every header points at live locals (names, iovecs) and at the arena and
            // control buffers of `self`, which are not written during the call; the kernel
            // only reads them.
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::sendmmsg(
                    fd.as_raw_fd(),
                    headers.as_mut_ptr(),
                    count as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            self.report.calls += 1;
            if rc > 0 {
                let sent = rc as usize;
                let datagrams: usize = self.messages[self.cursor..self.cursor + sent]
                    .iter()
                    .map(|m| m.count)
                    .sum();
                self.report.sent += datagrams;
                self.cursor += sent;
                continue;
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Err(error),
                _ => {}
            }
            let first = self.messages[self.cursor];
            let errno = error.raw_os_error().unwrap_or(0);
            if source_refused(errno)
                && let Some(local) = first.dest.local
            {
                tracing::debug!(local = %local.ip, "local address gone; sending from another");
                self.report.unpinned += self.unpin_from(self.cursor, local);
            } else if first.count > 1 && errno == libc::EIO {
                offload.disable_gso();
                self.split_from(self.cursor);
            } else if first.count > 1 && matches!(errno, libc::EINVAL | libc::EMSGSIZE) {
                tracing::debug!(%error, segment = first.segment, "GSO send refused; splitting");
                self.split_from(self.cursor);
            } else {
                tracing::trace!(%error, dest = %first.dest.remote, "UDP send failed");
                self.report.failed += first.count;
                self.cursor += 1;
                self.last_error = Some(error);
            }
        }
        let report = self.report;
        self.clear();
        Ok(report)
    }

    /// Waits for writability as needed and sends everything pending on `socket`.
    pub async fn send_to(
        &mut self,
        socket: &UdpSocket,
        offload: &UdpOffload,
    ) -> io::Result<SendReport> {
        if self.is_empty() {
            return Ok(SendReport::default());
        }
        socket
            .async_io(Interest::WRITABLE, || self.send(socket.as_fd(), offload))
            .await
    }

    /// The error of the last failed message of the last flush, if any.
    pub fn take_last_error(&mut self) -> Option<io::Error> {
        self.last_error.take()
    }

    /// The datagrams waiting to be sent with their destinations, in commit order (GSO
    /// messages split at their segment size).
    pub fn datagrams(&self) -> impl Iterator<Item = (Endpoint, &[u8])> {
        self.messages[self.cursor..]
            .iter()
            .flat_map(move |message| {
                let bytes = &self.data[message.start..message.start + message.len];
                bytes
                    .chunks(message.segment.max(1))
                    .map(move |datagram| (message.dest, datagram))
            })
    }

    /// Drops everything pending.
    pub fn clear(&mut self) {
        self.used = 0;
        self.datagrams = 0;
        self.cursor = 0;
        self.messages.clear();
        self.report = SendReport::default();
    }

    /// Lets the messages from `from` on that leave from `local` leave from the kernel's
    /// choice instead; returns how many.
    fn unpin_from(&mut self, from: usize, local: LocalAddr) -> usize {
        let mut unpinned = 0;
        for message in &mut self.messages[from..] {
            if message.dest.local == Some(local) {
                message.dest.local = None;
                unpinned += 1;
            }
        }
        unpinned
    }

    /// Rewrites the messages from `from` on as one message per datagram, in order. There
    /// is always room: messages never outnumber datagrams, which are at most the capacity.
    fn split_from(&mut self, from: usize) {
        let tail: usize = self.messages[from..].iter().map(|m| m.count).sum();
        let old_len = self.messages.len();
        let new_len = from + tail;
        if new_len == old_len {
            return;
        }
        let filler = self.messages[from];
        self.messages.resize(new_len, filler);
        let mut write = new_len;
        for read in (from..old_len).rev() {
            let message = self.messages[read];
            for segment in (0..message.count).rev() {
                let start = message.start + segment * message.segment;
                let end = (start + message.segment).min(message.start + message.len);
                write -= 1;
                self.messages[write] = Message {
                    dest: message.dest,
                    start,
                    len: end - start,
                    segment: end - start,
                    count: 1,
                    open: false,
                };
            }
        }
    }
}

/// Whether a send from a pinned local address failed with what the kernel answers when that
/// address is no longer ours: `EINVAL` (IPv6, and IPv4 on older kernels), `ENETUNREACH` (IPv4
/// route lookups since Linux 5.x), `EADDRNOTAVAIL`. A send that fails the same way without the
/// pin is counted as failed as usual.
fn source_refused(errno: i32) -> bool {
    matches!(
        errno,
        libc::EINVAL | libc::ENETUNREACH | libc::EADDRNOTAVAIL
    )
}

/// Sends one datagram to `to` on `fd` without blocking, from `to`'s local address if it has
/// one. A local address that is no longer ours is dropped and the datagram sent again with
/// the kernel's choice; the result says whether that happened (`Ok(true)`).
pub fn send_datagram(fd: BorrowedFd<'_>, datagram: &[u8], to: Endpoint) -> io::Result<bool> {
    let (mut name, name_len) = RawAddr::encode(to.remote);
    let mut iovec = libc::iovec {
        iov_base: datagram.as_ptr().cast_mut().cast(),
        iov_len: datagram.len(),
    };
    let mut control = Control([0; CONTROL_LEN]);
    let mut local = to.local;
    loop {
        // SAFETY: as in `RecvBatch::recv`, all-zero bytes are a valid `msghdr`.
        #[allow(unsafe_code)]
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&raw mut name).cast();
        msg.msg_namelen = name_len;
        msg.msg_iov = &raw mut iovec;
        msg.msg_iovlen = 1;
        set_control(&mut msg, &mut control, None, local);
        // SAFETY: `msg` points at live locals (name, iovec, control) and at `datagram`, which
        // the kernel only reads during the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::sendmsg(fd.as_raw_fd(), &raw const msg, libc::MSG_DONTWAIT) };
        if rc >= 0 {
            return Ok(local.is_none() && to.local.is_some());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(errno) if source_refused(errno) && local.is_some() => local = None,
            _ => return Err(error),
        }
    }
}

mod cmsg;
#[cfg(test)]
mod tests;
