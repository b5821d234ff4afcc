//! What the builder refuses, and that a refusal leaves no partial state behind.

use super::*;

#[test]
fn invalid_routes_are_rejected_with_readable_errors() {
    let cases: [(&[Route], &str); 5] = [
        (
            &[route("10.70.0.0/16", "10.68.0.0/24")],
            "does not match real prefix 10.70.0.0/16",
        ),
        (
            &[route("10.70.0.0/16", "fd00::/16")],
            "view fd00::/16 does not match",
        ),
        (
            &[route("10.70.1.0/16", "10.68.0.0/16")],
            "10.70.1.0/16 has host bits set",
        ),
        (
            &[
                route("10.70.0.0/16", "10.68.0.0/16"),
                route("10.70.0.0/16", "10.67.0.0/16"),
            ],
            "real prefix 10.70.0.0/16 is mapped to two views",
        ),
        (
            &[
                route("10.70.0.0/16", "10.68.0.0/16"),
                route("10.71.0.0/16", "10.68.0.0/16"),
            ],
            "view 10.68.0.0/16 is used twice",
        ),
    ];
    for (routes, message) in cases {
        let error = TableBuilder::new()
            .add_peer(3, routes, None)
            .expect_err("invalid");
        assert!(
            error.to_string().contains(message),
            "{error} should contain {message:?}"
        );
        assert!(
            error.to_string().contains("peer 3"),
            "{error} names the peer"
        );
    }
}

#[test]
fn a_view_belongs_to_one_peer_only() {
    let mut builder = TableBuilder::new();
    builder
        .add_peer(1, &[route("10.70.0.0/16", "10.68.0.0/16")], None)
        .expect("valid");
    let error = builder
        .add_peer(2, &[route("10.70.0.0/16", "10.68.0.0/16")], None)
        .expect_err("dup");
    assert_eq!(
        error,
        RemapError::DuplicateView {
            view: net("10.68.0.0/16"),
            first: 1,
            first_real: net("10.70.0.0/16"),
            second: 2,
            second_real: net("10.70.0.0/16"),
        }
    );
    // The rejected peer left no trace: it can be added again with a free view.
    builder
        .add_peer(2, &[route("10.70.0.0/16", "10.69.0.0/16")], None)
        .expect("valid");
    assert_eq!(builder.build().expect("valid").len(), 2);
}

#[test]
fn peers_acls_and_local_prefixes_are_validated() {
    let mut builder = TableBuilder::new();
    builder.add_peer(1, &[], None).expect("valid");
    assert_eq!(
        builder.add_peer(1, &[], None),
        Err(RemapError::DuplicatePeer(1))
    );
    assert_eq!(
        builder.add_peer(MAX_PEER_ID + 1, &[], None),
        Err(RemapError::PeerIdOutOfRange(MAX_PEER_ID + 1))
    );
    let error = builder
        .add_peer(2, &[], Some(&[net("10.203.0.1/16")]))
        .expect_err("host bits");
    assert!(error.to_string().contains("10.203.0.1/16"), "{error}");
    builder.local_prefixes(&[net("10.200.0.1/16")]);
    let error = builder.build().expect_err("host bits");
    assert!(
        error.to_string().contains("local prefix 10.200.0.1/16"),
        "{error}"
    );
}

#[test]
fn repeated_identical_routes_are_idempotent_and_views_are_listed() {
    let mut builder = TableBuilder::new();
    let routes = [
        route("10.70.0.0/16", "10.68.0.0/16"),
        route("10.70.0.0/16", "10.68.0.0/16"),
    ];
    builder.add_peer(4, &routes, None).expect("valid");
    let table = builder.build().expect("valid");
    assert_eq!(table.len(), 1);
    let views: Vec<_> = table.views().collect();
    assert_eq!(views, [(4, net("10.68.0.0/16"), net("10.70.0.0/16"))]);
    assert!(RemapTable::empty().is_empty());
}

#[test]
fn drop_reason_names_are_unique_snake_case() {
    let names: std::collections::HashSet<_> =
        DropReason::ALL.iter().map(DropReason::as_str).collect();
    assert_eq!(names.len(), DropReason::ALL.len());
    assert!(
        names
            .iter()
            .all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
    );
}
