//! The `PodHAPolicy` custom resource: which nodes to watch, how to judge them dead, and what
//! podha may do to the stateful pods they leave behind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;
use super::fencing::Fencing;
use super::owner_kind::{OWNERS_MAX_ITEMS, OWNERS_RULE, OWNERS_RULE_MESSAGE, OwnerKind};
use super::status::PodHAPolicyStatus;

/// A PodHAPolicy tells podha which nodes to watch, how to decide that one is dead, and which
/// stateful pods it may move off a dead node (by force-deleting them or by tainting the node
/// `node.kubernetes.io/out-of-service`) so that they run again elsewhere with their volumes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Each printcolumn(...) repeats `type_ = ...`; clippy reads them as one attribute's duplicates.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "podha.io",
    version = "v1alpha1",
    kind = "PodHAPolicy",
    plural = "podhapolicies",
    shortname = "pha",
    category = "podha",
    status = "PodHAPolicyStatus",
    doc = "A PodHAPolicy tells podha which nodes to watch, how to decide that one is dead, and \
           which stateful pods it may move off a dead node: by force-deleting them, or by \
           tainting the node node.kubernetes.io/out-of-service, so that they run again elsewhere \
           with their volumes. Its status reports the watched and failed nodes, how many of its \
           pods it would fail over now and why not the others, the recent failovers, and the \
           Ready and Degraded conditions.",
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused"),
    printcolumn(
        name = "Dry-Run",
        type_ = "boolean",
        json_path = ".spec.dryRun",
        priority = 1
    ),
    printcolumn(
        name = "Watched",
        type_ = "integer",
        json_path = ".status.watchedNodes"
    ),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failedNodes"),
    printcolumn(
        name = "Protected",
        type_ = "integer",
        json_path = ".status.protectedPods"
    ),
    printcolumn(
        name = "Unprotected",
        type_ = "integer",
        json_path = ".status.unprotectedPods"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Degraded\")].status"
    ),
    printcolumn(
        name = "Last-Failover",
        type_ = "date",
        json_path = ".status.lastFailoverTime"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
// Client-side CEL evaluation (`PodHAPolicy::validate_cel`) is only needed by the unit tests.
#[cfg_attr(test, kube(cel))]
#[x_kube(
    validation = Rule::new(KUBELET_HEARTBEAT_OR_CONFIRMED_PROOF).message("KubeletTCP and AgentHeartbeat as the only signals need action OutOfServiceTaint and a confirmed fencing proof (AgentAcknowledged, BMC with matchSystemUUID, External or CloudShutdownTaint; AnyOf of only those, AllOf with one of them): a probe that gets no answer does not tell a dead node from a network problem, so only a fence that is reported done, never one inferred from silence, may follow it; otherwise combine them with Lease or NodeReady"),
)]
#[serde(rename_all = "camelCase")]
pub struct PodHAPolicySpec {
    /// Nodes this policy watches. Empty selects every node.
    #[serde(default)]
    pub node_selector: LabelSelector,

    /// Namespaces whose pods this policy may move. Empty selects every namespace.
    #[serde(default)]
    pub namespace_selector: LabelSelector,

    /// Pods this policy may move. Empty selects every pod (subject to owners and volumes).
    #[serde(default)]
    pub pod_selector: LabelSelector,

    /// Controller kinds whose pods may be deleted on a dead node: `StatefulSet`, `Deployment`,
    /// `ReplicaSet` (the apps group), or any other controller as `Kind.group`, e.g.
    /// `Cluster.postgresql.cnpg.io`. Only the pod's controller owner reference (`controller:
    /// true`) counts. A pod controlled by a ReplicaSet counts as the ReplicaSet's own controller
    /// (`Deployment`, `Rollout.argoproj.io`); `ReplicaSet` means ReplicaSets no controller owns.
    /// Listing a kind says its controller recreates a deleted pod, which podha cannot check.
    /// A pod without a controller owner is never deleted. The pod annotation
    /// `podha.io/failover: "false"` opts a pod out; `"true"` opts in a pod of any controller
    /// kind.
    #[serde(default = "default_owners")]
    #[schemars(extend("x-kubernetes-list-type" = "set", "maxItems" = OWNERS_MAX_ITEMS))]
    #[x_kube(validation = Rule::new(OWNERS_RULE).message(OWNERS_RULE_MESSAGE))]
    pub owners: Vec<OwnerKind>,

