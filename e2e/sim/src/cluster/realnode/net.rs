//! Real nodes' network: per cluster a Linux bridge `phs<id>` with the host-side address
//! `172.31.<s>.1/24`; per node a network namespace `podha-sim-<id>-<node>` whose `eth0` (a veth
//! whose host end `phs<id>n<k>` is a bridge port) has `172.31.<s>.<k+1>`. The third octet `s`
//! is picked at `up` among those no host interface uses. Only these namespaces and the bridge
//! ever carry 172.31.<s>.0/24.
//!
//! The API server listens on 127.0.0.1 only. A node reaches it at `172.31.<s>.1:<port>`: one
//! `nat PREROUTING` DNAT rule (incoming on the bridge, to that address and port) sends it to
//! `127.0.0.1:<port>`, which the kernel allows once `route_localnet` is set on the bridge. So
//! the API server is not exposed on any other interface, and its certificate is unchanged (the
//! node's kubeconfig names the server `localhost` for TLS). The cluster's Redfish service, when
//! it has one, is reached the same way, by a rule of its own: podha installed by its chart
//! runs on a real node and reaches the nodes' BMCs as it would in a data centre.
//!
//! Each node routes every other node's pod range (`10.244.<k>.0/24`) through that node's
//! address, so pods reach each other, and Services, across nodes.
//!
//! Killing a node takes its veth down: packets to its address are lost, as to a machine that
//! is off. A partition drops, inside the node's namespace, its packets to the API server's
//! port (only those: the kubelet port still answers the host).

use std::net::Ipv4Addr;
use std::process::Command;

use crate::cluster::{Error, Result};

/// The range real nodes use: 172.31.<s>.0/24.
const FIRST_OCTETS: (u8, u8) = (172, 31);

