//! The WireGuard cross-platform userspace API (UAPI): the `get=1` / `set=1` text protocol the
//! stock `wg` tool speaks over `/var/run/wireguard/<ifname>.sock`.
//!
//! This module is the pure half: [`Operation::parse`] recognises the operation line,
//! [`SetParser`] takes the lines of a `set` one at a time (as bytes: the protocol is not
//! UTF-8), [`SetCommand::apply_to`] folds a `set` into a [`DesiredState`] (the same model the
//! gRPC API feeds), and [`format_get`] renders a `get` reply, of the view [`report`] makes
//! of a device report. The socket server, which frames requests and bounds them, lives in
//! [`server`].
//!
//! Errors follow wireguard-go: the reply is `errno=-N` with `N` the Linux errno (`wg` prints
//! it with `strerror`). Error messages never repeat a value the client sent, and name a key
//! only if it is one the protocol defines: a mistyped line may hold a private key.

#[cfg(any(fuzzing, test))]
mod fuzz;
pub mod report;
pub mod server;

#[cfg(any(fuzzing, test))]
pub use fuzz::{assert_no_echo, fuzz_check};

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use kubetun_gateway_core::key::Key;
use kubetun_gateway_core::state::{DesiredState, Endpoint, PeerConfig, RouteConfig};

/// `EIO`: applying failed for a reason outside the request; also wireguard-go's answer to a
/// line longer than its line scanner takes.
pub const EIO: i32 = 5;
/// `EAGAIN`: too many UAPI connections at once.
pub const EAGAIN: i32 = 11;
/// `EINVAL`: a key or value the protocol does not accept.
pub const EINVAL: i32 = 22;
/// `EPROTO`: a `set` line is not `key=value`.
pub const EPROTO: i32 = 71;
/// `EMSGSIZE`: the request is larger than the server accepts.
pub const EMSGSIZE: i32 = 90;
/// `EADDRINUSE`: the listen port is taken.
pub const EADDRINUSE: i32 = 98;
/// `ETIMEDOUT`: the request did not arrive in time.
pub const ETIMEDOUT: i32 = 110;

/// A rejected request, with the errno sent back to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct UapiError {
    /// The Linux errno (positive); the reply line carries it negated, as wireguard-go does.
    pub errno: i32,
    /// What was wrong, for the log. Never contains a value the client sent.
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

/// The operation line that starts a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `get=1\n`.
    Get,
    /// `set=1\n`.
    Set,
}

impl Operation {
    /// Recognises an operation line, newline included. Like wireguard-go, only the exact lines
    /// count (no `\r`, no spaces); the server closes the connection on anything else.
    pub fn parse(line: &[u8]) -> Option<Operation> {
        match line {
            b"get=1\n" => Some(Operation::Get),
            b"set=1\n" => Some(Operation::Set),
            _ => None,
        }
    }
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

/// Parses a whole request held in memory: the operation line, then (for `set`) `key=value`
/// lines up to the first empty line or the end. The server reads the same grammar off the
/// socket line by line; this form serves tests and fuzzing. An unknown operation, which
/// makes the server close the connection without a reply, is an `EPROTO` error here.
pub fn parse_request(data: &[u8]) -> Result<Request, UapiError> {
    let (op, rest) = match data.iter().position(|b| *b == b'\n') {
        Some(end) => data.split_at(end + 1),
        None => (data, &[][..]),
    };
    match Operation::parse(op) {
        // The byte after `get=1\n` must end the request (wireguard-go checks exactly one).
        Some(Operation::Get) => match rest.first() {
            None | Some(b'\n') => Ok(Request::Get),
            Some(_) => Err(UapiError::invalid("trailing characters after get=1")),
        },
        Some(Operation::Set) => {
            let mut parser = SetParser::default();
            for line in rest.split(|b| *b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if line.is_empty() {
                    break;
                }
                parser.line(line)?;
            }
            Ok(Request::Set(parser.finish()))
        }
        None => Err(UapiError::protocol(format!(
            "unknown operation line ({} bytes)",
            op.len()
        ))),
    }
}

/// Parses the lines of a `set`, one at a time, into a [`SetCommand`].
#[derive(Debug, Default)]
pub struct SetParser {
    command: SetCommand,
    lines: usize,
}

impl SetParser {
    /// Takes one line without its line ending. Empty lines end a request; the caller stops
    /// before them.
    pub fn line(&mut self, line: &[u8]) -> Result<(), UapiError> {
        self.lines += 1;
        let at = |e: UapiError| UapiError {
            errno: e.errno,
            message: format!("request line {}: {}", self.lines + 1, e.message),
        };
        let Some(eq) = line.iter().position(|b| *b == b'=') else {
            return Err(at(UapiError::protocol(format!(
                "not key=value ({} bytes)",
                line.len()
            ))));
        };
        let (key, value) = (&line[..eq], &line[eq + 1..]);
        if key == b"public_key" {
            let key = parse_hex_key("public_key", value).map_err(at)?;
            self.command.peers.push(PeerSet::new(key));
            return Ok(());
        }
        match self.command.peers.last_mut() {
            None => parse_interface_line(&mut self.command, key, value),
            Some(peer) => parse_peer_line(peer, key, value),
        }
        .map_err(at)
    }

