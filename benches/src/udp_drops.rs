//! Where a UDP run's lost datagrams were dropped, from kernel counters read before and after
//! the run: at the sending side's tunnel interface before encryption (`tx_dropped` of its TUN
//! device), at the receiving daemon's UDP socket (after encryption and transmission: the
//! receiver could not decrypt fast enough), or at the receiving application's socket (the
//! tunnel delivered, iperf3 could not read fast enough). The first and last are outside the
//! tunnel's decrypting path; the middle one is the "sender faster than the receiver can
//! decrypt" loss.

use serde::Serialize;

use crate::testbed::Testbed;
use kubetun_fixtures::implementations::Implementation;

/// Cumulative kernel drop counters relevant to one implementation's tunnel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DropCounters {
    /// `tx_dropped` of the sending side's tunnel interface.
    pub sender_interface: u64,
    /// Drops of the receiving daemon's UDP socket(s).
    pub tunnel_socket: u64,
    /// `RcvbufErrors` of the receiving namespace (every UDP socket in it).
    pub receiver_namespace: u64,
}

/// Datagrams dropped during one run, by place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UdpDrops {
    /// Before encryption, at the sender's tunnel interface.
    pub before_tunnel: u64,
    /// At the receiving daemon's socket, after encryption.
    pub in_tunnel: u64,
    /// At the receiving application's socket, after decryption.
    pub at_receiver: u64,
}

impl UdpDrops {
    /// The drops between two readings.
    pub fn between(before: DropCounters, after: DropCounters) -> Self {
        let in_tunnel = after.tunnel_socket.saturating_sub(before.tunnel_socket);
        let namespace = after
            .receiver_namespace
            .saturating_sub(before.receiver_namespace);
        UdpDrops {
            before_tunnel: after
                .sender_interface
                .saturating_sub(before.sender_interface),
            in_tunnel,
            at_receiver: namespace.saturating_sub(in_tunnel),
        }
    }
}

/// Reads the counters of `implementation`'s tunnel; missing counters read as zero.
pub fn read(testbed: &Testbed, implementation: Implementation) -> DropCounters {
    let sender_interface = testbed
        .sender_interface(implementation)
        .and_then(|ifname| {
            let path = format!("/sys/class/net/{ifname}/statistics/tx_dropped");
            testbed.client_ns().exec(&["cat", &path]).ok()
        })
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0);
    let tunnel_socket = testbed.listen_port(implementation).map_or(0, |port| {
        ["/proc/net/udp", "/proc/net/udp6"]
            .iter()
            .filter_map(|table| testbed.server_ns().exec(&["cat", table]).ok())
            .map(|text| socket_drops(&text, port))
            .sum()
    });
    let receiver_namespace = testbed
        .server_ns()
        .exec(&["cat", "/proc/net/snmp"])
        .ok()
        .and_then(|text| snmp_udp(&text, "RcvbufErrors"))
        .unwrap_or(0);
    DropCounters {
        sender_interface,
        tunnel_socket,
        receiver_namespace,
    }
}

/// The `drops` column summed over the sockets of `/proc/net/udp{,6}` bound to `port`.
pub fn socket_drops(table: &str, port: u16) -> u64 {
    let wanted = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            (local_port == wanted).then(|| fields.last()?.parse::<u64>().ok())?
        })
        .sum()
}

/// One counter of the `Udp:` lines of `/proc/net/snmp` (a header line, then a value line).
pub fn snmp_udp(snmp: &str, name: &str) -> Option<u64> {
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let header = lines.next()?;
    let values = lines.next()?;
    let index = header.split_whitespace().position(|f| f == name)?;
    values.split_whitespace().nth(index)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_socket_drops_by_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
            \x20 1: 00000000:CB21 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 17\n\
            \x20 2: 0200630A:1451 0100630A:B3A1 01 00000000:00000000 00:00000000 00000000     0        0 3 2 0000000000000000 4000\n";
        assert_eq!(socket_drops(table, 52001), 17);
        assert_eq!(socket_drops(table, 5201), 4000);
        assert_eq!(socket_drops(table, 51820), 0);
    }

    #[test]
    fn reads_snmp_udp_counters() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            Udp: 187296 0 435653 18 435650 0\n\
            UdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n";
        assert_eq!(snmp_udp(snmp, "RcvbufErrors"), Some(435_650));
        assert_eq!(snmp_udp(snmp, "InDatagrams"), Some(187_296));
        assert_eq!(snmp_udp(snmp, "Missing"), None);
    }

    #[test]
    fn the_tunnel_socket_is_taken_out_of_the_namespace_count() {
        let before = DropCounters {
            sender_interface: 10,
            tunnel_socket: 5,
            receiver_namespace: 100,
        };
        let after = DropCounters {
            sender_interface: 30,
            tunnel_socket: 15,
            receiver_namespace: 400,
        };
        assert_eq!(
            UdpDrops::between(before, after),
            UdpDrops {
                before_tunnel: 20,
                in_tunnel: 10,
                at_receiver: 290,
            }
        );
    }
}
