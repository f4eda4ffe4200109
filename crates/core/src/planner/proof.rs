//! Whether a dead node is proven fenced, as its policy's `spec.fencing` asks, before podha
//! puts the out-of-service taint on it: what proves it (the cloud's shutdown taint, an
//! acknowledgement of this incident's fence request, an agent's silence past what it
//! advertises, the node's BMC saying twice it is off after this incident's `ForceOff`) and what
//! podha knows of the node's agent for it.
//!
//! An agent's silence proves its fence only where the agent's own rule would have fenced it:
//! the agent fences when podha stops hearing it, and stays when it can show that at least half
//! of its peers are unheard. So podha counts the silence only of an
//! agent it heard right before the silence began, in its current leadership term (an agent
//! it never heard, its port blocked, has nothing to lose and fences nothing), and only while
//! it hears a strict majority of all the agents it expects, the silent one included
//! ([`agent_quorum`]): then the silent agent cannot show half of its peers unheard, which is when
//! an agent stays up. The silence counts only from when podha began hearing
//! enough agents without a break (see [`agent_quorum`]): while podha heard too few (the agent
//! port blocked everywhere), an agent cut off meanwhile showed half of its peers unheard and
//! stayed up, petting its watchdog; it starts deciding to fence only once podha hears enough of its
//! peers again.
//!
//! A replica that gains leadership heard no agent itself. An agent whose Lease says podha heard
//! it in the node's current boot ([`crate::contract::AGENT_HEARD_IN_BOOT_ANNOTATION`]) counts
//! its silence since that hearing, which came from a leader whose claim ended before this
//! term began (`crate::leader`): for such an agent, if this term got nothing from its port,
//! podha counts the silence from its own first unanswered probe, later than the agent's count
//! began ([`AgentEvidence::heard_in_boot_earlier`]).
//!
//! podha counts the silence only after an answer saying the agent is not held: a heartbeat
//! that told the agent podha holds its node (paused, or no policy with the `Agent` proof
//! selects it; see `crate::contract::AGENT_HEEDS_HOLD_ANNOTATION`) stops its fencing on
//! isolation, even when its answer was lost ([`SilenceDoubt::Disarmed`]).
//!
//! The agent must still advertise: its Lease in podha's namespace (see [`crate::contract`]) is
//! there and was renewed within its duration before the silence began. An agent uninstalled,
//! moved away or stopped withdraws it with its advert on the Node (or the Lease goes with its
//! Pod): its silence proves nothing, and podha no longer expects to hear it.
//!
//! Heard means an answer from the agent itself: an HTTP answer naming the node
//! ([`Heartbeat::agent_connected`](super::Heartbeat::agent_connected)). A refused connect, an
//! error status or an answer naming another node says the machine runs (detection counts it),
//! not that its agent does: an agent stopped for good (its watchdog disarmed) leaves its port
//! refusing, and a silence after that proves nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use super::holds::{Heartbeat, Heartbeats};
use crate::api::{CLOUD_SHUTDOWN_TAINT_KEY, Fencing, FencingProof};
use crate::contract::{
    FENCE_ACK_ANNOTATION, agent_addr, agent_lease_name, agent_quorum, fenced_within, requested_boot,
};
use crate::incident::PowerOff;
use crate::view::View;

pub use crate::contract::AGENT_HEARD_WITHIN;

/// How many renewals of a node's Lease, seen after its fence acknowledgement in the same boot,
/// contradict the acknowledgement: a fenced node's kubelet does not write to the API server.
/// Two, not one: a renewal written before the fence may reach podha after the acknowledgement
/// (they come on separate watches, and a watch that lists again delivers the latest renewal
/// late), but the kubelet renews only every 10 s.
pub const ACK_CONTRADICTED_BY: u32 = 2;

