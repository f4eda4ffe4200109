//! podha keeps stateful pods alive when their node dies: it watches node health through
//! `PodHAPolicy` resources and, when a node is judged dead, force-deletes the eligible pods (or
//! taints the node out-of-service), then follows their volumes until the replacements run.
#![forbid(unsafe_code)]

pub mod agent;
pub mod api;
pub mod chaos;
pub mod contract;
pub mod deadline;
pub mod detach;
pub mod eligibility;
pub mod health;
pub mod http;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod planner;
pub mod runtime;
#[cfg(test)]
pub(crate) mod test_builders;
pub mod view;
