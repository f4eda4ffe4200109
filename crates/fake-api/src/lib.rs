//! A fake API server for unit tests: a `kube::Client` whose requests are answered from a script
//! of routes and recorded whole (method, path, query, JSON body), so that a test asserts what
//! was sent: the preconditions a delete carries, the `uid` and `resourceVersion` a patch is
//! guarded by, the patch itself.
//!
//! ```text
//! let api = FakeApi::new()
//!     .on(Method::GET, "/api/v1/nodes/n1", |_| Reply::json(200, node))
//!     .on(Method::PATCH, "/api/v1/nodes/n1", |_| Reply::status(409, "Conflict"));
//! let client = api.client();
//! // ... the code under test ...
//! assert_eq!(api.lines(), ["GET /api/v1/nodes/n1", "PATCH /api/v1/nodes/n1"]);
//! ```
//!
//! Routes are tried in the order given; a request no route takes is answered `404 NotFound`
//! (and recorded like any other).

use std::sync::{Arc, Mutex};

use http::Method;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// One request as the fake API server got it.
#[derive(Clone, Debug)]
pub struct Request {
    /// When it came (tokio's clock: paused time in paused tests).
    pub at: tokio::time::Instant,
    pub method: Method,
    pub path: String,
    /// The query string, if any (without the `?`).
    pub query: String,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: Value,
}

impl Request {
    /// `METHOD /path`, without the query.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// Whether it asks for a watch (`watch=true`).
    pub fn watching(&self) -> bool {
        self.param("watch") == Some("true")
    }

    /// The value of query parameter `name`, as sent (not decoded).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    }
}

/// What the fake API server answers.
pub struct Reply {
    status: u16,
    body: Value,
    /// Answered only once this is notified.
    after: Option<Arc<Notify>>,
    /// The answer's body never comes, nor ends: a watch accepted, then nothing through it.
    endless: bool,
}

impl Reply {
    /// `status` with `body`.
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            body,
            after: None,
            endless: false,
        }
    }

    /// `200` and a body that never comes nor ends: a watch the API server accepted whose
    /// connection then passes nothing (black-holed).
    pub fn silent_watch() -> Self {
        Self {
            endless: true,
            ..Self::json(200, Value::Null)
        }
    }

    /// A `Status` object of `code` and `reason` (`Conflict`, `NotFound`, `Forbidden`...).
    pub fn status(code: u16, reason: &str) -> Self {
        Self::json(
            code,
            json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": reason, "code": code, "message": reason,
            }),
        )
    }

    /// The same answer, sent only once `release` is notified.
    pub fn after(mut self, release: Arc<Notify>) -> Self {
        self.after = Some(release);
        self
    }
}

type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

/// The fake API server: its routes, and every request it got.
#[derive(Clone, Default)]
pub struct FakeApi {
    routes: Vec<(Method, String, Handler)>,
    seen: Arc<Mutex<Vec<Request>>>,
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers `method` on `path` (the exact path, whatever the query; a path ending in `/*`:
    /// every path below it) as `reply` says.
    pub fn on(
        mut self,
        method: Method,
        path: &str,
        reply: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Self {
        self.routes
            .push((method, path.to_string(), Arc::new(reply)));
        self
    }

    /// A client of this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = http_body_util::BodyExt::collect(body)
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let request = Request {
                    at: tokio::time::Instant::now(),
                    method: parts.method,
                    path: parts.uri.path().to_string(),
                    query: parts.uri.query().unwrap_or_default().to_string(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                let reply = api.answer(&request);
                if let Some(release) = reply.after {
                    release.notified().await;
                }
                let body = if reply.endless {
                    axum::body::Body::from_stream(futures::stream::pending::<
                        Result<axum::body::Bytes, std::io::Error>,
                    >())
                } else {
                    axum::body::Body::from(reply.body.to_string())
                };
                http::Response::builder()
                    .status(reply.status)
                    .header("content-type", "application/json")
                    .body(body)
            }
        });
        kube::Client::new(service, "default")
    }

    fn answer(&self, request: &Request) -> Reply {
        self.seen
            .lock()
            .expect("the fake API server's log")
            .push(request.clone());
        self.routes
            .iter()
            .find(|(method, path, _)| *method == request.method && takes(path, &request.path))
            .map_or_else(
                || Reply::status(404, "NotFound"),
                |(_, _, reply)| reply(request),
            )
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Request> {
        self.seen.lock().expect("the fake API server's log").clone()
    }

    /// Every request so far as `METHOD /path`, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.requests().iter().map(Request::line).collect()
    }
}

/// Whether a route's `path` takes a request's `requested` path (see [`FakeApi::on`]).
fn takes(path: &str, requested: &str) -> bool {
    match path.strip_suffix('*') {
        Some(below) => requested.starts_with(below),
        None => path == requested,
    }
}
