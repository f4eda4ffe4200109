//! Nodes that share one kernel: containers that pose as machines (kind, k3d, minikube's docker
//! driver) run every node on their host's kernel. There, a reboot through
//! `/proc/sysrq-trigger` takes down every node and the machine that hosts them, and
//! `/dev/watchdog` is the host's: a watchdog the agent stops petting resets the host. So an
//! agent whose node shares its kernel with another node uses neither: it runs without a
//! watchdog (its node is not agent-protected, `podha.io/agent-watchdog` says why) and refuses a
//! fence that reboots the kernel; a fence of the node's own (`write:` to a BMC's interface, a
//! `command:`) and a declared stand-in for a watchdog (the sim's BMC) are kept.
//!
//! The kubelet reports its kernel's boot ID in its Node's `status.nodeInfo.bootID`: two Nodes
//! with the same one run on one kernel. The agent reads every Node once when it starts, before
//! it opens the watchdog. Nodes that register after it started are not seen until the agent
//! starts again; a cluster of containers registers its nodes before the chart's agents run.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tracing::{info, warn};

/// How long the read of every Node may take at start: an API server that does not answer
/// leaves the question open (the agent starts as configured), as it did before this check.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How many Nodes one page holds.
const PAGE: u32 = 500;

/// Another node on this node's kernel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {me} shares its kernel with node {with} (both report boot ID {boot_id}: containers \
     posing as machines, as kind's): a reboot or a watchdog reset would take down every node \
     on it and the machine that hosts them"
)]
pub struct SharedKernel {
    pub me: String,
    pub with: String,
    pub boot_id: String,
}

/// The first other node of `nodes` whose kubelet reports the boot ID `me`'s reports.
pub fn sharing(me: &str, nodes: &[Node]) -> Option<SharedKernel> {
    let boot_id = |node: &Node| {
        node.status
            .as_ref()?
            .node_info
            .as_ref()
            .map(|info| info.boot_id.clone())
            .filter(|id| !id.is_empty())
    };
    let name = |node: &Node| node.metadata.name.clone().unwrap_or_default();
    let mine = nodes.iter().find(|n| name(n) == me).and_then(boot_id)?;
    let other = nodes
        .iter()
        .find(|n| name(n) != me && boot_id(n).as_deref() == Some(mine.as_str()))?;
    Some(SharedKernel {
        me: me.to_string(),
        with: name(other),
        boot_id: mine,
    })
}

/// Whether node `me` shares its kernel with another node, as far as the API server tells
/// within [`READ_TIMEOUT`].
pub async fn check(nodes: &Api<Node>, me: &str) -> Option<SharedKernel> {
    let listed = match tokio::time::timeout(READ_TIMEOUT, list(nodes)).await {
        Ok(Ok(listed)) => listed,
        Ok(Err(e)) => {
            warn!(node = me, error = %e, "cannot read the Nodes to tell whether this node shares its kernel with another; starting as configured");
            return None;
        }
        Err(_) => {
            warn!(node = me, timeout = ?READ_TIMEOUT, "the Nodes were not read in time to tell whether this node shares its kernel with another; starting as configured");
            return None;
        }
    };
    let shared = sharing(me, &listed);
    match &shared {
        Some(shared) => {
            warn!(node = me, with = %shared.with, "{shared}: no kernel reboot, no watchdog device")
        }
        None => info!(
            node = me,
            nodes = listed.len(),
            "no other node reports this node's boot ID"
        ),
    }
    shared
}

async fn list(nodes: &Api<Node>) -> Result<Vec<Node>, kube::Error> {
    let mut params = ListParams::default().limit(PAGE);
    let mut all = Vec::new();
    loop {
        let page = nodes.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};

    fn node(name: &str, boot_id: &str) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo {
                    boot_id: boot_id.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn nodes_reporting_one_boot_id_share_a_kernel_others_and_unknown_ones_do_not() {
        let kind = [node("a", "b-1"), node("b", "b-2"), node("c", "b-1")];
        let shared = sharing("a", &kind).expect("a and c share");
        assert_eq!(
            (shared.with.as_str(), shared.boot_id.as_str()),
            ("c", "b-1")
        );
        assert!(
            shared
                .to_string()
                .contains("node a shares its kernel with node c")
        );
        assert_eq!(sharing("b", &kind), None);
        // An empty boot ID (a kubelet that reports none) tells nothing.
        let unknown = [node("a", ""), node("b", "")];
        assert_eq!(sharing("a", &unknown), None);
        // A node the list does not hold (not registered yet) tells nothing either.
        assert_eq!(sharing("z", &kind), None);
    }
}
