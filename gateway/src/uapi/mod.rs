//! The WireGuard cross-platform userspace API (UAPI): the `get=1` / `set=1` text protocol the
//! stock `wg` tool speaks over `/var/run/wireguard/<ifname>.sock`.
//!
//! This module is the pure half: [`parse_request`] turns request text into a [`Request`],
//! [`SetCommand::apply_to`] folds a `set` into a [`DesiredState`] (the same model the gRPC API
//! feeds), and [`format_get`] renders a `get` reply. Errors carry the positive errno the
//! protocol reports (`errno=N`). The socket server lives in [`server`].

pub mod server;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::key::Key;
use crate::state::{DesiredState, Endpoint, PeerConfig, RouteConfig};

/// `EINVAL`: a key or value the protocol does not accept.
pub const EINVAL: i32 = 22;
/// `EPROTO`: the request is not well-formed UAPI.
pub const EPROTO: i32 = 71;
/// `EADDRINUSE`: the listen port is taken.
pub const EADDRINUSE: i32 = 98;
/// `EIO`: applying failed for a reason outside the request.
pub const EIO: i32 = 5;

/// A rejected request, with the errno sent back to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct UapiError {
    /// Positive errno value, as written in the `errno=` reply line.
    pub errno: i32,
    /// What was wrong, for the log.
    pub message: String,
}

impl UapiError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            errno: EINVAL,
            message: message.into(),
        }
    }

    fn protocol(message: impl Into<String>) -> Self {
        Self {
            errno: EPROTO,
            message: message.into(),
        }
    }
}

/// One UAPI request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `get=1`: dump the configuration and counters.
    Get,
    /// `set=1`: change the configuration.
    Set(SetCommand),
}

/// The interface-level part of a `set` plus its peer sections, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetCommand {
    /// `private_key=`: `Some(None)` clears the key (all-zero value).
    pub private_key: Option<Option<Key>>,
    /// `listen_port=`.
    pub listen_port: Option<u16>,
    /// `fwmark=`: 0 clears the mark.
    pub fwmark: Option<u32>,
    /// `replace_peers=true`: drop every peer not mentioned below.
    pub replace_peers: bool,
    /// The `public_key=` sections.
    pub peers: Vec<PeerSet>,
}

/// One `public_key=` section of a `set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSet {
    /// The peer addressed.
    pub public_key: Key,
    /// `remove=true`.
    pub remove: bool,
    /// `update_only=true`: ignore the section if the peer does not exist.
    pub update_only: bool,
    /// `preshared_key=`: `Some(None)` clears it.
    pub preshared_key: Option<Option<Key>>,
    /// `endpoint=`.
    pub endpoint: Option<SocketAddr>,
    /// `persistent_keepalive_interval=`.
    pub persistent_keepalive: Option<u16>,
    /// `replace_allowed_ips=true`.
    pub replace_allowed_ips: bool,
    /// `allowed_ip=` lines, host bits cleared.
    pub allowed_ips: Vec<IpNet>,
}

