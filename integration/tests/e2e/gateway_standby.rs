//! A gateway replica's role against real processes: `kubetun-gateway --standby` and a plain
//! gateway in two namespaces joined by a veth pair, configured over gRPC.
//!
//! - On standby the replica answers no handshake and sends nothing, so the peer never
//!   completes one (its endpoint could otherwise move to a standby); what it reads is
//!   dropped and counted as `standby`.
//! - `Hold` makes it active: it initiates at once and traffic flows.
//! - Without another `Hold` it falls back to standby by itself at the deadline, and the
//!   traffic stops (what keeps a replica whose controller died from answering for the
//!   cluster beside the new active one).
//! - A hold beyond the accepted range is refused with a readable message.
//!
//! Traffic stays between the addresses the test assigns inside its namespaces.

use crate::gateway_ns;

use std::time::{Duration, Instant};

use gateway_ns::GatewayNs;
use kubetun_controller::gateway_api::{self, DesiredState};
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::netns::{require_root, veth};

const PORT: u32 = 51820;

/// One gateway and the addresses the test gives it.
struct Side {
    gateway: GatewayNs,
    underlay: &'static str,
    address: &'static str,
}

impl Side {
    fn new(ns: &str, underlay: &'static str, address: &'static str) -> Self {
        Self {
            gateway: GatewayNs::new(ns),
            underlay,
            address,
        }
    }

    fn state(&self, peer: &Side) -> DesiredState {
        DesiredState {
            version: "v1".to_owned(),
            interface: Some(gateway_api::Interface {
                private_key: self.gateway.key.private_base64(),
                listen_port: PORT,
                addresses: vec![format!("{}/32", self.address)],
                manage_routes: true,
                ..Default::default()
            }),
            peers: vec![gateway_api::Peer {
                public_key: peer.gateway.key.public_base64().to_owned(),
                name: "peer".to_owned(),
                endpoint: format!("{}:{PORT}", peer.underlay),
                persistent_keepalive: 1,
                routes: vec![gateway_api::Route {
                    real: format!("{}/32", peer.address),
                    view: String::new(),
                    fallback: false,
                }],
                ..Default::default()
            }],
        }
    }

    fn pings(&self, to: &str) -> bool {
        self.gateway.pings(self.address, to, 1)
    }
}

async fn handshake_ms(client: &GatewayClient) -> i64 {
    client
        .status()
        .await
        .expect("status")
        .peers
        .first()
        .map_or(0, |p| p.last_handshake_unix_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_stays_silent_until_held_and_falls_back_at_the_deadline() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("gateway_standby") {
        return;
    }
    let mut replica = Side::new("kst-r", "198.18.20.1", "10.91.0.1");
    let mut remote = Side::new("kst-p", "198.18.20.2", "10.92.0.1");
    veth(&replica.gateway.ns, "ul", &remote.gateway.ns, "ul").expect("veth");
    for side in [&replica, &remote] {
        side.gateway
            .ns
            .exec(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", side.underlay),
                "dev",
                "ul",
            ])
            .expect("address");
    }
    replica.gateway.start(&["--standby"]);
    remote.gateway.start(&[]);
    let (r, p) = (replica.gateway.client(), remote.gateway.client());
    r.apply(replica.state(&remote))
        .await
        .expect("apply replica");
    p.apply(remote.state(&replica)).await.expect("apply remote");

    // The remote initiates right after its apply and again on its timers; a standby answers
    // none of it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(handshake_ms(&p).await, 0, "no handshake with a standby");
    assert!(
        !replica.pings(remote.address),
        "no traffic through a standby"
    );
    let status = r.status().await.expect("status");
    assert!(!status.active && status.leased);
    assert!(
        status.drops.get("standby").copied().unwrap_or(0) > 0,
        "what a standby reads is counted: {:?}",
        status.drops
    );

    // Held: active at once, and it initiates itself.
    let started = Instant::now();
    let hold = r
        .hold(Duration::from_millis(2_500), Duration::from_secs(1))
        .await
        .expect("hold");
    assert!(!hold.was_active && hold.active);
    while handshake_ms(&p).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no handshake after the promotion"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("handshake {:?} after the hold", started.elapsed());
    assert!(replica.pings(remote.address), "traffic flows once active");
    let status = r.status().await.expect("status");
    assert!(status.active && status.active_remaining_ms > 0 && status.promotions == 1);

    // Not renewed: standby again at the deadline, without anyone saying so.
    while started.elapsed() < Duration::from_millis(2_700) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = r.status().await.expect("status");
    assert!(!status.active, "the hold lapsed");
    assert!(
        !replica.pings(remote.address),
        "no traffic after the deadline"
    );

    // Bounds.
    let refused = r
        .hold(Duration::from_millis(600_001), Duration::from_secs(1))
        .await
        .expect_err("too long a hold");
    assert!(
        refused
            .to_string()
            .contains("active_for_ms must be at most 600000"),
        "{refused}"
    );
    let again = r
        .hold(Duration::ZERO, Duration::from_secs(1))
        .await
        .expect("hold 0");
    assert!(!again.was_active && !again.active);
    assert_eq!(r.status().await.expect("status").promotions, 1);
}
