//! Whether the node's kernel is its own. Containers that pose as machines (kind, k3d,
//! minikube's docker driver) run every node on their host's kernel: there a reboot through
//! `/proc/sysrq-trigger` takes down every node and the machine that hosts them, and
//! `/dev/watchdog` is the host's, which a killed agent leaves armed to reset the host. So the
//! agent uses neither unless it knows the kernel is its node's own: it then runs without a
//! watchdog device (its node is not agent-protected, `podha.io/agent-watchdog` says why) and
//! refuses a fence that reboots the kernel; a fence of the node's own (`write:` to a BMC's
//! interface, a `command:`) and a stand-in for a watchdog that is no device (the sim's BMC) are
//! kept.
//!
//! The kubelet reports its kernel's boot ID in its Node's `status.nodeInfo.bootID`. The kernel
//! is the node's own when the node reports the boot ID of the kernel the agent runs on, and
//! other nodes report boot IDs and none reports the node's. A node that reports another boot ID
//! than the agent's kernel has (a file mounted over the kernel's, as podha's kind node image and
//! the sim's real nodes do, so that each start of a container is a boot of its own) poses as a
//! machine; another node that reports it shares the kernel; anything else (the Nodes cannot be
//! read, the node reports none, no other node does: a cluster of one, kind's default, cannot be
//! told from containers; the kernel's boot ID cannot be read) leaves it unknown, which counts as
//! not its own.
//!
//! The verdict is kept for the boot beside the hearing file, so that an agent restarted in the
//! same boot (perhaps with a watchdog its predecessor left armed) goes by it at once, without
//! waiting for the API server. While it is unknown (the first node of a cluster being set up,
//! the API server unreachable), the agent reads the Nodes again every [`RECHECK`]; once it is
//! known, the verdict is kept and the agent stops, so that the next agent starts by it.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tracing::{info, warn};

/// How long one read of every Node may take.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How often the agent reads the Nodes again while it runs.
pub const RECHECK: Duration = Duration::from_secs(30);

/// Why the agent does not take its node's kernel for its own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelDoubt {
    #[error(
        "node {me} shares its kernel with node {with} (both report boot ID {boot_id}: \
         containers posing as machines, as kind's): a reboot or a watchdog reset would take \
         down every node on it and the machine that hosts them"
    )]
    Shared {
        me: String,
        with: String,
        boot_id: String,
    },
    #[error(
        "node {me} reports boot ID {reported}, but the kernel the agent runs on has boot ID \
         {kernel}: the node's boots are not its kernel's (a container posing as a machine, as \
         kind's): a reboot or a watchdog reset would take down the machine that hosts it"
    )]
    Posed {
        me: String,
        reported: String,
        kernel: String,
    },
    #[error(
        "node {me} cannot tell whether its kernel is its own ({why}): on containers posing as \
         machines, as kind's, a reboot or a watchdog reset would take down the machine that \
         hosts them; the agent reads the Nodes again every 30s"
    )]
    Unknown { me: String, why: String },
}

/// The verdict: `Ok` when the kernel is the node's own.
pub type Kernel = Result<(), KernelDoubt>;

/// Where the kernel the agent runs on tells its boot ID (a container's own /proc shows the
/// kernel's, whatever is mounted over it in the node's).
pub const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The verdict for node `me` from every Node, the boot ID of the kernel the agent runs on and
/// the one the agent goes by (`--boot-id-file`; `None`: it cannot be read).
pub fn judge(me: &str, nodes: &[Node], kernel: Option<&str>, agent_boot: Option<&str>) -> Kernel {
    let unknown = |why: String| KernelDoubt::Unknown {
        me: me.to_string(),
        why,
    };
    let boot_id = |node: &Node| {
        node.status
            .as_ref()?
            .node_info
            .as_ref()
            .map(|info| info.boot_id.clone())
            .filter(|id| !id.is_empty())
    };
    let name = |node: &Node| node.metadata.name.clone().unwrap_or_default();
    let mine = nodes
        .iter()
        .find(|n| name(n) == me)
        .and_then(boot_id)
        .ok_or_else(|| unknown("its Node reports no boot ID".into()))?;
    let kernel = kernel.ok_or_else(|| unknown(format!("{KERNEL_BOOT_ID} cannot be read")))?;
    if kernel != mine {
        // The node poses as a machine when it reports the boot the agent goes by. Otherwise
        // the kubelet may not have reported this boot yet (a node that just rebooted): read
        // again, not kept.
        if agent_boot != Some(mine.as_str()) {
            return Err(unknown(format!(
                "its Node reports boot ID {mine}, which is neither its kernel's ({kernel}) nor \
                 the one the agent goes by ({})",
                agent_boot.unwrap_or("none")
            )));
        }
        return Err(KernelDoubt::Posed {
            me: me.to_string(),
            reported: mine,
            kernel: kernel.to_string(),
        });
    }
    let others: Vec<(String, String)> = nodes
        .iter()
        .filter(|n| name(n) != me)
        .filter_map(|n| Some((name(n), boot_id(n)?)))
        .collect();
    if let Some((with, _)) = others.iter().find(|(_, id)| *id == mine) {
        return Err(KernelDoubt::Shared {
            me: me.to_string(),
            with: with.clone(),
            boot_id: mine,
        });
    }
    if others.is_empty() {
        return Err(unknown("no other node reports a boot ID".into()));
    }
    Ok(())
}