impl PeerSet {
    fn new(public_key: Key) -> Self {
        Self {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// Parses one request: the operation line, then (for `set`) `key=value` lines. The text ends
/// at the first empty line or at its end.
pub fn parse_request(text: &str) -> Result<Request, UapiError> {
    let mut lines = text.split('\n');
    match lines.next() {
        Some("get=1") => {
            // A get carries no arguments; anything but the terminating blank line is an error.
            match lines.next() {
                None | Some("") => Ok(Request::Get),
                Some(line) => Err(UapiError::protocol(format!(
                    "unexpected line after get=1: {line:?}"
                ))),
            }
        }
        Some("set=1") => parse_set(lines).map(Request::Set),
        Some(other) => Err(UapiError::protocol(format!("unknown operation {other:?}"))),
        None => Err(UapiError::protocol("empty request")),
    }
}

fn parse_set<'a>(lines: impl Iterator<Item = &'a str>) -> Result<SetCommand, UapiError> {
    let mut cmd = SetCommand::default();
    for line in lines {
        if line.is_empty() {
            break;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| UapiError::protocol(format!("line without '=': {line:?}")))?;
        if key == "public_key" {
            cmd.peers.push(PeerSet::new(parse_hex_key(key, value)?));
            continue;
        }
        match cmd.peers.last_mut() {
            None => parse_interface_line(&mut cmd, key, value)?,
            Some(peer) => parse_peer_line(peer, key, value)?,
        }
    }
    Ok(cmd)
}

fn parse_interface_line(cmd: &mut SetCommand, key: &str, value: &str) -> Result<(), UapiError> {
    match key {
        "private_key" => {
            let k = parse_hex_key(key, value)?;
            cmd.private_key = Some((!k.is_zero()).then_some(k));
        }
        "listen_port" => cmd.listen_port = Some(parse_number(key, value)?),
        "fwmark" => {
            cmd.fwmark = Some(if value.is_empty() {
                0
            } else {
                parse_number(key, value)?
            })
        }
        "replace_peers" => cmd.replace_peers = parse_true(key, value)?,
        _ => return Err(UapiError::invalid(format!("invalid interface key {key:?}"))),
    }
    Ok(())
}

fn parse_peer_line(peer: &mut PeerSet, key: &str, value: &str) -> Result<(), UapiError> {
    match key {
        "remove" => peer.remove = parse_true(key, value)?,
        "update_only" => peer.update_only = parse_true(key, value)?,
        "preshared_key" => {
            let k = parse_hex_key(key, value)?;
            peer.preshared_key = Some((!k.is_zero()).then_some(k));
        }
        "endpoint" => {
            peer.endpoint = Some(
                value
                    .parse()
                    .map_err(|_| UapiError::invalid(format!("invalid endpoint {value:?}")))?,
            )
        }
        "persistent_keepalive_interval" => {
            peer.persistent_keepalive = Some(parse_number(key, value)?)
        }
        "replace_allowed_ips" => peer.replace_allowed_ips = parse_true(key, value)?,
        "allowed_ip" => {
            let prefix: IpNet = value
                .parse()
                .map_err(|_| UapiError::invalid(format!("invalid allowed_ip {value:?}")))?;
            peer.allowed_ips.push(prefix.trunc());
        }
        "protocol_version" => {
            if value != "1" {
                return Err(UapiError::invalid(format!(
                    "unsupported protocol_version {value:?}"
                )));
            }
        }
        _ => return Err(UapiError::invalid(format!("invalid peer key {key:?}"))),
    }
    Ok(())
}

fn parse_hex_key(key: &str, value: &str) -> Result<Key, UapiError> {
    Key::from_hex(value).map_err(|_| UapiError::invalid(format!("invalid {key}")))
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, UapiError> {
    value
        .parse()
        .map_err(|_| UapiError::invalid(format!("invalid {key} {value:?}")))
}

fn parse_true(key: &str, value: &str) -> Result<bool, UapiError> {
    if value == "true" {
        Ok(true)
    } else {
        Err(UapiError::invalid(format!(
            "{key} only accepts \"true\", got {value:?}"
        )))
    }
}

impl SetCommand {
    /// The state that results from applying this command to `state`, with wireguard-go's
    /// semantics: peers are created on first mention unless `update_only`; an allowed IP moves
    /// away from any other peer that had it; a section naming our own public key is ignored.
    ///
    /// With `replace_allowed_ips`, a prefix the peer already had keeps its view, so a
    /// `wg showconf | wg setconf` round trip leaves remapped routes intact.
    pub fn apply_to(&self, state: &DesiredState) -> DesiredState {
        let mut next = state.clone();
        if let Some(private_key) = self.private_key {
            next.interface.private_key = private_key;
        }
        if let Some(port) = self.listen_port {
            next.interface.listen_port = port;
        }
        if let Some(fwmark) = self.fwmark {
            next.interface.fwmark = fwmark;
        }
        if self.replace_peers {
            next.peers.clear();
        }
        let own = next.public_key();
        for set in &self.peers {
            if Some(set.public_key) == own {
                continue;
            }
            let position = next
                .peers
                .iter()
                .position(|p| p.public_key == set.public_key);
            if set.remove {
                if let Some(i) = position {
                    next.peers.remove(i);
                }
                continue;
            }
            let index = match position {
                Some(i) => i,
                None if set.update_only => continue,
                None => {
                    next.peers.push(PeerConfig::new(set.public_key));
                    next.peers.len() - 1
                }
            };
            let peer = &mut next.peers[index];
            if let Some(psk) = set.preshared_key {
                peer.preshared_key = psk;
            }
            if let Some(endpoint) = set.endpoint {
                peer.endpoint = Some(Endpoint::Addr(endpoint));
            }
            if let Some(keepalive) = set.persistent_keepalive {
                peer.persistent_keepalive = keepalive;
            }
            let previous = if set.replace_allowed_ips {
                std::mem::take(&mut peer.routes)
            } else {
                Vec::new()
            };
            for prefix in &set.allowed_ips {
                if peer.routes.iter().any(|r| r.real == *prefix) {
                    continue;
                }
                let route = previous
                    .iter()
                    .find(|r| r.real == *prefix)
                    .copied()
                    .unwrap_or(RouteConfig::identity(*prefix));
                peer.routes.push(route);
            }
            let claimed: Vec<IpNet> = peer.routes.iter().map(|r| r.view).collect();
            for (i, other) in next.peers.iter_mut().enumerate() {
                if i != index {
                    other.routes.retain(|r| !claimed.contains(&r.view));
                }
            }
        }
        next
    }
}

/// What a `get` reports about the interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterfaceView {
    /// The private key, if any.
    pub private_key: Option<Key>,
    /// The bound UDP port, if the sockets are open.
    pub listen_port: Option<u16>,
    /// `SO_MARK`; 0 = none.
    pub fwmark: u32,
    /// The peers.
    pub peers: Vec<PeerView>,
}

/// What a `get` reports about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    /// Identity.
    pub public_key: Key,
    /// Preshared key, if any.
    pub preshared_key: Option<Key>,
    /// Current (possibly roamed) endpoint.
    pub endpoint: Option<SocketAddr>,
    /// Time of the last handshake since the Unix epoch.
    pub last_handshake: Option<Duration>,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Keepalive interval in seconds.
    pub persistent_keepalive: u16,
    /// The peer's prefixes as this side sees them (local views; unique per device).
    pub allowed_ips: Vec<IpNet>,
}

/// Renders a `get` reply, including the final `errno=0` and blank line.
pub fn format_get(view: &InterfaceView) -> String {
    let mut out = String::with_capacity(256 + view.peers.len() * 512);
    // Writing to a String cannot fail; the results are ignored on purpose.
    if let Some(key) = view.private_key {
        let _ = writeln!(out, "private_key={}", key.to_hex());
    }
    if let Some(port) = view.listen_port {
        let _ = writeln!(out, "listen_port={port}");
    }
    if view.fwmark != 0 {
        let _ = writeln!(out, "fwmark={}", view.fwmark);
    }
    for peer in &view.peers {
        let _ = writeln!(out, "public_key={}", peer.public_key.to_hex());
        let psk = peer.preshared_key.unwrap_or_default();
        let _ = writeln!(out, "preshared_key={}", psk.to_hex());
        let _ = writeln!(out, "protocol_version=1");
        if let Some(endpoint) = peer.endpoint {
            let _ = writeln!(out, "endpoint={endpoint}");
        }
        let handshake = peer.last_handshake.unwrap_or_default();
        let _ = writeln!(out, "last_handshake_time_sec={}", handshake.as_secs());
        let _ = writeln!(out, "last_handshake_time_nsec={}", handshake.subsec_nanos());
        let _ = writeln!(out, "tx_bytes={}", peer.tx_bytes);
        let _ = writeln!(out, "rx_bytes={}", peer.rx_bytes);
        let _ = writeln!(
            out,
            "persistent_keepalive_interval={}",
            peer.persistent_keepalive
        );
        for prefix in &peer.allowed_ips {
            let _ = writeln!(out, "allowed_ip={prefix}");
        }
    }
    out.push_str("errno=0\n\n");
    out
}

/// The oracle of the `uapi` fuzz target, also replayed over the committed corpus by the unit
/// tests: parses arbitrary bytes as a request and, for a `set`, applies it to an empty and to a
/// populated state. Panics if parsing or applying panics, or if the result breaks an invariant
/// of the UAPI semantics (duplicate peers, one allowed IP on two peers, a peer with our key).
pub fn fuzz_check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(Request::Set(command)) = parse_request(text) else {
        return;
    };
    let mut populated = DesiredState::default();
    populated.interface.private_key = Some(Key::from_bytes([1; 32]));
    let mut peer = PeerConfig::new(Key::from_bytes([2; 32]));
    peer.routes
        .push(RouteConfig::identity(IpNet::from(std::net::IpAddr::from(
            [10, 0, 0, 1],
        ))));
    populated.peers.push(peer);
    for state in [DesiredState::default(), populated] {
        let next = command.apply_to(&state);
        let mut keys = std::collections::HashSet::new();
        let mut views = std::collections::HashSet::new();
        let own = next.public_key();
        for peer in &next.peers {
            assert!(keys.insert(peer.public_key), "duplicate peer after set");
            assert_ne!(
                Some(peer.public_key),
                own,
                "peer with the interface's own key"
            );
            for route in &peer.routes {
                assert!(views.insert(route.view), "allowed IP on two peers");
            }
        }
        // Validation must not panic either, whatever it decides.
        let _ = next.validate();
    }
}

/// Renders the reply to a `set`.
pub fn format_errno(errno: i32) -> String {
    format!("errno={errno}\n\n")
}

#[cfg(test)]
mod tests;
