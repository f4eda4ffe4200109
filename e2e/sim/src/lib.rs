//! podha-sim: a real Kubernetes control plane on one machine, for podha's tests, demo and
//! benchmarks. `cluster` starts and stops the processes; `csi` runs the CSI drivers (podha-csi behind the real sidecars, a simulated node side); `relay`
//! cuts one client off the API server;
//! `kind_bmc` powers the kind kit's nodes off as their BMCs would;
//! `forge` sends a node's agent heartbeats and peer surveys signed by no one.
#![forbid(unsafe_code)]

pub mod bench;
pub mod bmc_fifo;
pub mod chart_install;
pub mod chart_notes;
pub mod chart_rbac;
pub mod cluster;
pub mod csi;
pub mod demo;
pub mod examples;
pub mod failover;
pub mod forge;
pub mod kind_bmc;
#[cfg(test)]
mod kind_kit;
pub mod postgres;
pub mod relay;
pub mod testkit;
