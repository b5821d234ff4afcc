//! Batched UDP I/O for the WireGuard sockets: the syscalls that fill and drain the core's
//! batch arenas ([`kubetun_gateway_core::batch`], re-exported here).
//!
//! - Receive: [`BatchReceiver`] fills a [`RecvBatch`] with one `recvmmsg` of up to
//!   [`MAX_BATCH`] messages. With UDP GRO the kernel coalesces consecutive datagrams of one
//!   flow into one message of up to 64 KiB and reports the segment size in a `UDP_GRO`
//!   control message; the arena splits them again.
//! - Send: [`BatchSender`] hands a [`SendBatch`]'s messages to one `sendmmsg`, each GSO
//!   message with a `UDP_SEGMENT` control message.
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
use kubetun_gateway_core::batch::{MAX_BATCH, Received, RecvBatch, SendBatch, SendReport};
use kubetun_gateway_core::endpoint::Endpoint;

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

/// The kernel's side of receiving into a [`RecvBatch`]: the source addresses and control
/// messages of up to [`MAX_BATCH`] messages, made once.
pub struct BatchReceiver {
    names: Box<[RawAddr]>,
    controls: Box<[Control]>,
}

impl std::fmt::Debug for BatchReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchReceiver")
            .field("messages", &self.names.len())
            .finish()
    }
}

impl Default for BatchReceiver {
    fn default() -> Self {
        Self {
            names: vec![RawAddr::EMPTY; MAX_BATCH].into_boxed_slice(),
            controls: vec![Control([0; CONTROL_LEN]); MAX_BATCH].into_boxed_slice(),
        }
    }
}

impl BatchReceiver {
    /// Receives what is queued on `fd` into `batch` without blocking: `Err(WouldBlock)` when
    /// nothing is. Returns the number of messages; with GRO one message can carry many
    /// datagrams.
    pub fn recv(&mut self, batch: &mut RecvBatch, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let count = batch.capacity().min(MAX_BATCH);
        // SAFETY: `iovec` and `mmsghdr` are plain C structs of integers and raw pointers, for
        // which all-zero bytes are a valid (empty) value.
        #[allow(unsafe_code)]
        let (mut iovecs, mut headers): (
            [libc::iovec; MAX_BATCH],
            [libc::mmsghdr; MAX_BATCH],
        ) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let slots = iovecs
            .iter_mut()
            .zip(headers.iter_mut())
            .zip(batch.buffers_mut())
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
            // SAFETY: the first `count` headers point at live, exclusively borrowed buffers
            // (the batch's message buffers, `self`'s names and controls) and at `iovecs`, all
            // outliving the call, with their true lengths.
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
            batch.record(Received {
                source,
                local: control.local,
                len,
                segment,
            });
        }
        Ok(received)
    }

    /// Waits until `socket` is readable and receives into `batch` (see [`Self::recv`]).
    pub async fn recv_from(
        &mut self,
        batch: &mut RecvBatch,
        socket: &UdpSocket,
    ) -> io::Result<usize> {
        socket
            .async_io(Interest::READABLE, || self.recv(batch, socket.as_fd()))
            .await
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

/// The kernel's side of sending a [`SendBatch`]: the control messages of up to
/// [`MAX_BATCH`] messages, made once, and the last failure.
pub struct BatchSender {
    controls: Box<[Control]>,
    last_error: Option<io::Error>,
}

impl std::fmt::Debug for BatchSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSender")
            .field("last_error", &self.last_error)
            .finish_non_exhaustive()
    }
}

impl Default for BatchSender {
    fn default() -> Self {
        Self {
            controls: vec![Control([0; CONTROL_LEN]); MAX_BATCH].into_boxed_slice(),
            last_error: None,
        }
    }
}

impl BatchSender {
    /// Sends what `batch` holds on `fd` without blocking. `Err(WouldBlock)` means the socket
    /// buffer is full: wait for writability and call again, it resumes where it stopped. A
    /// message the kernel refuses for another reason is dropped and counted; when everything
    /// has been handed over the batch is empty again and the report is returned.
    pub fn send(
        &mut self,
        batch: &mut SendBatch,
        fd: BorrowedFd<'_>,
        offload: &UdpOffload,
    ) -> io::Result<SendReport> {
        if !offload.gso() {
            batch.split_pending();
        }
        while !batch.pending().is_empty() {
            let pending = batch.pending();
            let count = pending.len().min(MAX_BATCH);
            let mut names = [RawAddr::EMPTY; MAX_BATCH];
            // SAFETY: as in `BatchReceiver::recv`, all-zero bytes are a valid value of these
            // plain C structs.
            #[allow(unsafe_code)]
            let (mut iovecs, mut headers): (
                [libc::iovec; MAX_BATCH],
                [libc::mmsghdr; MAX_BATCH],
            ) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
            for (index, message) in pending[..count].iter().enumerate() {
                let (name, name_len) = RawAddr::encode(message.dest.remote);
                names[index] = name;
                let bytes = batch.bytes(message);
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
            // SAFETY: every header points at live locals (names, iovecs), at the batch's
            // arena and at `self`'s control buffers, none written during the call; the kernel
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
            batch.count_call();
            if rc > 0 {
                batch.sent(rc as usize);
                continue;
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Err(error),
                _ => {}
            }
            let first = batch.pending()[0];
            let errno = error.raw_os_error().unwrap_or(0);
            if source_refused(errno)
                && let Some(local) = first.dest.local
            {
                tracing::debug!(local = %local.ip, "local address gone; sending from another");
                batch.unpin_pending(local);
            } else if first.count > 1 && errno == libc::EIO {
                offload.disable_gso();
                batch.split_pending();
            } else if first.count > 1 && matches!(errno, libc::EINVAL | libc::EMSGSIZE) {
                tracing::debug!(%error, segment = first.segment, "GSO send refused; splitting");
                batch.split_pending();
            } else {
                tracing::trace!(%error, dest = %first.dest.remote, "UDP send failed");
                batch.fail_first();
                self.last_error = Some(error);
            }
        }
        Ok(batch.finish())
    }

    /// Waits for writability as needed and sends everything `batch` holds on `socket`.
    pub async fn send_to(
        &mut self,
        batch: &mut SendBatch,
        socket: &UdpSocket,
        offload: &UdpOffload,
    ) -> io::Result<SendReport> {
        if batch.is_empty() {
            return Ok(SendReport::default());
        }
        socket
            .async_io(Interest::WRITABLE, || {
                self.send(batch, socket.as_fd(), offload)
            })
            .await
    }

    /// The error of the last failed message of the last flush, if any.
    pub fn take_last_error(&mut self) -> Option<io::Error> {
        self.last_error.take()
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
        // SAFETY: as in `BatchReceiver::recv`, all-zero bytes are a valid `msghdr`.
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
