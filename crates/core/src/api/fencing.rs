//! `spec.fencing`: what must prove that a dead node can no longer write before podha puts the
//! out-of-service taint on it (the proof itself is judged in `planner::proof`).

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::HumanDuration;

/// The taint the cloud node lifecycle controller puts on a node whose instance the cloud
/// provider reports shut down.
pub const CLOUD_SHUTDOWN_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// The label binding a BMC's Secret to its node (see [`BmcFencing`]).
pub const BMC_NODE_LABEL: &str = "podha.io/bmc-node";

/// What proves a dead node fenced before anything moves off it. The out-of-service taint tells
/// Kubernetes the node is shut down: its volumes are detached at once and attached elsewhere.
/// A pod podha force-deletes (action `DeletePods`) has its volume force-detached by the
/// attach/detach controller 6 minutes later all the same. A node that is only frozen or cut
/// off from the control plane still runs its containers, and unless the storage fences it on
/// detach they write on beside the replacement. With a proof, podha holds the node (event
/// `FencingPending`, nothing deleted, nothing tainted) until the proof is there, under either
/// action.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(ASKS_BMC_HAS_BMC).message("fencing.proof BMC needs fencing.bmc: where podha finds each node's BMC"),
    validation = Rule::new("(self.proof == 'AnyOf') == has(self.anyOf)").message("fencing.proof AnyOf goes with fencing.anyOf, and fencing.anyOf with proof AnyOf"),
    validation = Rule::new("(self.proof == 'AllOf') == has(self.allOf)").message("fencing.proof AllOf goes with fencing.allOf, and fencing.allOf with proof AllOf"),
)]
pub struct Fencing {
    /// `Agent` (the default): the node's podha agent (docs/agent.md) fenced it: it
    /// acknowledged the fence podha asked for on the Node, or it has not answered podha's
    /// heartbeat for as long as it advertises on the Node (`podha.io/agent-fenced-within`, its
    /// isolation timeout) plus `agentMargin`, by which time its watchdog has reset a node cut
    /// off from podha or frozen. Only an agent that pets a watchdog advertises that: a frozen
    /// node without one never fences itself.
    /// The silence counts only for an agent podha heard right before it (within 3 s) in its
    /// current leadership term (or, after a leader change, whose agent Lease says podha heard
    /// it in the node's boot: counted from the new term's first unanswered probe), and only
    /// while podha hears a strict majority of all the agents
    /// (an agent that shows half of its peers unheard stays up); otherwise podha holds
    /// the node (event `AgentSilenceUnproven`) until the agent acknowledges the request. A
    /// node without an agent, or whose agent has no usable watchdog
    /// (`podha.io/agent-watchdog: none: ...`), has no silence proof: the policy shows it
    /// (condition `Degraded`, reason `AgentsMissing`).
    /// `AgentAcknowledged`: only the first half of `Agent`: the node's agent acknowledged the
    /// fence podha asked for (it fences, its `--fence-confirm` check passes, then it says so).
    /// Its silence proves nothing, so a node that dies with its agent (power loss) is held
    /// until someone fences it: choose it where the agent's fence leaves the agent running to
    /// say so (the kubelet and the workloads stopped, the storage cut), or where its silence
    /// must not count. The kubelet must stop with the fence: a Lease it renews after the
    /// acknowledgement contradicts it (`FenceContradicted`, the node held).
    /// `None`: no proof; the node is taken for shut down once judged dead, and the taint
    /// (or the deletes) follow the judgement alone (condition `Ready`, reason
    /// `WatchingWithoutProof`). Choose it only where a node that stops heartbeating is off
    /// (power loss, kernel panic), or where the storage refuses a detached node's writes; a
    /// frozen or cut-off node may otherwise write beside the replacement.
    /// `CloudShutdownTaint`: the cloud provider reported the instance shut down (the taint
    /// `node.cloudprovider.kubernetes.io/shutdown`, which the cloud node lifecycle controller
    /// adds while the instance is off and removes when it runs again). It never comes for an
    /// instance that still runs (hung, or cut off from the network): alone it holds such a node
    /// until a person acts; list it in `anyOf` beside a fence that can stop a running instance
    /// (`External`, `Agent`, `BMC`).
    /// `External`: a fence controller of the user's fenced it: podha asks on the Node
    /// (annotation `podha.io/fence-request`) and the controller, once the node is off (a BMC,
    /// a cloud API, a storage fence), sets `podha.io/fence-ack` to the request's value. Only an
    /// acknowledgement of this incident's request counts; silence proves nothing.
    /// `BMC`: the node's BMC says it is off (docs/bmc.md). podha asks the BMC (Redfish,
    /// `fencing.bmc`) to force the machine off (`ComputerSystem.Reset`, `ForceOff`) and takes
    /// for the proof only two reads of the system's `PowerState` that say `Off` at least 3 s
    /// apart (a BMC applies a reset seconds after it answers, and one read may be stale), of a
    /// system whose UUID is the node's, with nothing heard of the node since the first: no
    /// Lease renewal, no answer to podha's probes of its kubelet port or agent. No agent or
    /// watchdog is needed on the node, and nothing waits out an isolation timeout. A BMC that cannot be
    /// reached, refuses podha's credentials, does not know the system or never reports `Off`
    /// holds the node (a Warning event says which); the machine stays off until someone (or
    /// `fencing.bmc.powerCycle`) powers it on.
    /// `AgentAcknowledged`, `External`, `BMC` and `CloudShutdownTaint` are **confirmed**: each
    /// is something the fence or the machine's owner reported, never inferred from silence,
    /// and none holds for a node that still runs. Only they may follow a judgement without a
    /// kubelet heartbeat (`detection.signals` without `Lease` and `NodeReady`).
    /// `AnyOf` and `AllOf`: the proofs listed in `anyOf` or `allOf`, combined (see there).
    #[serde(default)]
    pub proof: FencingProof,
    /// With proof `AnyOf`: the first of these proofs to come proves the fence, e.g.
    /// `[AgentAcknowledged, BMC]`: the agent's acknowledgement or the BMC's `Off`, whichever
    /// comes first. podha asks for every one of them at once (the fence request on the Node,
    /// the BMC's `ForceOff`). Confirmed (see `proof`) only if every one listed is. Two or three
    /// of `CloudShutdownTaint`, `Agent`, `AgentAcknowledged`, `External` and `BMC`, at most
    /// one of the three answered by the same acknowledgement (`Agent`, `AgentAcknowledged`,
    /// `External`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 3))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(
        validation = Rule::new(LISTS_PROVING_PROOFS).message("fencing.anyOf lists proofs that prove something: not None, AnyOf or AllOf"),
        validation = Rule::new(ONE_ACKNOWLEDGED_PROOF).message("fencing.anyOf takes at most one of Agent, AgentAcknowledged and External: one acknowledgement (podha.io/fence-ack) answers them all"),
    )]
    pub any_of: Option<Vec<FencingProof>>,
    /// With proof `AllOf`: every one of these proofs must be there, e.g. `[Agent, BMC]`.
    /// podha asks for every one of them at once. Confirmed if one listed is. The same proofs
    /// as `anyOf` may be listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 3))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(
        validation = Rule::new(LISTS_PROVING_PROOFS).message("fencing.allOf lists proofs that prove something: not None, AnyOf or AllOf"),
        validation = Rule::new(ONE_ACKNOWLEDGED_PROOF).message("fencing.allOf takes at most one of Agent, AgentAcknowledged and External: one acknowledgement (podha.io/fence-ack) answers them all"),
    )]
    pub all_of: Option<Vec<FencingProof>>,
    /// With proof `BMC`: where podha finds each node's BMC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcFencing>,
    /// With proof `Agent`: how much longer than the time the agent advertises
    /// (`podha.io/agent-fenced-within`) podha waits on a silent agent. It covers the fence
    /// itself (a reboot, a BMC's power-off) and the delay of podha's heartbeat probes. At most
    /// 1h.
    #[serde(default = "default_agent_margin")]
    #[x_kube(validation = Rule::new("duration(self) <= duration('1h')").message("fencing.agentMargin must be at most 1h"))]
    pub agent_margin: HumanDuration,
}

