//! The lab's namespaces addressed by name. A lab outlives the process that built it (`up`,
//! then `move-gateway` or a test's own probes), so later steps cannot hold the fixtures' owning
//! handles; these helpers run commands in, and enter, a namespace given only its name.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kubetun_testenv::netns;

/// Pings `addr` from namespace `ns` (`count` packets, 1 s deadline each); true on replies.
pub fn ping(ns: &str, addr: Ipv4Addr, count: u32) -> bool {
    netns::ping_from(ns, &addr.to_string(), count)
}

/// Pings `addr` from namespace `ns` until it answers or `timeout` passes.
pub fn wait_ping(ns: &str, addr: Ipv4Addr, timeout: Duration) -> bool {
    netns::wait_ping_from(ns, &addr.to_string(), timeout)
}

/// Sends UDP datagrams from namespace `ns` to `target:port`, where nothing listens, until the
/// ICMP port-unreachable error comes back (a connected socket then fails with
/// `ConnectionRefused`) or `timeout` passes. Returns the time to the error.
pub fn udp_refused(
    ns: &str,
    target: Ipv4Addr,
    port: u16,
    timeout: Duration,
) -> Result<Duration, String> {
    let probe = move || -> Result<Duration, String> {
        let started = Instant::now();
        let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
            .and_then(|socket| {
                socket.connect((target, port))?;
                socket.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok(socket)
            })
            .map_err(|e| format!("udp socket: {e}"))?;
        let mut buffer = [0u8; 64];
        while started.elapsed() < timeout {
            // The send itself fails once an earlier datagram's error has arrived.
            let outcome = socket
                .send(b"kubetun lab udp check")
                .and_then(|_| socket.recv(&mut buffer));
            match outcome {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Ok(started.elapsed());
                }
                Ok(_) => return Err(format!("{target}:{port} answered")),
                Err(_) => {}
            }
        }
        Err(format!("no ICMP error within {timeout:?}"))
    };
    netns::run_in_named(ns, probe).map_err(|e| format!("enter namespace {ns}: {e}"))?
}

/// A TCP exchange: a server in `server_ns` listens on `listen:port`; a client in `client_ns`
/// connects to `target:port` (retrying until `timeout`), sends a message and reads it back.
/// Returns the client address the server saw.
pub fn tcp_exchange(
    client_ns: &str,
    server_ns: &str,
    listen: Ipv4Addr,
    target: Ipv4Addr,
    port: u16,
    timeout: Duration,
) -> Result<SocketAddr, String> {
    const MESSAGE: &[u8] = b"kubetun lab tcp check";
    let deadline = Instant::now() + timeout;
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    std::thread::scope(|scope| {
        let server = scope.spawn(move || -> Result<SocketAddr, String> {
            let serve = move || -> Result<SocketAddr, String> {
                let bound = TcpListener::bind((listen, port)).and_then(|listener| {
                    listener.set_nonblocking(true)?;
                    Ok(listener)
                });
                let listener = match bound {
                    Ok(listener) => {
                        let _ = ready_tx.send(Ok(()));
                        listener
                    }
                    Err(e) => {
                        let message = format!("listen on {listen}:{port}: {e}");
                        let _ = ready_tx.send(Err(message.clone()));
                        return Err(message);
                    }
                };
                let (mut stream, peer) = loop {
                    match listener.accept() {
                        Ok(accepted) => break accepted,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if Instant::now() >= deadline {
                                return Err("no connection arrived".to_owned());
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                };
                stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .map_err(|e| e.to_string())?;
                let mut buffer = [0u8; MESSAGE.len()];
                stream.read_exact(&mut buffer).map_err(|e| e.to_string())?;
                stream.write_all(&buffer).map_err(|e| e.to_string())?;
                Ok(peer)
            };
            netns::run_in_named(server_ns, serve)
                .map_err(|e| e.to_string())
                .and_then(|r| r)
        });
        let client_result = match ready_rx.recv_timeout(timeout) {
            Ok(Ok(())) => netns::run_in_named(client_ns, || {
                connect_and_echo(target, port, deadline, MESSAGE)
            })
            .map_err(|e| e.to_string())
            .and_then(|r| r),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the server did not start listening".to_owned()),
        };
        let server_result = server
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match (client_result, server_result) {
            (Ok(()), Ok(peer)) => Ok(peer),
            (Err(client), Ok(_)) => Err(format!("client: {client}")),
            (Ok(()), Err(server)) => Err(format!("server: {server}")),
            (Err(client), Err(server)) => Err(format!("client: {client}; server: {server}")),
        }
    })
}

fn connect_and_echo(
    target: Ipv4Addr,
    port: u16,
    deadline: Instant,
    message: &[u8],
) -> Result<(), String> {
    let address = SocketAddr::from((target, port));
    let mut stream = loop {
        match TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => return Err(format!("connect {address}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream.write_all(message).map_err(|e| e.to_string())?;
    let mut echo = vec![0u8; message.len()];
    stream.read_exact(&mut echo).map_err(|e| e.to_string())?;
    if echo == message {
        Ok(())
    } else {
        Err("the echo differs from what was sent".to_owned())
    }
}
