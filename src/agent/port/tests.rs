//! The port's limits against a flood, slow heads and bodies, on loopback: one address floods
//! (127.0.0.1), another (127.0.0.2, podha's leader here) keeps being answered.

use std::net::Ipv4Addr;

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::*;

const FLOODER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const PODHA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

fn limits() -> Limits {
    Limits {
        connections: 64,
        per_source: 4,
        head_within: Duration::from_millis(300),
        lifetime: Duration::from_secs(60),
    }
}

/// The agent's port on loopback, answering `GET /heartbeat` with `ok`.
async fn port(limits: Limits) -> SocketAddr {
    let (listener, listening) =
        crate::listen::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let router = Router::new().route("/heartbeat", get(|| async { "ok" }));
    tokio::spawn(serve(listener, router, limits));
    listening.addr
}

async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from.into(), 0))
        .expect("bind the source");
    socket.connect(to).await.expect("connect")
}

/// Whether the agent closed `stream` within `within` (a read gets the end, or a reset).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// A heartbeat from `from` on a new connection: answered `ok` within a second.
async fn answered(from: Ipv4Addr, to: SocketAddr) -> bool {
    let ask = async {
        let mut stream = connect_from(from, to).await;
        stream
            .write_all(b"GET /heartbeat HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(String::from_utf8_lossy(&answer).ends_with("ok"))
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[test]
fn a_source_and_the_port_each_get_their_share_and_a_closed_connection_gives_it_back() {
    let open = Arc::new(Mutex::new(Open::default()));
    let limits = Limits {
        connections: 3,
        per_source: 2,
        ..limits()
    };
    let a: IpAddr = FLOODER.into();
    let b: IpAddr = PODHA.into();
    let first = admit(&open, a, &limits).expect("a's first");
    let _second = admit(&open, a, &limits).expect("a's second");
    assert_eq!(
        admit(&open, a, &limits).err(),
        Some(Refusal::PerSource),
        "a's third"
    );
    let _b = admit(&open, b, &limits).expect("b's first");
    assert_eq!(
        admit(&open, "127.0.0.3".parse().expect("ip"), &limits).err(),
        Some(Refusal::Connections)
    );
    drop(first);
    assert!(
        admit(&open, a, &limits).is_ok(),
        "a closed one is given back"
    );
    // An IPv4 peer on the dual-stack socket is the same source as itself.
    let mapped: SocketAddr = "[::ffff:127.0.0.1]:40000".parse().expect("addr");
    assert_eq!(source_of(mapped), a);
    let v6: SocketAddr = "[fd00::1]:40000".parse().expect("addr");
    assert_eq!(source_of(v6), v6.ip());
}

/// One address opens far more connections than its share, each sending nothing, or its head
/// a byte at a time, or a body it never finishes: those over its share are closed at once,
/// the others within the head's time (the bodies after their answer), the refusals counted;
/// a heartbeat from another address is answered throughout.
#[tokio::test]
async fn a_flood_from_one_address_is_closed_and_counted_while_podha_is_answered() {
    let limits = limits();
    let addr = port(limits).await;
    let refused_before = counters::connections_refused(Refusal::PerSource.label());
    let mut idle = Vec::new();
    for _ in 0..limits.per_source {
        idle.push(connect_from(FLOODER, addr).await);
    }
    let mut over = Vec::new();
    for _ in 0..20 {
        over.push(connect_from(FLOODER, addr).await);
    }
    for stream in &mut over {
        assert!(
            closed_within(stream, Duration::from_millis(500)).await,
            "a connection over the source's share is closed at once"
        );
    }
    assert!(
        counters::connections_refused(Refusal::PerSource.label()) >= refused_before + 20,
        "each refusal counted"
    );
    assert!(answered(PODHA, addr).await, "another address is answered");
    for stream in &mut idle {
        assert!(
            closed_within(stream, Duration::from_secs(2)).await,
            "a connection that sends nothing is closed once the head's time is out"
        );
    }
    // A head a byte at a time.
    let mut slow = connect_from(FLOODER, addr).await;
    let trickle = async {
        for byte in b"GET /heartbeat HTTP/1.1\r\nHost: agent\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if slow.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(2), trickle)
            .await
            .is_ok(),
        "a head sent a byte at a time is cut off"
    );
    // A body announced and never sent: answered, then closed.
    let mut body = connect_from(FLOODER, addr).await;
    body.write_all(b"GET /heartbeat HTTP/1.1\r\nHost: agent\r\nContent-Length: 1000000\r\n\r\nx")
        .await
        .expect("write");
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(1), body.read(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    assert!(String::from_utf8_lossy(&answer[..n]).contains("200 OK"));
    assert!(
        closed_within(&mut body, Duration::from_secs(2)).await,
        "a body not read is not waited for"
    );
    assert!(answered(PODHA, addr).await);
}

/// podha's connection, kept open and used every 100 ms, outlives the head's time and is
/// answered throughout a flood that began after it, from many addresses filling the port.
#[tokio::test]
async fn podhas_kept_connection_is_answered_while_others_fill_the_port() {
    let limits = Limits {
        connections: 12,
        ..limits()
    };
    let addr = port(limits).await;
    let mut podha = connect_from(PODHA, addr).await;
    let mut flood = Vec::new();
    for i in 0..16u8 {
        let from = Ipv4Addr::new(127, 0, 1, i);
        for _ in 0..limits.per_source {
            flood.push(connect_from(from, addr).await);
        }
    }
    assert!(
        counters::connections_refused(Refusal::Connections.label()) > 0,
        "the port filled"
    );
    let mut buf = vec![0u8; 1024];
    for _ in 0..10 {
        podha
            .write_all(b"GET /heartbeat HTTP/1.1\r\nHost: agent\r\n\r\n")
            .await
            .expect("write");
        let n = tokio::time::timeout(Duration::from_secs(1), podha.read(&mut buf))
            .await
            .expect("answered in time")
            .expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("ok"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
