//! The UDP sockets of the device: one IPv4 and one IPv6 (v6-only) socket on the same port,
//! with large kernel buffers and an optional firewall mark.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

/// Kernel socket buffer size asked for (the same 7 MiB upstream wireguard-go uses): without it
/// the decrypting side overflows its receive queue under TCP load.
pub const SOCKET_BUFFER_BYTES: usize = 7 << 20;

/// The bound sockets. Either may be missing (e.g. IPv6 disabled), not both.
#[derive(Debug)]
pub struct Sockets {
    /// The IPv4 socket.
    pub v4: Option<Arc<UdpSocket>>,
    /// The IPv6 socket.
    pub v6: Option<Arc<UdpSocket>>,
    /// The port both are bound to.
    pub port: u16,
}

impl Sockets {
    /// Binds both families on `port` (0: a kernel-chosen port, shared by both).
    pub fn bind(port: u16, fwmark: u32) -> io::Result<Sockets> {
        let v4 = bind_one(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), fwmark)?;
        let port = v4.local_addr()?.port();
        let v6 = match bind_one(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)), fwmark) {
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
    pub fn for_addr(&self, addr: &SocketAddr) -> Option<&UdpSocket> {
        match addr {
            SocketAddr::V4(_) => self.v4.as_deref(),
            SocketAddr::V6(_) => self.v6.as_deref(),
        }
    }

    /// Sets `SO_MARK` on both sockets (0 clears it).
    pub fn set_fwmark(&self, fwmark: u32) -> io::Result<()> {
        for socket in self.v4.iter().chain(self.v6.iter()) {
            socket2::SockRef::from(socket.as_ref()).set_mark(fwmark)?;
        }
        Ok(())
    }
}

fn bind_one(addr: SocketAddr, fwmark: u32) -> io::Result<UdpSocket> {
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
    UdpSocket::from_std(socket.into())
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
