//! Unit tests of the UAPI parser, the `set` semantics and the `get` format.

use std::time::Duration;

use super::*;
use kubetun_gateway_core::state::DesiredState;

fn parse(text: &str) -> Result<Request, UapiError> {
    parse_request(text.as_bytes())
}

fn key(n: u8) -> Key {
    Key::from_bytes([n; 32])
}

fn net(text: &str) -> IpNet {
    text.parse().expect("cidr")
}

fn set(body: &str) -> SetCommand {
    match parse(&format!("set=1\n{body}\n")) {
        Ok(Request::Set(command)) => command,
        other => panic!("not a set: {other:?}"),
    }
}

fn errno(body: &str) -> i32 {
    parse(&format!("set=1\n{body}\n"))
        .expect_err("must be rejected")
        .errno
}

#[test]
fn parses_get_and_rejects_unknown_operations() {
    assert_eq!(parse("get=1\n\n"), Ok(Request::Get));
    assert_eq!(parse("get=1\n"), Ok(Request::Get));
    assert_eq!(parse("get=2\n\n").expect_err("op").errno, EPROTO);
    assert_eq!(parse("").expect_err("empty").errno, EPROTO);
    // wireguard-go checks the one byte after get=1 and answers EINVAL.
    assert_eq!(parse("get=1\nx=1\n").expect_err("arg").errno, EINVAL);
    // Only the exact operation lines count.
    assert_eq!(parse("get=1\r\n\r\n").expect_err("crlf").errno, EPROTO);
    assert_eq!(parse(" set=1\n\n").expect_err("space").errno, EPROTO);
}

#[test]
fn set_lines_may_end_in_crlf_and_hold_invalid_utf8() {
    assert!(
        parse("set=1\r\nlisten_port=7\r\n\r\n").is_err(),
        "the op line must be exact"
    );
    let Ok(Request::Set(command)) = parse_request(b"set=1\nlisten_port=7\r\n\r\nlisten_port=8\n")
    else {
        panic!("a CRLF set must parse");
    };
    assert_eq!(
        command.listen_port,
        Some(7),
        "the CRLF blank line ends the set"
    );
    for body in [&b"listen_port=\xff"[..], b"\xff=1", b"private_key=\xc3\x28"] {
        let mut request = b"set=1\n".to_vec();
        request.extend_from_slice(body);
        request.push(b'\n');
        assert_eq!(parse_request(&request).expect_err("utf-8").errno, EINVAL);
    }
    assert_eq!(
        parse_request(b"set=1\n\xff\xfe\n").expect_err("no =").errno,
        EPROTO
    );
}

#[test]
fn error_messages_never_repeat_key_material() {
    let secret = key(0xab).to_hex();
    let secret_b64 = key(0xab).to_base64();
    let peer = format!("public_key={}\n", key(2).to_hex());
    for body in [
        format!("private_key={}", &secret[..63]),
        format!("private_key={secret}0"),
        format!("private_key={secret_b64}"),
        format!("private_key {secret}"),
        format!("private_key:{secret}=x"),
        secret.clone(),
        format!("{secret}={secret}"),
        format!("{peer}preshared_key={}", &secret[1..]),
        format!("{peer}preshared_key={secret_b64}"),
        format!("{peer}preshared_key{secret}"),
        format!("{peer}endpoint={secret}"),
        format!("{peer}allowed_ip={secret}"),
        format!("{peer}persistent_keepalive_interval={secret}"),
        format!("listen_port={secret}"),
        format!("fwmark={secret}"),
        format!("replace_peers={secret}"),
        format!("{peer}protocol_version={secret}"),
        format!("public_key={secret}x"),
    ] {
        let request = format!("set=1\n{body}\n\n");
        let error = parse(&request).expect_err("malformed");
        for needle in [&secret[..16], &secret[20..36], &secret_b64[..16]] {
            assert!(
                !error.message.contains(needle) && !error.to_string().contains(needle),
                "{body:?} leaks into {error}"
            );
        }
        assert_no_echo(&error.message, request.as_bytes());
    }
}

