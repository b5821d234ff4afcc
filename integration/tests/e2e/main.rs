//! kubetun end to end: real processes in network namespaces, real API servers, pods under
//! podman, and the checks that keep `deploy/` in sync with the binaries. One test binary; the
//! programs it runs are built by `cargo build --workspace --bins` first.
//!
//! - Gateways: interop with wireguard-go (`gateway_interop`), hostile input on every socket
//!   (`gateway_hardening`), the connectivity check (`gateway_conncheck`), key rotation on two
//!   processes (`gateway_rotation`), standby and fallback with several gateways
//!   (`gateway_standby`, `gateway_fallback`; fixture `gateway_ns`), replicated gateways
//!   (`gateway_ha`), the image and the gateway pod (`gateway_pod`).
//! - Reliability: restarts and kill -9 (`reliability_gateway`), floods (`reliability_flood`),
//!   a soak (`reliability_soak`).
//! - The lab: in namespaces (`lab`, `lab_multinode`, `route_agent`, `netns_fixtures`) and on
//!   real API servers (`real_apiservers`, `key_rotation`; fixture `apiserver_lab`); kubetun
//!   installed as pods on real nodes, with the whole MCS conformance suite (`real_nodes`).
//! - `deploy/` against the binaries (`deploy_sync`, static), the dashboard against the
//!   metrics of a running gateway (`dashboard`).
//!
//! Every test that runs processes holds a turn of its module for its whole run
//! (`kubetun_testenv::turn(module_path!())`): the tests of one module (one binary before)
//! run side by side as before, never beside another module's, since each uses the machine's
//! cores, namespaces and ports as if alone and some measure time. `deploy_sync` (static) takes
//! none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_lab;
mod gateway_ns;

mod dashboard;
mod deploy_sync;
mod gateway_conncheck;
mod gateway_fallback;
mod gateway_ha;
mod gateway_hardening;
mod gateway_interop;
mod gateway_pod;
mod gateway_rotation;
mod gateway_standby;
mod key_rotation;
mod lab;
mod lab_multinode;
mod netns_fixtures;
mod real_apiservers;
mod real_nodes;
mod reliability_flood;
mod reliability_gateway;
mod reliability_soak;
mod route_agent;
