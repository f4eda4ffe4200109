//! Benchmarks: they print figures, they assert nothing (DESIGN.md; `make bench`).

pub mod failover;
pub mod scale;
