//! podha keeps stateful pods alive when their node dies: it watches node health through
//! `PodHAPolicy` resources and, when a node is judged dead, force-deletes the eligible pods (or
//! taints the node out-of-service), then follows their volumes until the replacements run.
#![forbid(unsafe_code)]
// Functions that decide should read in one screen (clippy.toml sets the limit); tests are
// tables and scenarios, and may run longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

// The node agent, the contract it shares with the operator, and what both build on are crates
// of their own (crates/): the agent builds on nothing of the operator's.
pub use podha_agent as agent;
pub use podha_contract as contract;
pub use podha_support::{backoff, kubeconfig, listen};
// The decisions are a crate of their own (crates/core): pure, and built on nothing of the
// process's.
#[cfg(test)]
pub(crate) use podha_core::test_builders;
pub use podha_core::{api, deadline, eligibility, health, incident, planner, protection, view};

#[cfg(test)]
mod agent_chart_tests;
pub mod build_info;
pub mod chaos;
#[cfg(test)]
mod examples_tests;
pub mod explain;
pub mod http;
#[cfg(test)]
mod install_docs_tests;
pub mod leader;
#[cfg(test)]
mod license_tests;
pub mod metrics;
pub mod redfish;
pub mod runtime;
