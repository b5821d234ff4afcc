//! One `kubetun-gateway` process in a namespace of its own, driven over gRPC: what the
//! tests with several gateways (standby, fallback through a hub) each need.

use std::path::PathBuf;
use std::time::Duration;

use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::netns::{Netns, NsChild, gateway_command, spawn_gateway};

/// Every test gateway's interface name: each has its own namespace and UAPI directory.
const INTERFACE: &str = "kt-test";

pub struct GatewayNs {
    // The process stops before its namespace is deleted.
    process: Option<NsChild>,
    pub ns: Netns,
    pub key: GatewayKey,
    dir: tempfile::TempDir,
}

impl GatewayNs {
    /// A fresh namespace `name` (with forwarding on) and key; no process yet.
    pub fn new(name: &str) -> Self {
        let ns = Netns::new(name).expect("namespace");
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])
            .expect("forwarding");
        Self {
            process: None,
            ns,
            key: GatewayKey::generate(),
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("gateway.grpc.sock")
    }

    /// Starts the gateway with `extra` arguments and waits for its control socket; its log
    /// goes to `gateway.log` in its directory.
    pub fn start(&mut self, extra: &[&str]) {
        let log = self.dir.path().join("gateway.log");
        let mut cmd = gateway_command(self.ns.name(), INTERFACE, &self.socket(), &log, "info")
            .expect("gateway command");
        cmd.arg("--uapi-dir").arg(self.dir.path()).args(extra);
        let process = spawn_gateway(&mut cmd, &self.socket(), Duration::from_secs(10));
        self.process = Some(process.unwrap_or_else(|e| panic!("{e}; log in {}", log.display())));
    }

    pub fn client(&self) -> GatewayClient {
        GatewayClient::new(self.socket())
    }

    /// Pings `to` from `from` (an address of this namespace), `count` times 200 ms apart;
    /// true when any reply came.
    pub fn pings(&self, from: &str, to: &str, count: u32) -> bool {
        let count = count.to_string();
        self.ns
            .succeeds(&["ping", "-c", &count, "-i", "0.2", "-W", "1", "-I", from, to])
    }
}

impl Drop for GatewayNs {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }
}
