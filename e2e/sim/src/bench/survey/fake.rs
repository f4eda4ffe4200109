//! The fake peers: real HTTP servers on 127.0.0.1 ports. An answering one serves podha's own
//! agent endpoints (`podha::agent::server::router`) for a node podha last heard a while ago; a
//! silent one takes every connection and never answers. Every peer counts the connections it
//! holds open, and those it has not answered yet, so the bench sees how many asks reach the
//! peers at once.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, bail};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use podha::agent::leader_key::LeaderKey;
use podha::agent::peers::{Peer, Peers};
use podha::agent::server::{Endpoints, Hearing, router};
use podha::contract::Identity;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Connections the peers took; those open now and the most at once; those not answered yet
/// (taken, no answer written: an ask under way) now and the most at once.
#[derive(Debug, Default)]
pub(super) struct Gauge {
    taken: AtomicUsize,
    silent_taken: AtomicUsize,
    open: Count,
    unanswered: Count,
}

/// A number of things under way, and the most at once since the last reset.
#[derive(Debug, Default)]
struct Count {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Count {
    fn up(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn down(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    /// The most since the last reset; from now on, the most counts from what is under way.
    fn reset(&self) -> usize {
        self.most.swap(self.now(), Ordering::SeqCst)
    }
}

/// What the peers saw of one survey.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seen {
    /// Connections taken: the peers asked.
    pub(super) asked: usize,
    /// ... of which by silent peers.
    pub(super) silent_asked: usize,
    /// The most asks at once the peers had taken and not answered: at most the asks the agent
    /// had under way.
    pub(super) most_unanswered: usize,
    /// The most connections open at the peers at once: also those answered whose close a peer
    /// had not seen yet.
    pub(super) most_open: usize,
}

impl Gauge {
    fn take(self: &Arc<Self>, silent: bool) -> Open {
        self.taken.fetch_add(1, Ordering::SeqCst);
        if silent {
            self.silent_taken.fetch_add(1, Ordering::SeqCst);
        }
        self.open.up();
        self.unanswered.up();
        Open {
            gauge: self.clone(),
            unanswered: true,
        }
    }

    pub(super) fn open(&self) -> usize {
        self.open.now()
    }

    /// What was seen since the last call; the counts start again from now.
    pub(super) fn reset(&self) -> Seen {
        Seen {
            asked: self.taken.swap(0, Ordering::SeqCst),
            silent_asked: self.silent_taken.swap(0, Ordering::SeqCst),
            most_unanswered: self.unanswered.reset(),
            most_open: self.open.reset(),
        }
    }
}

/// A connection a peer holds; counted until dropped, and as unanswered until the peer writes
/// its answer.
struct Open {
    gauge: Arc<Gauge>,
    unanswered: bool,
}

impl Open {
    fn answered(&mut self) {
        if std::mem::take(&mut self.unanswered) {
            self.gauge.unanswered.down();
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.answered();
        self.gauge.open.down();
    }
}

/// A TCP listener whose connections count in a [`Gauge`] while open.
struct Counted {
    listener: TcpListener,
    gauge: Arc<Gauge>,
}

/// An accepted connection, counted while open.
struct CountedStream {
    stream: TcpStream,
    open: Open,
}

impl axum::serve::Listener for Counted {
    type Io = CountedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let open = self.gauge.take(false);
                    return (CountedStream { stream, open }, addr);
                }
                // Out of file descriptors, say: the agent's ask fails, as it would.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.open.answered();
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A peer answering `/peer` as an agent does (signing its answers with a key of its own, and
/// answering the questions `trusted` holds the asker's key of), for a node podha last heard
/// `heard_ago` before now (podha's leader down since then).
pub(super) async fn answering(
    heard_ago: Duration,
    trusted: Arc<Peers>,
    gauge: Arc<Gauge>,
) -> anyhow::Result<Peer> {
    let listener = TcpListener::bind("127.0.0.1:0").await.context("bind")?;
    let addr = listener.local_addr()?;
    let node = format!("peer-{}", addr.port());
    let identity = Arc::new(Identity::generate().context("a peer's key")?);
    let hearing = Hearing::resumed(tokio::time::Instant::now(), Some(heard_ago), false);
    let app = router(Endpoints {
        node: node.as_str().into(),
        identity: identity.clone(),
        hearing: Arc::new(Mutex::new(hearing)),
        leader_key: Arc::new(LeaderKey::default()),
        peers: trusted,
    });
    let counted = Counted { listener, gauge };
    tokio::spawn(async move { axum::serve(counted, app).await });
    Ok(Peer {
        node,
        addr,
        key: Some(identity.public()),
    })
}

/// A peer that takes every connection and never answers (its agent hung, say); the connection
/// is held until the agent gives up on it.
pub(super) async fn silent(gauge: Arc<Gauge>) -> anyhow::Result<Peer> {
    let listener = TcpListener::bind("127.0.0.1:0").await.context("bind")?;
    let addr = listener.local_addr()?;
    let key = Identity::generate().context("a peer's key")?.public();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let open = gauge.take(true);
            tokio::spawn(async move {
                let mut sink = [0_u8; 1024];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                drop(open);
            });
        }
    });
    Ok(Peer {
        node: format!("peer-{}", addr.port()),
        addr,
        key: Some(key),
    })
}

/// Raises this process's open-file limit to `needed` if it is lower (up to the hard limit);
/// says how to raise the hard limit when that is too low.
pub(super) fn raise_open_files(needed: u64) -> anyhow::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("getrlimit")?;
    if soft >= needed {
        return Ok(soft);
    }
    if hard < needed {
        bail!(
            "the bench needs {needed} open files (its peers' listeners and connections, the \
             agent's asks), and this process may open at most {hard} (hard limit): raise it, \
             e.g. `ulimit -n {needed}` in a root shell or `prlimit --nofile={needed}:{needed} \
             --pid $$`, or pass fewer --peers"
        );
    }
    setrlimit(Resource::RLIMIT_NOFILE, needed, hard).context("setrlimit")?;
    Ok(needed)
}

/// Open file descriptors of this process now.
pub(super) fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Sockets in TIME_WAIT in this network namespace now (`/proc/net/sockstat`, `tw`).
pub(super) fn time_wait() -> usize {
    let text = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("TCP:"))
        .and_then(|l| {
            let mut words = l.split_whitespace();
            while let Some(word) = words.next() {
                if word == "tw" {
                    return words.next()?.parse().ok();
                }
            }
            None
        })
        .unwrap_or(0)
}