#[test]
fn apply_is_linear_in_the_allowed_ips() {
    // 100 000 /32s on one peer, then the same prefixes moved to a second peer: each must take
    // well under a second (the quadratic version took tens of seconds).
    let mut body = format!("public_key={}\n", key(2).to_hex());
    for i in 0..100_000u32 {
        let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        body.push_str(&format!("allowed_ip={ip}/32\n"));
    }
    let command = set(&body);
    let started = std::time::Instant::now();
    let state = command.apply_to(&DesiredState::default());
    let first = started.elapsed();
    assert_eq!(state.peers[0].routes.len(), 100_000);
    assert!(state.validate().is_ok());
    let moved = set(&body.replace(&key(2).to_hex(), &key(3).to_hex()));
    let started = std::time::Instant::now();
    let state = moved.apply_to(&state);
    let second = started.elapsed();
    assert_eq!(state.peers[0].routes.len(), 0, "every prefix moved away");
    assert_eq!(state.peers[1].routes.len(), 100_000);
    // Generous for debug builds on a shared machine; quadratic needs minutes here.
    for elapsed in [first, second] {
        assert!(
            elapsed < std::time::Duration::from_secs(5),
            "took {elapsed:?}"
        );
    }
}

#[test]
fn parses_a_full_setconf() {
    let body = format!(
        "private_key={}\nlisten_port=51820\nfwmark=0x0\nreplace_peers=true\n\
         public_key={}\npreshared_key={}\nendpoint=[fd00::1]:4242\n\
         persistent_keepalive_interval=25\nreplace_allowed_ips=true\n\
         allowed_ip=10.0.0.1/24\nallowed_ip=fd00::/64\nprotocol_version=1\n\
         public_key={}\nremove=true\n",
        key(1).to_hex(),
        key(2).to_hex(),
        key(3).to_hex(),
        key(4).to_hex()
    );
    // fwmark is decimal in the protocol; "0x0" is rejected like wireguard-go does.
    assert_eq!(errno(&body), EINVAL);
    let command = set(&body.replace("fwmark=0x0", "fwmark=7"));
    assert_eq!(command.private_key, Some(Some(key(1))));
    assert_eq!(command.listen_port, Some(51820));
    assert_eq!(command.fwmark, Some(7));
    assert!(command.replace_peers);
    assert_eq!(command.peers.len(), 2);
    let first = &command.peers[0];
    assert_eq!(first.public_key, key(2));
    assert_eq!(first.preshared_key, Some(Some(key(3))));
    assert_eq!(
        first.endpoint,
        Some("[fd00::1]:4242".parse().expect("addr"))
    );
    assert_eq!(first.persistent_keepalive, Some(25));
    assert!(first.replace_allowed_ips);
    // Host bits are cleared like the kernel and wireguard-go do.
    assert_eq!(
        first.allowed_ips,
        vec![net("10.0.0.0/24"), net("fd00::/64")]
    );
    assert!(command.peers[1].remove);
}

#[test]
fn zero_keys_clear() {
    let zero = Key::default().to_hex();
    let command = set(&format!(
        "private_key={zero}\npublic_key={}\npreshared_key={zero}\n",
        key(2).to_hex()
    ));
    assert_eq!(command.private_key, Some(None));
    assert_eq!(command.peers[0].preshared_key, Some(None));
}

#[test]
fn rejects_malformed_lines_with_the_right_errno() {
    assert_eq!(errno("listen_port"), EPROTO);
    assert_eq!(errno("bogus=1"), EINVAL);
    assert_eq!(errno("listen_port=70000"), EINVAL);
    assert_eq!(errno("private_key=abc"), EINVAL);
    assert_eq!(errno("replace_peers=false"), EINVAL);
    let peer = format!("public_key={}\n", key(2).to_hex());
    assert_eq!(errno(&format!("{peer}protocol_version=2")), EINVAL);
    assert_eq!(errno(&format!("{peer}endpoint=10.0.0.1")), EINVAL);
    assert_eq!(errno(&format!("{peer}allowed_ip=10.0.0.0/40")), EINVAL);
    assert_eq!(errno(&format!("{peer}listen_port=1")), EINVAL);
    assert_eq!(
        errno(&format!("{peer}persistent_keepalive_interval=-1")),
        EINVAL
    );
}