    /// Which volumes make a pod worth moving. A pod qualifies when it mounts at least one
    /// PersistentVolumeClaim and every claim it mounts is bound to a CSI volume of a listed
    /// driver with a listed access mode.
    #[serde(default)]
    pub volumes: VolumeRules,

    /// How node death is detected.
    #[serde(default)]
    pub detection: Detection,

    /// What podha does when a watched node is judged dead. `OutOfServiceTaint` (the default)
    /// taints the node `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, so the
    /// attach/detach controller detaches its volumes at once, and force-deletes the eligible pods.
    /// The taint acts on the whole node: Kubernetes then deletes every pod there that does not
    /// tolerate it. So podha refuses it while the node carries a pod it must not move (no
    /// controller owner, `podha.io/failover: "false"`, a volume no policy covers, a policy that
    /// holds, rehearses or chose `DeletePods`): it fences the node instead, deletes only the
    /// eligible pods and reports the refusal (event `OutOfServiceTaintRefused`).
    /// `DeletePods` fences the node (`podha.io/fenced=nodeDead:NoSchedule`, so the scheduler
    /// does not put replacements back on it before Kubernetes notices the node is gone) and
    /// force-deletes the eligible pods; their volumes detach only after the attach/detach
    /// controller's own 6-minute wait. That wait is no fence: the controller force-detaches
    /// from a node that may still be running, so `DeletePods` waits for the same
    /// `fencing.proof` as the taint. Choose `DeletePods` when you want the volume to move only
    /// after those 6 minutes (nodes that often come back by themselves). podha removes
    /// only taints it added itself (marked by the annotation `podha.io/out-of-service-taint`),
    /// once the node is healthy again and no volume of a pod that moved away is still attached
    /// to it.
    #[serde(default)]
    pub action: Action,

    /// What must prove a dead node fenced (unable to write any more) before podha moves
    /// anything off it, under either action: the out-of-service taint, podha's scheduling
    /// fence and the pods' deletion all wait for it. Until the proof is on the node podha
    /// holds it: nothing is tainted or deleted there, and a `FencingPending` event says why.
    #[serde(default)]
    pub fencing: Fencing,

    /// Guards against acting on bad information.
    #[serde(default)]
    pub safety: Safety,

    /// How long podha waits for a dead node's volumes to detach before it reports the detach as
    /// stuck (a Warning event, a metric and the Degraded condition). Kubernetes force-detaches
    /// after 6 minutes without the out-of-service taint.
    #[serde(default = "default_detach_timeout")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s')").message("detachTimeout must be at least 1s"))]
    pub detach_timeout: HumanDuration,

    /// Decide and report (events, metrics, status) but delete and taint nothing.
    #[serde(default)]
    pub dry_run: bool,

    /// Pause for maintenance: podha keeps watching and judging the policy's nodes (status,
    /// metrics) but takes no new action on a dead one and reports no would-be action (one
    /// `ActionsPaused` event per dead node says why). A failover already acting when the pause
    /// starts finishes what it started, and its taint stays until the node is back. One node
    /// is paused with the Node annotation `podha.io/paused: "true"`; cordoning pauses nothing
    /// (a cordoned node's pods still need protection).
    #[serde(default)]
    pub paused: bool,
}

fn default_owners() -> Vec<OwnerKind> {
    vec![OwnerKind::STATEFUL_SET, OwnerKind::DEPLOYMENT]
}

/// `detachTimeout` when the spec does not set it (and for an incident whose policy is gone).
pub fn default_detach_timeout() -> HumanDuration {
    HumanDuration::from_secs(390)
}