/// What podha knows of a node's agent for the `Agent` proof, computed by [`agent_evidence`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentEvidence<'a> {
    /// How long the agent has not answered podha's heartbeat; `None` while it answers (or was
    /// never asked).
    pub silent_for: Option<Duration>,
    /// How long before its silence began podha last got an answer from the agent itself (not
    /// its host's refusal); `None` when podha got none in its current leadership term before
    /// the silence.
    pub heard_before_silence: Option<Duration>,
    /// How long after the agent's silence began to count (see
    /// [`AgentEvidence::renewed_during_silence`]) the node's own (kubelet) Lease was last
    /// renewed, at the earliest (see `Heartbeat::renewal_not_before`), if it was.
    pub node_renewed_after_silence: Option<Duration>,
    /// How long ago podha last saw the agent's Lease renewed, if that was after the agent fell
    /// silent: the silence counts from then (an agent that renews its Lease runs, and stays up
    /// while it renews: see docs/agent.md).
    pub renewed_during_silence: Option<Duration>,
    /// What the agent advertises (`podha.io/agent-fenced-within`): how long after podha last
    /// heard it the node is fenced at the latest.
    pub fenced_within: Option<Duration>,
    /// The agent's Lease, while it is there: how long before the silence began podha last saw
    /// it renewed (zero when renewed since, or while the agent answers), and how long it lasts.
    pub advert: Option<AdvertAge>,
    /// The other nodes advertising an agent whose agent itself answered podha within
    /// [`AGENT_HEARD_WITHIN`].
    pub others_heard: usize,
    /// The other nodes advertising an agent (`podha.io/agent-port`, with an InternalIP).
    pub others_expected: usize,
    /// How long podha has heard enough agents without a break (see [`agent_quorum`]); `None`
    /// while it does not. The silence counts only for this long.
    pub quorum_for: Option<Duration>,
    /// The fence podha asked the agent for in this incident, if it did.
    pub request: Option<&'a str>,
    /// Renewals of the node's Lease podha saw after the fence acknowledgement on the Node, in
    /// its boot (see [`ACK_CONTRADICTED_BY`]).
    pub renewals_since_ack: u32,
    /// Whether podha saw the node's Lease renewed in the boot the Node reports, after it saw
    /// that boot ID (see `Heartbeat::renewed_in_boot`).
    pub renewed_in_boot: bool,
    /// Whether the agent's Lease says podha heard it in the boot the Node reports
    /// ([`crate::contract::AGENT_HEARD_IN_BOOT_ANNOTATION`]): heard by an earlier leadership
    /// term, when this one never got an answer (see [`AgentEvidence::silence_doubt`]).
    pub heard_in_boot_earlier: bool,
    /// Whether podha saw the Lease of an agent that heeds terms renewed since it began
    /// counting what it hears of the agent in this term (see `Heartbeat::agent_hearing_from`;
    /// also when it has not begun): such an agent runs, and stays up on isolation while it
    /// renews, as this term never heard it ([`SilenceDoubt::RenewedUnheard`]).
    pub renewed_in_term: bool,
    /// Whether, since podha last counted the agent armed in this term, a heartbeat or an
    /// answer showed it may count no silence (held: see
    /// `crate::contract::AGENT_HEEDS_HOLD_ANNOTATION`; never heard by its own word; its port
    /// answered by something else): it may fence nothing on isolation.
    pub disarmed: bool,
}

/// How old a node's agent Lease was when the agent fell silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdvertAge {
    /// How long before the silence began podha last saw the Lease renewed (zero when it saw a
    /// renewal since).
    pub renewed_before_silence: Duration,
    /// The Lease's duration.
    pub lasts: Duration,
}

