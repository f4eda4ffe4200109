//! The agent's port, bounded by design. It is plain HTTP on the host network, reachable by any
//! pod: nothing a pod sends it may take the agent down (its supervisor gives up after ten
//! quick deaths, the watchdog armed) or keep podha's heartbeat from being answered (an agent
//! podha stops hearing fences its node). So the agent serves its connections itself, in a task
//! of its own, with stated limits, sized against the chart's 128 MiB memory limit:
//!
//! - **Trusted connections first.** A connection that carried a word the agent believes (a
//!   heartbeat signed by podha's leader, a question signed by a peer: [`Trust`]) is kept open
//!   while it is used, and never evicted. Any other serves one request and closes (its answer
//!   says `Connection: close`; requests sent ahead of it are never read, so nothing piles up
//!   in a write buffer).
//! - **At most [`Limits::connections`] connections at once, at most [`Limits::per_source`]
//!   from one address.** A new connection over either evicts the oldest untrusted one in its
//!   way (from its own address, or at all), and is refused only when every connection in its
//!   way is trusted; both are counted (`podha_agent_connections_refused_total{limit}`). The
//!   agent keeps accepting: a listener that stopped would leave new connects, podha's among
//!   them, in the kernel's queue; a flood of connections that never say a believed word
//!   cannot keep podha's or a peer's out, whatever address it shares with them. A refused
//!   connection is reset (nothing left in TIME_WAIT or, for long, in conntrack).
//! - **A request's head within [`Limits::head_within`]**, on a new connection and between
//!   requests on one kept open: a connection that sends nothing, or its head a byte at a time
//!   (slowloris), is closed. podha's leader probes every second, well within it.
//! - **A head of at most [`HEAD_BUFFER`] bytes**: a longer one is refused (hyper's buffer
//!   limit). No request has a body: the endpoints read none, and a body not read is not
//!   waited for (the connection is closed after the answer).
//! - **An untrusted connection lives at most [`Limits::lifetime`]**, however it behaves.
//! - **Each accepted socket's receive buffer is [`crate::listen::RECEIVE_BUFFER`] bytes**
//!   (set on the listening socket, which its connections inherit): what a sender that never
//!   gets read can park in the kernel, charged to the agent's memory.
//!
//! Memory at the limits: a connection holds a read buffer of at most 16 KiB, a small write
//! buffer and task, and at most 32 KiB queued in the kernel (twice the buffer asked for):
//! under 64 KiB, so 512 connections take under 32 MiB beside the agent's own 10 to 20 MiB.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, Request, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tower::ServiceExt;
use tracing::warn;

use super::counters;
use super::peer_list::lock;

/// The limits of the agent's port (see the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub connections: usize,
    pub per_source: usize,
    pub head_within: Duration,
    pub lifetime: Duration,
}

/// The agent's limits: 512 connections, 8 from one address (podha's leader keeps one, a peer
/// opens one per survey), a request's head within 5 s (podha probes every second), 10 minutes
/// an untrusted connection.
pub const LIMITS: Limits = Limits {
    connections: 512,
    per_source: 8,
    head_within: Duration::from_secs(5),
    lifetime: Duration::from_secs(600),
};

/// The longest request head the agent reads, in bytes (hyper's smallest buffer limit is
/// 8 KiB; podha's heartbeat is about 400 bytes).
pub const HEAD_BUFFER: usize = 16 * 1024;

/// Which limit closed a connection as it was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// [`Limits::connections`] were open.
    Connections,
    /// [`Limits::per_source`] were open from its address.
    PerSource,
}

/// The label of an untrusted connection closed to make room for a new one.
pub const EVICTED: &str = "evicted";

/// Every `limit` label `podha_agent_connections_refused_total` takes.
pub const REFUSAL_LABELS: [&str; 3] = [
    Refusal::Connections.label(),
    Refusal::PerSource.label(),
    EVICTED,
];

impl Refusal {
    pub const fn label(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::PerSource => "per_source",
        }
    }
}

/// Whether a connection has carried a word the agent believes: a heartbeat signed by podha's
/// leader, or a survey question signed by a peer (the endpoints grant it, `super::server`). A
/// trusted connection is kept open between requests and never evicted; any other serves one
/// request and closes, and is the first to go when the port is full.
#[derive(Clone, Debug, Default)]
pub struct Trust(Arc<AtomicBool>);

