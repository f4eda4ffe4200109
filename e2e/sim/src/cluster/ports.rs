//! Ports for the sim's listeners, chosen below the kernel's ephemeral range.
//!
//! A port the kernel hands out for `bind(0)` comes from the ephemeral range, the same range
//! every outgoing connection takes its local port from. Between the sim choosing such a port
//! and the component binding it (seconds later, for the controller manager), a connection to
//! the API server or etcd can take it, and the component dies at start with "address already
//! in use" (CI saw it: no controller manager, so no DaemonSet pod ever ran). Ports below the
//! range are taken only by listeners.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: above the well-known ports and the ones the sim's components
/// keep fixed (the kubelet's 10250, kube-proxy's 10249 and 10256).
const LOWEST: u16 = 20000;

/// Where the kernel's ephemeral range begins, as `ip_local_port_range` says (Linux's default
/// when it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// The ports to try, in order, from `seed`: every port of `[LOWEST, end)` once, from a place
/// that differs between processes and calls, so sims started together rarely try the same
/// port first.
fn candidates(seed: u32, end: u16) -> impl Iterator<Item = u16> {
    let span = u32::from(end.saturating_sub(LOWEST));
    let start = if span == 0 { 0 } else { seed % span };
    (0..span).map(move |i| LOWEST + ((start + i) % span) as u16)
}

/// Calls so far in this process: each starts further on.
static CALLS: AtomicU32 = AtomicU32::new(0);

/// A port no process listens on at `ip`, below the ephemeral range; the kernel's choice when
/// the range leaves none below it.
pub(crate) fn free_port(ip: Ipv4Addr) -> std::io::Result<u16> {
    let seed = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(101));
    let found = candidates(seed, ephemeral_start()).find(|port| port_is_free(ip, *port));
    match found {
        Some(port) => Ok(port),
        None => TcpListener::bind((ip, 0))?.local_addr().map(|a| a.port()),
    }
}

pub(crate) fn port_is_free(ip: Ipv4Addr, port: u16) -> bool {
    TcpListener::bind((ip, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_cover_the_span_below_the_ephemeral_range_once() {
        let ports: Vec<u16> = candidates(12345, 32768).collect();
        assert_eq!(ports.len(), 32768 - 20000);
        assert!(ports.iter().all(|p| (LOWEST..32768).contains(p)));
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len());
        assert_ne!(candidates(1, 32768).next(), candidates(2, 32768).next());
        assert_eq!(candidates(7, LOWEST).count(), 0, "no room below the range");
    }

    #[test]
    fn a_free_port_is_below_the_ephemeral_range_and_bindable() {
        let port = free_port(Ipv4Addr::LOCALHOST).unwrap();
        assert!((LOWEST..ephemeral_start()).contains(&port), "{port}");
        let _held = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        assert!(!port_is_free(Ipv4Addr::LOCALHOST, port));
        assert_ne!(free_port(Ipv4Addr::LOCALHOST).unwrap(), port);
    }
}