/// Runs a command, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).output().map_err(|e| {
        Error::io(
            format!("run {program} (install it with `make node-deps`)"),
            e,
        )
    })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(Error::Other(format!(
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// The bridge's host address for third octet `s`.
pub fn host_ip(s: u8) -> Ipv4Addr {
    Ipv4Addr::new(FIRST_OCTETS.0, FIRST_OCTETS.1, s, 1)
}

/// Node `node-k`'s address.
pub fn node_ip(s: u8, index: u8) -> Ipv4Addr {
    Ipv4Addr::new(FIRST_OCTETS.0, FIRST_OCTETS.1, s, index.saturating_add(1))
}

/// A third octet no host interface uses yet, starting from `seed` (the cluster id).
pub fn free_subnet(seed: u8) -> Result<u8> {
    let addrs = run("ip", &["-4", "-o", "addr", "show"])?;
    (0..=255u16)
        .map(|i| seed.wrapping_add(i as u8))
        .find(|s| {
            let prefix = format!(" {}.{}.{s}.", FIRST_OCTETS.0, FIRST_OCTETS.1);
            !addrs.contains(&prefix)
        })
        .ok_or_else(|| Error::Other("no free 172.31.x.0/24 subnet on this host".into()))
}

fn dnat_rule(bridge: &str, s: u8, port: u16, tag: &str) -> Vec<String> {
    let port = port.to_string();
    let host = host_ip(s).to_string();
    [
        "PREROUTING",
        "-i",
        bridge,
        "-d",
        &host,
        "-p",
        "tcp",
        "--dport",
        &port,
        "-m",
        "comment",
        "--comment",
        tag,
        "-j",
        "DNAT",
        "--to-destination",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([format!("127.0.0.1:{port}")])
    .collect()
}

fn iptables(table: &str, op: &str, rule: &[String]) -> Result<String> {
    let mut args = vec!["-w", "-t", table, op];
    args.extend(rule.iter().map(String::as_str));
    run("iptables", &args)
}

/// Creates the bridge with its host address and a DNAT rule to each of this host's loopback
/// `ports` (the API server's, the Redfish service's). Leftovers of an earlier cluster in the
/// same directory are removed first.
pub fn create_bridge(bridge: &str, s: u8, ports: &[u16], tag: &str) -> Result<()> {
    delete_bridge(bridge, tag)?;
    run("ip", &["link", "add", bridge, "type", "bridge"])?;
    run(
        "ip",
        &["addr", "add", &format!("{}/24", host_ip(s)), "dev", bridge],
    )?;
    run("ip", &["link", "set", bridge, "up"])?;
    let sysctl = format!("/proc/sys/net/ipv4/conf/{bridge}/route_localnet");
    std::fs::write(&sysctl, "1").map_err(|e| Error::io(format!("write {sysctl}"), e))?;
    for &port in ports {
        iptables("nat", "-I", &dnat_rule(bridge, s, port, tag))?;
    }
    Ok(())
}

/// Removes the bridge and every nat rule tagged `tag`. Idempotent.
pub fn delete_bridge(bridge: &str, tag: &str) -> Result<()> {
    let rules = run("iptables", &["-w", "-t", "nat", "-S", "PREROUTING"]).unwrap_or_default();
    for line in rules.lines().filter(|l| l.contains(tag)) {
        if let Some(spec) = line.strip_prefix("-A ") {
            let rule: Vec<String> = spec
                .split_whitespace()
                .map(|w| w.trim_matches('"').to_string())
                .collect();
            iptables("nat", "-D", &rule)?;
        }
    }
    if link_exists(bridge) {
        run("ip", &["link", "del", bridge])?;
    }
    Ok(())
}

fn link_exists(name: &str) -> bool {
    run("ip", &["link", "show", name]).is_ok()
}

fn netns_exists(netns: &str) -> bool {
    std::path::Path::new("/run/netns").join(netns).exists()
}

/// The node's namespace, with `eth0` at `ip`, a default route through the bridge, and its veth
/// `veth` on the bridge. Leftovers with the same names are removed first.
pub fn create_node(netns: &str, veth: &str, bridge: &str, s: u8, ip: Ipv4Addr) -> Result<()> {
    delete_node(netns, veth)?;
    run("ip", &["netns", "add", netns])?;
    run(
        "ip",
        &[
            "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns,
        ],
    )?;
    run("ip", &["link", "set", veth, "master", bridge, "up"])?;
    let host = host_ip(s).to_string();
    for args in [
        vec!["addr", "add", &format!("{ip}/24"), "dev", "eth0"],
        vec!["link", "set", "eth0", "up"],
        vec!["link", "set", "lo", "up"],
        vec!["route", "add", "default", "via", &host],
    ] {
        let mut full = vec!["-n", netns];
        full.extend(args.iter().copied());
        run("ip", &full)?;
    }
    Ok(())
}

/// A route in node namespace `netns` to another node's pods, `pod_cidr`, through that node's
/// address `via`: the bridge joins the nodes, so it is one hop, as on a flat network whose
/// routes a CNI plugin keeps. Idempotent.
pub fn add_pod_route(netns: &str, pod_cidr: &str, via: Ipv4Addr) -> Result<()> {
    run(
        "ip",
        &[
            "-n",
            netns,
            "route",
            "replace",
            pod_cidr,
            "via",
            &via.to_string(),
        ],
    )?;
    Ok(())
}

/// Removes the namespace (its veth goes with it). Idempotent.
pub fn delete_node(netns: &str, veth: &str) -> Result<()> {
    if netns_exists(netns) {
        run("ip", &["netns", "del", netns])?;
    }
    if link_exists(veth) {
        run("ip", &["link", "del", veth])?;
    }
    Ok(())
}

/// Brings the host end of the node's veth up or down (down: the node's address goes silent).
pub fn set_link(veth: &str, up: bool) -> Result<()> {
    run("ip", &["link", "set", veth, if up { "up" } else { "down" }])?;
    Ok(())
}

fn partition_rule(s: u8, apiserver_port: u16) -> Vec<String> {
    [
        "OUTPUT",
        "-d",
        &format!("{}/32", host_ip(s)),
        "-p",
        "tcp",
        "--dport",
        &apiserver_port.to_string(),
        "-j",
        "DROP",
    ]
    .map(String::from)
    .to_vec()
}

fn in_netns(netns: &str, op: &str, rule: &[String]) -> Result<String> {
    let ns = format!("--net=/run/netns/{netns}");
    let mut args = vec![ns.as_str(), "iptables", "-w", op];
    args.extend(rule.iter().map(String::as_str));
    run("nsenter", &args)
}

/// Drops (`cut`) or lets through again every packet from the node to the API server; the
/// node's containers keep running, and its kubelet port still answers (replies go to other
/// ports of the host).
pub fn set_partition(netns: &str, s: u8, apiserver_port: u16, cut: bool) -> Result<()> {
    let rule = partition_rule(s, apiserver_port);
    let present = in_netns(netns, "-C", &rule).is_ok();
    match (cut, present) {
        (true, false) => in_netns(netns, "-I", &rule).map(drop),
        (false, true) => in_netns(netns, "-D", &rule).map(drop),
        _ => Ok(()),
    }
}

/// Drops (`cut`) or lets through again every packet the node, or a pod on it, sends to
/// node `to` or to its pods (`to_pods`, its pod range): the node's own (OUTPUT) and its pods'
/// (FORWARD, routed through the node's namespace). Replies to `to`'s own connections are
/// dropped too, so neither side reaches the other.
pub fn set_unreachable(netns: &str, to: Ipv4Addr, to_pods: &str, cut: bool) -> Result<()> {
    for destination in [format!("{to}/32"), to_pods.to_string()] {
        for chain in ["OUTPUT", "FORWARD"] {
            let rule: Vec<String> = [chain, "-d", &destination, "-j", "DROP"]
                .map(String::from)
                .to_vec();
            let present = in_netns(netns, "-C", &rule).is_ok();
            match (cut, present) {
                (true, false) => in_netns(netns, "-I", &rule).map(drop)?,
                (false, true) => in_netns(netns, "-D", &rule).map(drop)?,
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_the_chosen_subnet() {
        assert_eq!(host_ip(7), Ipv4Addr::new(172, 31, 7, 1));
        assert_eq!(node_ip(7, 4), Ipv4Addr::new(172, 31, 7, 5));
        let rule = dnat_rule("phsabc", 7, 6443, "podha-sim:x");
        assert_eq!(rule.last().map(String::as_str), Some("127.0.0.1:6443"));
        assert!(rule.contains(&"172.31.7.1".to_string()));
    }
}
