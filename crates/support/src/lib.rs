//! What podha's operator and its node agent both build on and neither owns: every backoff they
//! wait by ([`backoff`]), their listening sockets and open-file limit ([`listen`]), and their
//! Kubernetes client ([`kubeconfig`]).
#![forbid(unsafe_code)]
// Functions that decide should read in one screen (clippy.toml sets the limit); tests are
// tables and scenarios, and may run longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod backoff;
pub mod kubeconfig;
pub mod listen;
