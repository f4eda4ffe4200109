//! Would podha fail a pod over if its node died now? The rules with their results. The planner
//! answers what it would do: `planner::foresee` plans the round that death would get, and
//! [`verdicts`] reads its verdicts as rules (the policies' state, each eligibility rule up to
//! the refusal, the taint). What the proof needs of the node (`fence.rs`: its agent, the
//! agents podha must hear, its BMC as `planner::bmc_target` reaches it, its cloud provider) is
//! said beside it: whether the proof comes depends on the death itself. A pod that fails no
//! rule is *protected*.
//!
//! Two readers share it: `podha explain` (the rules, in words, for one pod, node or policy)
//! and the operator, which counts each policy's protected and unprotected pods by the first
//! rule that fails ([`coverage`]) for the policy's status and `podha_pods`.

mod agent;
#[cfg(test)]
mod agreement;
mod coverage;
mod fence;
pub mod pod;
#[cfg(test)]
mod tests;
pub mod verdicts;

use std::cell::{OnceCell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use serde::{Serialize, Serializer};
use tokio::time::Instant;

use crate::api::PodHAPolicyStatus;
use crate::eligibility::SkipReason;
use crate::planner::{NodeVerdict, PolicyRef, Seen, foresee};
use crate::view::View;
pub use agent::{AgentGap, agent_gap};
pub use coverage::{Coverage, coverage};
pub use fence::proof_checks;
pub use pod::{PodExplanation, explain_pod, ready_elsewhere};

/// How a rule came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The rule lets podha fail the pod over.
    Pass,
    /// The rule keeps the pod where it is.
    Fail,
    /// Worth knowing, decides nothing (what the taint will be, timing).
    Note,
    /// podha fails the pod over, but not on the fast path: under `OutOfServiceTaint` the taint
    /// would be refused (a pod that must stay is on the node), so the volume detaches only
    /// after the attach/detach controller's 6-minute wait.
    Slow,
}

/// Why a pod is not protected: the rule that keeps it where it is, as a bounded label
/// (`podha_pods{reason}`, a policy's `status.unprotectedReasons`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unprotected {
    /// No podha replica leads: nothing acts.
    NoLeader,
    /// The pod is not on a node that exists, or it has finished: nothing to move.
    NotOnNode,
    /// No policy selects the pod (or the node).
    NotSelected,
    /// The pod as read is not one the planner judged on its node (no UID, or it changed
    /// between two reads of `podha explain`).
    NotJudged,
    /// Its policy, or its node (`podha.io/paused`), is paused.
    Paused,
    /// Its policy only says what it would do.
    DryRun,
    /// A policy before it by name cannot be read: podha holds every action after it.
    PolicyUnreadable,
    /// Its policy holds every action: too many unhealthy nodes (`safety.maxUnhealthy`).
    TooManyUnhealthy,
    /// Its node's policy would wait for good: some of its nodes answer none of the probes it
    /// judges by, so a death cannot be told from podha's own cut-off (the settle wait).
    Unconfirmed,
    /// An eligibility rule refuses the pod.
    Ineligible(SkipReason),
    /// `fencing.proof: Agent` and the node has no agent whose silence proves its fence.
    NoProvingAgent,
    /// `fencing.proof: Agent` and too few other agents are heard for a silence to count.
    TooFewAgentsHeard,
    /// `fencing.proof: CloudShutdownTaint` on a node no cloud provider manages.
    NoCloudProvider,
    /// `fencing.proof: BMC` on a node whose Secret has no name (`fencing.bmc.secretNameLabel`
    /// is not on the Node).
    NoBmc,
    /// `fencing.proof: AnyOf` or `AllOf` without a proof listed (a CRD without its rules let
    /// it in).
    NoProof,
}

impl Unprotected {
    /// CamelCase label; an eligibility refusal keeps its `podha_pods_skipped_total` reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoLeader => "NoLeader",
            Self::NotOnNode => "NotOnNode",
            Self::NotSelected => "NotSelected",
            Self::NotJudged => "NotJudged",
            Self::Paused => "Paused",
            Self::DryRun => "DryRun",
            Self::PolicyUnreadable => "PolicyUnreadable",
            Self::TooManyUnhealthy => "TooManyUnhealthyNodes",
            Self::Unconfirmed => "NodesNotHeardFrom",
            Self::Ineligible(reason) => reason.as_str(),
            Self::NoProvingAgent => "NoProvingAgent",
            Self::TooFewAgentsHeard => "TooFewAgentsHeard",
            Self::NoCloudProvider => "NoCloudProvider",
            Self::NoBmc => "NoBMC",
            Self::NoProof => "NoProof",
        }
    }
}

impl Serialize for Unprotected {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One rule and its result; a failed rule says why as a label too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub rule: &'static str,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Unprotected>,
    pub detail: String,
}

impl Check {
    pub fn pass(rule: &'static str, detail: impl Into<String>) -> Self {
        Self::new(rule, Outcome::Pass, None, detail)
    }
    pub fn fail(rule: &'static str, reason: Unprotected, detail: impl Into<String>) -> Self {
        Self::new(rule, Outcome::Fail, Some(reason), detail)
    }
    pub fn note(rule: &'static str, detail: impl Into<String>) -> Self {
        Self::new(rule, Outcome::Note, None, detail)
    }
    pub fn slow(rule: &'static str, detail: impl Into<String>) -> Self {
        Self::new(rule, Outcome::Slow, None, detail)
    }
    fn new(
        rule: &'static str,
        outcome: Outcome,
        reason: Option<Unprotected>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            rule,
            outcome,
            reason,
            detail: detail.into(),
        }
    }
    pub fn failed(&self) -> bool {
        self.outcome == Outcome::Fail
    }
}

