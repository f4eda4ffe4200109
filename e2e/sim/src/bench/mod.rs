//! Benchmarks: they print figures, they assert nothing (`make bench`; the figures and what they mean are in `docs/benchmarks.md`).

pub mod failover;
mod operator;
pub mod postgres;
pub mod scale;
pub mod survey;