/// The verdict kept for a boot: `own`, `shared <node> <boot ID>` or `posed <reported boot ID>
/// <kernel's boot ID>`, after the boot's ID on the first line. An unknown verdict is not kept:
/// the next agent asks again.
pub struct SavedVerdict {
    path: PathBuf,
    boot: Option<String>,
}

impl SavedVerdict {
    pub fn new(path: PathBuf, boot: Option<&str>) -> Self {
        Self {
            path,
            boot: boot.map(str::to_string),
        }
    }

    /// The verdict kept for this boot, if any (none for an unknown boot).
    pub fn load(&self, me: &str) -> Option<Kernel> {
        let boot = self.boot.as_deref()?;
        let text = std::fs::read_to_string(&self.path).ok()?;
        let mut lines = text.lines();
        if lines.next()? != boot {
            return None;
        }
        let verdict: Vec<&str> = lines.next()?.split(' ').collect();
        match verdict.as_slice() {
            ["own"] => Some(Ok(())),
            ["shared", with, boot_id] => Some(Err(KernelDoubt::Shared {
                me: me.to_string(),
                with: (*with).to_string(),
                boot_id: (*boot_id).to_string(),
            })),
            ["posed", reported, kernel] => Some(Err(KernelDoubt::Posed {
                me: me.to_string(),
                reported: (*reported).to_string(),
                kernel: (*kernel).to_string(),
            })),
            _ => None,
        }
    }

    fn save(&self, kernel: &Kernel) {
        let (Some(boot), Some(line)) = (self.boot.as_deref(), line_of(kernel)) else {
            return;
        };
        let written = std::fs::write(&self.path, format!("{boot}\n{line}\n"));
        if let Err(e) = written {
            warn!(file = %self.path.display(), error = %e, "cannot keep the kernel's verdict for the next agent of this boot");
        }
    }
}

fn line_of(kernel: &Kernel) -> Option<String> {
    match kernel {
        Ok(()) => Some("own".into()),
        Err(KernelDoubt::Shared { with, boot_id, .. }) => Some(format!("shared {with} {boot_id}")),
        Err(KernelDoubt::Posed {
            reported, kernel, ..
        }) => Some(format!("posed {reported} {kernel}")),
        Err(KernelDoubt::Unknown { .. }) => None,
    }
}

/// The verdict the agent starts by: the one kept for this boot, else one read of every Node.
pub async fn at_start(nodes: &Api<Node>, me: &str, saved: &SavedVerdict) -> Kernel {
    if let Some(kernel) = saved.load(me) {
        info!(
            node = me,
            own = kernel.is_ok(),
            "the kernel's verdict kept for this boot"
        );
        return kernel;
    }
    let kernel = read(nodes, me, saved.boot.as_deref()).await;
    saved.save(&kernel);
    say(me, &kernel);
    kernel
}

/// While the verdict is unknown, reads the Nodes again every [`RECHECK`]; returns the first
/// known verdict (kept for the next agent). A read that fails, or tells nothing, changes
/// nothing. A known verdict is not read again: boot IDs do not change while a node runs, and
/// every agent reading every Node would cost the API server as much as the peer lists do.
pub async fn until_changed(
    nodes: &Api<Node>,
    me: &str,
    start: &Kernel,
    saved: &SavedVerdict,
) -> Kernel {
    if !matches!(start, Err(KernelDoubt::Unknown { .. })) {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(RECHECK).await;
        let kernel = read(nodes, me, saved.boot.as_deref()).await;
        let known = !matches!(kernel, Err(KernelDoubt::Unknown { .. }));
        if known && line_of(&kernel) != line_of(start) {
            saved.save(&kernel);
            say(me, &kernel);
            return kernel;
        }
    }
}

fn say(me: &str, kernel: &Kernel) {
    match kernel {
        Ok(()) => info!(
            node = me,
            "the node reports its kernel's boot ID and other nodes report others: this node's kernel is its own"
        ),
        Err(doubt) => warn!(node = me, "{doubt}: no kernel reboot, no watchdog device"),
    }
}

