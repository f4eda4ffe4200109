//! install.md's "Uninstall" names what `helm uninstall` leaves behind: what podha creates at
//! run time beside the chart's objects, and the host directories the agent's DaemonSet mounts.
//! A new hostPath in the chart, or a new object podha makes for itself, must be named there.

const INSTALL_MD: &str = include_str!("../docs/install.md");
const AGENT_DAEMONSET: &str = include_str!("../charts/podha/templates/agent-daemonset.yaml");
const VALUES: &str = include_str!("../charts/podha/values.yaml");

fn uninstall_section() -> &'static str {
    let start = INSTALL_MD
        .find("\n## Uninstall")
        .expect("install.md has an Uninstall section");
    let rest = &INSTALL_MD[start + 1..];
    let end = rest[1..].find("\n## ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// The fixed host paths the agent's DaemonSet mounts (the watchdog device, a path of the
/// values, is the node's own and not podha's to remove).
fn host_paths() -> Vec<&'static str> {
    let lines: Vec<&str> = AGENT_DAEMONSET.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].trim() == "hostPath:")
        .filter_map(|w| w[1].trim().strip_prefix("path: "))
        .filter(|p| p.starts_with('/'))
        .collect()
}

#[test]
fn the_uninstall_section_names_what_podha_leaves_behind() {
    let section = uninstall_section();
    let paths = host_paths();
    assert!(
        paths.contains(&"/var/lib/podha-agent") && paths.contains(&"/run/podha-agent"),
        "the agent's host directories, read from the chart: {paths:?}"
    );
    for path in paths {
        assert!(
            section.contains(path),
            "install.md's Uninstall does not name the agent's host directory {path}"
        );
    }
    assert!(
        section.contains("/var/lib/podha-agent/<node>/key"),
        "the agent's key on each node"
    );
    let values: serde_norway::Value = serde_norway::from_str(VALUES).expect("values.yaml");
    let lease = values["leaderElection"]["leaseName"]
        .as_str()
        .expect("leaderElection.leaseName");
    let cfg = crate::leader::LeaderConfig {
        lease_name: lease.to_string(),
        ..crate::leader::LeaderConfig::new("podha-system", "podha-0")
    };
    for name in [lease.to_string(), crate::leader::key::secret_name(&cfg)] {
        assert!(
            section.contains(&format!("`{name}`")),
            "install.md's Uninstall does not name {name}, which podha creates at run time"
        );
    }
}
