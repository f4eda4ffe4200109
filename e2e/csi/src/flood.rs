//! `podha-csi flood`: what any pod can do to a port it reaches, for the podha agent's limits
//! (docs/agent.md, "The agent's port"): many connections at once, each never finishing its
//! request, reopened as soon as the other side closes it. A third send nothing, a third send a
//! request head a byte at a time, a third a head announcing a large body and then the body a
//! byte at a time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How a flood went: connections opened, closed by the target, and connects that failed.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct Flooded {
    pub opened: u64,
    pub closed_by_target: u64,
    pub connect_errors: u64,
}

#[derive(Default)]
struct Counts {
    opened: AtomicU64,
    closed: AtomicU64,
    failed: AtomicU64,
}

/// How long between two bytes of a slow head or body.
const TRICKLE: Duration = Duration::from_millis(200);

/// Floods `target` with `connections` at once for `duration`.
pub async fn flood(target: SocketAddr, connections: usize, duration: Duration) -> Flooded {
    let until = Instant::now() + duration;
    let counts = Arc::new(Counts::default());
    let tasks: Vec<_> = (0..connections)
        .map(|i| tokio::spawn(keep_one(target, i % 3, until, counts.clone())))
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    Flooded {
        opened: counts.opened.load(Ordering::Relaxed),
        closed_by_target: counts.closed.load(Ordering::Relaxed),
        connect_errors: counts.failed.load(Ordering::Relaxed),
    }
}

/// One connection of kind `kind` (0 idle, 1 slow head, 2 slow body), reopened until `until`.
async fn keep_one(target: SocketAddr, kind: usize, until: Instant, counts: Arc<Counts>) {
    while Instant::now() < until {
        let connect = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(target));
        let Ok(Ok(mut stream)) = connect.await else {
            counts.failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        counts.opened.fetch_add(1, Ordering::Relaxed);
        let closed = tokio::time::timeout_at(until, abuse(&mut stream, kind)).await;
        if closed.is_ok() {
            counts.closed.fetch_add(1, Ordering::Relaxed);
            // Not a busy loop against a target that closes at once.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Abuses one connection until the target closes it.
async fn abuse(stream: &mut TcpStream, kind: usize) {
    let trickled: &[u8] = match kind {
        0 => {
            let mut buf = [0u8; 256];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    return;
                }
            }
            return;
        }
        1 => {
            b"GET /heartbeat HTTP/1.1\r\nHost: agent\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        }
        _ => {
            let head =
                b"GET /heartbeat HTTP/1.1\r\nHost: agent\r\nContent-Length: 100000000\r\n\r\n";
            if stream.write_all(head).await.is_err() {
                return;
            }
            b"0123456789"
        }
    };
    for byte in trickled.iter().cycle() {
        if stream.write_all(&[*byte]).await.is_err() {
            return;
        }
        tokio::time::sleep(TRICKLE).await;
    }
}
