//! The UDP sockets of the device: IPv4 and IPv6 (v6-only) sockets on the same port, with
//! large kernel buffers, an optional firewall mark, and the UDP offloads (GSO, GRO) the
//! kernel supports and the [`IoOptions`] allow.
//!
//! With one queue ([`IoOptions::queues`]) each family has one socket. With N queues each
//! family has a `SO_REUSEPORT` group of N sockets on the port: the kernel picks the socket
//! of an incoming datagram by a hash of its 4-tuple, so all datagrams of one peer endpoint
//! reach the same socket (and its one reader task) in the order they arrived, while
//! different peers spread over the readers. Any socket of a group can send, with the same
//! source address and port.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use crate::io_options::IoOptions;
use kubetun_gateway_core::drops::{DeviceDrop, Drops};
use kubetun_gateway_core::endpoint::Endpoint;
use kubetun_gateway_core::transmits::Transmits;
use kubetun_gateway_io::udp_batch::{UdpOffload, receive_local_addresses, send_datagram};

/// Kernel socket buffer size asked for (the same 7 MiB upstream wireguard-go uses): without it
/// the decrypting side overflows its receive queue under TCP load.
pub const SOCKET_BUFFER_BYTES: usize = 7 << 20;

/// One bound socket and the offloads in use on it.
#[derive(Debug)]
pub struct WgSocket {
    pub udp: UdpSocket,
    /// GSO/GRO state, shared by every task sending on the socket.
    pub offload: UdpOffload,
}

/// The bound sockets: per family one socket per data-path queue. IPv6 may be missing
/// (empty, e.g. IPv6 disabled); IPv4 never is.
#[derive(Debug)]
pub struct Sockets {
    /// The IPv4 sockets, one per queue.
    pub v4: Vec<Arc<WgSocket>>,
    /// The IPv6 sockets, one per queue; empty without IPv6.
    pub v6: Vec<Arc<WgSocket>>,
    /// The port all are bound to.
    pub port: u16,
}

impl Sockets {
    /// Binds both families on `port` (0: a kernel-chosen port, shared by both), one socket
    /// per queue of `io` ([`IoOptions::queues`]), with the UDP offloads `io` allows.
    pub fn bind(port: u16, fwmark: u32, io: &IoOptions) -> io::Result<Sockets> {
        let v4 = bind_family(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), fwmark, io)?;
        let port = v4[0].udp.local_addr()?.port();
        let v6 = match bind_family(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)), fwmark, io) {
            Ok(sockets) => sockets,
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => return Err(error),
            Err(error) => {
                tracing::warn!(%error, "IPv6 UDP socket unavailable; continuing with IPv4 only");
                Vec::new()
            }
        };
        Ok(Sockets { v4, v6, port })
    }

    /// The family's sockets for `addr`.
    fn family(&self, addr: &SocketAddr) -> &[Arc<WgSocket>] {
        match addr {
            SocketAddr::V4(_) => &self.v4,
            SocketAddr::V6(_) => &self.v6,
        }
    }

    /// A socket that can reach `addr` (the family's first), for sends off the data path.
    pub fn for_addr(&self, addr: &SocketAddr) -> Option<&WgSocket> {
        self.family(addr).first().map(Arc::as_ref)
    }

    /// The socket of data-path queue `queue` that can reach `addr`.
    pub fn for_queue(&self, addr: &SocketAddr, queue: usize) -> Option<&WgSocket> {
        queue_socket(self.family(addr), queue)
    }

    /// Every socket with its queue index, IPv4 first.
    pub fn queues(&self) -> impl Iterator<Item = (usize, &Arc<WgSocket>)> {
        self.v4.iter().enumerate().chain(self.v6.iter().enumerate())
    }

    /// Sets `SO_MARK` on every socket (0 clears it).
    pub fn set_fwmark(&self, fwmark: u32) -> io::Result<()> {
        for (_, socket) in self.queues() {
            socket2::SockRef::from(&socket.udp).set_mark(fwmark)?;
        }
        Ok(())
    }
}

/// Sends the core's single datagrams ([`Transmits`]) on the family's first socket without
/// waiting, from the endpoint's local address when it has one: the sockets are non-blocking,
/// and a full send buffer drops the datagram (counted as `udp_send`), as the kernel would.
#[derive(Debug)]
pub struct Sender<'a> {
    sockets: &'a Sockets,
    drops: &'a Drops,
}

