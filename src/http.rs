//! The operator's HTTP endpoints: `/metrics` for Prometheus, `/healthz` for the liveness probe
//! (fails once the leader election loop has made no progress for longer than a working one
//! ever takes, see [`Progress`])
//! and `/readyz` for the readiness probe (ready once every watch cache has synced, so a fresh
//! replica does not take traffic, or leadership decisions, on an empty view).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::leader::Progress;
use crate::metrics::Metrics;

/// Content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    election: Progress,
}

/// The routes, without a socket; `ready` turns true once the caches are synced, `election` is
/// the leader election's progress.
pub fn router(metrics: Arc<Metrics>, ready: watch::Receiver<bool>, election: Progress) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            metrics,
            ready,
            election,
        })
}

/// Serves [`router`] on `listener` until `shutdown` completes, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    election: Progress,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, ready, election))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
        Err(error) => {
            tracing::warn!(%error, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to encode metrics\n",
            )
                .into_response()
        }
    }
}

async fn healthz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.election.stuck_for() {
        None => (StatusCode::OK, "ok".to_string()),
        Some(quiet) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "leader election stuck: no progress for {}s",
                quiet.as_secs()
            ),
        ),
    }
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if *state.ready.borrow() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Phase;
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    struct TestServer {
        addr: std::net::SocketAddr,
        stop: oneshot::Sender<()>,
        task: JoinHandle<std::io::Result<()>>,
    }

    impl TestServer {
        async fn start(metrics: Arc<Metrics>, ready: watch::Receiver<bool>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = oneshot::channel::<()>();
            let election = Progress::new(&crate::leader::LeaderConfig::new("ns", "me"));
            let task = tokio::spawn(serve(listener, metrics, ready, election, async {
                let _ = stopped.await;
            }));
            Self { addr, stop, task }
        }

        /// Sends `GET path` and returns (status, content type, body).
        async fn get(&self, path: &str) -> (u16, String, String) {
            let raw = self
                .request(format!(
                    "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
                ))
                .await;
            let (head, body) = raw.split_once("\r\n\r\n").unwrap();
            let mut lines = head.lines();
            let status = lines
                .next()
                .unwrap()
                .split(' ')
                .nth(1)
                .unwrap()
                .parse()
                .unwrap();
            let content_type = lines
                .filter_map(|l| l.split_once(':'))
                .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
                .map(|(_, value)| value.trim().to_string())
                .unwrap_or_default();
            (status, content_type, body.to_string())
        }

        /// Sends a raw HTTP/1.1 request and returns the raw response. Blocking std I/O on a
        /// blocking thread keeps the test free of an HTTP client and of tokio's `io-util`.
        async fn request(&self, request: String) -> String {
            let addr = self.addr;
            tokio::task::spawn_blocking(move || {
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream.write_all(request.as_bytes()).unwrap();
                let mut raw = String::new();
                stream.read_to_string(&mut raw).unwrap();
                raw
            })
            .await
            .unwrap()
        }

        async fn stop(self) {
            self.stop.send(()).unwrap();
            self.task.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn readyz_turns_ready_when_caches_sync() {
        let (ready_tx, ready) = watch::channel(false);
        let server = TestServer::start(Arc::new(Metrics::new().unwrap()), ready).await;

        let (status, _, body) = server.get("/readyz").await;
        assert_eq!((status, body.as_str()), (503, "caches not synced"));

        ready_tx.send(true).unwrap();
        let (status, _, body) = server.get("/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ready"));

        server.stop().await;
    }

    /// A hung lease call or a loop waiting on nothing: the kubelet must restart the process.
    #[tokio::test(start_paused = true)]
    async fn healthz_fails_once_the_leader_election_makes_no_progress() {
        use tower::ServiceExt;
        let cfg = crate::leader::LeaderConfig::new("ns", "me");
        let (_ready_tx, ready) = watch::channel(true);
        let app = router(
            Arc::new(Metrics::new().unwrap()),
            ready,
            Progress::new(&cfg),
        );
        let healthz = || {
            let app = app.clone();
            async move {
                let request = axum::http::Request::get("/healthz")
                    .body(axum::body::Body::empty())
                    .unwrap();
                let response = app.oneshot(request).await.unwrap();
                let status = response.status().as_u16();
                let body = axum::body::to_bytes(response.into_body(), 1024)
                    .await
                    .unwrap();
                (status, String::from_utf8(body.to_vec()).unwrap())
            }
        };
        assert_eq!(healthz().await, (200, "ok".to_string()));

        tokio::time::advance(cfg.lease_duration * 2).await;
        assert_eq!(
            healthz().await.0,
            200,
            "two leases without progress can happen"
        );

        tokio::time::advance(cfg.lease_duration + std::time::Duration::from_secs(1)).await;
        let (status, body) = healthz().await;
        assert_eq!(status, 503);
        assert_eq!(body, "leader election stuck: no progress for 46s");
    }

    #[tokio::test]
    async fn healthz_is_ok_before_caches_sync() {
        let (_ready_tx, ready) = watch::channel(false);
        let server = TestServer::start(Arc::new(Metrics::new().unwrap()), ready).await;

        let (status, _, body) = server.get("/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok"));

        server.stop().await;
    }

    #[tokio::test]
    async fn metrics_are_served_in_the_text_format() {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.actions.inc_pods_deleted("db", "StatefulSet");
        metrics.operating.set_leader(true);
        metrics
            .failovers
            .observe_phase("db", Phase::Total, std::time::Duration::from_secs(95));
        let (_ready_tx, ready) = watch::channel(true);
        let server = TestServer::start(metrics.clone(), ready).await;

        let (status, content_type, body) = server.get("/metrics").await;
        assert_eq!(status, 200);
        assert_eq!(content_type, METRICS_CONTENT_TYPE);
        assert!(body.contains("# TYPE podha_pods_deleted_total counter\n"));
        assert!(
            body.lines()
                .any(|l| l == r#"podha_pods_deleted_total{owner_kind="StatefulSet",policy="db"} 1"#)
        );
        assert!(body.lines().any(|l| l == "podha_leader 1"));
        assert!(body.contains("# TYPE podha_failover_phase_duration_seconds histogram\n"));
        assert!(body.lines().any(|l| l
            == r#"podha_failover_phase_duration_seconds_bucket{phase="total",policy="db",le="120"} 1"#));

        // The endpoint reflects observations made after the server started.
        metrics.actions.inc_pods_deleted("db", "StatefulSet");
        let (_, _, body) = server.get("/metrics").await;
        assert!(
            body.lines()
                .any(|l| l == r#"podha_pods_deleted_total{owner_kind="StatefulSet",policy="db"} 2"#)
        );

        server.stop().await;
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_rejected() {
        let (_ready_tx, ready) = watch::channel(true);
        let server = TestServer::start(Arc::new(Metrics::new().unwrap()), ready).await;

        let (status, _, _) = server.get("/nope").await;
        assert_eq!(status, 404);

        let raw = server
            .request(
                "POST /metrics HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string(),
            )
            .await;
        assert!(raw.starts_with("HTTP/1.1 405 "), "{raw}");

        server.stop().await;
    }

    /// A collector that yields a family without a name, which the text encoder refuses.
    struct Unencodable(prometheus::core::Desc);

    impl prometheus::core::Collector for Unencodable {
        fn desc(&self) -> Vec<&prometheus::core::Desc> {
            vec![&self.0]
        }

        fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
            let mut family = prometheus::proto::MetricFamily::default();
            family.set_metric(vec![prometheus::proto::Metric::default()]);
            vec![family]
        }
    }

    #[tokio::test]
    async fn metrics_encoding_failure_is_a_500() {
        let metrics = Metrics::new().unwrap();
        let desc =
            prometheus::core::Desc::new("broken".into(), "broken".into(), vec![], HashMap::new())
                .unwrap();
        metrics
            .registry()
            .register(Box::new(Unencodable(desc)))
            .unwrap();
        let (_ready_tx, ready) = watch::channel(true);
        let server = TestServer::start(Arc::new(metrics), ready).await;

        let (status, _, body) = server.get("/metrics").await;
        assert_eq!((status, body.as_str()), (500, "failed to encode metrics\n"));

        server.stop().await;
    }

    #[tokio::test]
    async fn serve_returns_after_shutdown_and_releases_the_port() {
        let (_ready_tx, ready) = watch::channel(true);
        let server = TestServer::start(Arc::new(Metrics::new().unwrap()), ready).await;
        let addr = server.addr;
        let (status, _, _) = server.get("/healthz").await;
        assert_eq!(status, 200);

        server.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
