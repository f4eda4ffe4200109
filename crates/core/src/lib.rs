//! podha's decisions, pure: they take data and return data, hold no client and do no IO. The
//! `PodHAPolicy` API, the plain view of the cluster every decision reads, node health,
//! eligibility, the incidents, the planner (the intents, and the verdicts they carry out) and
//! what it foresees of a death (`protection`, read by `podha explain` and the coverage). The
//! operator process, its CLIs and its agent build on it; it builds on none of them.
#![forbid(unsafe_code)]
// Functions that decide should read in one screen (clippy.toml sets the limit); tests are
// tables and scenarios, and may run longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub use podha_contract as contract;

pub mod api;
pub mod deadline;
pub mod eligibility;
pub mod health;
pub mod incident;
pub mod planner;
pub mod protection;
#[cfg(any(test, feature = "test-builders"))]
pub mod test_builders;
pub mod view;
