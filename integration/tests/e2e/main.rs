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
//!   real API servers (`real_apiservers`, `key_rotation`; fixture `apiserver_lab`).
//! - Static: `deploy/` against the binaries (`deploy_sync`), the dashboard against the
//!   metrics (`dashboard`).
//!
//! Every test that runs processes holds [`serial`] for its whole run: each uses the
//! machine's cores, namespaces and ports as if alone, and some measure time. Only the static
//! checks run beside them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Condvar, Mutex, PoisonError};

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
mod reliability_flood;
mod reliability_gateway;
mod reliability_soak;
mod route_agent;

static BUSY: Mutex<bool> = Mutex::new(false);
static FREE: Condvar = Condvar::new();

/// The turn of one test that runs processes; the next one's starts when it is dropped (also
/// when the test panics).
#[derive(Debug)]
#[must_use = "the turn ends when the guard is dropped"]
pub struct Serial(());

/// Waits for the turn (see the module docs).
pub fn serial() -> Serial {
    let mut busy = BUSY.lock().unwrap_or_else(PoisonError::into_inner);
    while *busy {
        busy = FREE.wait(busy).unwrap_or_else(PoisonError::into_inner);
    }
    *busy = true;
    Serial(())
}

impl Drop for Serial {
    fn drop(&mut self) {
        *BUSY.lock().unwrap_or_else(PoisonError::into_inner) = false;
        FREE.notify_one();
    }
}