#[test]
fn set_creates_updates_and_removes_peers() {
    let state = set(&format!(
        "private_key={}\npublic_key={}\nallowed_ip=10.1.0.0/16\nendpoint=192.0.2.1:51820\n\
         public_key={}\nupdate_only=true\nallowed_ip=10.2.0.0/16\n",
        key(1).to_hex(),
        key(2).to_hex(),
        key(3).to_hex()
    ))
    .apply_to(&DesiredState::default());
    assert_eq!(state.interface.private_key, Some(key(1)));
    assert_eq!(state.peers.len(), 1, "update_only must not create a peer");
    assert_eq!(
        state.peers[0].routes,
        vec![RouteConfig::identity(net("10.1.0.0/16"))]
    );
    assert!(state.validate().is_ok());

    let state = set(&format!(
        "public_key={}\nallowed_ip=10.3.0.0/16\npersistent_keepalive_interval=5\n",
        key(2).to_hex()
    ))
    .apply_to(&state);
    assert_eq!(
        state.peers[0].routes.len(),
        2,
        "without replace, allowed IPs accumulate"
    );
    assert_eq!(state.peers[0].persistent_keepalive, 5);
    assert_eq!(
        state.peers[0].endpoint,
        Some(Endpoint::Addr("192.0.2.1:51820".parse().expect("addr")))
    );

    let state = set(&format!("public_key={}\nremove=true\n", key(2).to_hex())).apply_to(&state);
    assert!(state.peers.is_empty());
}

#[test]
fn an_allowed_ip_moves_to_the_peer_that_claims_it() {
    let state = set(&format!(
        "public_key={}\nallowed_ip=10.1.0.0/16\nallowed_ip=10.9.0.0/16\n\
         public_key={}\nallowed_ip=10.9.0.0/16\n",
        key(2).to_hex(),
        key(3).to_hex()
    ))
    .apply_to(&DesiredState::default());
    assert_eq!(
        state.peers[0].routes,
        vec![RouteConfig::identity(net("10.1.0.0/16"))]
    );
    assert_eq!(
        state.peers[1].routes,
        vec![RouteConfig::identity(net("10.9.0.0/16"))]
    );
    assert!(state.validate().is_ok());
}

#[test]
fn replace_allowed_ips_keeps_views_of_prefixes_that_stay() {
    let mut state = DesiredState::default();
    let mut peer = PeerConfig::new(key(2));
    peer.routes = vec![
        RouteConfig::remapped(net("10.70.0.0/16"), net("10.201.0.0/16")),
        RouteConfig::identity(net("10.80.0.0/16")),
    ];
    state.peers.push(peer);
    let next = set(&format!(
        "public_key={}\nreplace_allowed_ips=true\nallowed_ip=10.70.0.0/16\nallowed_ip=10.90.0.0/16\n",
        key(2).to_hex()
    ))
    .apply_to(&state);
    assert_eq!(
        next.peers[0].routes,
        vec![
            RouteConfig::remapped(net("10.70.0.0/16"), net("10.201.0.0/16")),
            RouteConfig::identity(net("10.90.0.0/16")),
        ]
    );
}

#[test]
fn own_key_is_ignored_and_replace_peers_clears() {
    let mut state = DesiredState::default();
    state.interface.private_key = Some(key(1));
    state.peers.push(PeerConfig::new(key(5)));
    let own = key(1).public_key();
    let next = set(&format!(
        "replace_peers=true\npublic_key={}\nallowed_ip=10.0.0.0/8\npublic_key={}\n",
        own.to_hex(),
        key(6).to_hex()
    ))
    .apply_to(&state);
    assert_eq!(next.peers.len(), 1);
    assert_eq!(next.peers[0].public_key, key(6));
}

