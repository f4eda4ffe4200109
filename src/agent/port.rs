//! The agent's port, bounded by design. It is plain HTTP on the host network, reachable by any
//! pod: nothing a pod sends it may take the agent down (its supervisor gives up after ten
//! quick deaths, the watchdog armed) or keep podha's heartbeat from being answered (an agent
//! podha stops hearing fences its node). So the agent serves its connections itself, with
//! stated limits, sized against the chart's 128 MiB memory limit:
//!
//! - **At most [`Limits::connections`] connections at once, at most [`Limits::per_source`]
//!   from one address.** A connection over either is closed the moment it is accepted, and
//!   counted (`podha_agent_connections_refused_total{limit}`). The agent keeps accepting:
//!   a listener that stopped would leave new connects in the kernel's queue, and podha's among
//!   them. One pod (one address) cannot fill the port; podha's leader (a pod address of its
//!   own) and each peer (its node's address) keep their share. podha keeps its connection
//!   open between heartbeats, so a flood that began after it does not close it.
//! - **A request's head within [`Limits::head_within`]**, on a new connection and between
//!   requests on one kept open: a connection that sends nothing, or its head a byte at a time
//!   (slowloris), is closed. podha's leader probes every second, well within it.
//! - **A head of at most [`HEAD_BUFFER`] bytes**: a longer one is refused (hyper's buffer
//!   limit). No request has a body: the endpoints read none, and a body not read is not
//!   waited for (the connection is closed after the answer).
//! - **A connection lives at most [`Limits::lifetime`]**, however it behaves.
//! - **Each accepted socket's receive buffer is [`crate::listen::RECEIVE_BUFFER`] bytes**
//!   (set on the listening socket, which its connections inherit): what a sender that never
//!   gets read can park in the kernel, charged to the agent's memory.
//!
//! Memory at the limits: a connection holds a read buffer of at most 16 KiB, a small write
//! buffer and task, and at most 32 KiB queued in the kernel (twice the buffer asked for):
//! under 64 KiB, so 512 connections take under 32 MiB beside the agent's own 10 to 20 MiB.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
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
/// a connection.
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

impl Refusal {
    pub const fn label(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::PerSource => "per_source",
        }
    }
}

/// The connections open, in all and by source address.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// A connection's place among those open, given back when it ends.
struct Slot {
    open: Arc<Mutex<Open>>,
    source: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
    }
}

/// A place for a connection from `source`, or the limit that refuses it.
fn admit(open: &Arc<Mutex<Open>>, source: IpAddr, limits: &Limits) -> Result<Slot, Refusal> {
    let mut book = lock(open);
    if book.total >= limits.connections {
        return Err(Refusal::Connections);
    }
    let from_source = book.by_source.entry(source).or_default();
    if *from_source >= limits.per_source {
        return Err(Refusal::PerSource);
    }
    *from_source += 1;
    book.total += 1;
    Ok(Slot {
        open: open.clone(),
        source,
    })
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
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if transient(&e) => {
                // Out of files or memory for a moment, or a connection that reset before it
                // was accepted: try again shortly rather than spin.
                warn!(error = %e, "cannot accept a connection on the agent's port");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let slot = match admit(&open, source_of(peer), &limits) {
            Ok(slot) => slot,
            Err(refusal) => {
                counters::connection_refused(refusal.label());
                drop(stream);
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.head_within)
                .max_buf_size(HEAD_BUFFER)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.lifetime, connection).await;
        });
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
