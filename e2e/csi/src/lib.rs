//! podha-csi: a CSI v1 plugin over a shared directory (the "SAN") that fences on unpublish and
//! keeps a write log per volume, plus the writer workload and the checker that reads the log.
//! See README.md.

pub mod authority;
pub mod capability;
pub mod checker;
pub mod controller;
pub mod flood;
pub mod identity;
pub mod mount;
pub mod node;
pub mod registration;
pub mod server;
pub mod store;
pub mod writer;

/// The CSI v1 messages and services, generated from `proto/csi.proto` at build time.
#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// The kubelet's plugin registration API v1, generated from `proto/pluginregistration.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// The two driver names the sim serves, so driver scoping stays testable.
pub const DRIVERS: [&str; 2] = ["rwo.sim.podha.io", "other.sim.podha.io"];