fn sample_view() -> InterfaceView {
    InterfaceView {
        private_key: Some(key(1)),
        listen_port: Some(51820),
        fwmark: 0,
        peers: vec![PeerView {
            public_key: key(2),
            preshared_key: None,
            endpoint: Some("192.0.2.1:51820".parse().expect("addr")),
            last_handshake: Some(Duration::new(1_700_000_000, 250_000_000)),
            rx_bytes: 1234,
            tx_bytes: 5678,
            persistent_keepalive: 25,
            allowed_ips: vec![net("10.70.0.0/16"), net("fd00::/64")],
        }],
    }
}

#[test]
fn get_reply_has_wireguard_go_layout() {
    let expected = format!(
        "private_key={}\nlisten_port=51820\npublic_key={}\npreshared_key={}\n\
         protocol_version=1\nendpoint=192.0.2.1:51820\nlast_handshake_time_sec=1700000000\n\
         last_handshake_time_nsec=250000000\ntx_bytes=5678\nrx_bytes=1234\n\
         persistent_keepalive_interval=25\nallowed_ip=10.70.0.0/16\nallowed_ip=fd00::/64\n\
         errno=0\n\n",
        key(1).to_hex(),
        key(2).to_hex(),
        Key::default().to_hex()
    );
    assert_eq!(format_get(&sample_view()), expected);
    assert_eq!(format_get(&InterfaceView::default()), "errno=0\n\n");
    assert_eq!(format_errno(22), "errno=-22\n\n");
    assert_eq!(format_errno(0), "errno=0\n\n");
}

/// What `wg showconf | wg setconf` does: the configuration keys of a get reply, sent back as a
/// set with replace_peers / replace_allowed_ips.
fn showconf_to_setconf(reply: &str) -> String {
    let mut out = String::from("set=1\nreplace_peers=true\n");
    for line in reply.lines() {
        let Some((k, _)) = line.split_once('=') else {
            continue;
        };
        match k {
            "private_key"
            | "listen_port"
            | "fwmark"
            | "preshared_key"
            | "endpoint"
            | "persistent_keepalive_interval"
            | "allowed_ip" => {
                out.push_str(line);
                out.push('\n');
            }
            "public_key" => {
                out.push_str(line);
                out.push_str("\nreplace_allowed_ips=true\n");
            }
            _ => {}
        }
    }
    out.push('\n');
    out
}

#[test]
fn get_then_set_round_trips_the_configuration() {
    let view = sample_view();
    let Ok(Request::Set(command)) = parse(&showconf_to_setconf(&format_get(&view))) else {
        panic!("round trip must parse");
    };
    let state = command.apply_to(&DesiredState::default());
    assert_eq!(state.interface.private_key, view.private_key);
    assert_eq!(state.interface.listen_port, 51820);
    let peer = &state.peers[0];
    assert_eq!(peer.public_key, key(2));
    assert_eq!(peer.preshared_key, None);
    assert_eq!(peer.persistent_keepalive, 25);
    assert_eq!(
        peer.routes.iter().map(|r| r.real).collect::<Vec<_>>(),
        view.peers[0].allowed_ips
    );
    assert!(state.validate().is_ok());
}

#[test]
fn committed_fuzz_corpus_replays_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/uapi");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()));
    let mut replayed = 0;
    for entry in entries {
        let path = entry.expect("corpus entry").path();
        fuzz_check(&std::fs::read(&path).expect("corpus file"));
        replayed += 1;
    }
    assert!(
        replayed >= 5,
        "expected a seeded corpus, found {replayed} files"
    );
}

#[test]
fn fuzz_oracle_survives_hostile_inputs() {
    for input in [
        &b"set=1\npublic_key="[..],
        b"set=1\n=\n",
        b"set=1\nallowed_ip=10.0.0.0/8\n",
        b"\xff\xfe",
        b"set=1\nlisten_port=65535\nlisten_port=0\n",
    ] {
        fuzz_check(input);
    }
}
