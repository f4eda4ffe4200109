//! The [`Cluster`] operations on real nodes: booting them, waiting for them, and the faults
//! only a real node has (freeze, partition, listing its processes).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tracing::info;

use super::{self as realnode, RealNode};
use crate::cluster::state::{NodeRecord, State};
use crate::cluster::{Cluster, Error, Result, kubelet_proc, node_is_ready, process};

impl Cluster {
    pub(in crate::cluster) fn real_node_of(&self, rec: &NodeRecord) -> RealNode {
        RealNode::new(&self.dir, &rec.name, rec.index, rec.ip)
    }

    /// The real node `name`, or an error when it is a kwok node.
    pub(in crate::cluster) fn real_node(&self, name: &str, what: &str) -> Result<RealNode> {
        let st = self.reload();
        let rec = st.node(name)?;
        if !rec.real {
            return Err(Error::Other(format!(
                "{name} is a kwok node: only real nodes (--real-nodes) can be {what}"
            )));
        }
        Ok(self.real_node_of(rec))
    }

    /// Creates the real nodes' network, prepares each node and boots it; returns each node's
    /// name and boot ID, for [`Cluster::wait_real_nodes_ready`].
    pub(in crate::cluster) fn boot_real_nodes(
        &self,
        recs: &[NodeRecord],
    ) -> Result<Vec<(String, String)>> {
        let mut st = self.lock();
        let Some(real) = st.real_nodes.clone() else {
            return Ok(Vec::new());
        };
        let port = st.ports.apiserver;
        let redfish = st.redfish.as_ref().map(|r| r.port);
        let reached: Vec<u16> = [Some(port), redfish].into_iter().flatten().collect();
        realnode::create_host_network(&self.dir, real.subnet, &reached)?;
        let mut boots = Vec::new();
        for rec in recs {
            let node = self.real_node_of(rec);
            let uuid = rec.system_uuid.as_deref().ok_or_else(|| {
                Error::Other(format!("real node {} has no system UUID", rec.name))
            })?;
            realnode::prepare(&node, &real, port, uuid)?;
            boots.push((rec.name.clone(), self.boot_real_node(&mut st, rec)?));
        }
        let nodes: Vec<RealNode> = recs.iter().map(|r| self.real_node_of(r)).collect();
        realnode::route_pods_between(&nodes)?;
        Ok(boots)
    }

    /// Starts a real node's BMC, then its boot script (it runs the kubelet); returns the
    /// node's boot ID.
    fn boot_real_node(&self, st: &mut State, rec: &NodeRecord) -> Result<String> {
        let watchdog = st.real_nodes.as_ref().and_then(|r| r.watchdog_timeout);
        self.spawn_bmc(st, &rec.name, watchdog)?;
        let (cmd, boot_id) = realnode::boot_command(&self.real_node_of(rec))?;
        self.spawn(st, &kubelet_proc(&rec.name), cmd)?;
        Ok(boot_id)
    }

