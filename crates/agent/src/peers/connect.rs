//! How an agent connects to a peer: as hyper's HTTP connector does, then set to close with a
//! reset rather than the usual exchange of FINs (`SO_LINGER` 0).
//!
//! A survey opens one connection per ask and closes it once answered (see `Peers::with`).
//! While podha's leader or the API server is down, every agent asks half the cluster every
//! second: at 5,000 nodes some 2,600 connections out of each node a second, and as many in.
//! Closed the usual way, each would leave a socket in TIME_WAIT and, on a node that tracks
//! connections (kube-proxy's iptables mode does), an entry in the connection table for 120 s
//! (`nf_conntrack_tcp_timeout_time_wait`): over half a million per node, more than such a
//! table usually holds (at least 131,072 by kube-proxy's default). A full table drops new
//! connections, the surveys' asks among them, and too few answers fence. Reset, a connection
//! leaves no TIME_WAIT socket, and its entry goes within 10 s (`..._timeout_close`); one given
//! up before its peer accepted it keeps its SYN_SENT entry (120 s). A lost reset is not sent
//! again: the peer's TCP keepalive closes what it would hold (`crate::listen`).
//! Nothing is lost: the agent closes a connection once it has the whole answer, or has given
//! up on it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use socket2::SockRef;
use tokio::net::TcpStream;
use tower::Service;
use tracing::debug;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// hyper's HTTP connector, whose connections close with a reset.
#[derive(Clone, Debug)]
pub(super) struct ResetOnClose(HttpConnector);

impl ResetOnClose {
    pub(super) fn new() -> Self {
        let mut http = HttpConnector::new();
        // One small request and its answer: nothing to gain from waiting to fill a packet.
        http.set_nodelay(true);
        Self(http)
    }
}

impl Service<Uri> for ResetOnClose {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            if let Err(e) = SockRef::from(io.inner()).set_linger(Some(Duration::ZERO)) {
                // Closed the usual way then: the answer is as good.
                debug!(error = %e, "cannot set a peer connection to close with a reset");
            }
            Ok(io)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_connection_closes_with_a_reset() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let uri: Uri = format!("http://{}/peer", listener.local_addr().expect("address"))
            .parse()
            .expect("uri");
        let io = ResetOnClose::new().call(uri).await.expect("connect");
        let socket = SockRef::from(io.inner());
        assert_eq!(socket.linger().expect("linger"), Some(Duration::ZERO));
        assert!(socket.tcp_nodelay().expect("nodelay"));
    }
}
