//! Framing and bounds of the UAPI server, against an in-memory stream and a fake handler
//! (the wireguard-go side-by-side comparison is in the integration tests).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::peercred::PeerPolicy;

fn limits() -> Limits {
    Limits {
        max_line: 1024,
        max_request: 8 * 1024,
        timeout: Duration::from_secs(2),
        max_connections: 2,
    }
}

async fn fake(request: Request) -> String {
    match request {
        Request::Get => "listen_port=1\nerrno=0\n\n".to_owned(),
        Request::Set(command) => format_errno(if command.listen_port == Some(9) {
            98
        } else {
            0
        }),
    }
}

/// Starts a conversation with the fake handler; returns the client end.
fn connect(limits: Limits) -> DuplexStream {
    let (client, server) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        let (read, write) = tokio::io::split(server);
        converse(read, write, limits, fake).await;
    });
    client
}

/// Sends `request`, half-closes if `close`, and reads until the server closes (bounded).
async fn exchange(request: &[u8], close: bool) -> (Vec<u8>, bool) {
    let mut client = connect(limits());
    client.write_all(request).await.expect("write");
    if close {
        client.shutdown().await.expect("shutdown");
    }
    let mut reply = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut reply))
        .await
        .is_ok();
    (reply, closed)
}

#[tokio::test]
async fn answers_requests_one_after_another() {
    let (reply, closed) = exchange(b"get=1\n\nset=1\nlisten_port=9\n\nset=1\r\n", false).await;
    assert!(closed, "an unknown operation (CRLF) closes the connection");
    assert_eq!(reply, b"listen_port=1\nerrno=0\n\nerrno=-98\n\n");
}

#[tokio::test]
async fn get_with_an_extra_line_is_einval_and_closes() {
    let (reply, closed) = exchange(b"get=1\nfoo=bar\n\n", false).await;
    assert!(closed);
    assert_eq!(reply, b"errno=-22\n\n");
}

#[tokio::test]
async fn crlf_operation_and_invalid_utf8_operation_close_without_reply() {
    for request in [&b"get=1\r\n\r\n"[..], b"\xff\xfe\n\n", b"bogus\n\n"] {
        let (reply, closed) = exchange(request, false).await;
        assert!(closed, "{request:?} must not hang");
        assert!(reply.is_empty(), "{request:?}: {reply:?}");
    }
}

#[tokio::test]
async fn crlf_set_lines_and_invalid_utf8_values_get_errno() {
    let (reply, _) = exchange(b"set=1\r\nlisten_port=7\r\n\r\nget=1\n\n", true).await;
    // "set=1\r\n" is not an operation: closed before anything else is read.
    assert!(reply.is_empty());
    let (reply, closed) = exchange(b"set=1\nlisten_port=7\r\n\r\nget=1\n\n", true).await;
    assert!(closed);
    assert_eq!(reply, b"errno=0\n\nlisten_port=1\nerrno=0\n\n");
    let (reply, _) = exchange(b"set=1\nlisten_port=\xff\n\nget=1\n\n", true).await;
    assert_eq!(reply, b"errno=-22\n\nlisten_port=1\nerrno=0\n\n");
    let (reply, _) = exchange(b"set=1\nno equals\nlisten_port=1\n\n", true).await;
    assert_eq!(reply, b"errno=-71\n\n");
}

#[tokio::test]
async fn a_set_ended_by_eof_is_applied() {
    let (reply, closed) = exchange(b"set=1\nlisten_port=9", true).await;
    assert!(closed);
    assert_eq!(reply, b"errno=-98\n\n");
}

#[tokio::test]
async fn an_oversized_line_is_answered_and_closed_without_reading_it_all() {
    let mut client = connect(limits());
    client
        .write_all(b"set=1\nallowed_ip=")
        .await
        .expect("write");
    // Far more than the limit, never a newline; the server must answer while we still send.
    let chunk = vec![b'1'; 4096];
    let writer = tokio::spawn(async move {
        for _ in 0..64 {
            if client.write_all(&chunk).await.is_err() {
                break;
            }
        }
        client
    });
    let mut client = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the server must not stall the writer")
        .expect("writer task");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut reply))
        .await
        .expect("closed")
        .expect("read");
    assert_eq!(reply, b"errno=-5\n\n");
}

#[tokio::test]
async fn an_oversized_request_gets_emsgsize() {
    let mut request = b"set=1\n".to_vec();
    for _ in 0..1000 {
        request.extend_from_slice(b"listen_port=1\n");
    }
    let (reply, closed) = exchange(&request, false).await;
    assert!(closed);
    assert_eq!(reply, b"errno=-90\n\n");
}

#[tokio::test]
async fn an_idle_or_slow_client_times_out() {
    let short = Limits {
        timeout: Duration::from_millis(200),
        ..limits()
    };
    for request in [&b""[..], b"set=1\nlisten_port=1\n", b"get=1\n"] {
        let mut client = connect(short);
        client.write_all(request).await.expect("write");
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut reply))
            .await
            .expect("the server must close an idle connection")
            .expect("read");
        assert_eq!(reply, b"errno=-110\n\n", "{request:?}");
    }
}

#[tokio::test]
async fn excess_connections_get_eagain_and_the_socket_deletion_stops_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t0.sock");
    let server = UapiServer::bind(&path)
        .await
        .expect("bind")
        .with_limits(limits());
    let serving = tokio::spawn(server.serve_with(fake, PeerPolicy::for_this_process()));
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::UnixStream::connect(&path)
            .await
            .expect("connect");
        // A round trip proves the connection holds a slot.
        stream.write_all(b"get=1\n\n").await.expect("write");
        let mut reply = [0u8; 23];
        stream.read_exact(&mut reply).await.expect("reply");
        held.push(stream);
    }
    let mut third = tokio::net::UnixStream::connect(&path)
        .await
        .expect("connect");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut reply))
        .await
        .expect("refused promptly")
        .expect("read");
    assert_eq!(reply, b"errno=-11\n\n");
    drop(held);

    std::fs::remove_file(&path).expect("delete the socket");
    let reason = tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("the server stops when its socket is deleted")
        .expect("task");
    assert!(reason.contains("deleted"), "{reason}");
}