/// Volume rules: which CSI drivers and access modes qualify a pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRules {
    /// CSI driver names (as in a PersistentVolume's `spec.csi.driver`). Empty accepts any CSI
    /// driver.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub drivers: Vec<String>,

    /// Access modes that qualify. A ReadWriteMany volume does not block a replacement, so it
    /// is not listed by default.
    #[serde(default = "default_access_modes")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("volumes.accessModes must list at least one access mode"))]
    pub access_modes: Vec<AccessMode>,
}

impl Default for VolumeRules {
    fn default() -> Self {
        Self {
            drivers: Vec::new(),
            access_modes: default_access_modes(),
        }
    }
}

fn default_access_modes() -> Vec<AccessMode> {
    vec![AccessMode::ReadWriteOnce, AccessMode::ReadWriteOncePod]
}

/// A PersistentVolume access mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadWriteOncePod,
    ReadWriteMany,
    ReadOnlyMany,
}

impl AccessMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ReadWriteOnce => "ReadWriteOnce",
            Self::ReadWriteOncePod => "ReadWriteOncePod",
            Self::ReadWriteMany => "ReadWriteMany",
            Self::ReadOnlyMany => "ReadOnlyMany",
        }
    }
}

/// The rule that judging a node dead without its kubelet's heartbeat (signals without `Lease`
/// and `NodeReady`) needs the out-of-service taint behind a confirmed proof
/// ([`Fencing::is_confirmed`], which this mirrors). Defaults are applied before it runs; the `has` checks keep
/// it sound on an object read without them.
///
/// The BMC's `Off` is confirmed only of the node's own machine: such a policy must match the
/// system's UUID (`fencing.bmc.matchSystemUUID`), or a Secret holding another machine's
/// address would have podha taint a node that runs on.
const KUBELET_HEARTBEAT_OR_CONFIRMED_PROOF: &str = concat!(
    "!has(self.detection) || !has(self.detection.signals) || self.detection.signals.size() == 0 || self.detection.signals.exists(s, s == 'Lease' || s == 'NodeReady') || ",
    "((!has(self.action) || self.action == 'OutOfServiceTaint') && has(self.fencing) && has(self.fencing.proof) && ",
    "[!has(self.fencing.bmc) || !has(self.fencing.bmc.matchSystemUUID) || self.fencing.bmc.matchSystemUUID].all(uuidBound, ",
    "(self.fencing.proof in ['AgentAcknowledged', 'External', 'CloudShutdownTaint'] || (self.fencing.proof == 'BMC' && uuidBound)) || ",
    "(self.fencing.proof == 'AnyOf' && has(self.fencing.anyOf) && self.fencing.anyOf.size() > 0 && self.fencing.anyOf.all(p, p in ['AgentAcknowledged', 'External', 'CloudShutdownTaint'] || (p == 'BMC' && uuidBound))) || ",
    "(self.fencing.proof == 'AllOf' && has(self.fencing.allOf) && self.fencing.allOf.exists(p, p in ['AgentAcknowledged', 'External', 'CloudShutdownTaint'] || (p == 'BMC' && uuidBound)))))"
);

/// How a node is judged dead. Every `interval` podha evaluates each enabled signal; the probe
/// fails only when all of them say the node is dead. After `failureThreshold` consecutive
/// failed probes the node is Failed; one passing probe makes it Healthy again. A gap in
/// podha's own view (restarted watch, unreachable API server, leadership just gained) is never
/// taken as evidence of death.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("duration(self.tcpTimeout) < duration(self.interval)").message("detection.tcpTimeout must be shorter than detection.interval"),
)]
pub struct Detection {
    /// Time between two probes of a node. A probe also runs as soon as the evidence turns (the
    /// lease grace runs out, Ready changes); failed probes that count towards
    /// `failureThreshold` are always this far apart.
    #[serde(default = "default_interval")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s')").message("detection.interval must be at least 1s"))]
    pub interval: HumanDuration,

    /// Consecutive failed probes after which a node is Failed.
    #[serde(default = "default_failure_threshold")]
    #[x_kube(validation = Rule::new("self >= 1").message("detection.failureThreshold must be at least 1"))]
    pub failure_threshold: i32,