/// The rule that a policy asking for the BMC's proof (alone or in a list) says where the BMCs
/// are.
const ASKS_BMC_HAS_BMC: &str = "has(self.bmc) || !(self.proof == 'BMC' || (has(self.anyOf) && 'BMC' in self.anyOf) || (has(self.allOf) && 'BMC' in self.allOf))";
/// The rule that a list of proofs holds only proofs that prove something.
const LISTS_PROVING_PROOFS: &str = "self.all(p, !(p in ['None', 'AnyOf', 'AllOf']))";
/// The rule that a list of proofs holds at most one answered by the fence acknowledgement.
const ONE_ACKNOWLEDGED_PROOF: &str =
    "self.filter(p, p in ['Agent', 'AgentAcknowledged', 'External']).size() <= 1";

impl Fencing {
    /// The proofs the policy asks for: `proof`, or the members of `anyOf`/`allOf`.
    pub fn proofs(&self) -> Proofs {
        match self.proof {
            FencingProof::AnyOf => {
                Proofs::listed(self.any_of.as_deref().unwrap_or_default(), false)
            }
            FencingProof::AllOf => Proofs::listed(self.all_of.as_deref().unwrap_or_default(), true),
            one => Proofs::from(one),
        }
    }

    /// Whether the policy's proof is confirmed ([`FencingProof::is_confirmed`]): each member
    /// of `anyOf`, at least one of `allOf`. The BMC's only when its system must be the node's
    /// (`matchSystemUUID`): with the Secret's label as the only binding, a Secret holding
    /// another machine's address gives an `Off` of that machine.
    pub fn is_confirmed(&self) -> bool {
        let confirmed = |p: FencingProof| {
            p.is_confirmed()
                && (p != FencingProof::Bmc || self.bmc.as_ref().is_none_or(|b| b.match_system_uuid))
        };
        let proofs = self.proofs();
        let mut members = proofs.members();
        if proofs.needs_all() {
            members.any(confirmed)
        } else {
            proofs.count() > 0 && members.all(confirmed)
        }
    }
}

