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

use super::{Endpoint, Error, PowerState, ResetType, Result, SystemReading, tls};

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
    /// The system's path once found: the configured one, or the BMC's only system as first
    /// listed. Pinned, so a reset and the reads that confirm it are of one system even if
    /// the BMC lists its systems differently later.
    system_path: tokio::sync::OnceCell<String>,
}

/// The parts of a `ComputerSystem` podha reads.
#[derive(Deserialize)]
struct System {
    #[serde(rename = "@odata.id", default)]
    odata_id: Option<String>,
    #[serde(rename = "@odata.type", default)]
    odata_type: Option<String>,
    #[serde(rename = "Id", default)]
    id: Option<String>,
    #[serde(rename = "PowerState", default)]
    power_state: Option<String>,
    #[serde(rename = "UUID", default)]
    uuid: Option<String>,
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
            system_path: tokio::sync::OnceCell::new(),
        })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The system's power state, as the BMC reports it now.
    pub async fn power_state(&self) -> Result<PowerState> {
        Ok(self.read().await?.power)
    }

    /// The system's power state and identity, as the BMC reports them now.
    pub async fn read(&self) -> Result<SystemReading> {
        self.within_timeout(async {
            let (_, system) = self.system().await?;
            Ok(SystemReading {
                power: PowerState::parse(system.power_state.as_deref()),
                uuid: system.uuid,
            })
        })
        .await
    }

    /// Asks for `reset` through the action the system advertises. `Ok` is the request taken,
    /// not the reset done: read [`Bmc::power_state`] until it says so.
    pub async fn reset(&self, reset: ResetType) -> Result<()> {
        self.reset_if(reset, || true).await.map(|_| ())
    }

    /// [`Bmc::reset`], asking `proceed` right before the request goes out (after the reads
    /// that find the action): `Ok(false)`, nothing sent, when it says no.
    pub async fn reset_if(&self, reset: ResetType, proceed: impl Fn() -> bool) -> Result<bool> {
        self.within_timeout(async {
            let (path, system) = self.system().await?;
            let name = system.id.unwrap_or_else(|| path.clone());
            let not_allowed = |allowed: String| Error::ResetNotAllowed {
                system: name.clone(),
                reset: reset.as_str(),
                allowed,
            };
            let action = system
                .actions
                .reset
                .ok_or_else(|| not_allowed("no ComputerSystem.Reset action".to_string()))?;
            if !action.allowed.is_empty() && !action.allowed.iter().any(|a| a == reset.as_str()) {
                return Err(not_allowed(action.allowed.join(", ")));
            }
            // The action must be the system's own: a target elsewhere (another system, another
            // host) is not where this system's reset goes.
            let target = self.on_this_bmc(&action.target)?;
            if !target.starts_with(&format!("{path}/")) {
                return Err(self.mismatch(format!(
                    "the reset action of {path} points outside it: {target}"
                )));
            }
            let body = serde_json::json!({ "ResetType": reset.as_str() }).to_string();
            if !proceed() {
                return Ok(false);
            }
            let (status, answer) = self.send(Method::POST, &target, Some(body)).await?;
            if status == StatusCode::NOT_FOUND {
                return Err(not_allowed(format!("no action at {target} (HTTP 404)")));
            }
            self.check(status, &answer, None).map(|()| true)
        })
        .await
    }

    /// Runs one call of the client within the endpoint's timeout, however many requests it
    /// takes.
    async fn within_timeout<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.endpoint.timeout, call)
            .await
            .map_err(|_| {
                self.unreachable(format!(
                    "no answer within {}",
                    humantime::format_duration(self.endpoint.timeout)
                ))
            })?
    }

    /// The system's canonical path and resource: the configured one (following the BMC's
    /// redirects), or the BMC's only one.
    async fn system(&self) -> Result<(String, System)> {
        let path = self
            .system_path
            .get_or_try_init(|| async {
                match &self.endpoint.system {
                    Some(id) => Ok(format!("{SYSTEMS}/{id}")),
                    None => self.only_system().await,
                }
            })
            .await?;
        let (path, body) = self.get(path, self.endpoint.system.as_deref()).await?;
        let system: System = serde_json::from_slice(&body)
            .map_err(|e| self.bad_answer(format!("{path}: not a ComputerSystem ({e})")))?;
        if let Some(detail) = not_the_system(&path, &system) {
            return Err(self.mismatch(detail));
        }
        Ok((path, system))
    }

    async fn only_system(&self) -> Result<String> {
        let (_, body) = self.get(SYSTEMS, None).await?;
        let collection: Collection = serde_json::from_slice(&body)
            .map_err(|e| self.bad_answer(format!("{SYSTEMS}: not a collection ({e})")))?;
        match <[Member; 1]>::try_from(collection.members) {
            Ok([only]) => {
                let path = self.on_this_bmc(&only.id)?;
                if !path.starts_with(&format!("{SYSTEMS}/")) {
                    return Err(self.mismatch(format!("{SYSTEMS} lists {path}, not a system")));
                }
                Ok(path)
            }
            Err(members) => Err(Error::AmbiguousSystem {
                address: self.endpoint.authority(),
                count: members.len(),
            }),
        }
    }

    /// `GET path`, following redirects on this BMC; the final path and the body. A `404`
    /// is [`Error::UnknownSystem`] when `system` names what was asked for.
    async fn get(&self, path: &str, system: Option<&str>) -> Result<(String, Bytes)> {
        let mut path = path.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let (status, answer) = self.send(Method::GET, &path, None).await?;
            if status.is_redirection() {
                let location = answer.location.as_deref().ok_or_else(|| {
                    self.bad_answer(format!("a redirect from {path} without Location"))
                })?;
                path = self.on_this_bmc(location)?;
                continue;
            }
            self.check(status, &answer, system)?;
            return Ok((path, answer.body));
        }
        Err(self.mismatch(format!("more than {MAX_REDIRECTS} redirects from {path}")))
    }

    /// `reference` (a path, or a URL the BMC gave) as a path on this BMC; anything that
    /// would reach another host is refused: the credentials go with every request.
    fn on_this_bmc(&self, reference: &str) -> Result<String> {
        same_origin(&self.endpoint.address, reference)
            .ok_or_else(|| self.mismatch(format!("{reference:?} is not on this BMC")))
    }

    /// Maps an error status to its [`Error`].
    fn check(&self, status: StatusCode, answer: &Answer, system: Option<&str>) -> Result<()> {
        let address = self.endpoint.authority();
        match (status.as_u16(), system) {
            (200..=299, _) => Ok(()),
            (code @ (401 | 403), _) => Err(Error::Unauthorized {
                address,
                status: code,
            }),
            (404, Some(system)) => Err(Error::UnknownSystem {
                address,
                system: system.to_string(),
            }),
            (code, _) => Err(Error::Refused {
                address,
                status: code,
                message: error_message(&answer.body),
            }),
        }
    }

    /// One request to `path` (a path on this BMC, see [`same_origin`]); the status and what
    /// came back. Bounded by the call's timeout ([`Bmc::within_timeout`]).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<(StatusCode, Answer)> {
        let uri = Uri::builder()
            .scheme(self.endpoint.address.scheme_str().unwrap_or("https"))
            .authority(self.endpoint.authority())
            .path_and_query(path)
            .build()
            .map_err(|e| self.mismatch(format!("path {path:?}: {e}")))?;
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
            .map_err(|e| self.bad_answer(format!("reading the answer from {path}: {e}")))?
            .to_bytes();
        Ok((status, Answer { body, location }))
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

    fn mismatch(&self, detail: String) -> Error {
        Error::Mismatch {
            address: self.endpoint.authority(),
            detail,
        }
    }
}