    /// Signals that must all say "dead" for a probe to fail; one that shows life passes it.
    /// `Lease`: no renewal of the node's Lease in `kube-node-lease` seen for
    /// `leaseGracePeriod` (the kubelet's heartbeat). `NodeReady`: the Ready condition is
    /// Unknown, which the node lifecycle controller writes when that same Lease goes stale, so
    /// it is a second observer of one heartbeat, not a second witness of the machine; False is
    /// written by a running kubelet and counts as alive; no condition counts as neither.
    /// `KubeletTCP`: a TCP connect to the node's InternalIP and kubelet port gets no answer
    /// within `tcpTimeout` (a path to the machine independent of the API server); a refused
    /// connect is the host's kernel answering, so the machine runs and it counts as alive.
    /// `AgentHeartbeat`: the node's podha agent does not answer the leader's heartbeat
    /// (asked every second, a second to answer whatever `tcpTimeout` says: the agent fences
    /// when unheard, so no policy shortens it); like KubeletTCP a refusal counts as alive.
    /// A node without an agent gives it no evidence either way, so a policy that lists it never
    /// judges such a node dead (under the default proof, the agent's, the policy says so:
    /// `Degraded`, reason `AgentsMissing`); without agents, list `[Lease]` or
    /// `[Lease, NodeReady]`.
    /// Which faults each sees: a machine that is off or crashed fails all four; a frozen
    /// machine fails `Lease`, `NodeReady` and `AgentHeartbeat`, while its kernel still accepts
    /// the `KubeletTCP` connect (alive); a kubelet that died on a running machine fails `Lease`
    /// and `NodeReady` only; a network fault between podha and the node alone fails
    /// `KubeletTCP` and `AgentHeartbeat` while the kubelet still renews its Lease. Without
    /// `Lease` or `NodeReady` (faster: no wait for the kubelet's 10 s renewal) that last fault
    /// is judged a death, so such signals need action `OutOfServiceTaint` and a confirmed
    /// `fencing.proof`: the healthy node is fenced (a reboot), nothing it writes is lost.
    /// The default, `[Lease, AgentHeartbeat]`, needs two independent witnesses: the kubelet's
    /// heartbeat through the API server and the agent's answer to podha, so no fault of one
    /// path judges a running node dead. Adding `NodeReady` waits also for the controller
    /// manager's NotReady (50 s): slower, a third witness.
    #[serde(default = "default_signals")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(validation = Rule::new("self.size() > 0").message("detection.signals must name at least one signal"))]
    pub signals: Vec<Signal>,

    /// How long a node's Lease may go without a renewal seen by podha before the Lease signal
    /// says dead. Measured on podha's own clock, never against the lease's renewTime. The
    /// kubelet renews every 10s with the default 40s lease duration.
    #[serde(default = "default_lease_grace_period")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s')").message("detection.leaseGracePeriod must be at least 1s"))]
    pub lease_grace_period: HumanDuration,

    /// Time allowed for the KubeletTCP connect.
    #[serde(default = "default_tcp_timeout")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10ms')").message("detection.tcpTimeout must be at least 10ms"))]
    pub tcp_timeout: HumanDuration,
}

impl Detection {
    /// Whether the judgement waits for the kubelet's own heartbeat (`Lease` or `NodeReady`,
    /// both fed by the node's Lease), which a fault between podha and the node alone does not
    /// stop.
    pub fn watches_kubelet_heartbeat(&self) -> bool {
        self.signals
            .iter()
            .any(|s| matches!(s, Signal::Lease | Signal::NodeReady))
    }
}

impl Default for Detection {
    fn default() -> Self {
        Self {
            interval: default_interval(),
            failure_threshold: default_failure_threshold(),
            signals: default_signals(),
            lease_grace_period: default_lease_grace_period(),
            tcp_timeout: default_tcp_timeout(),
        }
    }
}

fn default_interval() -> HumanDuration {
    HumanDuration::from_secs(2)
}
fn default_failure_threshold() -> i32 {
    3
}
fn default_signals() -> Vec<Signal> {
    vec![Signal::Lease, Signal::AgentHeartbeat]
}
fn default_lease_grace_period() -> HumanDuration {
    HumanDuration::from_secs(15)
}
fn default_tcp_timeout() -> HumanDuration {
    HumanDuration::from_secs(1)
}