impl AgentEvidence<'_> {
    /// Why the agent's silence proves no fence, if it is silent and it does not (see the
    /// module's rule); however long the silence lasts, it will not prove one until this
    /// changes.
    pub fn silence_doubt(&self) -> Option<SilenceDoubt> {
        self.silent_for?;
        match self.advert {
            None => return Some(SilenceDoubt::NoAdvert),
            Some(age) if age.renewed_before_silence > age.lasts => {
                return Some(SilenceDoubt::AdvertLapsed {
                    gap: age.renewed_before_silence,
                });
            }
            Some(_) => {}
        }
        // Renewals before the agent's deadline are a node still running while its agent
        // fences it (podha cut off from the agent alone); after it, the node was not fenced.
        let deadline = self.fenced_within.unwrap_or_default() + AGENT_HEARD_WITHIN;
        if let Some(after) = self
            .node_renewed_after_silence
            .filter(|after| *after > deadline)
        {
            return Some(SilenceDoubt::NodeLivedOn { after });
        }
        match self.heard_before_silence {
            // Never answered this term, but heard in this boot by an earlier one: the agent
            // counts its silence from its last hearing, which no earlier leader can have given
            // after this term began, and podha counts from its own first unanswered probe,
            // later still.
            None if self.disarmed => Some(SilenceDoubt::Disarmed),
            // ... unless the agent renewed its Lease in this term: it runs, this leader never
            // heard it, and it stays up (the leader Lease shows it a term that did not hear
            // it), so long as the renewals go on often enough for this term to see one.
            None if self.heard_in_boot_earlier && self.renewed_in_term => {
                Some(SilenceDoubt::RenewedUnheard)
            }
            None if self.heard_in_boot_earlier => self.quorum_doubt(),
            None => Some(SilenceDoubt::NeverHeard),
            Some(gap) if gap > AGENT_HEARD_WITHIN => Some(SilenceDoubt::HeardLongBefore { gap }),
            Some(_) => self.quorum_doubt(),
        }
    }

    /// Whether podha hears too few of the other agents for any silence to count.
    fn quorum_doubt(&self) -> Option<SilenceDoubt> {
        (!silence_counts_among(self.others_heard, self.others_expected)).then_some(
            SilenceDoubt::FewOthersHeard {
                heard: self.others_heard,
                expected: self.others_expected,
            },
        )
    }
}

impl AgentEvidence<'_> {
    /// What `node`'s acknowledgement says of this incident's fence request (see
    /// [`acknowledgement`]). A request of another boot than the one the Node reports is
    /// acknowledged without a fence (the reboot was one), and the Node's boot ID is written by
    /// anyone who may patch its status: a boot ID changed while podha asked, then changed back,
    /// looks the same. Only the node's kubelet renewing its Lease in the boot the Node reports
    /// shows that boot runs, and the one the request names ended.
    pub fn acknowledgement(&self, node: &Node) -> Acknowledgement {
        let said = acknowledgement(node, self.request, self.renewals_since_ack);
        let of_another_boot = self
            .request
            .and_then(requested_boot)
            .zip(boot_id(node))
            .is_some_and(|(then, now)| then != now);
        if said == Acknowledgement::Given && of_another_boot && !self.renewed_in_boot {
            return Acknowledgement::RebootUnheard;
        }
        said
    }

    /// How much of the silence counts: the part since podha has heard enough agents (see
    /// [`agent_quorum`]) and since it last saw the agent's Lease renewed; `None` while the
    /// agent answers or podha hears too few.
    pub fn counted_silence(&self) -> Option<Duration> {
        let counted = self
            .silent_for
            .zip(self.quorum_for)
            .map(|(s, q)| s.min(q))?;
        Some(
            self.renewed_during_silence
                .map_or(counted, |renewed| counted.min(renewed)),
        )
    }
}

/// Whether `proof`, what [`proven`] found for `fencing`, rests on the agent's silence: there is
/// a proof, and without that silence there would be none (under `anyOf`, no other proof is in;
/// under `allOf`, the `Agent` member is proven by the silence). The silence counts from the
/// last renewal of the agent's Lease podha saw (or, for a leadership term that never heard the
/// agent, through the Lease's word of being heard): a renewal its view missed would make it
/// count too early, so such a taint goes out only after a read of the Lease.
pub fn rests_on_agent_silence(
    fencing: &Fencing,
    node: &Node,
    agent: AgentEvidence<'_>,
    powered_off: bool,
    proof: Option<FenceEvidence>,
) -> bool {
    let without_silence = AgentEvidence {
        silent_for: None,
        ..agent
    };
    proof.is_some()
        && agent.silent_for.is_some()
        && proven(fencing, node, without_silence, powered_off).is_none()
}

pub use crate::contract::silence_counts_among;

