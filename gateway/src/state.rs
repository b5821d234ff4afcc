//! The gateway's desired state as the gRPC `Apply` sends it: [`from_proto`] turns a request
//! into the pure model of [`kubetun_gateway_core::state`], which the
//! WireGuard UAPI `set` feeds too. A request is parsed and validated completely before the
//! device applies it, so an invalid one never leaves a half-applied configuration behind.

// The type `from_proto` takes and returns, for its callers outside the gateway.
use crate::proto;
use kubetun_gateway_core::conncheck::{
    ConnCheckConfig, DEFAULT_INTERVAL_MS, DEFAULT_LOSS_THRESHOLD,
};
use kubetun_gateway_core::key::Key;
pub use kubetun_gateway_core::state::DesiredState;
use kubetun_gateway_core::state::{
    Endpoint, InterfaceConfig, MAX_MTU, MIN_MTU, PeerConfig, RouteConfig, StateError, parse_cidr,
};

/// Builds a state from a gRPC request. Zero/empty interface fields that the API defines
/// as "keep" take their value from `current`.
pub fn from_proto(
    request: proto::DesiredState,
    current: &DesiredState,
) -> Result<DesiredState, StateError> {
    let iface = request.interface.unwrap_or_default();
    let private_key = if iface.private_key.is_empty() {
        current.interface.private_key
    } else {
        Some(Key::from_base64(&iface.private_key).map_err(StateError::PrivateKey)?)
    };
    let listen_port = match iface.listen_port {
        0 => current.interface.listen_port,
        port => u16::try_from(port).map_err(|_| StateError::OutOfRange {
            field: "interface listen_port",
            value: u64::from(port),
            min: 1,
            max: u64::from(u16::MAX),
        })?,
    };
    let mtu = match iface.mtu {
        0 => current.interface.mtu,
        // Range-checked here, on the value as sent: saturating to u16 first made the
        // message report 65535 for 70000.
        mtu => u16::try_from(mtu)
            .ok()
            .filter(|mtu| (MIN_MTU..=MAX_MTU).contains(mtu))
            .ok_or(StateError::OutOfRange {
                field: "interface mtu",
                value: u64::from(mtu),
                min: u64::from(MIN_MTU),
                max: u64::from(MAX_MTU),
            })?,
    };
    let previous_private_key = match iface.previous_private_key.as_str() {
        "" => None,
        text => Some(Key::from_base64(text).map_err(StateError::PreviousPrivateKey)?),
    }
    .filter(|previous| private_key.is_some_and(|key| key != *previous));
    let interface = InterfaceConfig {
        private_key,
        previous_private_key,
        listen_port,
        fwmark: iface.fwmark,
        mtu,
        addresses: iface
            .addresses
            .iter()
            .map(|a| parse_cidr("interface addresses", a))
            .collect::<Result<_, _>>()?,
        local_prefixes: iface
            .local_prefixes
            .iter()
            .map(|a| parse_cidr("interface local_prefixes", a))
            .collect::<Result<_, _>>()?,
        manage_routes: iface.manage_routes,
        conncheck: iface.conncheck.map(|c| {
            let interval_ms = nonzero_or(c.interval_ms, DEFAULT_INTERVAL_MS);
            ConnCheckConfig {
                interval_ms,
                loss_threshold: nonzero_or(c.loss_threshold, DEFAULT_LOSS_THRESHOLD),
                fallback_interval_ms: nonzero_or(c.fallback_interval_ms, interval_ms),
            }
        }),
    };
    let peers = request
        .peers
        .into_iter()
        .enumerate()
        .map(|(i, p)| peer_from_proto(i, p))
        .collect::<Result<_, _>>()?;
    let state = DesiredState {
        version: request.version,
        interface,
        peers,
        admissions: admissions::from_proto(request.admissions)?,
    };
    state.validate()?;
    Ok(state)
}

fn peer_from_proto(index: usize, peer: proto::Peer) -> Result<PeerConfig, StateError> {
    let label = if peer.name.is_empty() {
        format!("#{index}")
    } else {
        peer.name.clone()
    };
    let key_error = |field, source| StateError::PeerKey {
        peer: label.clone(),
        field,
        source,
    };
    let public_key = Key::from_base64(&peer.public_key).map_err(|e| key_error("public_key", e))?;
    let preshared_key = match peer.preshared_key.as_str() {
        "" => None,
        text => Some(Key::from_base64(text).map_err(|e| key_error("preshared_key", e))?),
    };
    let endpoint = match peer.endpoint.as_str() {
        "" => None,
        text => Some(Endpoint::parse(text).ok_or_else(|| StateError::Endpoint {
            peer: label.clone(),
            value: text.to_owned(),
        })?),
    };
    let persistent_keepalive =
        u16::try_from(peer.persistent_keepalive).map_err(|_| StateError::OutOfRange {
            field: "peer persistent_keepalive",
            value: u64::from(peer.persistent_keepalive),
            min: 0,
            max: u64::from(u16::MAX),
        })?;
    let context = format!("peer {label}: route");
    let routes = peer
        .routes
        .iter()
        .map(|r| {
            let real = parse_cidr(&context, &r.real)?;
            let view = if r.view.is_empty() {
                real
            } else {
                parse_cidr(&context, &r.view)?
            };
            Ok(RouteConfig {
                real,
                view,
                fallback: r.fallback,
            })
        })
        .collect::<Result<_, StateError>>()?;
    let acl = peer
        .acl
        .map(|acl| {
            acl.allowed
                .iter()
                .map(|a| parse_cidr(&format!("peer {label}: acl"), a))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(PeerConfig {
        public_key,
        name: peer.name,
        preshared_key,
        endpoint,
        persistent_keepalive,
        routes,
        acl,
        conncheck: !peer.conncheck_disabled,
    })
}

/// `value`, or `default` for the proto's 0 ("unset").
fn nonzero_or(value: u32, default: u32) -> u32 {
    if value == 0 { default } else { value }
}

mod admissions;
#[cfg(test)]
mod tests;
