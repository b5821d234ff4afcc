//! A peer's UDP endpoint as WireGuard keeps it: the remote address, and the local address its
//! datagrams arrived at, so that replies leave from the address the peer sent to ("sticky
//! sockets", as wireguard-go and the kernel do on both families). Without it the kernel
//! picks the source by its own rules: on a multi-homed IPv6 interface that is often another
//! address than the one the peer uses, and the peer roams away from the address it was given.
//!
//! The local address is a hint, never a requirement: when it is no longer on the host the send
//! is retried without it (by the shell that sends), and the next datagram from the peer sets it
//! again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Where a peer's datagrams arrived: our address, and the interface it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalAddr {
    /// The destination address of the peer's datagrams.
    pub ip: IpAddr,
    /// The interface they arrived on (0 when unknown).
    pub ifindex: u32,
}

impl LocalAddr {
    /// The interface a send from this address must name: only an IPv6 link-local address
    /// needs one (it is ambiguous without); for every other address the route decides, so a
    /// route change is followed at once.
    pub fn send_ifindex(&self) -> u32 {
        match self.ip {
            IpAddr::V6(ip) if ip.is_unicast_link_local() => self.ifindex,
            _ => 0,
        }
    }

    /// Whether a reply to `remote` can leave from this address (same family, and not an
    /// unspecified or multicast address).
    fn usable_for(&self, remote: &SocketAddr) -> bool {
        match (self.ip, remote) {
            (IpAddr::V4(ip), SocketAddr::V4(_)) => {
                ip != Ipv4Addr::UNSPECIFIED && !ip.is_multicast() && !ip.is_broadcast()
            }
            (IpAddr::V6(ip), SocketAddr::V6(_)) => {
                ip != Ipv6Addr::UNSPECIFIED && !ip.is_multicast()
            }
            _ => false,
        }
    }
}

/// Where datagrams for a peer go, and from which of our addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The peer's address and port.
    pub remote: SocketAddr,
    /// Our address the peer's datagrams arrived at; `None` lets the kernel choose.
    pub local: Option<LocalAddr>,
}

impl Endpoint {
    /// The reply endpoint of a datagram from `remote` that arrived at `local`; a local
    /// address that cannot be a reply's source is left out.
    pub fn reply(remote: SocketAddr, local: Option<LocalAddr>) -> Self {
        Self {
            remote,
            local: local.filter(|local| local.usable_for(&remote)),
        }
    }

    /// `remote`, with the source left to the kernel.
    pub const fn unpinned(remote: SocketAddr) -> Self {
        Self {
            remote,
            local: None,
        }
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(remote: SocketAddr) -> Self {
        Self::unpinned(remote)
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.local {
            Some(local) => write!(f, "{} (from {})", self.remote, local.ip),
            None => write!(f, "{}", self.remote),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(ip: &str, ifindex: u32) -> LocalAddr {
        LocalAddr {
            ip: ip.parse().unwrap(),
            ifindex,
        }
    }

    #[test]
    fn only_a_link_local_source_names_its_interface() {
        assert_eq!(local("fe80::1", 7).send_ifindex(), 7);
        assert_eq!(local("fd00::1", 7).send_ifindex(), 0);
        assert_eq!(local("192.0.2.1", 7).send_ifindex(), 0);
    }

    #[test]
    fn a_reply_keeps_only_a_usable_source_of_the_same_family() {
        let v4: SocketAddr = "192.0.2.9:51820".parse().unwrap();
        let v6: SocketAddr = "[2001:db8::9]:51820".parse().unwrap();
        assert_eq!(
            Endpoint::reply(v4, Some(local("192.0.2.1", 2))).local,
            Some(local("192.0.2.1", 2))
        );
        assert_eq!(
            Endpoint::reply(v4, Some(local("2001:db8::1", 2))).local,
            None
        );
        assert_eq!(Endpoint::reply(v6, Some(local("::", 2))).local, None);
        assert_eq!(Endpoint::reply(v6, Some(local("ff02::1", 2))).local, None);
        assert_eq!(
            Endpoint::reply(v4, Some(local("255.255.255.255", 2))).local,
            None
        );
        assert_eq!(Endpoint::reply(v6, None), Endpoint::unpinned(v6));
    }
}