/// Why a silent agent's silence proves no fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SilenceDoubt {
    /// The node's agent Lease is not there: the agent withdrew it when it stopped (uninstalled,
    /// moved away by a nodeSelector), it went with the agent's Pod, or the agent is older than
    /// the Lease.
    NoAdvert,
    /// podha last saw the agent's Lease renewed `gap` before the silence began, longer than
    /// the Lease lasts: the agent had stopped renewing it (stopped, or hung).
    AdvertLapsed { gap: Duration },
    /// The node's own Lease was renewed `after` the agent fell silent (or, when podha saw the
    /// agent's Lease renewed during the silence, after that renewal), past the time the agent
    /// advertises (and [`AGENT_HEARD_WITHIN`]): the node ran on without its agent (stopped,
    /// killed, or its withdrawal on SIGTERM failed), and nothing fenced it when it failed
    /// later. (A node cut off from everything stops both at once; one cut off from podha
    /// alone renews while its agent renews, and its agent stays up.)
    NodeLivedOn { after: Duration },
    /// podha got no answer from the agent in its current leadership term before the silence,
    /// and the agent's Lease does not say an earlier term heard it in the node's current boot:
    /// its port may be blocked, or it stopped before it was heard.
    NeverHeard,
    /// Since podha last counted the agent armed in this term, a heartbeat held the node (the
    /// node, or every policy with the `Agent` proof that selects it, was paused, or none
    /// selected it), or the agent answered that it is held or that podha has not heard it in
    /// this boot, or something else answered at its port: it may fence nothing on isolation
    /// until an answer says it is armed again.
    Disarmed,
    /// podha's last answer from the agent came `gap` before its silence began, more than
    /// [`AGENT_HEARD_WITHIN`].
    HeardLongBefore { gap: Duration },
    /// podha hears `heard` of the `expected` other agents: with the silent one, no strict
    /// majority of the agents it expects.
    FewOthersHeard { heard: usize, expected: usize },
    /// podha got no answer from the agent in its current leadership term, and saw the Lease of
    /// the agent (one that heeds terms) renewed in this term: the agent runs without hearing
    /// this leader (its port blocked from this replica alone, say), and an agent that knows a
    /// later term than the one that last heard it stays up on isolation while it renews its
    /// Lease. Held for the rest of the term, unless the agent answers.
    RenewedUnheard,
}

impl SilenceDoubt {
    /// The doubt without its figures: what tells two holds of the same node apart.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoAdvert => "NoAdvert",
            Self::AdvertLapsed { .. } => "AdvertLapsed",
            Self::NodeLivedOn { .. } => "NodeLivedOn",
            Self::NeverHeard => "NeverHeard",
            Self::Disarmed => "Disarmed",
            Self::HeardLongBefore { .. } => "HeardLongBefore",
            Self::FewOthersHeard { .. } => "FewOthersHeard",
            Self::RenewedUnheard => "RenewedUnheard",
        }
    }

    /// The doubt in words, about the agent of `node`.
    pub fn describe(self, node: &str) -> String {
        match self {
            Self::NoAdvert => format!(
                "node {node} has no agent Lease ({}) in podha's namespace: its agent was \
                 uninstalled, moved away or stopped (or predates the Lease), and nothing says it \
                 fences the node",
                agent_lease_name(node)
            ),
            Self::AdvertLapsed { gap } => format!(
                "podha last saw the agent Lease of node {node} renewed {}s before the agent fell \
                 silent, longer than it lasts: the agent had stopped renewing it, and may not \
                 fence the node",
                gap.as_secs()
            ),
            Self::NodeLivedOn { after } => format!(
                "node {node} renewed its Lease {}s after its agent fell silent (or last renewed \
                 its own Lease), past the time the agent advertises: the agent stopped while its \
                 node ran on, and nothing fenced the node when it failed",
                after.as_secs()
            ),
            Self::NeverHeard => format!(
                "podha never heard the agent of node {node} in this leadership term, and its \
                 Lease does not say an earlier term heard it in the node's current boot: an \
                 agent podha never heard (its port blocked, or stopped before it was heard) \
                 does not fence its node on isolation"
            ),
            Self::Disarmed => format!(
                "before its silence, podha's heartbeat held node {node} (it, or every policy \
                 with the Agent proof that selects it, was paused, or none selected it), or the \
                 agent answered that it is held or not heard in this boot, or something else \
                 answered at its port, and no answer armed it again: the agent may fence \
                 nothing on isolation, so its silence proves no fence"
            ),
            Self::HeardLongBefore { gap } => format!(
                "podha last heard the agent of node {node} {}s before its silence began (more \
                 than {}s): the silence may not be the agent's",
                gap.as_secs(),
                AGENT_HEARD_WITHIN.as_secs()
            ),
            Self::FewOthersHeard { heard, expected: 0 } => format!(
                "podha hears {heard} of the 0 other agents it expects: an agent without peers \
                 stays up when podha stops hearing it, so the silence of node {node}'s agent \
                 proves no fence"
            ),
            Self::FewOthersHeard { heard, expected } => format!(
                "podha hears {heard} of the {expected} other agents it expects, and with node \
                 {node}'s silent one that is no strict majority of the {}: the agent port may be \
                 blocked, and an agent that can show half of its peers unheard stays up",
                expected + 1
            ),
            Self::RenewedUnheard => format!(
                "podha never heard the agent of node {node} in this leadership term, and saw its \
                 Lease renewed in it: the agent ran without hearing this leader (its port may be \
                 blocked from this replica), and stays up on isolation while it renews, so its \
                 silence proves nothing in this term"
            ),
        }
    }
}