impl Trust {
    pub fn grant(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn granted(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// An open connection: where from, whether trusted, and how to close it.
struct Conn {
    source: IpAddr,
    trust: Trust,
    task: Option<AbortHandle>,
}

/// The connections open, oldest first.
#[derive(Default)]
struct Open {
    conns: BTreeMap<u64, Conn>,
    next: u64,
}

impl Open {
    fn open_from(&self, source: IpAddr) -> usize {
        self.conns.values().filter(|c| c.source == source).count()
    }

    /// The oldest connection not trusted (from `source`, if given).
    fn oldest_untrusted(&self, source: Option<IpAddr>) -> Option<u64> {
        self.conns
            .iter()
            .find(|(_, c)| !c.trust.granted() && source.is_none_or(|s| c.source == s))
            .map(|(id, _)| *id)
    }
}

/// A connection's place among those open, given back when it ends.
struct Slot {
    open: Arc<Mutex<Open>>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.open).conns.remove(&self.id);
    }
}

/// A place for a connection from `source`, with its trust, and the connection evicted for it,
/// if one was: the oldest one not trusted from the same address when that address has its
/// share open, or the oldest one not trusted at all when the port is full. Refused (the limit
/// that refuses it) only when every connection in the way is trusted: a flood of connections
/// that never say a believed word cannot keep podha's, or a peer's, out.
fn admit(
    open: &Arc<Mutex<Open>>,
    source: IpAddr,
    limits: &Limits,
) -> Result<(Slot, Trust, Option<AbortHandle>), Refusal> {
    let mut book = lock(open);
    let in_the_way = if book.open_from(source) >= limits.per_source {
        Some(
            book.oldest_untrusted(Some(source))
                .ok_or(Refusal::PerSource)?,
        )
    } else if book.conns.len() >= limits.connections {
        Some(book.oldest_untrusted(None).ok_or(Refusal::Connections)?)
    } else {
        None
    };
    let evicted = in_the_way
        .and_then(|id| book.conns.remove(&id))
        .and_then(|c| c.task);
    let id = book.next;
    book.next += 1;
    let trust = Trust::default();
    book.conns.insert(
        id,
        Conn {
            source,
            trust: trust.clone(),
            task: None,
        },
    );
    let slot = Slot {
        open: open.clone(),
        id,
    };
    Ok((slot, trust, evicted))
}

/// The address a connection came from, an IPv4 one as itself when it reached the dual-stack
/// socket as `::ffff:a.b.c.d`: one source, however it arrived.
fn source_of(peer: SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Serves `router` on `listener` within `limits`, until accepting fails for good.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits) -> std::io::Result<()> {
    let open = Arc::new(Mutex::new(Open::default()));
    let mut said_accept_error = false;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                said_accept_error = false;
                accepted
            }
            Err(e) if transient(&e) => {
                // Out of files or memory for a moment, or a connection that reset before it
                // was accepted: try again shortly rather than spin (said once per run).
                if !said_accept_error {
                    warn!(error = %e, "cannot accept a connection on the agent's port");
                    said_accept_error = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let (slot, trust, evicted) = match admit(&open, source_of(peer), &limits) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                counters::connection_refused(refusal.label());
                // A reset, not a close: nothing left in TIME_WAIT, nor in conntrack for long.
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                drop(stream);
                continue;
            }
        };
        if let Some(task) = evicted {
            counters::connection_refused(EVICTED);
            task.abort();
        }
        let id = slot.id;
        let task = tokio::spawn(connection(stream, router.clone(), slot, trust, limits));
        if let Some(conn) = lock(&open).conns.get_mut(&id) {
            conn.task = Some(task.abort_handle());
        }
    }
}

/// One connection: `router`'s answers, within the limits. A connection not trusted closes
/// after its first answer (hyper reads no request after a `Connection: close`, so requests
/// sent ahead without reading the answers pile up nowhere) and lives at most
/// [`Limits::lifetime`]; a trusted one stays open while it is used.
async fn connection(stream: TcpStream, router: Router, slot: Slot, trust: Trust, limits: Limits) {
    let _slot = slot;
    let of_connection = trust.clone();
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let trust = of_connection.clone();
        request.extensions_mut().insert(trust.clone());
        let answer = router.clone().oneshot(request);
        async move {
            let mut response = answer.await?;
            if !trust.granted() {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_within)
        .max_buf_size(HEAD_BUFFER)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = &mut connection => {}
        () = tokio::time::sleep(limits.lifetime) => {
            if trust.granted() {
                let _ = connection.await;
            }
        }
    }
}

/// Whether an accept error passes: every one but a listener that is gone.
fn transient(e: &std::io::Error) -> bool {
    !matches!(
        e.raw_os_error(),
        Some(nix::libc::EBADF | nix::libc::EINVAL | nix::libc::ENOTSOCK)
    )
}

#[cfg(test)]
mod tests;