/// Why `system`, read at `path`, is not the system asked for, if it is not: a `ComputerSystem`
/// whose `@odata.id` is the path it was read at (a BMC may answer a wrong path with another
/// resource).
fn not_the_system(path: &str, system: &System) -> Option<String> {
    if let Some(kind) = &system.odata_type
        && !kind.starts_with("#ComputerSystem.")
    {
        return Some(format!("{path} is a {kind}, not a ComputerSystem"));
    }
    let id = system
        .odata_id
        .as_deref()
        .map(|id| id.trim_end_matches('/'));
    (id != Some(path.trim_end_matches('/'))).then(|| {
        format!(
            "{path} answered as {}",
            id.unwrap_or("a resource without @odata.id")
        )
    })
}

/// `reference` as a path (with its query) on the BMC at `base`: an absolute path (`/...`,
/// not `//host/...`), or an absolute URL with `base`'s scheme and authority. `None` for
/// anything else: another host, a relative reference, userinfo.
pub(super) fn same_origin(base: &Uri, reference: &str) -> Option<String> {
    let uri: Uri = reference.parse().ok()?;
    let path = uri.path_and_query()?.as_str();
    if !path.starts_with('/') || path.starts_with("//") {
        return None;
    }
    let here = match (uri.scheme(), uri.authority()) {
        (None, None) => reference.starts_with('/'),
        (Some(scheme), Some(authority)) => {
            Some(scheme) == base.scheme()
                && Some(authority.as_str()) == base.authority().map(|a| a.as_str())
        }
        _ => false,
    };
    here.then(|| path.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_on_the_same_bmc_are_followed() {
        let base: Uri = "https://10.0.0.9:8443".parse().unwrap();
        for (reference, expected) in [
            ("/redfish/v1/Systems/1", Some("/redfish/v1/Systems/1")),
            (
                "/redfish/v1/Systems/1?x=1",
                Some("/redfish/v1/Systems/1?x=1"),
            ),
            (
                "https://10.0.0.9:8443/redfish/v1/Systems/1",
                Some("/redfish/v1/Systems/1"),
            ),
            ("https://10.0.0.10:8443/redfish/v1/Systems/1", None),
            ("https://10.0.0.9/redfish/v1/Systems/1", None),
            ("http://10.0.0.9:8443/redfish/v1/Systems/1", None),
            ("//evil.example/redfish/v1", None),
            ("@evil.example/redfish/v1", None),
            (".evil.net/x", None),
            ("https://10.0.0.9:8443@evil.example/redfish/v1", None),
            ("redfish/v1/Systems/1", None),
            ("", None),
        ] {
            assert_eq!(
                same_origin(&base, reference).as_deref(),
                expected,
                "{reference:?}"
            );
        }
    }

    fn system(id: Option<&str>, kind: Option<&str>) -> System {
        System {
            odata_id: id.map(str::to_string),
            odata_type: kind.map(str::to_string),
            id: None,
            power_state: Some("Off".to_string()),
            uuid: None,
            actions: Actions::default(),
        }
    }

    #[test]
    fn an_answer_counts_only_as_the_system_read() {
        let path = "/redfish/v1/Systems/1";
        let kind = Some("#ComputerSystem.v1_10_0.ComputerSystem");
        assert_eq!(not_the_system(path, &system(Some(path), kind)), None);
        assert_eq!(
            not_the_system(path, &system(Some("/redfish/v1/Systems/1/"), None)),
            None
        );
        for (id, kind) in [
            (Some("/redfish/v1/Systems/2"), kind),
            (None, kind),
            (Some(path), Some("#Chassis.v1_0_0.Chassis")),
            (Some(path), Some("#Outlet.v1_0_0.Outlet")),
        ] {
            assert!(
                not_the_system(path, &system(id, kind)).is_some(),
                "{id:?} {kind:?} taken for the system"
            );
        }
    }
}
