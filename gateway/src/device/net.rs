//! The UDP sockets of the device: one IPv4 and one IPv6 (v6-only) socket on the same port,
//! with large kernel buffers, an optional firewall mark, and the UDP offloads (GSO, GRO) the
//! kernel supports and the [`IoOptions`] allow.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use crate::io::IoOptions;
use crate::io::udp_batch::UdpOffload;

/// Kernel socket buffer size asked for (the same 7 MiB upstream wireguard-go uses): without it
/// the decrypting side overflows its receive queue under TCP load.
pub const SOCKET_BUFFER_BYTES: usize = 7 << 20;

/// One bound socket and the offloads in use on it.
#[derive(Debug)]
pub struct WgSocket {
    /// The socket.
    pub udp: UdpSocket,
    /// GSO/GRO state, shared by every task sending on the socket.
    pub offload: UdpOffload,
}

/// The bound sockets. Either may be missing (e.g. IPv6 disabled), not both.
#[derive(Debug)]
pub struct Sockets {
    /// The IPv4 socket.
    pub v4: Option<Arc<WgSocket>>,
    /// The IPv6 socket.
    pub v6: Option<Arc<WgSocket>>,
    /// The port both are bound to.
    pub port: u16,
}

impl Sockets {
    /// Binds both families on `port` (0: a kernel-chosen port, shared by both), with the
    /// UDP offloads `io` allows.
    pub fn bind(port: u16, fwmark: u32, io: &IoOptions) -> io::Result<Sockets> {
        let v4 = bind_one(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), fwmark, io)?;
        let port = v4.udp.local_addr()?.port();
        let v6 = match bind_one(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)), fwmark, io) {
            Ok(socket) => Some(Arc::new(socket)),
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => return Err(error),
            Err(error) => {
                tracing::warn!(%error, "IPv6 UDP socket unavailable; continuing with IPv4 only");
                None
            }
        };
        Ok(Sockets {
            v4: Some(Arc::new(v4)),
            v6,
            port,
        })
    }

    /// The socket that can reach `addr`.
    pub fn for_addr(&self, addr: &SocketAddr) -> Option<&WgSocket> {
        match addr {
            SocketAddr::V4(_) => self.v4.as_deref(),
            SocketAddr::V6(_) => self.v6.as_deref(),
        }
    }

    /// Sets `SO_MARK` on both sockets (0 clears it).
    pub fn set_fwmark(&self, fwmark: u32) -> io::Result<()> {
        for socket in self.v4.iter().chain(self.v6.iter()) {
            socket2::SockRef::from(&socket.udp).set_mark(fwmark)?;
        }
        Ok(())
    }
}

fn bind_one(addr: SocketAddr, fwmark: u32, io: &IoOptions) -> io::Result<WgSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    if fwmark != 0 {
        socket.set_mark(fwmark)?;
    }
    set_buffer(&socket, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF);
    set_buffer(&socket, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF);
    socket.bind(&addr.into())?;
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
