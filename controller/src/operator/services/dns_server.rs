//! IO shell of the `clusterset.local` DNS server: one UDP socket and one TCP listener on the
//! same address, answering from the table the services loop publishes ([`super::dns`] does
//! the rest). Bounded as an exposed socket must be: a datagram is read into a fixed buffer
//! (a longer one arrives cut and gets FORMERR); TCP allows [`MAX_CONNECTIONS`] at once, each
//! idle for at most [`IDLE`], and drops a connection whose length prefix announces nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::dns::{DnsTable, Transport, answer};

/// TCP connections served at once; more wait in the accept queue.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a TCP connection may stay silent (and how long one message may take).
pub const IDLE: Duration = Duration::from_secs(10);

/// The table the server answers from; the services loop swaps in a new one after each pass.
pub type SharedTable = Arc<ArcSwap<DnsTable>>;

/// Labels of the query counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// `answered` or `dropped` (not even a header).
    pub outcome: &'static str,
}

/// `kubetun_controller_dns_queries_total`.
#[derive(Clone, Debug, Default)]
pub struct DnsMetrics {
    /// Queries by transport and outcome.
    pub queries: Family<QueryLabels, Counter>,
}

impl DnsMetrics {
    /// Registers under `kubetun_controller`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry
            .sub_registry_with_prefix("kubetun_controller")
            .register(
                "dns_queries",
                "DNS queries for clusterset.local, by transport and outcome",
                self.queries.clone(),
            );
    }

    fn count(&self, transport: &'static str, answered: bool) {
        let outcome = if answered { "answered" } else { "dropped" };
        self.queries
            .get_or_create(&QueryLabels { transport, outcome })
            .inc();
    }
}

/// Binds UDP and TCP on `addr` (both, or an error naming the address).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(UdpSocket, TcpListener)> {
    Ok((UdpSocket::bind(addr).await?, TcpListener::bind(addr).await?))
}

/// Serves until the process stops.
pub async fn serve(sockets: (UdpSocket, TcpListener), table: SharedTable, metrics: DnsMetrics) {
    let (udp, tcp) = sockets;
    tokio::join!(
        serve_udp(udp, table.clone(), metrics.clone()),
        serve_tcp(tcp, table, metrics)
    );
}

async fn serve_udp(socket: UdpSocket, table: SharedTable, metrics: DnsMetrics) {
    let mut buffer = vec![0u8; 4096];
    loop {
        let (len, from) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "dns: receive failed");
                continue;
            }
        };
        let reply = answer(&table.load(), &buffer[..len], Transport::Udp);
        metrics.count("udp", reply.is_some());
        if let Some(reply) = reply
            && let Err(error) = socket.send_to(&reply, from).await
        {
            tracing::debug!(%error, "dns: send failed");
        }
    }
}

async fn serve_tcp(listener: TcpListener, table: SharedTable, metrics: DnsMetrics) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "dns: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (table, metrics) = (table.clone(), metrics.clone());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(3600),
                connection(stream, &table, &metrics),
            )
            .await;
            drop(permit);
        });
    }
}

/// Length-prefixed messages (RFC 1035 4.2.2) until the client goes quiet or stops making
/// sense.
async fn connection(mut stream: TcpStream, table: &SharedTable, metrics: &DnsMetrics) {
    let mut message = Vec::new();
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(IDLE, stream.read_u16()).await else {
            return;
        };
        if len == 0 {
            return;
        }
        message.resize(usize::from(len), 0);
        let Ok(Ok(_)) = tokio::time::timeout(IDLE, stream.read_exact(&mut message)).await else {
            return;
        };
        let Some(reply) = answer(&table.load(), &message, Transport::Tcp) else {
            metrics.count("tcp", false);
            return;
        };
        metrics.count("tcp", true);
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&reply_len.to_be_bytes());
        framed.extend_from_slice(&reply);
        if !matches!(
            tokio::time::timeout(IDLE, stream.write_all(&framed)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}
