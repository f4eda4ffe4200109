//! [`Bmc`]: the requests, and what their answers mean.

use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::{Endpoint, Error, PowerState, ResetType, Result, tls};

/// The Systems collection, the root of every path podha reads.
const SYSTEMS: &str = "/redfish/v1/Systems";
/// Redirects followed per request (a BMC may send a system's alias to its canonical path).
const MAX_REDIRECTS: usize = 3;
/// Redfish resources are small; anything larger is not the answer asked for.
const MAX_BODY: usize = 1 << 20;

/// One BMC's Redfish service, for the system of one node.
pub struct Bmc {
    endpoint: Endpoint,
    http: HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    authorization: HeaderValue,
}

/// The parts of a `ComputerSystem` podha reads.
#[derive(Deserialize)]
struct System {
    #[serde(rename = "Id", default)]
    id: Option<String>,
    #[serde(rename = "PowerState", default)]
    power_state: Option<String>,
    #[serde(rename = "Actions", default)]
    actions: Actions,
}

#[derive(Deserialize, Default)]
struct Actions {
    #[serde(rename = "#ComputerSystem.Reset", default)]
    reset: Option<ResetAction>,
}

#[derive(Deserialize)]
struct ResetAction {
    target: String,
    /// Empty when the BMC lists them elsewhere (`@Redfish.ActionInfo`) or not at all: then
    /// the reset is sent and its answer tells.
    #[serde(rename = "ResetType@Redfish.AllowableValues", default)]
    allowed: Vec<String>,
}

#[derive(Deserialize)]
struct Collection {
    #[serde(rename = "Members", default)]
    members: Vec<Member>,
}

#[derive(Deserialize)]
struct Member {
    #[serde(rename = "@odata.id")]
    id: String,
}

/// A Redfish error body: `{"error": {"message": ..., "@Message.ExtendedInfo": [{"Message": ...}]}}`.
#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    message: Option<String>,
    #[serde(rename = "@Message.ExtendedInfo", default)]
    extended: Vec<ExtendedInfo>,
}

#[derive(Deserialize)]
struct ExtendedInfo {
    #[serde(rename = "Message", default)]
    message: Option<String>,
}