/// Rules in the order they were checked.
#[derive(Default)]
pub struct Checks(pub Vec<Check>);

impl Checks {
    pub fn push(&mut self, check: Check) {
        self.0.push(check);
    }
    pub fn pass(&mut self, rule: &'static str, detail: impl Into<String>) {
        self.push(Check::pass(rule, detail));
    }
    pub fn fail(&mut self, rule: &'static str, reason: Unprotected, detail: impl Into<String>) {
        self.push(Check::fail(rule, reason, detail));
    }
    pub fn note(&mut self, rule: &'static str, detail: impl Into<String>) {
        self.push(Check::note(rule, detail));
    }
}

/// The leader-election Lease of podha's replicas, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderLease {
    pub namespace: String,
    pub name: String,
    pub holder: Option<String>,
    /// How long ago it was renewed, by this machine's clock (`None`: never renewed).
    pub renewed_ago: Option<Duration>,
    /// How long it lasts after a renewal.
    pub lasts: Duration,
}

impl LeaderLease {
    /// A replica holds it and renewed it within its duration: podha runs and leads.
    pub fn held(&self) -> bool {
        self.holder.as_deref().is_some_and(|h| !h.is_empty())
            && self.renewed_ago.is_some_and(|ago| ago <= self.lasts)
    }
}

/// What the asker knows of podha's own leadership.
#[derive(Clone, Copy, Debug)]
pub enum Operator<'a> {
    /// A reader of the API: podha's leader Lease as read (`None`: there is none).
    Lease(Option<&'a LeaderLease>),
    /// The operator itself, while it leads (only the leader counts coverage).
    Leading,
}

/// What every answer reads: the policies in name order, their statuses, the decision view,
/// podha's leadership.
pub struct Cluster<'a> {
    pub policies: Vec<PolicyRef<'a>>,
    /// Policies that cannot be read, with why.
    pub unreadable: &'a BTreeMap<String, String>,
    pub statuses: &'a BTreeMap<String, PodHAPolicyStatus>,
    pub view: &'a View,
    pub operator: Operator<'a>,
    pub now: Instant,
    /// What the operator judges of its nodes, when it is the one asking (`None` for a reader
    /// of the API, who has the policies' statuses only).
    pub seen: Option<Seen<'a>>,
    /// What each node's pods share, once worked out: the planner's verdict on the node's
    /// foreseen death, and the proof its fence would need.
    foreseen: RefCell<BTreeMap<String, Rc<Option<NodeVerdict>>>>,
    proofs: RefCell<BTreeMap<String, Vec<Check>>>,
    /// The unreadable policies' names, as the planner reads them.
    unreadable_names: Vec<String>,
    /// Nodes that advertise an agent, and those of them with a watchdog and a fresh Lease.
    agents: OnceCell<(usize, usize)>,
}

impl<'a> Cluster<'a> {
    pub fn new(
        policies: Vec<PolicyRef<'a>>,
        unreadable: &'a BTreeMap<String, String>,
        statuses: &'a BTreeMap<String, PodHAPolicyStatus>,
        view: &'a View,
        operator: Operator<'a>,
        now: Instant,
    ) -> Self {
        Self {
            policies,
            unreadable,
            statuses,
            view,
            operator,
            now,
            seen: None,
            foreseen: RefCell::default(),
            unreadable_names: unreadable.keys().cloned().collect(),
            proofs: RefCell::default(),
            agents: OnceCell::new(),
        }
    }

    /// The same cluster, asked by the operator, which judges its nodes itself.
    pub fn seen(mut self, seen: Seen<'a>) -> Self {
        self.seen = Some(seen);
        self
    }

    /// What the planner would do were `node` judged dead now (`planner::foresee`), worked
    /// out the first time.
    pub fn foreseen(&self, node: &str) -> Rc<Option<NodeVerdict>> {
        remembered(&self.foreseen, node, || {
            Rc::new(foresee(
                &self.policies,
                &self.unreadable_names,
                self.view,
                self.seen,
                node,
                self.now,
            ))
        })
    }

    /// `node`'s proof checks, worked out by `work` the first time.
    fn proof_of(&self, node: &str, work: impl FnOnce() -> Vec<Check>) -> Vec<Check> {
        remembered(&self.proofs, node, work)
    }
}

/// What `memo` holds for `node`, worked out by `work` (and kept) the first time.
fn remembered<T: Clone>(
    memo: &RefCell<BTreeMap<String, T>>,
    node: &str,
    work: impl FnOnce() -> T,
) -> T {
    if let Some(known) = memo.borrow().get(node) {
        return known.clone();
    }
    let value = work();
    memo.borrow_mut().insert(node.to_string(), value.clone());
    value
}

/// A duration as people read it: whole seconds from 10 s on, tenths below.
pub fn human(d: Duration) -> String {
    if d >= Duration::from_secs(10) {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}