    /// Waits until each real node is Ready and reports the boot ID it was booted with.
    pub(in crate::cluster) async fn wait_real_nodes_ready(
        &self,
        client: &kube::Client,
        boots: &[(String, String)],
        timeout: Duration,
    ) -> Result<()> {
        if boots.is_empty() {
            return Ok(());
        }
        let watched: Vec<String> = boots.iter().map(|(n, _)| kubelet_proc(n)).collect();
        let watched: Vec<&str> = watched.iter().map(String::as_str).collect();
        let nodes: Api<Node> = Api::all(client.clone());
        let nodes = &nodes;
        let names: Vec<&str> = boots.iter().map(|(n, _)| n.as_str()).collect();
        let what = format!("real nodes {} to be Ready after boot", names.join(", "));
        self.wait_until(&what, timeout, &watched, || async move {
            for (name, boot_id) in boots {
                let Some(node) = nodes.get_opt(name).await.ok().flatten() else {
                    return Ok(false);
                };
                let reported = node
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.boot_id.as_str());
                if !node_is_ready(&node) || reported != Some(boot_id.as_str()) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await
    }

    /// Imports an image tar (`docker save`; see `images`) into every real node's containerd, namespace
    /// `k8s.io` where the kubelet looks, as `kind load` does; returns the nodes. Images stay
    /// across reboots (containerd's root is the node's disk).
    pub fn load_image(&self, tar: &std::path::Path) -> Result<Vec<String>> {
        let tar = tar
            .canonicalize()
            .map_err(|e| Error::io(format!("read {}", tar.display()), e))?;
        let tar = tar.to_string_lossy();
        let st = self.reload();
        let nodes: Vec<RealNode> = st
            .nodes
            .iter()
            .filter(|r| r.real)
            .map(|r| self.real_node_of(r))
            .collect();
        if nodes.is_empty() {
            return Err(Error::Other(
                "the cluster has no real nodes (--real-nodes) to load an image into".into(),
            ));
        }
        // One import per node, all at once: a large image takes seconds to unpack on each.
        std::thread::scope(|scope| {
            let imports: Vec<_> = nodes
                .iter()
                .map(|node| {
                    let tar = &tar;
                    scope.spawn(move || {
                        let sock = node.containerd_socket();
                        let sock = sock.to_string_lossy();
                        realnode::net::run(
                            "ctr",
                            &["-a", &sock, "-n", "k8s.io", "images", "import", tar],
                        )?;
                        info!(node = node.name, image = %tar, "image loaded");
                        Ok::<(), Error>(())
                    })
                })
                .collect();
            imports
                .into_iter()
                .try_for_each(|import| import.join().expect("an image import panicked"))
        })?;
        Ok(nodes.into_iter().map(|n| n.name).collect())
    }

    /// The network namespace of real node `name` (under `/run/netns`): where its pods' addresses
    /// are reachable (`nsenter --net=/run/netns/<it>`).
    pub fn node_netns(&self, name: &str) -> Result<String> {
        Ok(self.real_node(name, "entered")?.netns())
    }

    /// Pids of every process of real node `name`: containerd, its shims, the containers and
    /// the kubelet (its cgroup tree).
    pub fn node_pids(&self, name: &str) -> Result<Vec<i32>> {
        Ok(self.real_node(name, "listed by pid")?.cgroup().pids())
    }

    /// The processes of pod `uid` on real node `name` (its containers', from its cgroup).
    pub fn pod_pids(&self, name: &str, uid: &str) -> Result<Vec<i32>> {
        Ok(self
            .real_node(name, "listed by pod")?
            .cgroup()
            .pod_pids(uid))
    }

    /// Pod `uid`'s processes on real node `name` freeze (`frozen`) or thaw: they stay, and
    /// a SIGKILL waits until they thaw.
    pub fn freeze_pod(&self, name: &str, uid: &str, frozen: bool) -> Result<()> {
        self.real_node(name, "frozen by pod")?
            .cgroup()
            .freeze_pod(uid, frozen)
    }

    /// Real node `name` hangs: every process of it is frozen (cgroup freezer). The kernel still
    /// answers on its address (a connect to the kubelet port is accepted).
    pub fn freeze_node(&self, name: &str) -> Result<()> {
        self.real_node(name, "frozen")?.cgroup().freeze()?;
        info!(node = name, "node frozen");
        Ok(())
    }

    /// Undoes [`Cluster::freeze_node`].
    pub fn thaw_node(&self, name: &str) -> Result<()> {
        self.real_node(name, "thawed")?.cgroup().thaw()?;
        info!(node = name, "node thawed");
        Ok(())
    }

    /// Cuts (`cut`) real node `name` off from everything, or lets it back: its address goes
    /// silent both ways (the host end of its link down), while its processes, its containers
    /// and their volumes run on, as on a machine whose network failed.
    pub fn isolate_node(&self, name: &str, cut: bool) -> Result<()> {
        let node = self.real_node(name, "isolated")?;
        realnode::net::set_link(&node.veth(), !cut)?;
        info!(node = name, cut, "node isolation changed");
        Ok(())
    }

    /// Cuts (`cut`) real node `from` off from real node `to`, or lets it through again: every
    /// packet `from` or its pods send to `to`'s address is dropped, and so are the replies to
    /// `to`'s connections. Every other path, `to`'s own included, stays.
    pub fn unreachable_from(&self, from: &str, to: &str, cut: bool) -> Result<()> {
        let from_node = self.real_node(from, "cut off")?;
        let to_node = self.real_node(to, "cut off")?;
        realnode::net::set_unreachable(&from_node.netns(), to_node.ip, &to_node.pod_cidr(), cut)?;
        info!(from, to, cut, "reachability between nodes changed");
        Ok(())
    }

    /// Cuts (`cut`) or restores real node `name`'s traffic to the API server; its containers
    /// keep running and its kubelet port still answers.
    pub fn partition_node(&self, name: &str, cut: bool) -> Result<()> {
        let node = self.real_node(name, "partitioned")?;
        let st = self.reload();
        let subnet = st
            .real_nodes
            .map(|r| r.subnet)
            .ok_or_else(|| Error::Other("the cluster has no real nodes".into()))?;
        realnode::net::set_partition(&node.netns(), subnet, st.ports.apiserver, cut)?;
        info!(node = name, cut, "node partition changed");
        Ok(())
    }

    pub(in crate::cluster) async fn reboot_real_node(&self, name: &str) -> Result<()> {
        let node = self.real_node(name, "started")?;
        let boot_id = {
            let mut st = self.lock_reloaded();
            if st
                .processes
                .get(&kubelet_proc(name))
                .is_some_and(process::is_alive)
            {
                return Err(Error::NodeRunning(name.to_string()));
            }
            realnode::kill(&node)?;
            let rec = st.node(name)?.clone();
            self.boot_real_node(&mut st, &rec)?
        };
        let client = self.client().await?;
        self.wait_real_nodes_ready(
            &client,
            &[(name.to_string(), boot_id)],
            Duration::from_secs(120),
        )
        .await?;
        info!(node = name, "real node rebooted");
        Ok(())
    }
}