impl<'a> Sender<'a> {
    /// Sends on `sockets`, counting failures in `drops`.
    pub fn new(sockets: &'a Sockets, drops: &'a Drops) -> Self {
        Self { sockets, drops }
    }
}

impl Sender<'_> {
    /// Sends every datagram `out` holds, in order, records those that left for their peers,
    /// and empties it.
    pub fn send(&mut self, out: &mut Transmits) {
        for transmit in out.iter() {
            if self.transmit(transmit.datagram, transmit.endpoint()) {
                transmit.sent();
            }
        }
        out.clear();
    }

    /// Sends `datagram` to `endpoint` without waiting; true when it left.
    fn transmit(&mut self, datagram: &[u8], endpoint: Endpoint) -> bool {
        let Some(socket) = self.sockets.for_addr(&endpoint.remote) else {
            self.drops.device(DeviceDrop::UdpSend);
            return false;
        };
        match send_datagram(socket.udp.as_fd(), datagram, endpoint) {
            Ok(_) => true,
            Err(error) => {
                tracing::trace!(%error, %endpoint, "UDP send failed");
                self.drops.device(DeviceDrop::UdpSend);
                false
            }
        }
    }
}

/// The socket of data-path queue `queue` among one family's `sockets`; queues beyond the
/// sockets wrap around. `None` when the family has no socket.
pub fn queue_socket(sockets: &[Arc<WgSocket>], queue: usize) -> Option<&WgSocket> {
    sockets
        .get(queue.checked_rem(sockets.len())?)
        .map(Arc::as_ref)
}

/// Binds one socket on `addr`, or with several queues a `SO_REUSEPORT` group of one socket
/// per queue.
///
/// The port of a group is first claimed by a plain socket, then released and the group
/// bound on it. The plain bind fails with `AddrInUse` when anyone holds the port (another
/// group of the same user included, which a reuse-port bind would silently join and share
/// the traffic with), and on port 0 it picks a port no group uses: a reuse-port bind on
/// port 0 may pick the port of another group of the same user.
fn bind_family(addr: SocketAddr, fwmark: u32, io: &IoOptions) -> io::Result<Vec<Arc<WgSocket>>> {
    let queues = io.queues();
    if queues == 1 {
        return Ok(vec![Arc::new(bind_one(addr, fwmark, io, false)?)]);
    }
    let claimed = {
        let probe = new_socket(addr)?;
        probe.bind(&addr.into())?;
        probe.local_addr()?.as_socket().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "bound address of unknown family",
            )
        })?
    };
    (0..queues)
        .map(|_| bind_one(claimed, fwmark, io, true).map(Arc::new))
        .collect()
}

fn new_socket(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    Ok(socket)
}

fn bind_one(
    addr: SocketAddr,
    fwmark: u32,
    io: &IoOptions,
    reuse_port: bool,
) -> io::Result<WgSocket> {
    let socket = new_socket(addr)?;
    socket.set_nonblocking(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if fwmark != 0 {
        socket.set_mark(fwmark)?;
    }
    set_buffer(&socket, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF);
    set_buffer(&socket, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF);
    socket.bind(&addr.into())?;
    // Replies leave from the address the peer sent to (see `kubetun_gateway_core::endpoint`); without the
    // option every reply takes the kernel's choice of source, which still works.
    if let Err(error) = receive_local_addresses(socket.as_fd(), addr.is_ipv6()) {
        tracing::warn!(%error, %addr, "cannot learn the local address of received datagrams");
    }
    let offload = UdpOffload::configure(&socket, io.udp_gso, io.udp_gro);
    Ok(WgSocket {
        udp: UdpSocket::from_std(socket.into())?,
        offload,
    })
}

/// Asks for [`SOCKET_BUFFER_BYTES`], first with the `*FORCE` option (needs CAP_NET_ADMIN,
/// ignores `rmem_max`), then with the plain option, which the kernel caps at the sysctl limit.
fn set_buffer(socket: &Socket, force: libc::c_int, plain: libc::c_int) {
    let size = libc::c_int::try_from(SOCKET_BUFFER_BYTES).unwrap_or(libc::c_int::MAX);
    if setsockopt_int(socket, force, size).is_err()
        && let Err(error) = setsockopt_int(socket, plain, size)
    {
        tracing::warn!(%error, "cannot enlarge UDP socket buffer");
    }
}

fn setsockopt_int(socket: &Socket, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `socket` owns a valid descriptor for the duration of the call, and the option
    // value is a live c_int whose exact size is passed as the length.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
