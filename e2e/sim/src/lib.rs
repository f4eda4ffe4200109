//! podha-sim: a real Kubernetes control plane on one machine, for podha's tests, demo and
//! benchmarks. `cluster` starts and stops the processes; `csi` is the sim-csi driver.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cluster;
pub mod csi;
pub mod failover;
pub mod testkit;
