//! The oracle of the `uapi` fuzz target (`gateway/fuzz`), compiled only for fuzzing and the
//! unit tests (which replay the committed corpus and a bounded mutation loop over it).

use ipnet::IpNet;

use super::*;
use kubetun_gateway_core::key::Key;
use kubetun_gateway_core::state::{DesiredState, PeerConfig, RouteConfig};

/// The oracle of the `uapi` fuzz target, also replayed over the committed corpus by the unit
/// tests: parses arbitrary bytes as a request. A `set` is applied to an empty and to a
/// populated state; a `get` is answered for the populated one and the reply parsed back as a
/// `set` (what `wg showconf | wg setconf` does). Panics if anything panics, if a result breaks
/// an invariant of the UAPI semantics (duplicate peers, one allowed IP on two peers, a peer
/// with our key), or if an error message repeats 12 or more characters of the request.
pub fn fuzz_check(data: &[u8]) {
    let mut populated = DesiredState::default();
    populated.interface.private_key = Some(Key::from_bytes([1; 32]));
    populated.interface.listen_port = 51820;
    let mut peer = PeerConfig::new(Key::from_bytes([2; 32]));
    peer.routes
        .push(RouteConfig::identity(IpNet::from(std::net::IpAddr::from(
            [10, 0, 0, 1],
        ))));
    populated.peers.push(peer);
    let command = match parse_request(data) {
        Ok(Request::Set(command)) => command,
        Ok(Request::Get) => {
            let reply = format_get(&view_of(&populated));
            let body = reply
                .strip_suffix("errno=0\n\n")
                .expect("get reply ends in errno=0");
            let mut setconf = b"set=1\nreplace_peers=true\n".to_vec();
            // What `wg showconf` keeps: the configuration, not the counters.
            for line in body.lines().filter(|l| {
                !l.starts_with("last_handshake_time_")
                    && !l.starts_with("tx_bytes=")
                    && !l.starts_with("rx_bytes=")
            }) {
                setconf.extend_from_slice(line.as_bytes());
                setconf.push(b'\n');
            }
            let Ok(Request::Set(command)) = parse_request(&setconf) else {
                panic!("a get reply does not parse back as a set");
            };
            let again = command.apply_to(&DesiredState::default());
            assert_eq!(
                again.peers.len(),
                populated.peers.len(),
                "get/set round trip"
            );
            return;
        }
        Err(error) => {
            assert_no_echo(&error.message, data);
            return;
        }
    };
    for state in [DesiredState::default(), populated] {
        let next = command.apply_to(&state);
        let mut keys = HashSet::new();
        let mut views = HashSet::new();
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

/// The `get` view of a configuration without a running device (no counters, no handshakes).
fn view_of(state: &DesiredState) -> InterfaceView {
    InterfaceView {
        private_key: state.interface.private_key,
        listen_port: Some(state.interface.listen_port),
        fwmark: state.interface.fwmark,
        peers: state
            .peers
            .iter()
            .map(|p| PeerView {
                public_key: p.public_key,
                preshared_key: p.preshared_key,
                endpoint: None,
                last_handshake: None,
                rx_bytes: 0,
                tx_bytes: 0,
                persistent_keepalive: p.persistent_keepalive,
                allowed_ips: p.routes.iter().map(|r| r.real).collect(),
            })
            .collect(),
    }
}

/// Panics if `message` carries a run of 12 or more key-alphabet characters (hex, base64) that
/// also occurs in `request`: such a run could be part of a key the client sent.
pub fn assert_no_echo(message: &str, request: &[u8]) {
    let key_char = |c: char| c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '=';
    for run in message.split(|c: char| !key_char(c)) {
        if run.len() >= 12 {
            assert!(
                !request.windows(run.len()).any(|w| w == run.as_bytes()),
                "error message repeats request text: {message:?}"
            );
        }
    }
}