/// What podha knows of `node`'s agent now, from its heartbeats and the nodes in `view`
/// (those advertising an agent are the ones podha expects to hear); `request` is the fence
/// this incident asked for. The one place both the planner and the decision loop's report of
/// the proof take it from.
pub fn agent_evidence<'a>(
    node: &str,
    view: &View,
    heartbeats: &Heartbeats,
    quorum_since: Option<Instant>,
    now: Instant,
    request: Option<&'a str>,
) -> AgentEvidence<'a> {
    let own = heartbeats.get(node);
    let silent_since = own.and_then(|hb| hb.agent_silent_since);
    let heard_before_silence = own
        .and_then(|hb| hb.agent_armed)
        .zip(silent_since)
        .map(|(answered, since)| since.saturating_duration_since(answered));
    // The agent's Lease renewed since it fell silent: the silence counts from that renewal.
    let lease = view.agent_adverts.get(node);
    let renewed_silent = lease
        .map(|lease| lease.renewed_seen)
        .zip(silent_since)
        .filter(|(renewed, since)| renewed > since)
        .map(|(renewed, _)| renewed);
    let counted_since = renewed_silent.or(silent_since);
    let node_renewed_after_silence = own
        .and_then(|hb| hb.renewal_not_before)
        .zip(counted_since)
        .and_then(|(renewed, since)| renewed.checked_duration_since(since));
    let advert = lease.map(|lease| AdvertAge {
        renewed_before_silence: silent_since.map_or(Duration::ZERO, |since| {
            since.saturating_duration_since(lease.renewed_seen)
        }),
        lasts: lease.lasts,
    });
    let others = advertising(view).filter(|name| *name != node);
    let (mut others_heard, mut others_expected) = (0, 0);
    for name in others {
        others_expected += 1;
        others_heard += usize::from(heard_now(heartbeats, name, now));
    }
    AgentEvidence {
        silent_for: silent_since.map(|since| now.saturating_duration_since(since)),
        heard_before_silence,
        node_renewed_after_silence,
        renewed_during_silence: renewed_silent.map(|at| now.saturating_duration_since(at)),
        fenced_within: view.nodes.get(node).and_then(|n| fenced_within(n)),
        advert,
        others_heard,
        others_expected,
        quorum_for: quorum_since.map(|since| now.saturating_duration_since(since)),
        request,
        renewals_since_ack: own.map_or(0, |hb| hb.renewals_since_ack),
        renewed_in_boot: own.is_some_and(|hb| hb.renewed_in_boot),
        // Nothing from the agent's port in this term that armed or disarmed it (a refusal is
        // an agent not running, and disarms it: a silence after it is not one the agent
        // counts; see the module's docs).
        heard_in_boot_earlier: own.is_none_or(|hb| hb.agent_armed.is_none() && !hb.agent_disarmed)
            && heard_in_current_boot(view, node),
        disarmed: own.is_some_and(|hb| hb.agent_disarmed),
        renewed_in_term: renewed_in_term(view, node, own),
    }
}

