//! Many nodes on few processes, for scale benchmarks.
//!
//! A normal sim node is one kwok process (`--manage-single-node`) plus one sim-csi node agent:
//! two processes per node, which a 2-core machine cannot run a thousand times. A *fleet* adds
//! nodes in groups instead: group `g` is `group_size` Node objects `fleet-<g>-<i>` labelled
//! [`FLEET_GROUP_LABEL`]`=g<g>`, all managed by one kwok process
//! (`--manage-nodes-with-label-selector`, process name `kwok-fleet-<g>`). That kwok renews every
//! group node's Lease (40 s duration, renewed every 10 s) and plays the same Stages as a normal
//! node, so SIGKILLing it ([`Cluster::kill_fleet_group`]) makes the whole group die at once:
//! leases stop, status freezes, the group's kubelet address refuses connections.
//!
//! What a fleet node lacks, against a normal node:
//! - no sim-csi node agent: [`Cluster::add_fleet`] registers both sim-csi drivers in each node's
//!   CSINode itself (so the attacher can attach), but nobody reports `volumesInUse` and nobody
//!   sets the `sim.podha.io/volumes-ready` annotation: pods meant for fleet nodes must carry it
//!   in their template (they start without waiting for their volumes);
//! - one kubelet address per group: every node of group `g` reports the group kwok's address,
//!   `127.1.0.<g + 1>:10250`, as InternalIP and kubelet port;
//! - pod IPs come from the node's `spec.podCIDR`, `10.<128 + g>.<i>.0/24`.
//!
//! `down` kills the group processes with the rest of the cluster (they are in `state.json`).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ListParams, PostParams};

use super::{
    CONTROLLER_MANAGER, Cluster, Error, KUBELET_PORT, NODE_LEASE_DURATION_SECONDS, Result,
    SCHEDULER, node_is_ready, process,
};

/// Label carrying a fleet node's group, `g<index>`.
pub const FLEET_GROUP_LABEL: &str = "sim.podha.io/fleet-group";
/// Largest group: pod CIDRs are `10.<128 + g>.<i>.0/24`.
pub const MAX_GROUP_SIZE: usize = 256;
/// Most groups: pod CIDRs are `10.<128 + g>.<i>.0/24`.
pub const MAX_GROUPS: usize = 127;
/// Object creations in flight while adding a fleet.
const CREATE_CONCURRENCY: usize = 16;

/// One group of fleet nodes, managed by one kwok process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetGroup {
    pub index: usize,
    /// Value of [`FLEET_GROUP_LABEL`] on its nodes.
    pub label: String,
    /// kwok's address, reported as every group node's InternalIP.
    pub ip: Ipv4Addr,
    pub nodes: Vec<String>,
}

impl FleetGroup {
    fn new(index: usize, size: usize) -> Self {
        FleetGroup {
            index,
            label: format!("g{index}"),
            ip: Ipv4Addr::new(127, 1, 0, (index + 1) as u8),
            nodes: (0..size).map(|i| format!("fleet-{index}-{i}")).collect(),
        }
    }

    /// Name of its kwok process in `state.json` and `logs/`.
    pub fn process_name(&self) -> String {
        format!("kwok-fleet-{}", self.index)
    }

    /// Label selector matching its nodes.
    pub fn selector(&self) -> String {
        format!("{FLEET_GROUP_LABEL}={}", self.label)
    }
}

impl Cluster {
    /// Adds groups `first..first + groups` of `group_size` nodes each, one kwok process per
    /// group, and returns once every new node is Ready. See the module documentation.
    pub async fn add_fleet(
        &self,
        first: usize,
        groups: usize,
        group_size: usize,
    ) -> Result<Vec<FleetGroup>> {
        if group_size == 0 || group_size > MAX_GROUP_SIZE || first + groups > MAX_GROUPS {
            return Err(Error::Other(format!(
                "fleet groups must hold 1..={MAX_GROUP_SIZE} nodes and number at most \
                 {MAX_GROUPS}; asked for groups {first}..{} of {group_size}",
                first + groups
            )));
        }
        let groups: Vec<FleetGroup> = (first..first + groups)
            .map(|g| FleetGroup::new(g, group_size))
            .collect();
        let client = self.client().await?;
        let specs: Vec<(usize, usize, String, &FleetGroup)> = groups
            .iter()
            .flat_map(|g| {
                g.nodes
                    .iter()
                    .enumerate()
                    .map(move |(i, n)| (g.index, i, n.clone(), g))
            })
            .collect();
        let c = &client;
        stream::iter(specs.into_iter().map(|(g, i, name, group)| async move {
            create_fleet_node(c, &name, group, g, i).await?;
            create_csinode(c, &name).await
        }))
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
        self.spawn_fleet_kwoks(&groups)?;
        let names: BTreeSet<String> = groups.iter().flat_map(|g| g.nodes.clone()).collect();
        let watched: Vec<String> = groups.iter().map(FleetGroup::process_name).collect();
        let watched: Vec<&str> = watched.iter().map(String::as_str).collect();
        let nodes: Api<Node> = Api::all(client.clone());
        let lp = ListParams::default().labels(FLEET_GROUP_LABEL);
        let (nodes, lp, names) = (&nodes, &lp, &names);
        let timeout = Duration::from_secs(120) + Duration::from_millis(100) * names.len() as u32;
        self.wait_until(
            &format!("{} fleet nodes to be Ready", names.len()),
            timeout,
            &watched,
            || async move {
                let list = nodes
                    .list(lp)
                    .await
                    .map_err(|e| Error::kube("list fleet nodes", e))?;
                let ready = list
                    .items
                    .iter()
                    .filter(|n| names.contains(n.metadata.name.as_deref().unwrap_or_default()))
                    .filter(|n| node_is_ready(n))
                    .count();
                Ok(ready == names.len())
            },
        )
        .await?;
        tracing::info!(
            groups = groups.len(),
            nodes = names.len(),
            "fleet nodes Ready"
        );
        Ok(groups)
    }

