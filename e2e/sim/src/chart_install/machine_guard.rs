//! The guard that keeps a test's podha agent off this machine: the sim's real nodes and the kind
//! kit's share this machine's kernel, so an agent may fence only through the stand-ins a node
//! shows it (its BMC's directory, its own pods' cgroups) and mount nothing else of the host.

/// Where the sim's real nodes show their pods' cgroups (`MACHINE_DIR/cgroup`, the node's own
/// cgroup v2 tree), ending in `/`.
pub(super) fn sim_pods_cgroup() -> String {
    format!("{}/cgroup/kubepods/", crate::cluster::realnode::MACHINE_DIR)
}

/// Where the sim's real nodes show their BMC (`sim_agent_values`), ending in `/`.
fn sim_bmc_dir() -> String {
    format!("{}/bmc/", crate::cluster::realnode::MACHINE_DIR)
}

/// What the sim's real nodes show their agents.
pub(super) fn sim_stand_ins() -> StandIns<'static> {
    static BMC: std::sync::LazyLock<String> = std::sync::LazyLock::new(sim_bmc_dir);
    static PODS: std::sync::LazyLock<String> = std::sync::LazyLock::new(sim_pods_cgroup);
    StandIns {
        bmc_dir: &BMC,
        pods_cgroup: Some(&PODS),
        host_dirs: &[crate::cluster::realnode::MACHINE_DIR],
    }
}

/// What a machine shows its agent in a test: where its BMC stand-in is, where its own pods'
/// cgroups are, and the only host directories the agent's pod may mount beyond the chart's own.
pub(crate) struct StandIns<'a> {
    /// The BMC's directory (its power control and watchdog), ending in `/`.
    pub bmc_dir: &'a str,
    /// The node's own pods' cgroups, ending in `/`: a fence may kill one (`cgroup.kill`).
    pub pods_cgroup: Option<&'a str>,
    /// Each mounted at its own path in the agent's container.
    pub host_dirs: &'a [&'a str],
}