impl Default for Fencing {
    fn default() -> Self {
        Self {
            proof: FencingProof::default(),
            any_of: None,
            all_of: None,
            bmc: None,
            agent_margin: default_agent_margin(),
        }
    }
}

fn default_agent_margin() -> HumanDuration {
    HumanDuration::from_secs(4)
}

/// The proof the out-of-service taint needs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum FencingProof {
    None,
    CloudShutdownTaint,
    #[default]
    Agent,
    AgentAcknowledged,
    External,
    #[serde(rename = "BMC")]
    Bmc,
    AnyOf,
    AllOf,
}

impl FencingProof {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::CloudShutdownTaint => "CloudShutdownTaint",
            Self::Agent => "Agent",
            Self::AgentAcknowledged => "AgentAcknowledged",
            Self::External => "External",
            Self::Bmc => "BMC",
            Self::AnyOf => "AnyOf",
            Self::AllOf => "AllOf",
        }
    }

    /// Whether the proof is something reported (by the fence, its controller, the BMC, the
    /// cloud provider), never inferred from silence: it cannot hold for a node that still
    /// runs, so a wrong judgement of death costs a fence, never data. (The BMC's only of the
    /// node's own machine: see [`Fencing::is_confirmed`].)
    pub const fn is_confirmed(self) -> bool {
        matches!(
            self,
            Self::AgentAcknowledged | Self::External | Self::Bmc | Self::CloudShutdownTaint
        )
    }
}

