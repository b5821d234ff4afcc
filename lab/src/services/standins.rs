//! Long-lived processes the services demo starts inside the lab's namespaces, as hidden
//! `kubetun-lab` subcommands (they die with their namespace on `down`):
//!
//! - [`serve_http`]: the demo Service's backend, a minimal HTTP/1.1 server whose answer names
//!   its cluster and the client address it saw;
//! - [`serve_dns`]: in a lab without API servers, the `clusterset.local` server: the
//!   controller's own DNS server, answering from a table file the lab rewrites (what the
//!   controller's services loop would publish), reloaded when it changes.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use kubetun_controller::operator::services::dns::{DnsService, DnsTable};
use kubetun_controller::operator::services::dns_server::{self, DnsMetrics};

use crate::error::LabError;

/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 64;
/// The largest request head read.
const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the DNS table file is checked for changes.
const RELOAD_EVERY: Duration = Duration::from_millis(50);

/// Serves `GET` on `listen` until killed: `200` with `<label>, client <address>`.
pub fn serve_http(listen: SocketAddr, label: &str) -> Result<(), LabError> {
    let listener = TcpListener::bind(listen).map_err(|error| LabError::Io {
        path: PathBuf::from(listen.to_string()),
        error,
    })?;
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (active, label) = (active.clone(), label.to_owned());
        std::thread::spawn(move || {
            let _ = answer(stream, &label);
            active.fetch_sub(1, Ordering::AcqRel);
        });
    }
    Ok(())
}

fn answer(mut stream: TcpStream, label: &str) -> std::io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut request = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer)?;
        if n == 0 || request.len() + n > MAX_REQUEST {
            return Ok(());
        }
        request.extend_from_slice(&buffer[..n]);
    }
    let status = if request.starts_with(b"GET ") {
        "200 OK"
    } else {
        "405 Method Not Allowed"
    };
    let body = format!("{label}, client {}\n", stream.peer_addr()?.ip());
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The table file's form: JSON rows, since the table's keys are pairs.
type TableRows = Vec<(String, String, DnsService)>;

/// Writes `table` to `path` atomically (the server may read it at any time).
pub fn write_dns_table(path: &Path, table: &DnsTable) -> Result<(), LabError> {
    let rows: TableRows = table
        .iter()
        .map(|((namespace, name), service)| (namespace.clone(), name.clone(), service.clone()))
        .collect();
    let text = serde_json::to_string(&rows).map_err(|e| LabError::Internal(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|error| LabError::Io {
            path: path.to_owned(),
            error,
        })
}

fn read_dns_table(path: &Path) -> Option<DnsTable> {
    let rows: TableRows = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some(
        rows.into_iter()
            .map(|(namespace, name, service)| ((namespace, name), service))
            .collect(),
    )
}

/// Serves `clusterset.local` on `listen` (UDP and TCP) from the table in `table_file` until
/// killed, reloading the file whenever it changes.
pub fn serve_dns(listen: SocketAddr, table_file: &Path) -> Result<(), LabError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LabError::Runtime)?;
    runtime.block_on(async {
        let sockets = dns_server::bind(listen)
            .await
            .map_err(|error| LabError::Io {
                path: PathBuf::from(listen.to_string()),
                error,
            })?;
        let table = Arc::new(ArcSwap::from_pointee(DnsTable::new()));
        tokio::spawn(dns_server::serve(
            sockets,
            table.clone(),
            DnsMetrics::default(),
        ));
        // Every write renames a new file over the old one: a new inode, even when two writes
        // fall within one tick of the file system's clock.
        let mut loaded: Option<(u64, SystemTime)> = None;
        loop {
            let modified = std::fs::metadata(table_file)
                .and_then(|m| Ok((std::os::unix::fs::MetadataExt::ino(&m), m.modified()?)))
                .ok();
            if modified != loaded
                && let Some(new) = read_dns_table(table_file)
            {
                table.store(Arc::new(new));
                loaded = modified;
            }
            tokio::time::sleep(RELOAD_EVERY).await;
        }
    })
}
