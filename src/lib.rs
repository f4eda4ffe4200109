//! podha keeps stateful pods alive when their node dies: it watches node health through
//! `PodHAPolicy` resources and, when a node is judged dead, force-deletes the eligible pods (or
//! taints the node out-of-service), then follows their volumes until the replacements run.
#![forbid(unsafe_code)]
// Functions that decide should read in one screen (clippy.toml sets the limit); tests are
// tables and scenarios, and may run longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod agent;
pub mod api;
pub mod backoff;
pub mod build_info;
pub mod chaos;
pub mod contract;
pub mod deadline;
pub mod eligibility;
pub mod explain;
#[cfg(test)]
pub(crate) mod fake_api;
pub mod health;
pub mod http;
pub mod incident;
pub mod kubeconfig;
pub mod leader;
pub mod listen;
pub mod metrics;
pub mod planner;
pub mod protection;
pub mod redfish;
pub mod runtime;
#[cfg(test)]
pub(crate) mod test_builders;
pub mod view;