/// The proofs a policy asks for, as one value: a single proof, or the members of `anyOf`
/// (any one proves the fence) or `allOf` (every one must). Members are the proofs that prove
/// something: a list holding `None`, `AnyOf` or `AllOf` (which the CRD refuses) counts without
/// them, and an empty list is never proven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Proofs {
    /// One bit per member, by [`FencingProof::MEMBERS`] order.
    set: u8,
    combine: Combine,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Combine {
    /// `fencing.proof: None`: nothing to prove.
    NoProof,
    /// Any member proves the fence (a single proof is a list of one).
    Any,
    /// Every member must be there.
    All,
}

impl FencingProof {
    /// Whether the fence acknowledgement on the Node (`podha.io/fence-ack`) answers this proof:
    /// podha asks for it with a fence request. The other members (`BMC`, `CloudShutdownTaint`)
    /// are proofs the node itself has no part in.
    pub const fn answered_by_acknowledgement(self) -> bool {
        matches!(self, Self::Agent | Self::AgentAcknowledged | Self::External)
    }

    /// The proofs a list may hold, in the order [`Proofs`] names them.
    pub const MEMBERS: [FencingProof; 5] = [
        Self::Agent,
        Self::AgentAcknowledged,
        Self::External,
        Self::Bmc,
        Self::CloudShutdownTaint,
    ];
}

impl From<FencingProof> for Proofs {
    /// The single proof `proof` (`None` included); `AnyOf` or `AllOf` without their list is
    /// the empty list, never proven.
    fn from(proof: FencingProof) -> Self {
        match proof {
            FencingProof::None => Self {
                set: 0,
                combine: Combine::NoProof,
            },
            FencingProof::AnyOf => Self::listed(&[], false),
            FencingProof::AllOf => Self::listed(&[], true),
            one => Self::listed(&[one], false),
        }
    }
}

impl Proofs {
    fn listed(proofs: &[FencingProof], all: bool) -> Self {
        let set = FencingProof::MEMBERS
            .iter()
            .enumerate()
            .filter(|(_, p)| proofs.contains(p))
            .fold(0u8, |set, (i, _)| set | 1 << i);
        let combine = if all { Combine::All } else { Combine::Any };
        Self { set, combine }
    }

    /// The proofs asked for, none for `None`.
    pub fn members(self) -> impl Iterator<Item = FencingProof> {
        FencingProof::MEMBERS
            .into_iter()
            .enumerate()
            .filter(move |(i, _)| self.set & 1 << i != 0)
            .map(|(_, p)| p)
    }

    pub fn count(self) -> usize {
        self.set.count_ones() as usize
    }

    /// No proof at all (`fencing.proof: None`): the taint follows the judgement.
    pub fn is_none(self) -> bool {
        self.combine == Combine::NoProof
    }

    /// Whether every member must be there (`allOf`), rather than any one.
    pub fn needs_all(self) -> bool {
        self.combine == Combine::All && self.count() > 1
    }

    /// Whether `proof` is one of those asked for.
    pub fn asks(self, proof: FencingProof) -> bool {
        self.members().any(|p| p == proof)
    }

    /// Whether `proof` must be there for the fence to be proven: the single proof, or a
    /// member of `allOf`.
    pub fn requires(self, proof: FencingProof) -> bool {
        self.asks(proof) && (self.count() == 1 || self.needs_all())
    }

    /// The single proof asked for (`None` for no proof), if it is a single one.
    pub fn single(self) -> Option<FencingProof> {
        match (self.combine, self.count()) {
            (Combine::NoProof, _) => Some(FencingProof::None),
            (_, 1) => self.members().next(),
            _ => None,
        }
    }

    /// Whether podha asks for the fence on the Node (`podha.io/fence-request`) and takes an
    /// acknowledgement of it as a proof.
    pub fn requests_fence(self) -> bool {
        self.members()
            .any(FencingProof::answered_by_acknowledgement)
    }

    /// Whether a proof no fence acknowledgement answers may prove the fence alone (`anyOf`
    /// with `BMC` or `CloudShutdownTaint`): an acknowledgement the node contradicts then only
    /// fails to count, and the other proof may still come.
    pub fn may_prove_without_acknowledgement(self) -> bool {
        !self.needs_all()
            && self.count() > 1
            && self.members().any(|p| !p.answered_by_acknowledgement())
    }

