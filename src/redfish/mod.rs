//! A client of a machine's BMC over Redfish (DMTF DSP0266), for the one thing podha asks of a
//! BMC: power the machine off, and say whether it is off.
//!
//! - [`Endpoint`] is where the BMC is and how to trust and log in to it (HTTPS only: the
//!   credentials travel in every request), read from a Secret's keys ([`endpoint`]).
//! - [`Bmc`] reads the system's `PowerState` (`GET /redfish/v1/Systems/{id}`) and sends
//!   `ComputerSystem.Reset` to the target the system itself advertises, after checking the
//!   reset type is among those it allows.
//!
//! A reset answered `2xx` is a request taken, not a machine off: real BMCs apply it seconds
//! later. Only a read that reports `Off` says the machine is off ([`PowerState::is_off`]).
//!
//! Every failure is an [`Error`] with a bounded label ([`Error::as_str`]) for events and metrics.

mod client;
pub mod endpoint;
mod tls;

pub use client::Bmc;

/// What a read of the system says: its power state, and the UUID it reports (`UUID`, the
/// machine's SMBIOS UUID on real hardware).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemReading {
    pub power: PowerState,
    pub uuid: Option<String>,
}

pub use endpoint::{Endpoint, Trust};

/// A system's `PowerState` as its BMC reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    Paused,
    /// A value outside the schema's list, or none (`null`): never taken for off.
    Other(String),
}

impl PowerState {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("On") => Self::On,
            Some("Off") => Self::Off,
            Some("PoweringOn") => Self::PoweringOn,
            Some("PoweringOff") => Self::PoweringOff,
            Some("Paused") => Self::Paused,
            Some(other) => Self::Other(other.to_string()),
            None => Self::Other("null".to_string()),
        }
    }

    /// The machine is off: the only state that proves it cannot write.
    pub fn is_off(&self) -> bool {
        *self == Self::Off
    }
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::On => "On",
            Self::Off => "Off",
            Self::PoweringOn => "PoweringOn",
            Self::PoweringOff => "PoweringOff",
            Self::Paused => "Paused",
            Self::Other(value) => value,
        })
    }
}

/// The `ResetType`s podha sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetType {
    /// Off at once, without asking the operating system.
    ForceOff,
    /// On (after a confirmed off, for a power cycle).
    On,
}

impl ResetType {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ForceOff => "ForceOff",
            Self::On => "On",
        }
    }
}

/// What went wrong asking a BMC.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint's settings are unusable (bad address, unreadable CA, missing key).
    #[error("BMC settings: {0}")]
    Settings(String),
    /// No answer: refused, reset, unresolvable, or not within the request timeout.
    #[error("BMC {address} unreachable: {detail}")]
    Unreachable { address: String, detail: String },
    /// The TLS handshake failed: most often a certificate the given CA does not sign.
    #[error("BMC {address}: TLS handshake failed: {detail}")]
    Tls { address: String, detail: String },
    /// `401` or `403`: the credentials are wrong or not allowed to do this.
    #[error("BMC {address} refused the credentials (HTTP {status})")]
    Unauthorized { address: String, status: u16 },
    /// The system is not there (`404`).
    #[error("BMC {address} has no system {system:?}")]
    UnknownSystem { address: String, system: String },
    /// No system named, and the BMC does not have exactly one.
    #[error("BMC {address} has {count} systems: name the one that runs this node (systemId)")]
    AmbiguousSystem { address: String, count: usize },
    /// The system does not offer the reset podha needs.
    #[error("system {system:?} does not allow ResetType {reset} (allowed: {allowed})")]
    ResetNotAllowed {
        system: String,
        reset: &'static str,
        allowed: String,
    },
    /// Any other error status, with the BMC's own message when it gave one.
    #[error("BMC {address} answered HTTP {status}: {message}")]
    Refused {
        address: String,
        status: u16,
        message: String,
    },
    /// An answer that could not be read (malformed, too large, cut short).
    #[error("BMC {address} answered something unreadable: {detail}")]
    BadAnswer { address: String, detail: String },
    /// An answer that is not what was asked for, or that points elsewhere: another resource
    /// than the system, a redirect or action on another host or outside the system. podha
    /// neither trusts nor follows it.
    #[error("BMC {address}: {detail}")]
    Mismatch { address: String, detail: String },
}

impl Error {
    /// A bounded label for metrics and event reasons.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Settings(_) => "settings",
            Self::Unreachable { .. } => "unreachable",
            Self::Tls { .. } => "tls",
            Self::Unauthorized { .. } => "unauthorized",
            Self::UnknownSystem { .. } => "unknown_system",
            Self::AmbiguousSystem { .. } => "ambiguous_system",
            Self::ResetNotAllowed { .. } => "reset_not_allowed",
            Self::Refused { .. } => "refused",
            Self::BadAnswer { .. } => "bad_answer",
            Self::Mismatch { .. } => "mismatch",
        }
    }

    /// Worth asking again later (the BMC or the way to it may come back); the others need a
    /// change of settings or credentials first.
    pub const fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::BadAnswer { .. } => true,
            // 409: an operation in progress (a BMC busy with another reset); 429: too many.
            Self::Refused { status, .. } => *status >= 500 || matches!(*status, 409 | 429),
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
