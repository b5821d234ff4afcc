//! The sockets the controller serves on ([`Listeners`]) and how a flag names one
//! ([`ListenAddr`]).

use std::net::SocketAddr;

use crate::operator::process::error::ProcessError;
use crate::operator::services;

/// Where a server listens: kubebuilder's `--metrics-bind-address` convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenAddr {
    /// `0`: not served.
    Disabled,
    /// An address to listen on.
    Listen(SocketAddr),
}

/// `0` (off), `:PORT` (every address) or `HOST:PORT`.
pub fn parse_listen_addr(text: &str) -> Result<ListenAddr, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(ListenAddr::Disabled);
    }
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse().map(ListenAddr::Listen).map_err(|_| {
        format!("{text:?} is not a listen address (0 disables; examples: :9587, 127.0.0.1:9587)")
    })
}

/// The sockets the controller serves on, bound before anything else so that a taken port
/// fails the start instead of later.
#[derive(Debug)]
pub struct Listeners {
    /// `/metrics` and the probes (`--metrics-addr`).
    pub metrics: Option<tokio::net::TcpListener>,
    /// The DNS server, UDP and TCP (`--dns-addr`).
    pub dns: Option<(tokio::net::UdpSocket, tokio::net::TcpListener)>,
}

impl Listeners {
    /// Binds what `metrics_addr` and `dns_addr` ask for.
    pub async fn bind(
        metrics_addr: ListenAddr,
        dns_addr: ListenAddr,
    ) -> Result<Self, ProcessError> {
        let metrics = match metrics_addr {
            ListenAddr::Disabled => None,
            ListenAddr::Listen(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| ProcessError::Metrics { addr, source })?,
            ),
        };
        let dns = match dns_addr {
            ListenAddr::Disabled => None,
            ListenAddr::Listen(addr) => Some(
                services::dns_server::bind(addr)
                    .await
                    .map_err(|source| ProcessError::Dns { addr, source })?,
            ),
        };
        Ok(Self { metrics, dns })
    }
}
