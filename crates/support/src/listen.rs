//! Listening on both address families, and whether a socket serves an address: podha's HTTP
//! server (metrics, probes) and the agent's. Also the open-file limit both raise
//! ([`raise_open_file_limit`]): a leader probes every agent, an agent's survey asks hundreds of
//! peers at once while others ask it.
//!
//! podha and the agent's peers dial a node's first InternalIP (`podha_contract::internal_ip`), of
//! whichever family the node lists first: IPv6 on an IPv6-only or IPv6-first node. The agent
//! listens on `[::]` by default, one socket for both families (`IPV6_V6ONLY` off, whatever the
//! host's `net.ipv6.bindv6only`), so either address reaches it; on a host without IPv6 it falls
//! back to `0.0.0.0`. An agent whose node's address its socket does not serve does not
//! advertise itself ([`Listening::serves`]): podha would count the silence of an agent it
//! cannot reach as a fence of a node that runs on.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use std::time::Duration;

use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};
use tracing::warn;

/// How many connections may wait to be accepted.
const BACKLOG: i32 = 1024;

/// TCP keepalive of accepted connections: a silent peer is probed after 10 s, and its
/// connection closed after three probes 2 s apart went unanswered.
const KEEPALIVE: TcpKeepalive = TcpKeepalive::new()
    .with_time(Duration::from_secs(10))
    .with_interval(Duration::from_secs(2))
    .with_retries(3);

/// A listening socket: its address, and whether an IPv6 wildcard also accepts IPv4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listening {
    pub addr: SocketAddr,
    pub dual_stack: bool,
}

impl Listening {
    /// Whether a connection to `ip` (on the listening port) reaches this socket.
    pub fn serves(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match canonical(self.addr.ip()) {
            IpAddr::V6(any) if any.is_unspecified() => ip.is_ipv6() || self.dual_stack,
            IpAddr::V4(any) if any.is_unspecified() => ip.is_ipv4(),
            own => own == ip,
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Binds `addr`: an IPv6 address for both families; `[::]` on a host without IPv6 as
/// `0.0.0.0` instead.
pub fn bind(addr: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, Listening)> {
    match bind_socket(addr) {
        Err(e) if addr.ip().is_unspecified() && addr.is_ipv6() && no_ipv6(&e) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            warn!(%addr, error = %e, fallback = %v4, "this host has no IPv6: listening on IPv4 only");
            bind_socket(v4)
        }
        other => other,
    }
}

/// Whether `e` says the host has no IPv6 at all (not a port in use, say).
fn no_ipv6(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EAFNOSUPPORT | nix::libc::EADDRNOTAVAIL)
    )
}

/// Each accepted connection's socket receive buffer, in bytes (the kernel doubles it for its
/// bookkeeping): the requests served here are a few hundred bytes.
pub const RECEIVE_BUFFER: usize = 16 * 1024;

fn bind_socket(addr: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, Listening)> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    let dual_stack = addr.is_ipv6();
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    // Accepted connections inherit it: a peer that vanished (its reset lost, its node
    // gone) no longer holds a connection, and an open file, for good.
    socket.set_tcp_keepalive(&KEEPALIVE)?;
    // Accepted connections inherit it too: what a sender that is never read can park in the
    // kernel, charged to this process's memory (see `agent::port`).
    socket.set_recv_buffer_size(RECEIVE_BUFFER)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    let listener = tokio::net::TcpListener::from_std(socket.into())?;
    let addr = listener.local_addr()?;
    Ok((listener, Listening { addr, dual_stack }))
}

/// Raises this process's soft limit of open files to its hard limit (containers often start
/// at 1,024 of a far higher hard limit), and says what it is.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "open-file limit raised"),
            Err(e) => warn!(soft, hard, error = %e, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot read the open-file limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::SockRef;

    fn listening(addr: &str, dual_stack: bool) -> Listening {
        Listening {
            addr: addr.parse().expect("address"),
            dual_stack,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_wildcard_serves_its_families_and_an_address_itself() {
        let both = listening("[::]:9441", true);
        assert!(
            both.serves(ip("10.0.0.5")),
            "IPv4 through a dual-stack socket"
        );
        assert!(both.serves(ip("fd00::5")));
        let v6_only = listening("[::]:9441", false);
        assert!(!v6_only.serves(ip("10.0.0.5")));
        assert!(v6_only.serves(ip("fd00::5")));
        let v4 = listening("0.0.0.0:9441", false);
        assert!(v4.serves(ip("10.0.0.5")));
        assert!(!v4.serves(ip("fd00::5")), "an IPv6-only node's address");
        let one = listening("10.0.0.5:9441", false);
        assert!(one.serves(ip("10.0.0.5")));
        assert!(
            one.serves(ip("::ffff:10.0.0.5")),
            "the same address, mapped"
        );
        assert!(!one.serves(ip("10.0.0.6")));
        assert!(listening("[fd00::5]:9441", true).serves(ip("fd00::5")));
    }

    #[tokio::test]
    async fn accepted_connections_are_kept_alive() {
        let (listener, listening) = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let client = tokio::net::TcpStream::connect(listening.addr)
            .await
            .expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        let socket = SockRef::from(&accepted);
        assert!(socket.keepalive().expect("keepalive"));
        assert_eq!(
            socket.tcp_keepalive_time().expect("time"),
            Duration::from_secs(10)
        );
        drop(client);
    }

    #[tokio::test]
    async fn the_ipv6_wildcard_accepts_ipv4_and_ipv6() {
        let (listener, listening) = bind("[::]:0".parse().expect("addr")).expect("bind");
        let port = listening.addr.port();
        let accept = tokio::spawn(async move {
            for _ in 0..2 {
                listener.accept().await.expect("accept");
            }
        });
        if listening.addr.is_ipv6() {
            assert!(listening.dual_stack);
            tokio::net::TcpStream::connect(("::1", port))
                .await
                .expect("connect over IPv6 loopback");
        } else {
            // A host without IPv6: the fallback.
            assert_eq!(listening.addr.ip(), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
        }
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect over IPv4 loopback");
        accept.await.expect("accepted both");
    }
}