/// Whether podha saw `node`'s agent Lease renewed since it began counting what it hears of the
/// agent (`hb`'s `agent_hearing_from`), or has not begun, and the agent heeds terms (an older
/// agent fences whenever a later term's leader does not hear it, as it always did: its silence
/// counts as before). The latest renewal seen tells. Once true it stays so for the term: a
/// silence after renewals seen is counted by nothing this term sees afresh (a watch of the
/// agent Leases that stalls would show none), so the node is held rather than proven.
fn renewed_in_term(view: &View, node: &str, hb: Option<&Heartbeat>) -> bool {
    let Some(advert) = view.agent_adverts.get(node).filter(|a| a.heeds_term) else {
        return false;
    };
    hb.and_then(|hb| hb.agent_hearing_from)
        .is_none_or(|from| advert.renewed_seen >= from)
}

/// Whether `node`'s agent Lease says podha heard the agent in the boot the Node reports, as
/// this process saw it renewed (a Lease only found, by a process that just started, could be
/// one its agent no longer renews: its age is unknown).
fn heard_in_current_boot(view: &View, node: &str) -> bool {
    let lease_says = view
        .agent_adverts
        .get(node)
        .filter(|advert| advert.renewal_observed)
        .and_then(|advert| advert.heard_in_boot.as_deref());
    let booted = view.nodes.get(node).and_then(|n| boot_id(n));
    lease_says.is_some_and(|heard| booted == Some(heard))
}

/// The nodes whose agent podha expects to hear: those advertising one on the Node (port, with
/// an InternalIP). The same set the agents take their peers from (`agent::peer_list`): the
/// majority podha counts must be of the agents a silent agent counts, or a node whose peers
/// kept it up could pass for fenced. (An agent that stops withdraws this advert with its
/// Lease; an agent without a Lease still counts here, though its own silence proves nothing.)
fn advertising(view: &View) -> impl Iterator<Item = &str> {
    view.nodes
        .iter()
        .filter(|(_, n)| agent_addr(n).is_some())
        .map(|(name, _)| name.as_str())
}

/// Whether podha hears `node`'s agent now: the agent itself answered within
/// [`AGENT_HEARD_WITHIN`].
fn heard_now(heartbeats: &Heartbeats, node: &str, now: Instant) -> bool {
    heartbeats
        .get(node)
        .and_then(|hb| hb.agent_connected)
        .is_some_and(|t| now.saturating_duration_since(t) <= AGENT_HEARD_WITHIN)
}

/// Whether podha hears enough agents now ([`agent_quorum`] over the nodes of `view` that
/// advertise one); the decision loop follows since when it has, without a break.
pub fn hears_agent_quorum(view: &View, heartbeats: &Heartbeats, now: Instant) -> bool {
    let (mut heard, mut expected) = (0, 0);
    for name in advertising(view) {
        expected += 1;
        heard += usize::from(heard_now(heartbeats, name, now));
    }
    expected > 0 && agent_quorum(heard, expected)
}

/// What proved a node fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceEvidence {
    /// The policy asks for no proof.
    NotAsked,
    /// The cloud provider's shutdown taint.
    CloudShutdown,
    /// The agent acknowledged podha's fence request.
    AgentAcknowledged,
    /// The agent has been silent past its isolation timeout and the margin.
    AgentSilent,
    /// The user's fence controller acknowledged podha's fence request.
    ExternalAcknowledged,
    /// The node's BMC said the machine is off, read twice after it accepted podha's
    /// `ForceOff`, and nothing was heard of the node since (see [`bmc_off`]).
    BmcPoweredOff,
}

impl FenceEvidence {
    /// Whether the fence was reported done (by the agent, a fence controller, the BMC, the
    /// cloud provider), not inferred from silence or not asked for: the only evidence that
    /// may follow a judgement without the kubelet's heartbeat.
    pub const fn is_confirmed(self) -> bool {
        !matches!(self, Self::NotAsked | Self::AgentSilent)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotAsked => "NotAsked",
            Self::CloudShutdown => "CloudShutdownTaint",
            Self::AgentAcknowledged => "AgentAcknowledged",
            Self::AgentSilent => "AgentSilent",
            Self::ExternalAcknowledged => "ExternalAcknowledged",
            Self::BmcPoweredOff => "BMCPoweredOff",
        }
    }
}