/// A node health signal.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum Signal {
    Lease,
    NodeReady,
    KubeletTCP,
    /// podha agent's heartbeat: the leader asks every node's agent each second (see
    /// docs/agent.md); an agent that does not answer says dead, one that answers or whose host
    /// refuses the connect says alive.
    AgentHeartbeat,
}

impl Signal {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "Lease",
            Self::NodeReady => "NodeReady",
            Self::KubeletTCP => "KubeletTCP",
            Self::AgentHeartbeat => "AgentHeartbeat",
        }
    }
}

/// What to do on a dead node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum Action {
    DeletePods,
    #[default]
    OutOfServiceTaint,
}

impl Action {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DeletePods => "DeletePods",
            Self::OutOfServiceTaint => "OutOfServiceTaint",
        }
    }
}

/// Guards that make podha hold instead of act.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Safety {
    /// When more watched nodes are unhealthy than this (a count, or a percentage of the watched
    /// nodes such as `30%`, never below one node), podha holds every action of this policy: so
    /// many deaths at once more likely mean a network or control-plane problem than dead
    /// machines. Unhealthy counts nodes judged Failed, nodes on their way there (a failed probe
    /// already), and nodes that failed within `unhealthyWindow`. Before its first action on a
    /// newly failed node podha also waits until the other watched nodes have shown life since
    /// that node went silent (a Lease renewal, or with KubeletTCP a probe their host answered:
    /// about one probe interval with KubeletTCP, at most one renew interval, about 10s, on the
    /// Lease alone): until then a partition cannot be told from one dead node, and nodes not
    /// yet heard from count too.
    #[serde(default = "default_max_unhealthy")]
    #[x_kube(validation = Rule::new("string(self).matches('^([1-9][0-9]*|(100|[1-9][0-9]?)%)$')").message("safety.maxUnhealthy must be a count of at least 1 or a percentage from 1% to 100%"))]
    pub max_unhealthy: IntOrString,

    /// Delete a pod only when at least one healthy, schedulable node could run it (node
    /// selector, required node affinity, taints and the volumes' topology all allow it).
    #[serde(default = "default_require_target")]
    pub require_target: bool,

    /// How long a node that failed keeps counting towards `maxUnhealthy` after it is back, so
    /// that nodes failing one after another cannot each slip in under the limit: at most
    /// `maxUnhealthy` nodes fail over within any such window.
    #[serde(default = "default_unhealthy_window")]
    #[x_kube(validation = Rule::new("duration(self) <= duration('24h')").message("safety.unhealthyWindow must be at most 24h"))]
    pub unhealthy_window: HumanDuration,
}

impl Default for Safety {
    fn default() -> Self {
        Self {
            max_unhealthy: default_max_unhealthy(),
            require_target: default_require_target(),
            unhealthy_window: default_unhealthy_window(),
        }
    }
}

fn default_unhealthy_window() -> HumanDuration {
    HumanDuration::from_secs(600)
}

fn default_max_unhealthy() -> IntOrString {
    IntOrString::String("30%".to_string())
}
fn default_require_target() -> bool {
    true
}

impl PodHAPolicySpec {
    /// The largest number of unhealthy nodes, out of `watched`, at which this policy still acts.
    /// Percentages round down (like the node lifecycle controller's thresholds), but never
    /// below one node: a policy always tolerates a single dead node.
    pub fn max_unhealthy_nodes(&self, watched: usize) -> usize {
        match &self.safety.max_unhealthy {
            IntOrString::Int(n) => usize::try_from(*n).unwrap_or(0).max(1),
            IntOrString::String(s) => match s.strip_suffix('%') {
                Some(percent) => {
                    let percent: usize = percent.parse().unwrap_or(0).min(100);
                    (watched * percent / 100).max(1)
                }
                // "3" written as a string: the validation rule accepts it as a count.
                None => s.parse::<usize>().unwrap_or(0).max(1),
            },
        }
    }
}