/// Whether the chart's `agent` values keep the agent off this machine's own kernel: off (and
/// nothing else said), or fencing by a write under the BMC's directory or by killing a cgroup
/// of the node's own pods, petting a stand-in under the BMC's directory (or none), mounting
/// only the stand-ins' host directories (each at its own path, whole), with nothing else that
/// names a device or the kernel.
pub(crate) fn agent_on_this_machine_is_safe(agent: &serde_json::Value, machine: &StandIns) -> bool {
    if agent["enabled"] == false {
        return agent.as_object().is_some_and(|a| a.len() == 1);
    }
    let plain = |p: &str| !p.split('/').any(|c| c == "..");
    let under_bmc = |v: &serde_json::Value| {
        v.as_str()
            .is_some_and(|p| plain(p) && p.starts_with(machine.bmc_dir))
    };
    let kills_pods = |write: &str| {
        let rest = machine.pods_cgroup.and_then(|dir| write.strip_prefix(dir));
        rest == Some("cgroup.kill=1") || rest.is_some_and(|r| r.ends_with("/cgroup.kill=1"))
    };
    let fence = agent["fence"]
        .as_str()
        .and_then(|f| f.strip_prefix("write:"))
        .filter(|f| plain(f))
        .is_some_and(|f| f.starts_with(machine.bmc_dir) || kills_pods(f));
    let device = &agent["watchdog"]["device"];
    let extra: Vec<&str> = agent["extraArgs"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let watchdog = device == "" || (under_bmc(device) && extra.contains(&"--watchdog-stand-in"));
    let nothing_else = extra
        .iter()
        .all(|a| !a.contains("/dev/") && !a.contains("/proc/") && !a.starts_with("--watchdog="));
    fence && watchdog && nothing_else && mounts_only(agent, machine.host_dirs)
}

/// Whether the agent's extra volumes are hostPaths of `host_dirs` alone, each mounted whole at
/// its own path.
fn mounts_only(agent: &serde_json::Value, host_dirs: &[&str]) -> bool {
    let list = |key: &str| agent[key].as_array().cloned().unwrap_or_default();
    let volumes = list("extraVolumes");
    let host_path = |name: &serde_json::Value| {
        volumes
            .iter()
            .find(|v| v["name"] == *name)
            .and_then(|v| v["hostPath"]["path"].as_str())
    };
    let volumes_ok = volumes.iter().all(|v| {
        v.as_object()
            .is_some_and(|o| o.keys().all(|k| k == "name" || k == "hostPath"))
            && v["hostPath"]["path"]
                .as_str()
                .is_some_and(|p| host_dirs.contains(&p))
    });
    let mounts_ok = list("extraVolumeMounts").iter().all(|m| {
        let keys = ["name", "mountPath", "readOnly"];
        m.as_object()
            .is_some_and(|o| o.keys().all(|k| keys.contains(&k.as_str())))
            && host_path(&m["name"]).is_some_and(|p| m["mountPath"] == p)
    });
    volumes_ok && mounts_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart_install::{SimAgent, sim_agent_values};
    use std::time::Duration;

    #[test]
    fn only_the_bmc_stand_ins_and_the_nodes_own_pods_pass_for_an_agent_on_this_machine() {
        for watchdog in [None, Some(Duration::from_secs(4))] {
            let SimAgent::OnBmc(values) = sim_agent_values(Duration::from_secs(8), watchdog, None)
            else {
                panic!("on");
            };
            assert!(
                agent_on_this_machine_is_safe(&values["agent"], &sim_stand_ins()),
                "{values}"
            );
        }
        assert!(agent_on_this_machine_is_safe(
            &SimAgent::Off.values()["agent"],
            &sim_stand_ins()
        ));
        let SimAgent::OnBmc(base) =
            sim_agent_values(Duration::from_secs(8), Some(Duration::from_secs(4)), None)
        else {
            panic!("on");
        };
        let pods_fence = SimAgent::OnBmc(base.clone()).fencing_best_effort_pods();
        assert!(
            agent_on_this_machine_is_safe(&pods_fence.values()["agent"], &sim_stand_ins()),
            "{}",
            pods_fence.values()
        );
        let machine = crate::cluster::realnode::MACHINE_DIR;
        let kill = |target: &str| {
            let mut values = base.clone();
            values["agent"]["fence"] = format!("write:{target}=1").into();
            values
        };
        let host_cgroup = kill("/sys/fs/cgroup/unified/cgroup.kill");
        let whole_node = kill(&format!("{machine}/cgroup/cgroup.kill"));
        let escaped = kill(&format!("{machine}/cgroup/kubepods/../../cgroup.kill"));
        let mut escaped_bmc = base.clone();
        escaped_bmc["agent"]["fence"] =
            format!("write:{machine}/bmc/../cgroup/cgroup.kill=1").into();
        let mut sysrq_mounted = base.clone();
        sysrq_mounted["agent"]["extraVolumes"] = serde_json::json!([
            { "name": "machine", "hostPath": { "path": machine, "type": "Directory" } },
            { "name": "s", "hostPath": { "path": "/proc/sysrq-trigger" } },
        ]);
        sysrq_mounted["agent"]["extraVolumeMounts"] = serde_json::json!([
            { "name": "machine", "mountPath": machine },
            { "name": "s", "mountPath": format!("{machine}/bmc/power") },
        ]);
        let mut host_cgroups_mounted = base.clone();
        host_cgroups_mounted["agent"]["extraVolumeMounts"] = serde_json::json!([
            { "name": "machine", "mountPath": machine },
            { "name": "machine", "mountPath": format!("{machine}/bmc/h"), "subPath": "../.." },
        ]);
        let mut watchdog_escaped = base.clone();
        watchdog_escaped["agent"]["watchdog"]["device"] =
            format!("{machine}/bmc/../../../dev/watchdog").into();
        let mut off_but_more = SimAgent::Off.values();
        off_but_more["agent"]["fence"] = "sysrq-reboot".into();
        let mut chart_default = base.clone();
        chart_default["agent"]["fence"] = "sysrq-reboot".into();
        let mut sysrq_by_write = base.clone();
        sysrq_by_write["agent"]["fence"] = "write:/proc/sysrq-trigger=b".into();
        let mut host_watchdog = base.clone();
        host_watchdog["agent"]["watchdog"]["device"] = "/dev/watchdog".into();
        let mut extra_watchdog = base.clone();
        extra_watchdog["agent"]["watchdog"]["device"] = "".into();
        extra_watchdog["agent"]["extraArgs"] = serde_json::json!(["--watchdog=/dev/watchdog"]);
        let mut undeclared = base;
        undeclared["agent"]["extraArgs"] = serde_json::json!([]);
        for unsafe_values in [
            chart_default,
            sysrq_by_write,
            host_watchdog,
            extra_watchdog,
            undeclared,
            host_cgroup,
            whole_node,
            escaped,
            escaped_bmc,
            sysrq_mounted,
            host_cgroups_mounted,
            watchdog_escaped,
            off_but_more,
        ] {
            assert!(
                !agent_on_this_machine_is_safe(&unsafe_values["agent"], &sim_stand_ins()),
                "{unsafe_values}"
            );
        }
    }
}