/// The proof `fencing` asks for, if `node` has it (always, with `None`): with `anyOf` the
/// first member there (in [`FencingProof::MEMBERS`] order), with `allOf` the last, once every
/// one is; `powered_off`: the node's BMC proves the machine off (see [`bmc_off`]).
pub fn proven(
    fencing: &Fencing,
    node: &Node,
    agent: AgentEvidence<'_>,
    powered_off: bool,
) -> Option<FenceEvidence> {
    let proofs = fencing.proofs();
    if proofs.is_none() {
        return Some(FenceEvidence::NotAsked);
    }
    let mut each = proofs
        .members()
        .map(|p| member_proven(p, fencing, node, agent, powered_off));
    if proofs.needs_all() {
        // An empty list proves nothing: `try_fold` starts from no evidence.
        each.try_fold(None, |_, e| e.map(Some)).flatten()
    } else {
        each.flatten().next()
    }
}

/// How far apart the two reads of a node's BMC that prove its machine off must be. One read
/// is one look at what the BMC believes: some BMCs serve a `PowerState` they cached seconds
/// before, or read it wrong for a moment after their own firmware restarts. A second read a
/// few seconds later is a new look, and meanwhile podha's probes of the node go on (its agent
/// is asked every second): a machine that still runs answers one, and that answer takes the
/// `Off` back. Short beside the failover it guards: the taint waits this much longer.
pub const BMC_OFF_READS_APART: Duration = Duration::from_secs(3);

/// When the node's BMC said `Off` a second time, at least [`BMC_OFF_READS_APART`] after the
/// first, with no read between them that did not, if it has.
pub fn bmc_off_read_twice(power_off: &PowerOff) -> Option<Instant> {
    power_off
        .off_reads
        .filter(|r| r.last >= r.first + BMC_OFF_READS_APART)
        .map(|r| r.last)
}

/// Whether the node's BMC proves its machine off (proof `BMC`): it said `Off` twice after
/// accepting this incident's `ForceOff` (see [`bmc_off_read_twice`]), and nothing was heard of
/// the node since the first `Off`: no renewal of its Lease, no answer to podha's probes of its
/// kubelet port or agent (a host refusing the connection answers too: something runs there).
/// A node heard since runs: someone powered the machine on, or it never stopped (the BMC reads
/// another machine, or misreads this one), and the `Off` proves nothing.
pub fn bmc_off(power_off: Option<PowerOff>, heard: Option<&Heartbeat>) -> bool {
    let Some(power_off) = power_off else {
        return false;
    };
    let Some(first) = power_off.off_reads.map(|r| r.first) else {
        return false;
    };
    let heard_since = heard.is_some_and(|hb| {
        hb.renewal_not_before.is_some_and(|r| r > first)
            || [hb.tcp_answered, hb.agent_answered]
                .into_iter()
                .flatten()
                .any(|sent| sent >= first)
    });
    bmc_off_read_twice(&power_off).is_some() && !heard_since
}

/// The proof `fencing` asks for, counting only the members the node has no part in (the BMC's
/// `Off`, the cloud provider's shutdown taint), under an `anyOf` that lists one: what may still
/// prove a node whose acknowledgement it contradicted (its own word and its agent's silence no
/// longer count). `None` for any other policy.
pub fn proven_without_the_node(
    fencing: &Fencing,
    node: &Node,
    powered_off: bool,
) -> Option<FenceEvidence> {
    let proofs = fencing.proofs();
    if !proofs.may_prove_without_acknowledgement() {
        return None;
    }
    proofs
        .members()
        .filter(|p| !p.answered_by_acknowledgement())
        .find_map(|p| member_proven(p, fencing, node, AgentEvidence::default(), powered_off))
}