    /// The command parsed so far.
    pub fn finish(self) -> SetCommand {
        self.command
    }
}

/// The name of a key for messages: the protocol's own names are echoed, anything else is
/// described by its length only (it may be a mistyped line holding key material).
fn key_name(key: &[u8]) -> String {
    const KNOWN: &[&str] = &[
        "private_key",
        "listen_port",
        "fwmark",
        "replace_peers",
        "public_key",
        "remove",
        "update_only",
        "preshared_key",
        "endpoint",
        "persistent_keepalive_interval",
        "replace_allowed_ips",
        "allowed_ip",
        "protocol_version",
    ];
    match KNOWN.iter().find(|k| k.as_bytes() == key) {
        Some(known) => (*known).to_owned(),
        None => format!("an unknown key of {} bytes", key.len()),
    }
}

/// A value as text; invalid UTF-8 cannot be a valid value of any key.
fn text<'a>(name: &str, value: &'a [u8]) -> Result<&'a str, UapiError> {
    std::str::from_utf8(value).map_err(|_| UapiError::invalid(format!("invalid {name} value")))
}

fn parse_interface_line(cmd: &mut SetCommand, key: &[u8], value: &[u8]) -> Result<(), UapiError> {
    match key {
        b"private_key" => {
            let k = parse_hex_key("private_key", value)?;
            cmd.private_key = Some((!k.is_zero()).then_some(k));
        }
        b"listen_port" => cmd.listen_port = Some(parse_number("listen_port", value)?),
        b"fwmark" => {
            cmd.fwmark = Some(if value.is_empty() {
                0
            } else {
                parse_number("fwmark", value)?
            })
        }
        b"replace_peers" => cmd.replace_peers = parse_true("replace_peers", value)?,
        _ => {
            return Err(UapiError::invalid(format!(
                "invalid interface key: {}",
                key_name(key)
            )));
        }
    }
    Ok(())
}

fn parse_peer_line(peer: &mut PeerSet, key: &[u8], value: &[u8]) -> Result<(), UapiError> {
    match key {
        b"remove" => peer.remove = parse_true("remove", value)?,
        b"update_only" => peer.update_only = parse_true("update_only", value)?,
        b"preshared_key" => {
            let k = parse_hex_key("preshared_key", value)?;
            peer.preshared_key = Some((!k.is_zero()).then_some(k));
        }
        b"endpoint" => {
            peer.endpoint = Some(
                text("endpoint", value)?
                    .parse()
                    .map_err(|_| UapiError::invalid("invalid endpoint (expected ip:port)"))?,
            )
        }
        b"persistent_keepalive_interval" => {
            peer.persistent_keepalive = Some(parse_number("persistent_keepalive_interval", value)?)
        }
        b"replace_allowed_ips" => {
            peer.replace_allowed_ips = parse_true("replace_allowed_ips", value)?
        }
        b"allowed_ip" => {
            let prefix: IpNet = text("allowed_ip", value)?
                .parse()
                .map_err(|_| UapiError::invalid("invalid allowed_ip (expected a CIDR)"))?;
            peer.allowed_ips.push(prefix.trunc());
        }
        b"protocol_version" => {
            if value != b"1" {
                return Err(UapiError::invalid("unsupported protocol_version"));
            }
        }
        _ => {
            return Err(UapiError::invalid(format!(
                "invalid peer key: {}",
                key_name(key)
            )));
        }
    }
    Ok(())
}

fn parse_hex_key(name: &str, value: &[u8]) -> Result<Key, UapiError> {
    // The value is not echoed, not even its length: it is (part of) a key.
    let value = text(name, value)?;
    Key::from_hex(value)
        .map_err(|_| UapiError::invalid(format!("invalid {name} (expected 64 hex digits)")))
}

fn parse_number<T: std::str::FromStr>(name: &str, value: &[u8]) -> Result<T, UapiError> {
    text(name, value)?.parse().map_err(|_| {
        UapiError::invalid(format!(
            "invalid {name} (out of range or not a decimal number)"
        ))
    })
}

fn parse_true(name: &str, value: &[u8]) -> Result<bool, UapiError> {
    if value == b"true" {
        Ok(true)
    } else {
        Err(UapiError::invalid(format!("{name} only accepts \"true\"")))
    }
}