    /// One kwok process per group, managing the group's nodes by their label.
    fn spawn_fleet_kwoks(&self, groups: &[FleetGroup]) -> Result<()> {
        let mut st = self.lock_reloaded();
        for g in groups {
            let mut kwok = Self::bin(&st, "kwok");
            kwok.arg(format!("--kubeconfig={}", self.kubeconfig_path().display()))
                .arg(format!(
                    "--config={}",
                    self.dir.join("kwok-stages.yaml").display()
                ))
                .arg(format!(
                    "--manage-nodes-with-label-selector={}",
                    g.selector()
                ))
                .arg(format!("--node-ip={}", g.ip))
                .arg(format!("--node-port={KUBELET_PORT}"))
                .arg(format!("--server-address={}:{KUBELET_PORT}", g.ip))
                .arg(format!(
                    "--node-lease-duration-seconds={NODE_LEASE_DURATION_SECONDS}"
                ))
                .env("HOME", self.dir.join("kwok-home"));
            self.spawn(&mut st, &g.process_name(), kwok)?;
        }
        Ok(())
    }

    /// SIGKILLs the group's kwok: every node of the group dies at once.
    pub fn kill_fleet_group(&self, group: &FleetGroup) -> Result<()> {
        let mut st = self.lock_reloaded();
        let name = group.process_name();
        let rec =
            st.processes.get(&name).copied().ok_or_else(|| {
                Error::Other(format!("fleet group {} is not running", group.label))
            })?;
        process::kill(&name, &rec)?;
        st.processes.remove(&name);
        st.save(&self.dir)?;
        tracing::info!(group = %group.label, nodes = group.nodes.len(), "fleet group killed");
        Ok(())
    }

    /// Pid of a running cluster process (`kube-apiserver`, `kwok-fleet-3`, ...).
    pub fn pid_of(&self, name: &str) -> Option<i32> {
        let st = self.reload();
        st.processes
            .get(name)
            .filter(|r| process::is_alive(r))
            .map(|r| r.pid)
    }

    /// Restarts the controller manager and the scheduler with a higher client rate limit
    /// (`--kube-api-qps`, `--kube-api-burst`; upstream defaults 20/30 and 50/100), everything
    /// else unchanged. Creating thousands of pods, claims and attachments at the upstream
    /// limits takes most of an hour; the node lifecycle timing of the profile is untouched.
    pub async fn raise_client_qps(&self, qps: u32, burst: u32) -> Result<()> {
        for name in [CONTROLLER_MANAGER, SCHEDULER] {
            let mut st = self.lock_reloaded();
            let rec = st
                .processes
                .get(name)
                .copied()
                .ok_or_else(|| Error::Other(format!("{name} is not running")))?;
            let raw = std::fs::read(format!("/proc/{}/cmdline", rec.pid))
                .map_err(|e| Error::io(format!("read the command line of {name}"), e))?;
            let mut argv = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned());
            let program = argv
                .next()
                .ok_or_else(|| Error::Other(format!("{name} has an empty command line")))?;
            let mut cmd = Command::new(program);
            cmd.args(argv.filter(|a| {
                !a.starts_with("--kube-api-qps") && !a.starts_with("--kube-api-burst")
            }))
            .arg(format!("--kube-api-qps={qps}"))
            .arg(format!("--kube-api-burst={burst}"));
            self.spawn(&mut st, name, cmd)?;
        }
        // Both serve /healthz on their secure port once started; a short pause is enough for
        // what follows (objects created meanwhile are picked up by their initial list).
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Some(exited) = self.exited(&[CONTROLLER_MANAGER, SCHEDULER]) {
                return Err(exited);
            }
        }
        Ok(())
    }
}

async fn create_fleet_node(
    client: &kube::Client,
    name: &str,
    group: &FleetGroup,
    g: usize,
    i: usize,
) -> Result<()> {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                FLEET_GROUP_LABEL: group.label,
            },
            "annotations": {
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "node.alpha.kubernetes.io/ttl": "0",
                "kwok.x-k8s.io/node": "fake",
            },
        },
        "spec": { "podCIDR": format!("10.{}.{i}.0/24", 128 + g) },
    }))
    .map_err(|e| Error::Other(format!("node object: {e}")))?;
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("create node {name}"), e)),
    }
}

/// What the sim-csi node agent would register: both drivers, node ID = node name.
async fn create_csinode(client: &kube::Client, name: &str) -> Result<()> {
    let drivers: Vec<serde_json::Value> = crate::csi::DRIVERS
        .iter()
        .map(|d| serde_json::json!({ "name": d, "nodeID": name, "topologyKeys": [] }))
        .collect();
    let csinode: CSINode = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": { "name": name },
        "spec": { "drivers": drivers },
    }))
    .map_err(|e| Error::Other(format!("CSINode object: {e}")))?;
    let api: Api<CSINode> = Api::all(client.clone());
    match api.create(&PostParams::default(), &csinode).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("create CSINode {name}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_get_distinct_addresses_and_names() {
        let a = FleetGroup::new(0, 3);
        let b = FleetGroup::new(126, 3);
        assert_eq!(a.ip, Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(b.ip, Ipv4Addr::new(127, 1, 0, 127));
        assert_eq!(a.nodes, ["fleet-0-0", "fleet-0-1", "fleet-0-2"]);
        assert_eq!(a.selector(), "sim.podha.io/fleet-group=g0");
        assert_eq!(b.process_name(), "kwok-fleet-126");
    }
}