/// Whether one proof asked for is there.
fn member_proven(
    proof: FencingProof,
    fencing: &Fencing,
    node: &Node,
    agent: AgentEvidence<'_>,
    powered_off: bool,
) -> Option<FenceEvidence> {
    let acknowledged = agent.acknowledgement(node) == Acknowledgement::Given;
    match proof {
        FencingProof::Bmc => powered_off.then_some(FenceEvidence::BmcPoweredOff),
        FencingProof::CloudShutdownTaint => node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|taints| taints.iter().any(|t| t.key == CLOUD_SHUTDOWN_TAINT_KEY))
            .then_some(FenceEvidence::CloudShutdown),
        FencingProof::External => acknowledged.then_some(FenceEvidence::ExternalAcknowledged),
        FencingProof::AgentAcknowledged => acknowledged.then_some(FenceEvidence::AgentAcknowledged),
        FencingProof::Agent => {
            let isolation = fenced_within(node);
            let silent = agent.silence_doubt().is_none()
                && matches!(
                    (agent.counted_silence(), isolation),
                    (Some(silent), Some(timeout)) if silent >= timeout + fencing.agent_margin.get()
                );
            if acknowledged {
                Some(FenceEvidence::AgentAcknowledged)
            } else if silent {
                Some(FenceEvidence::AgentSilent)
            } else {
                None
            }
        }
        // Not members (see `Proofs`): they prove nothing.
        FencingProof::None | FencingProof::AnyOf | FencingProof::AllOf => None,
    }
}

/// The system UUID `node` reports (`status.nodeInfo.systemUUID`), in the form UUIDs are
/// compared in ([`crate::api::canonical_uuid`]); empty when it reports none.
pub fn system_uuid_of(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| crate::api::canonical_uuid(&i.system_uuid))
        .unwrap_or_default()
}

/// Another node of `view` that reports the same system UUID as node `name`, if any. Such a
/// UUID binds neither node to its BMC (firmware that gives many boards one UUID, a cloned VM):
/// a Secret with the other machine's address would pass the check.
pub fn system_uuid_shared_with<'v>(view: &'v View, name: &str, node: &Node) -> Option<&'v str> {
    let uuid = system_uuid_of(node);
    if uuid.is_empty() {
        return None;
    }
    view.nodes
        .iter()
        .find(|(other, n)| other.as_str() != name && system_uuid_of(n) == uuid)
        .map(|(other, _)| other.as_str())
}

/// The boot `node` reports (`status.nodeInfo.bootID`), if it reports one.
fn boot_id(node: &Node) -> Option<&str> {
    let id = node.status.as_ref()?.node_info.as_ref()?.boot_id.as_str();
    (!id.is_empty()).then_some(id)
}

/// What the acknowledgement on a node says of a fence request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acknowledgement {
    /// None of that request: none at all, or of another one.
    Missing,
    /// The request acknowledged, and nothing the node did since contradicts it: the proof.
    Given,
    /// The request acknowledged, but the node's Lease was renewed `renewals` times since, in
    /// the boot the request names (at least [`ACK_CONTRADICTED_BY`]): the fence did not take,
    /// and neither the acknowledgement nor (while the kubelet writes) the agent's silence
    /// proves it did.
    Contradicted { renewals: u32 },
    /// The request, of another boot than the one the Node reports, acknowledged, but podha has
    /// not seen the node's Lease renewed in the boot the Node reports: nothing shows the boot
    /// the request names ended (see [`AgentEvidence::acknowledgement`]), and the
    /// acknowledgement proves nothing until it does.
    RebootUnheard,
}

/// What `node`'s acknowledgement (`podha.io/fence-ack`) says of `request`, given how many
/// renewals of the node's Lease podha saw after it (see `Heartbeat::renewals_since_ack`).
pub fn acknowledgement(
    node: &Node,
    request: Option<&str>,
    renewals_since_ack: u32,
) -> Acknowledgement {
    let acknowledged = request.is_some_and(|request| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FENCE_ACK_ANNOTATION))
            .map(String::as_str)
            == Some(request)
    });
    match (acknowledged, renewals_since_ack) {
        (false, _) => Acknowledgement::Missing,
        (true, renewals) if renewals >= ACK_CONTRADICTED_BY => {
            Acknowledgement::Contradicted { renewals }
        }
        (true, _) => Acknowledgement::Given,
    }
}

#[cfg(test)]
mod tests;
