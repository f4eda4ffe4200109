//! A dead machine's address stops answering: packets to it are dropped, so a TCP connect gets
//! neither an accept nor a refusal and runs into its timeout, as it does against a powered-off
//! host. (A refusal would be the host's kernel answering: a machine that runs.)
//!
//! Sim nodes share the loopback interface, so the drop is an `iptables` rule in the host's
//! `OUTPUT` chain on the node's address *and* kubelet port (two sim clusters may use the same
//! loopback address on different ports). Each rule carries a comment naming its cluster
//! (`podha-sim:<hash of the cluster directory>`), so [`clear`] removes exactly that cluster's rules
//! and nothing else on the host.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use super::{Error, Result};

/// The comment that tags every rule of the cluster in `dir`.
pub(super) fn tag(dir: &Path) -> String {
    // FNV-1a: stable across builds and processes (std's hasher is not), short enough for a comment.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in dir.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("podha-sim:{hash:016x}")
}

fn rule(dir: &Path, ip: Ipv4Addr, port: u16) -> Vec<String> {
    [
        "OUTPUT",
        "-d",
        &format!("{ip}/32"),
        "-p",
        "tcp",
        "--dport",
        &port.to_string(),
        "-m",
        "comment",
        "--comment",
        &tag(dir),
        "-j",
        "DROP",
    ]
    .map(str::to_string)
    .to_vec()
}

fn iptables(args: &[String]) -> Result<std::process::Output> {
    Command::new("iptables")
        // Wait for the xtables lock rather than fail when another rule is being changed.
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| Error::Io {
            context: "running iptables (a killed sim node's address is silenced with it; \
                      install it with `make sim-deps`)"
                .to_string(),
            source: e,
        })
}

fn exists(dir: &Path, ip: Ipv4Addr, port: u16) -> Result<bool> {
    let mut args = vec!["-C".to_string()];
    args.extend(rule(dir, ip, port));
    Ok(iptables(&args)?.status.success())
}

fn run(what: &str, args: Vec<String>) -> Result<()> {
    let out = iptables(&args)?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Io {
        context: format!("iptables {what}"),
        source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    })
}

/// Drops every packet to `ip:port` from now on. Idempotent.
pub fn silence(dir: &Path, ip: Ipv4Addr, port: u16) -> Result<()> {
    if exists(dir, ip, port)? {
        return Ok(());
    }
    let mut args = vec!["-I".to_string()];
    args.extend(rule(dir, ip, port));
    run(&format!("silencing {ip}:{port}"), args)
}

/// Lets packets to `ip:port` through again. Idempotent.
pub fn restore(dir: &Path, ip: Ipv4Addr, port: u16) -> Result<()> {
    while exists(dir, ip, port)? {
        let mut args = vec!["-D".to_string()];
        args.extend(rule(dir, ip, port));
        run(&format!("restoring {ip}:{port}"), args)?;
    }
    Ok(())
}

/// Removes every rule of the cluster in `dir` (at `down`). Does nothing when iptables is not
/// installed: then no rule can exist.
pub fn clear(dir: &Path) -> Result<()> {
    let Ok(out) = Command::new("iptables")
        .args(["-w", "-S", "OUTPUT"])
        .output()
    else {
        return Ok(());
    };
    let tag = tag(dir);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `-A OUTPUT -d 127.0.0.3/32 -p tcp -m tcp --dport 10250 -m comment --comment ... -j DROP`
        if !line.contains(&tag) {
            continue;
        }
        let Some(spec) = line.strip_prefix("-A ") else {
            continue;
        };
        let mut args = vec!["-D".to_string()];
        args.extend(
            spec.split_whitespace()
                .map(|w| w.trim_matches('"').to_string()),
        );
        run("clearing a silenced node", args)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cluster_directory_has_its_own_stable_tag() {
        let a = tag(Path::new("/tmp/a"));
        assert_eq!(a, tag(Path::new("/tmp/a")));
        assert_ne!(a, tag(Path::new("/tmp/b")));
        assert!(a.starts_with("podha-sim:") && a.len() == "podha-sim:".len() + 16);
    }
}
