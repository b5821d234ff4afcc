//! The veth that joins the host to a cluster's gateway namespace in a lab with real control
//! planes: the client's controller runs on the host and serves `clusterset.local` DNS on it.

use std::hash::{Hash as _, Hasher as _};
use std::net::{Ipv4Addr, SocketAddrV4};

use kubetun_testenv::netns;

use crate::error::LabError;
use crate::state::ClusterState;

/// The port the client's controller serves DNS on (the installed default).
pub const DNS_PORT: u16 = 5353;
/// The gateway namespace's end of the DNS veth.
pub(crate) const NAMESPACE_END: &str = "dns0";
/// The link-local block the DNS veths take their /30 from.
const DNS_BLOCK: Ipv4Addr = Ipv4Addr::new(169, 254, 53, 0);
/// Joins the host to `cluster`'s gateway namespace with a veth on a free /30 of
/// 169.254.53.0/24 (tried from a place derived from the link's name, so that parallel labs
/// rarely meet); returns the address the controller serves DNS on (the host end).
pub fn attach_dns(cluster: &ClusterState) -> Result<SocketAddrV4, LabError> {
    let link = cluster.dns_link();
    let in_use = netns::ip(&["-4", "-o", "addr", "show"])?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    link.hash(&mut hasher);
    let start = hasher.finish() % 64;
    let block = (0..64)
        .map(|i| u32::from(DNS_BLOCK) + 4 * ((start + i) % 64) as u32)
        .find(|block| !in_use.contains(&format!(" {}/", Ipv4Addr::from(block + 1))))
        .ok_or_else(|| LabError::Host("169.254.53.0/24 has no free /30 left".to_owned()))?;
    let (host, inside) = (Ipv4Addr::from(block + 1), Ipv4Addr::from(block + 2));
    let _ = netns::ip(&["link", "del", &link]);
    netns::ip(&[
        "link",
        "add",
        &link,
        "type",
        "veth",
        "peer",
        "name",
        NAMESPACE_END,
        "netns",
        &cluster.namespace,
    ])?;
    netns::ip(&["addr", "add", &format!("{host}/30"), "dev", &link])?;
    netns::ip(&["link", "set", &link, "up"])?;
    let inside_cidr = format!("{inside}/30");
    netns::exec_in(
        &cluster.namespace,
        &["ip", "addr", "add", &inside_cidr, "dev", NAMESPACE_END],
    )?;
    netns::exec_in(
        &cluster.namespace,
        &["ip", "link", "set", NAMESPACE_END, "up"],
    )?;
    Ok(SocketAddrV4::new(host, DNS_PORT))
}