/// `agent_boot`: the boot the agent goes by.
async fn read(nodes: &Api<Node>, me: &str, agent_boot: Option<&str>) -> Kernel {
    match tokio::time::timeout(READ_TIMEOUT, list(nodes)).await {
        Ok(Ok(listed)) => {
            let kernel = super::boot::boot_id(std::path::Path::new(KERNEL_BOOT_ID));
            judge(me, &listed, kernel.as_deref(), agent_boot)
        }
        Ok(Err(e)) => Err(KernelDoubt::Unknown {
            me: me.to_string(),
            why: format!("the Nodes cannot be read: {e}"),
        }),
        Err(_) => Err(KernelDoubt::Unknown {
            me: me.to_string(),
            why: format!("the Nodes were not read within {READ_TIMEOUT:?}"),
        }),
    }
}

async fn list(nodes: &Api<Node>) -> Result<Vec<Node>, kube::Error> {
    let mut all = Vec::new();
    super::peer_list::each_page(nodes, |page| all.extend(page)).await?;
    Ok(all)
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
    fn a_kernel_is_the_nodes_own_only_when_others_report_other_boot_ids() {
        let kind = [node("a", "b-1"), node("b", "b-2"), node("c", "b-1")];
        let Err(shared @ KernelDoubt::Shared { .. }) = judge("a", &kind, Some("b-1"), Some("b-1"))
        else {
            panic!("a and c share a kernel");
        };
        assert!(
            shared
                .to_string()
                .contains("node a shares its kernel with node c")
        );
        assert_eq!(judge("b", &kind, Some("b-2"), Some("b-2")), Ok(()));
        // What tells nothing is no proof of an own kernel: a cluster of one (kind's default),
        // boot IDs nobody reports, a node not registered yet, a kernel's boot ID not read.
        for (me, nodes, kernel) in [
            ("a", vec![node("a", "b-1")], Some("b-1")),
            ("a", vec![node("a", ""), node("b", "")], Some("b-1")),
            ("a", vec![node("a", "b-1"), node("b", "")], Some("b-1")),
            ("z", kind.to_vec(), Some("b-1")),
            ("b", kind.to_vec(), None),
        ] {
            assert!(
                matches!(
                    judge(me, &nodes, kernel, kernel),
                    Err(KernelDoubt::Unknown { .. })
                ),
                "{me} of {:?} on {kernel:?}",
                nodes
                    .iter()
                    .map(|n| n.metadata.name.clone())
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_node_whose_boot_is_not_its_kernels_poses_as_a_machine() {
        // Each start of a container given a boot ID of its own (podha's kind node image, the
        // sim's real nodes): every node reports another, all on the one kernel the agents see.
        let posed = [node("a", "s-1"), node("b", "s-2"), node("c", "s-3")];
        let Err(doubt @ KernelDoubt::Posed { .. }) = judge("b", &posed, Some("host"), Some("s-2"))
        else {
            panic!("b reports a boot that is not its kernel's");
        };
        assert_eq!(
            doubt,
            KernelDoubt::Posed {
                me: "b".into(),
                reported: "s-2".into(),
                kernel: "host".into(),
            }
        );
        assert!(doubt.to_string().contains("posing as a machine"));
        // Posing is told before sharing: its reason names the kernel's boot ID.
        let both = [node("a", "s-1"), node("c", "s-1")];
        assert!(matches!(
            judge("a", &both, Some("host"), Some("s-1")),
            Err(KernelDoubt::Posed { .. })
        ));
        // A Node that reports neither the kernel's boot nor the agent's: a kubelet that has not
        // reported a new boot yet (a machine just rebooted), or an agent given another boot
        // ID file (the chart's default on such a node). Unknown: read again, never kept.
        for agent_boot in [Some("host"), Some("other"), None] {
            assert!(
                matches!(
                    judge("b", &posed, Some("host"), agent_boot),
                    Err(KernelDoubt::Unknown { .. })
                ),
                "{agent_boot:?}"
            );
        }
    }

    #[test]
    fn a_known_verdict_is_kept_for_its_boot_only() {
        let dir = std::env::temp_dir().join(format!("podha-kernel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard.kernel");
        let saved = SavedVerdict::new(path.clone(), Some("boot-1"));
        let shared = Err(KernelDoubt::Shared {
            me: "a".into(),
            with: "c".into(),
            boot_id: "b-1".into(),
        });
        let posed = Err(KernelDoubt::Posed {
            me: "a".into(),
            reported: "s-1".into(),
            kernel: "host".into(),
        });
        for kernel in [Ok(()), shared, posed] {
            saved.save(&kernel);
            assert_eq!(saved.load("a"), Some(kernel));
        }
        // Another boot's, an unknown boot's, and an unknown verdict count as none.
        assert_eq!(
            SavedVerdict::new(path.clone(), Some("boot-2")).load("a"),
            None
        );
        assert_eq!(SavedVerdict::new(path.clone(), None).load("a"), None);
        let _ = std::fs::remove_file(&path);
        saved.save(&Err(KernelDoubt::Unknown {
            me: "a".into(),
            why: "test".into(),
        }));
        assert_eq!(saved.load("a"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
