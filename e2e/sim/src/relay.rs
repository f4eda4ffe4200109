//! A TCP relay in front of the API server that a test can cut: one client (podha) sees the API
//! server go away, as in an API server restart, while the rest of the cluster keeps running.
//! TLS passes through untouched; the serving certificate's SAN 127.0.0.1 matches the relay's
//! address as well as the API server's.

use std::io;
use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Relay {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and relays each connection to `upstream`. Must be called
    /// within a tokio runtime, which then runs the relay.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(accept(listener, upstream, cut_rx));
        Ok(Self { addr, cut, task })
    }

    /// `https://<relay address>`, the URL a client uses instead of the API server's.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Closes every open connection and refuses new ones until [`Self::restore`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, cut: watch::Receiver<bool>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *cut.borrow() {
            // Refused: dropping the accepted socket closes it at once.
            continue;
        }
        tokio::spawn(relay(client, upstream, cut.clone()));
    }
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut client, &mut server) => {}
        // Both sockets are dropped, so both peers see the connection closed.
        _ = cut.wait_for(|cut| *cut) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server: writes back whatever it reads, per connection.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Whether a round trip through `conn` works within a second.
    async fn echoes(conn: &mut TcpStream) -> bool {
        let trip = async {
            conn.write_all(b"ping").await?;
            let mut buf = [0u8; 4];
            conn.read_exact(&mut buf).await?;
            io::Result::Ok(&buf == b"ping")
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), trip).await,
            Ok(Ok(true))
        )
    }

    async fn connect(relay: &Relay) -> TcpStream {
        TcpStream::connect(relay.addr).await.unwrap()
    }

    #[tokio::test]
    async fn cut_closes_and_refuses_connections_until_restored() {
        let relay = Relay::start(echo_server().await).await.unwrap();
        let mut before = connect(&relay).await;
        assert!(echoes(&mut before).await, "relays before the cut");

        relay.cut();
        assert!(!echoes(&mut before).await, "an open connection is closed");
        let mut during = connect(&relay).await;
        assert!(!echoes(&mut during).await, "a new connection is refused");

        relay.restore();
        let mut after = connect(&relay).await;
        assert!(echoes(&mut after).await, "relays again once restored");
    }
}
