//! The port's limits against a flood, slow heads and bodies, on loopback: one address floods
//! (127.0.0.1), another (127.0.0.2, podha's leader here) keeps being answered.

use std::net::Ipv4Addr;

use axum::Extension;
use axum::extract::RawQuery;
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

/// The agent's port on loopback, answering `GET /heartbeat` with `ok`, and trusting a
/// connection that asks `GET /heartbeat?signed` (a stand-in for a word it believes).
async fn port(limits: Limits) -> SocketAddr {
    let (listener, listening) =
        crate::listen::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let router = Router::new().route(
        "/heartbeat",
        get(
            |Extension(trust): Extension<Trust>, RawQuery(query): RawQuery| async move {
                if query.as_deref() == Some("signed") {
                    trust.grant();
                }
                "ok"
            },
        ),
    );
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

/// A kept connection that asked a believed word (`?signed`), and is answered each time.
async fn trusted(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let mut stream = connect_from(from, to).await;
    assert!(ask_on(&mut stream, "/heartbeat?signed").await, "answered");
    stream
}

/// One request on a kept connection: whether it was answered `ok` within a second.
async fn ask_on(stream: &mut TcpStream, path: &str) -> bool {
    let request = format!("GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !String::from_utf8_lossy(&answer).ends_with("ok") {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .ok()
        .flatten()
        .is_some()
}

#[test]
fn a_full_share_or_port_evicts_its_oldest_untrusted_connection_and_refuses_only_behind_trusted_ones()
 {
    let open = Arc::new(Mutex::new(Open::default()));
    let limits = Limits {
        connections: 3,
        per_source: 2,
        ..limits()
    };
    let a: IpAddr = FLOODER.into();
    let b: IpAddr = PODHA.into();
    let admitted = |source| admit(&open, source, &limits);
    let (first, _, none) = admitted(a).expect("a's first");
    assert!(none.is_none());
    let (_second, _, _) = admitted(a).expect("a's second");
    // a's third: a has its share, its oldest untrusted one goes.
    let (_third, third_trust, _) = admitted(a).expect("a's third, evicting");
    assert!(
        !lock(&open).conns.contains_key(&first.id),
        "a's first evicted"
    );
    assert_eq!(lock(&open).open_from(a), 2);
    let (_b, b_trust, _) = admitted(b).expect("b's first");
    b_trust.grant();
    third_trust.grant();
    // The port is full: the oldest untrusted connection (a's second) goes for c's.
    let c: IpAddr = "127.0.0.3".parse().expect("ip");
    let (_c, c_trust, _) = admitted(c).expect("c, evicting a's second");
    c_trust.grant();
    // Every connection trusted: refused.
    assert_eq!(admitted(a).err(), Some(Refusal::Connections));
    drop(first);
    // An IPv4 peer on the dual-stack socket is the same source as itself.
    let mapped: SocketAddr = "[::ffff:127.0.0.1]:40000".parse().expect("addr");
    assert_eq!(source_of(mapped), a);
    let v6: SocketAddr = "[fd00::1]:40000".parse().expect("addr");
    assert_eq!(source_of(v6), v6.ip());
}

/// One address opens far more connections than its share, each sending nothing, or its head
/// a byte at a time, or a body it never finishes, or requests sent ahead without reading the
/// answers: each new one evicts the oldest, the others close within the head's time (a body
/// or requests sent ahead after one answer), every eviction counted; a heartbeat from another
/// address is answered throughout.
#[tokio::test]
async fn a_flood_from_one_address_is_closed_and_counted_while_podha_is_answered() {
    let limits = limits();
    let addr = port(limits).await;
    let evicted_before = counters::connections_refused("evicted");
    let mut flood = Vec::new();
    for _ in 0..24 {
        flood.push(connect_from(FLOODER, addr).await);
    }
    let (old, newest) = flood.split_at_mut(24 - limits.per_source);
    for stream in old.iter_mut() {
        assert!(
            closed_within(stream, Duration::from_millis(500)).await,
            "an older connection evicted for a newer one from the same address"
        );
    }
    assert!(
        counters::connections_refused("evicted") >= evicted_before + 20,
        "each eviction counted"
    );
    assert!(answered(PODHA, addr).await, "another address is answered");
    for stream in newest.iter_mut() {
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
    // A thousand requests sent ahead, the answers never read: one answer, then the end.
    let mut ahead = connect_from(FLOODER, addr).await;
    let requests = "GET /heartbeat HTTP/1.1\r\nHost: agent\r\n\r\n".repeat(1000);
    let _ = ahead.write_all(requests.as_bytes()).await;
    let mut answers = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), ahead.read_to_end(&mut answers)).await;
    let text = String::from_utf8_lossy(&answers);
    assert_eq!(
        text.matches("200 OK").count(),
        1,
        "an untrusted connection is answered once: {text}"
    );
    assert!(answered(PODHA, addr).await);
}

/// podha's connection, trusted once it carried a believed word and kept open, is answered
/// every 100 ms through a flood from many addresses that fills the port; and a new
/// connection of podha's gets in while the port is full, evicting a flood's.
#[tokio::test]
async fn podhas_kept_connection_is_answered_and_a_new_one_gets_in_while_others_fill_the_port() {
    let limits = Limits {
        connections: 12,
        ..limits()
    };
    let addr = port(limits).await;
    let mut podha = trusted(PODHA, addr).await;
    let mut flood = Vec::new();
    for i in 0..16u8 {
        let from = Ipv4Addr::new(127, 0, 1, i);
        for _ in 0..limits.per_source {
            flood.push(connect_from(from, addr).await);
        }
    }
    for _ in 0..10 {
        assert!(
            ask_on(&mut podha, "/heartbeat?signed").await,
            "kept, answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut again = connect_from(Ipv4Addr::new(127, 0, 0, 3), addr).await;
    assert!(
        ask_on(&mut again, "/heartbeat?signed").await,
        "a new connection gets in, evicting a flood's"
    );
    assert!(ask_on(&mut podha, "/heartbeat?signed").await);
}