impl SetCommand {
    /// The state that results from applying this command to `state`, with wireguard-go's
    /// semantics: peers are created on first mention unless `update_only`; an allowed IP moves
    /// away from any other peer that had it; a section naming our own public key is ignored.
    ///
    /// With `replace_allowed_ips`, a prefix the peer already had keeps its view, so a
    /// `wg showconf | wg setconf` round trip leaves remapped routes intact.
    ///
    /// Runs in O(n) expected time over the peers, routes and lines involved (hash maps for
    /// peers by key, views by owner, and a peer's routes by real prefix); routes taken away
    /// from a peer are dropped in one pass at the end, so moving many prefixes is not
    /// quadratic either.
    pub fn apply_to(&self, state: &DesiredState) -> DesiredState {
        let mut next = DesiredState {
            version: state.version.clone(),
            interface: state.interface.clone(),
            peers: Vec::new(),
            // The WireGuard protocol has no admissions: the controller's stay.
            admissions: state.admissions.clone(),
        };
        if let Some(private_key) = self.private_key
            && private_key != state.interface.private_key
        {
            // A key set through `wg` takes over at once, like on any WireGuard device; only
            // the controller's rotation (gRPC) keeps a previous key for a grace period.
            next.interface.private_key = private_key;
            next.interface.previous_private_key = None;
        }
        if let Some(port) = self.listen_port {
            next.interface.listen_port = port;
        }
        if let Some(fwmark) = self.fwmark {
            next.interface.fwmark = fwmark;
        }
        // Removed peers become `None` and are compacted at the end, so indices stay valid.
        let mut peers: Vec<Option<PeerConfig>> = if self.replace_peers {
            Vec::new()
        } else {
            state.peers.iter().cloned().map(Some).collect()
        };
        let mut by_key: HashMap<Key, usize> = peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((p.as_ref()?.public_key, i)))
            .collect();
        // Which peer owns each view; routes whose owner moved are dropped at the end.
        let mut owner: HashMap<IpNet, usize> = HashMap::new();
        for (i, peer) in peers.iter().enumerate() {
            for route in peer.iter().flat_map(|p| &p.routes) {
                owner.entry(route.view).or_insert(i);
            }
        }
        let mut lost_routes: HashSet<usize> = HashSet::new();
        // A touched peer's routes by real prefix, built on first use.
        let mut reals: HashMap<usize, HashMap<IpNet, IpNet>> = HashMap::new();
        let own = next.public_key();
        for set in &self.peers {
            if Some(set.public_key) == own {
                continue;
            }
            let position = by_key.get(&set.public_key).copied();
            if set.remove {
                if let Some(i) = position {
                    peers[i] = None;
                    by_key.remove(&set.public_key);
                    reals.remove(&i);
                }
                continue;
            }
            let index = match position {
                Some(i) => i,
                None if set.update_only => continue,
                None => {
                    peers.push(Some(PeerConfig::new(set.public_key)));
                    by_key.insert(set.public_key, peers.len() - 1);
                    peers.len() - 1
                }
            };
            let Some(peer) = peers[index].as_mut() else {
                continue;
            };
            if let Some(psk) = set.preshared_key {
                peer.preshared_key = psk;
            }
            if let Some(endpoint) = set.endpoint {
                peer.endpoint = Some(Endpoint::Addr(endpoint));
            }
            if let Some(keepalive) = set.persistent_keepalive {
                peer.persistent_keepalive = keepalive;
            }
            let previous: HashMap<IpNet, IpNet> = if set.replace_allowed_ips {
                reals.remove(&index);
                std::mem::take(&mut peer.routes)
                    .into_iter()
                    .map(|r| (r.real, r.view))
                    .collect()
            } else {
                HashMap::new()
            };
            if set.allowed_ips.is_empty() {
                continue;
            }
            let mine = reals
                .entry(index)
                .or_insert_with(|| peer.routes.iter().map(|r| (r.real, r.view)).collect());
            for prefix in &set.allowed_ips {
                let view = match mine.get(prefix) {
                    Some(view) => *view,
                    None => {
                        let view = previous.get(prefix).copied().unwrap_or(*prefix);
                        mine.insert(*prefix, view);
                        peer.routes.push(RouteConfig::remapped(*prefix, view));
                        view
                    }
                };
                if let Some(before) = owner.insert(view, index)
                    && before != index
                {
                    lost_routes.insert(before);
                }
            }
        }
        for i in lost_routes {
            if let Some(peer) = peers[i].as_mut() {
                peer.routes.retain(|r| owner.get(&r.view) == Some(&i));
            }
        }
        next.peers = peers.into_iter().flatten().collect();
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

/// Renders a status reply: `errno=0`, or the negated errno as wireguard-go writes it.
pub fn format_errno(errno: i32) -> String {
    format!("errno={}\n\n", -errno.abs())
}

#[cfg(test)]
mod tests;