    /// As the policy says it: `Agent`, `AnyOf [AgentAcknowledged, BMC]`.
    pub fn describe(self) -> String {
        match self.single() {
            Some(one) => one.as_str().to_string(),
            None => {
                let members: Vec<&str> = self.members().map(FencingProof::as_str).collect();
                let kind = if self.combine == Combine::All {
                    "AllOf"
                } else {
                    "AnyOf"
                };
                format!("{kind} [{}]", members.join(", "))
            }
        }
    }
}

impl std::fmt::Display for Proofs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// `fencing.bmc`: the Secret holding a node's BMC, in podha's own namespace (podha reads no
/// other namespace's Secrets). Exactly one of `secretName` and `secretNameLabel` says which.
/// The Secret's keys: `address` (`https://host[:port]`), `username`, `password`, optionally
/// `systemId` (the Redfish system; without it the BMC must serve exactly one), and the trust
/// in the BMC's certificate: `ca.crt` (PEM) or, explicitly, `insecureSkipVerify: "true"`.
/// The Secret must carry the label `podha.io/bmc-node` naming the node: a name template or a
/// node label that points one node at another's Secret (a typo, or a node that set its own
/// label) makes podha refuse it, not power off the wrong machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.secretName) != has(self.secretNameLabel)").message("fencing.bmc needs exactly one of secretName and secretNameLabel"),
)]
pub struct BmcFencing {
    /// The Secret's name, `{node}` standing for the node's name: `bmc-{node}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.replace('{node}', 'n').matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("fencing.bmc.secretName must be a Secret name, with {node} for the node's name"))]
    pub secret_name: Option<String>,
    /// A label on each Node whose value is the name of its Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')").message("fencing.bmc.secretNameLabel must be a label key"))]
    pub secret_name_label: Option<String>,
    /// Power the machine on again once its failover is done (the moved pods' volumes detached
    /// from it and their replacements running): `ForceOff`, `Off` read, the failover, then
    /// `On`. The node boots with its pods gone, and podha takes its taint off once it is back.
    /// Off (the default): the machine stays off until someone powers it on.
    #[serde(default)]
    pub power_cycle: bool,
    /// Power a machine off or count it off only if the system its BMC reports has the node's
    /// UUID (`UUID` of the Redfish ComputerSystem, `status.nodeInfo.systemUUID` of the Node:
    /// both the machine's SMBIOS UUID): a Secret holding the address of another machine is
    /// refused rather than used. Set `false` only for machines whose BMC reports the UUID
    /// differently from the kubelet (a byte order of its own); the Secret's label is then
    /// the only binding.
    #[serde(rename = "matchSystemUUID", default = "default_match_system_uuid")]
    pub match_system_uuid: bool,
}

fn default_match_system_uuid() -> bool {
    true
}

impl BmcFencing {
    /// The name of `node`'s Secret: the template filled in, or the value of the node's label;
    /// `None` when the node has no such label.
    pub fn secret_for(&self, node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
        match (&self.secret_name, &self.secret_name_label) {
            (Some(template), _) => Some(template.replace("{node}", node.metadata.name.as_deref()?)),
            (None, Some(label)) => node.metadata.labels.as_ref()?.get(label).cloned(),
            (None, None) => None,
        }
    }

    /// The UUID `node`'s BMC must report for its system, when the policy matches it (the
    /// node's `status.nodeInfo.systemUUID`; empty when the node reports none, which no system
    /// matches).
    pub fn expected_uuid(&self, node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
        self.match_system_uuid.then(|| {
            node.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.system_uuid.clone())
                .unwrap_or_default()
        })
    }
}

/// `uuid` in one form for comparing a node's system UUID with the one its BMC reports: hex
/// digits only, lowercase.
pub fn canonical_uuid(uuid: &str) -> String {
    uuid.chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}
