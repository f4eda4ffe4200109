//! Where a BMC is and how to trust and log in to it, as a Secret holds it.
//!
//! | key | value |
//! |---|---|
//! | `address` | `https://<host>[:<port>]`, the BMC's Redfish service (required) |
//! | `username`, `password` | the BMC account's credentials, sent as HTTP basic auth (required) |
//! | `systemId` | the system that runs this node (`/redfish/v1/Systems/<systemId>`); without it the BMC must have exactly one |
//! | `ca.crt` | PEM certificates that sign the BMC's serving certificate (a CA's; a BMC's own self-signed certificate works only as an X.509 v3 certificate naming the BMC's address in its subjectAltName) |
//! | `insecureSkipVerify` | `"true"` to accept any certificate (a man in the middle could then answer for the BMC); only without `ca.crt` |
//!
//! One of `ca.crt` and `insecureSkipVerify` is required: podha's image holds no system roots,
//! and BMCs mostly serve self-signed certificates.

use std::collections::BTreeMap;
use std::time::Duration;

use hyper::Uri;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use super::{Error, Result};

/// How long one request to a BMC may take: BMCs are slow embedded web servers, and a reset
/// may be answered only once taken.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How podha trusts the BMC's serving certificate.
#[derive(Clone, PartialEq, Eq)]
pub enum Trust {
    /// Certificates signed by these.
    Ca(Vec<CertificateDer<'static>>),
    /// Any certificate.
    InsecureSkipVerify,
}

impl Trust {
    /// Certificates signed by the PEM certificates in `pem`.
    pub fn from_ca_pem(pem: &[u8]) -> Result<Self> {
        parse_ca(pem).map(Self::Ca)
    }
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ca(certs) => write!(f, "Ca({} certificates)", certs.len()),
            Self::InsecureSkipVerify => f.write_str("InsecureSkipVerify"),
        }
    }
}

/// One BMC's Redfish service, and the system on it that runs a node.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `https://host[:port]`, no path.
    pub address: Uri,
    /// The system's identity in `/redfish/v1/Systems/<id>`; `None`: the BMC's only system.
    pub system: Option<String>,
    pub username: String,
    pub password: String,
    pub trust: Trust,
    /// The longest one request may take.
    pub timeout: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("address", &self.address)
            .field("system", &self.system)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("trust", &self.trust)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Endpoint {
    /// An endpoint at `address` (`https://host[:port]`).
    pub fn new(
        address: &str,
        system: Option<String>,
        username: String,
        password: String,
        trust: Trust,
    ) -> Result<Self> {
        if let Some(system) = &system {
            check_system_id(system)?;
        }
        Ok(Self {
            address: parse_address(address)?,
            system,
            username,
            password,
            trust,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The endpoint a Secret's `data` describes (the keys in the module's table).
    pub fn from_secret_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Self> {
        let text = |key: &str| -> Result<Option<String>> {
            data.get(key)
                .map(|bytes| {
                    String::from_utf8(bytes.clone())
                        .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
                        .map_err(|_| Error::Settings(format!("key {key} is not UTF-8 text")))
                })
                .transpose()
        };
        let required = |key: &str| -> Result<String> {
            text(key)?
                .filter(|value| !value.is_empty())
                .ok_or_else(|| Error::Settings(format!("key {key} is missing or empty")))
        };
        let address = required("address")?;
        let username = required("username")?;
        let password = required("password")?;
        let system = text("systemId")?.filter(|s| !s.is_empty());
        let insecure = match text("insecureSkipVerify")?.as_deref() {
            None | Some("" | "false") => false,
            Some("true") => true,
            Some(_) => {
                return Err(Error::Settings(
                    "key insecureSkipVerify must be \"true\" or \"false\"".to_string(),
                ));
            }
        };
        let trust = match (data.get("ca.crt"), insecure) {
            (Some(_), true) => {
                return Err(Error::Settings(
                    "give ca.crt or insecureSkipVerify, not both".to_string(),
                ));
            }
            (Some(pem), false) => Trust::from_ca_pem(pem)?,
            (None, true) => Trust::InsecureSkipVerify,
            (None, false) => {
                return Err(Error::Settings(
                    "key ca.crt is missing: give the CA that signs the BMC's certificate, or \
                     insecureSkipVerify: \"true\""
                        .to_string(),
                ));
            }
        };
        Self::new(&address, system, username, password, trust)
    }

    /// `host:port` as messages name the BMC.
    pub fn authority(&self) -> String {
        self.address
            .authority()
            .map_or_else(String::new, ToString::to_string)
    }
}

fn parse_address(address: &str) -> Result<Uri> {
    // The value is never echoed: a password pasted into it would reach events and logs.
    let bad = |why: &str| Error::Settings(format!("key address: {why}"));
    let uri: Uri = address
        .parse()
        .map_err(|e| bad(&format!("not a URL ({e})")))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad(
            "must start with https:// (the credentials go in every request)",
        ));
    }
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad(
            "must not hold credentials (use the username and password keys)",
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("must be the BMC's address alone, without a path"));
    }
    Ok(uri)
}

/// A system identity is one path segment, not `.` or `..`.
fn check_system_id(system: &str) -> Result<()> {
    if !matches!(system, "." | "..")
        && system
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
    {
        Ok(())
    } else {
        Err(Error::Settings(
            "key systemId: only letters, digits and - . _ ~ (one path segment)".to_string(),
        ))
    }
}

fn parse_ca(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Settings(format!("ca.crt: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Settings(
            "ca.crt holds no PEM certificate".to_string(),
        ));
    }
    Ok(certs)
}
