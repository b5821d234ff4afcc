use super::*;
use kubetun_gateway_core::state::DEFAULT_MTU;

fn key(n: u8) -> Key {
    Key::from_bytes([n; 32])
}

fn proto_peer(n: u8, routes: &[(&str, &str)]) -> proto::Peer {
    proto::Peer {
        public_key: key(n).to_base64(),
        name: format!("peer{n}"),
        routes: routes
            .iter()
            .map(|(real, view)| proto::Route {
                real: (*real).into(),
                view: (*view).into(),
                fallback: false,
            })
            .collect(),
        ..Default::default()
    }
}

fn request(peers: Vec<proto::Peer>) -> proto::DesiredState {
    proto::DesiredState {
        version: "v1".into(),
        interface: Some(proto::Interface {
            private_key: key(1).to_base64(),
            listen_port: 51820,
            ..Default::default()
        }),
        peers,
        admissions: Vec::new(),
    }
}

#[test]
fn accepts_remapped_and_identity_routes() {
    let state = from_proto(
        request(vec![
            proto_peer(2, &[("10.70.0.0/16", "10.201.0.0/16")]),
            proto_peer(3, &[("10.70.0.0/16", "10.202.0.0/16"), ("fd00::/64", "")]),
        ]),
        &DesiredState::default(),
    )
    .expect("valid");
    assert_eq!(state.peers.len(), 2);
    assert_eq!(state.interface.mtu, DEFAULT_MTU);
    assert_eq!(
        state.peers[1].routes[1],
        RouteConfig::identity("fd00::/64".parse().expect("cidr"))
    );
}

#[test]
fn zero_fields_keep_current_values() {
    let mut current = DesiredState::default();
    current.interface.listen_port = 4242;
    current.interface.mtu = 1380;
    current.interface.private_key = Some(key(9));
    let mut req = request(vec![]);
    req.interface = Some(proto::Interface::default());
    let state = from_proto(req, &current).expect("valid");
    assert_eq!(state.interface.listen_port, 4242);
    assert_eq!(state.interface.mtu, 1380);
    assert_eq!(state.interface.private_key, Some(key(9)));
}

#[test]
fn previous_key_is_kept_only_beside_another_private_key() {
    let with_previous = |private: Option<u8>, previous: u8| {
        let mut req = request(vec![]);
        let interface = req.interface.as_mut().expect("interface");
        interface.private_key = private.map(|n| key(n).to_base64()).unwrap_or_default();
        interface.previous_private_key = key(previous).to_base64();
        from_proto(req, &DesiredState::default())
            .expect("valid")
            .interface
            .previous_private_key
    };
    assert_eq!(with_previous(Some(1), 2), Some(key(2)));
    assert_eq!(with_previous(Some(1), 1), None);
    assert_eq!(with_previous(None, 2), None);

    let mut req = request(vec![proto_peer(2, &[])]);
    req.interface
        .as_mut()
        .expect("interface")
        .previous_private_key = key(3).to_base64();
    req.peers[0].public_key = key(3).public_key().to_base64();
    let error =
        from_proto(req, &DesiredState::default()).expect_err("a peer with our previous key");
    assert!(matches!(error, StateError::OwnKey(_)), "{error}");
    let mut req = request(vec![]);
    req.interface
        .as_mut()
        .expect("interface")
        .previous_private_key = "short".into();
    let error = from_proto(req, &DesiredState::default()).expect_err("bad key");
    assert!(!error.to_string().contains("short"), "{error}");
}

fn rejection(peers: Vec<proto::Peer>) -> String {
    from_proto(request(peers), &DesiredState::default())
        .expect_err("must be rejected")
        .to_string()
}

#[test]
fn rejects_invalid_states_with_readable_messages() {
    let mut bad_key = proto_peer(2, &[]);
    bad_key.public_key = "nope".into();
    assert!(rejection(vec![bad_key]).contains("peer peer2: public_key"));

    assert!(rejection(vec![proto_peer(2, &[("10.70.0.0/33", "")])]).contains("invalid CIDR"));
    assert!(
        rejection(vec![proto_peer(2, &[("10.70.0.0/16", "10.201.0.0/24")])])
            .contains("same family and length")
    );
    assert!(
        rejection(vec![proto_peer(2, &[("10.70.0.0/16", "fd00::/16")])])
            .contains("same family and length")
    );
    assert!(rejection(vec![proto_peer(2, &[("10.70.0.1/16", "")])]).contains("host bits"));
    assert!(
        rejection(vec![
            proto_peer(2, &[("10.70.0.0/16", "10.201.0.0/16")]),
            proto_peer(3, &[("10.71.0.0/16", "10.201.0.0/16")]),
        ])
        .contains("view 10.201.0.0/16 is used by both peer peer2 and peer peer3")
    );
    assert!(rejection(vec![proto_peer(2, &[]), proto_peer(2, &[])]).contains("duplicate"));

    let mut own = proto_peer(2, &[]);
    own.public_key = key(1).public_key().to_base64();
    assert!(rejection(vec![own]).contains("own public key"));

    let mut endpoint = proto_peer(2, &[]);
    endpoint.endpoint = "10.0.0.1".into();
    assert!(rejection(vec![endpoint]).contains("invalid endpoint"));
}