impl Bmc {
    /// A client for `endpoint`; fails only on unusable TLS settings (nothing is sent).
    pub fn new(endpoint: Endpoint) -> Result<Self> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls::client_config(&endpoint.trust)?)
            .https_only()
            .enable_http1()
            .build();
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let credentials = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", endpoint.username, endpoint.password));
        let mut authorization =
            HeaderValue::from_str(&format!("Basic {credentials}")).map_err(|_| {
                Error::Settings("username or password holds a control character".into())
            })?;
        authorization.set_sensitive(true);
        Ok(Self {
            endpoint,
            http,
            authorization,
        })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The system's power state, as the BMC reports it now.
    pub async fn power_state(&self) -> Result<PowerState> {
        let (_, system) = self.system().await?;
        Ok(PowerState::parse(system.power_state.as_deref()))
    }

    /// Asks for `reset` through the action the system advertises. `Ok` is the request taken,
    /// not the reset done: read [`Bmc::power_state`] until it says so.
    pub async fn reset(&self, reset: ResetType) -> Result<()> {
        let (path, system) = self.system().await?;
        let name = system.id.unwrap_or(path);
        let action = system.actions.reset.ok_or_else(|| Error::ResetNotAllowed {
            system: name.clone(),
            reset: reset.as_str(),
            allowed: "no ComputerSystem.Reset action".to_string(),
        })?;
        if !action.allowed.is_empty() && !action.allowed.iter().any(|a| a == reset.as_str()) {
            return Err(Error::ResetNotAllowed {
                system: name,
                reset: reset.as_str(),
                allowed: action.allowed.join(", "),
            });
        }
        let body = serde_json::json!({ "ResetType": reset.as_str() }).to_string();
        let (status, answer) = self.send(Method::POST, &action.target, Some(body)).await?;
        self.check(status, &answer, None)
    }

    /// The system's canonical path and resource: the configured one (following the BMC's
    /// redirects), or the BMC's only one.
    async fn system(&self) -> Result<(String, System)> {
        let path = match &self.endpoint.system {
            Some(id) => format!("{SYSTEMS}/{id}"),
            None => self.only_system().await?,
        };
        let (path, body) = self.get(&path, self.endpoint.system.as_deref()).await?;
        let system = serde_json::from_slice(&body)
            .map_err(|e| self.bad_answer(format!("{path}: not a ComputerSystem ({e})")))?;
        Ok((path, system))
    }

    async fn only_system(&self) -> Result<String> {
        let (_, body) = self.get(SYSTEMS, None).await?;
        let collection: Collection = serde_json::from_slice(&body)
            .map_err(|e| self.bad_answer(format!("{SYSTEMS}: not a collection ({e})")))?;
        match <[Member; 1]>::try_from(collection.members) {
            Ok([only]) => Ok(only.id),
            Err(members) => Err(Error::AmbiguousSystem {
                address: self.endpoint.authority(),
                count: members.len(),
            }),
        }
    }

    /// `GET path`, following same-origin redirects; the final path and the body. A `404`
    /// is [`Error::UnknownSystem`] when `system` names what was asked for.
    async fn get(&self, path: &str, system: Option<&str>) -> Result<(String, Bytes)> {
        let mut path = path.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let (status, body) = self.send(Method::GET, &path, None).await?;
            if status.is_redirection() {
                path = self.redirect_target(&body)?;
                continue;
            }
            self.check(status, &body, system)?;
            return Ok((path, body.body));
        }
        Err(self.bad_answer(format!("more than {MAX_REDIRECTS} redirects from {path}")))
    }

    /// Where a redirect points, as a path on this BMC (never another host: the credentials
    /// go with every request).
    fn redirect_target(&self, answer: &Answer) -> Result<String> {
        let location = answer
            .location
            .as_deref()
            .ok_or_else(|| self.bad_answer("a redirect without Location".to_string()))?;
        let uri: Uri = location
            .parse()
            .map_err(|_| self.bad_answer(format!("redirect to {location:?}")))?;
        if uri.authority().is_some()
            && (uri.authority() != self.endpoint.address.authority()
                || uri.scheme() != self.endpoint.address.scheme())
        {
            return Err(self.bad_answer(format!("redirect to another host: {location}")));
        }
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        if !path.starts_with('/') {
            return Err(self.bad_answer(format!("redirect to {location:?}")));
        }
        Ok(path.to_string())
    }

    /// Maps an error status to its [`Error`].
    fn check(&self, status: StatusCode, answer: &Answer, system: Option<&str>) -> Result<()> {
        let address = self.endpoint.authority();
        match status.as_u16() {
            200..=299 => Ok(()),
            401 | 403 => Err(Error::Unauthorized {
                address,
                status: status.as_u16(),
            }),
            404 if system.is_some() => Err(Error::UnknownSystem {
                address,
                system: system.unwrap_or_default().to_string(),
            }),
            code => Err(Error::Refused {
                address,
                status: code,
                message: error_message(&answer.body),
            }),
        }
    }

    /// One request, within the endpoint's timeout; the status and what came back.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<(StatusCode, Answer)> {
        let uri = self.uri(path)?;
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(ACCEPT, "application/json")
            .header("OData-Version", "4.0")
            .header(AUTHORIZATION, self.authorization.clone());
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| Error::Settings(format!("request for {path}: {e}")))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| self.transport_error(&e))?;
            let status = response.status();
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| self.unreachable(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, Answer { body, location }))
        };
        tokio::time::timeout(self.endpoint.timeout, exchange)
            .await
            .map_err(|_| {
                self.unreachable(format!(
                    "no answer within {}",
                    humantime::format_duration(self.endpoint.timeout)
                ))
            })?
    }

    fn uri(&self, path: &str) -> Result<Uri> {
        let base = &self.endpoint.address;
        format!(
            "{}://{}{path}",
            base.scheme_str().unwrap_or("https"),
            self.endpoint.authority()
        )
        .parse()
        .map_err(|e| self.bad_answer(format!("path {path:?}: {e}")))
    }

    /// A failed exchange: the TLS handshake's own error when that is what failed.
    fn transport_error(&self, error: &(dyn std::error::Error + 'static)) -> Error {
        let mut causes = Vec::new();
        let mut current = Some(error);
        while let Some(cause) = current {
            if let Some(tls) = rustls_error(cause) {
                return Error::Tls {
                    address: self.endpoint.authority(),
                    detail: tls.to_string(),
                };
            }
            causes.push(cause.to_string());
            current = cause.source();
        }
        causes.dedup();
        self.unreachable(causes.join(": "))
    }

    fn unreachable(&self, detail: String) -> Error {
        Error::Unreachable {
            address: self.endpoint.authority(),
            detail,
        }
    }

    fn bad_answer(&self, detail: String) -> Error {
        Error::BadAnswer {
            address: self.endpoint.authority(),
            detail,
        }
    }
}

/// The TLS error `error` is or wraps: the connector wraps it in I/O errors, whose `source`
/// skips what they wrap.
fn rustls_error<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = error.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_error(inner)
}

/// What an answer brought besides its status.
struct Answer {
    body: Bytes,
    location: Option<String>,
}

/// The BMC's own words from a Redfish error body, else the start of the body.
fn error_message(body: &[u8]) -> String {
    if let Ok(parsed) = serde_json::from_slice::<ErrorBody>(body) {
        let extended = parsed.error.extended.into_iter().find_map(|e| e.message);
        if let Some(message) = extended.or(parsed.error.message) {
            return message;
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "no message".to_string()
    } else {
        text.chars().take(200).collect()
    }
}