#[test]
fn rejects_mtu_out_of_range() {
    let mut req = request(vec![]);
    if let Some(iface) = req.interface.as_mut() {
        iface.mtu = 100;
    }
    let err = from_proto(req, &DesiredState::default()).expect_err("mtu");
    assert!(err.to_string().contains("mtu"));
    for (mtu, shown) in [
        (70_000u32, "70000"),
        (9001, "9001"),
        (u32::MAX, "4294967295"),
    ] {
        let mut req = request(vec![]);
        if let Some(iface) = req.interface.as_mut() {
            iface.mtu = mtu;
        }
        let message = from_proto(req, &DesiredState::default())
            .expect_err("mtu above the limit")
            .to_string();
        assert!(
            message.contains(shown) && message.contains(&format!("..={MAX_MTU}")),
            "the message must give the value sent and the real limit: {message}"
        );
        assert!(!message.contains("65535"), "{message}");
    }
}

#[test]
fn conncheck_defaults_and_validation() {
    let mut req = request(vec![proto_peer(2, &[])]);
    let state = from_proto(req.clone(), &DesiredState::default()).expect("ok");
    assert_eq!(state.interface.conncheck, None, "absent: off");
    assert!(
        state.peers[0].conncheck,
        "peers are probed unless opted out"
    );

    if let Some(iface) = req.interface.as_mut() {
        iface.conncheck = Some(proto::ConnCheck::default());
    }
    req.peers[0].conncheck_disabled = true;
    let state = from_proto(req.clone(), &DesiredState::default()).expect("ok");
    assert_eq!(
        state.interface.conncheck,
        Some(ConnCheckConfig {
            interval_ms: 2000,
            loss_threshold: 5,
            fallback_interval_ms: 2000,
        }),
        "0 means the defaults (the fallback interval: the interval)"
    );
    assert!(!state.peers[0].conncheck);

    for (interval_ms, loss_threshold, fallback_interval_ms, expected) in [
        (
            50,
            0,
            0,
            "interface conncheck interval_ms: 50 is out of range 100..=60000",
        ),
        (3_600_000, 0, 0, "interval_ms: 3600000 is out of range"),
        (
            0,
            1000,
            0,
            "interface conncheck loss_threshold: 1000 is out of range 1..=100",
        ),
        (
            0,
            0,
            99,
            "interface conncheck fallback_interval_ms: 99 is out of range 100..=60000",
        ),
    ] {
        if let Some(iface) = req.interface.as_mut() {
            iface.conncheck = Some(proto::ConnCheck {
                interval_ms,
                loss_threshold,
                fallback_interval_ms,
            });
        }
        let error = from_proto(req.clone(), &DesiredState::default())
            .expect_err("out of range")
            .to_string();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn a_fallback_needs_a_probed_primary_on_another_peer_and_is_alone_on_its_view() {
    let fallback = |n: u8, real: &str, view: &str| {
        let mut peer = proto_peer(n, &[]);
        peer.routes.push(proto::Route {
            real: real.into(),
            view: view.into(),
            fallback: true,
        });
        peer
    };
    let primary = proto_peer(2, &[("10.70.0.0/16", "10.73.0.0/16")]);
    let mut hub = fallback(3, "10.72.0.0/16", "10.73.0.0/16");
    hub.routes.push(proto::Route {
        real: "10.200.0.0/16".into(),
        view: String::new(),
        fallback: false,
    });
    let mut req = request(vec![primary.clone(), hub.clone()]);
    req.interface.as_mut().expect("interface").conncheck = Some(proto::ConnCheck::default());
    let state = from_proto(req.clone(), &DesiredState::default())
        .expect("a fallback on the hub for the shortcut's view");
    assert!(state.peers[1].routes[0].fallback);

    let unprobed = from_proto(
        request(vec![primary.clone(), hub.clone()]),
        &DesiredState::default(),
    )
    .expect_err("without the connectivity check nothing finds the primary down")
    .to_string();
    assert_eq!(
        unprobed,
        "fallback route for view 10.73.0.0/16 (peer peer3): the connectivity check must be enabled on the interface and for peer peer2"
    );
    let mut orphan = req.clone();
    orphan.peers.remove(0);
    let error = from_proto(orphan, &DesiredState::default())
        .expect_err("no primary")
        .to_string();
    assert_eq!(
        error,
        "peer peer3: fallback route for view 10.73.0.0/16: no other peer has a primary route with that view"
    );
    let mut twice = req.clone();
    twice
        .peers
        .push(fallback(4, "10.75.0.0/16", "10.73.0.0/16"));
    let error = from_proto(twice, &DesiredState::default())
        .expect_err("two fallbacks")
        .to_string();
    assert_eq!(
        error,
        "view 10.73.0.0/16 has fallback routes on both peer peer3 and peer peer4"
    );
    let mut own = req;
    own.peers[0].routes.push(proto::Route {
        real: "10.72.0.0/16".into(),
        view: "10.73.0.0/16".into(),
        fallback: true,
    });
    own.peers.remove(1);
    assert!(
        from_proto(own, &DesiredState::default())
            .expect_err("a peer cannot back itself up")
            .to_string()
            .contains("no other peer has a primary route")
    );
}

#[test]
fn endpoint_forms() {
    assert_eq!(
        Endpoint::parse("[fd00::1]:51820"),
        Some(Endpoint::Addr("[fd00::1]:51820".parse().expect("addr")))
    );
    assert_eq!(
        Endpoint::parse("gw.example.org:51820"),
        Some(Endpoint::Host {
            host: "gw.example.org".into(),
            port: 51820
        })
    );
    assert_eq!(Endpoint::parse(":51820"), None);
    assert_eq!(Endpoint::parse("host:99999"), None);
    assert_eq!(Endpoint::parse("bad host:1"), None);
}
