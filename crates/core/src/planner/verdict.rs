//! What one round decided about a failed node and about each pod on it, in the planner's own
//! terms: the hold that stops the node, the taint it gets, and each pod's ruling. The intents
//! carry the decisions out; the verdicts say them. `podha explain`, the policies' coverage and
//! `podha_pods` read the verdicts of a foreseen death (see `foresight.rs`), so the rules are
//! written once, here in the planner.

use crate::api::NodeTaint;
use crate::eligibility::OwnerMatch;
use crate::view::ObjectKey;

use super::{HoldReason, Protected, Skip};

/// One failed node, as one round judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVerdict {
    pub node: String,
    /// The node's policy: the first by name whose node selector selects it.
    pub policy: String,
    /// The hold that stops every new action on the node this round, if one is reported (a
    /// settle wait not yet overdue stops the round with none, and judges no pod).
    pub hold: Option<HoldReason>,
    /// The node's policy is in `dryRun`: every action on the node is only said.
    pub rehearsed: bool,
    /// The taint the node gets once its pods may move: the one its policy's action asks for,
    /// or podha's scheduling fence while `spared` must stay.
    pub taint: NodeTaint,
    /// The first pod (in the node's order) the out-of-service taint must not remove.
    pub spared: Option<Protected>,
    /// Every pod on the node that has not finished and was not deleted already; none when the
    /// round stopped before the pods were judged (a pause, a judgement without a confirmed
    /// proof, the settle wait).
    pub pods: Vec<PodVerdict>,
}

impl NodeVerdict {
    /// `uid`'s verdict, if the round judged that pod.
    pub fn pod(&self, uid: &str) -> Option<&PodVerdict> {
        self.pods.iter().find(|p| p.uid == uid)
    }
}

/// One pod on a failed node, as one round judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodVerdict {
    pub pod: ObjectKey,
    pub uid: String,
    /// The pod's policy: the first by name whose selectors all select it.
    pub policy: Option<String>,
    pub ruling: Ruling,
}

/// What happens to a pod on a failed node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ruling {
    /// podha moves it: marks it NotReady, deletes it, or waits for the taint eviction to
    /// (`rehearsed`: a dry run of its policy or of the node's only says it would).
    Moves {
        rehearsed: bool,
        /// The controller kind it is counted under (`crate::eligibility::Eligible`).
        owner: OwnerMatch,
    },
    /// Left where it is, for a reason its policy reports (`podha_pods_skipped_total`).
    Skipped(Skip),
    /// Left where it is: its policy, or the node's, holds every action.
    Held(HoldReason),
    /// No policy selects it.
    NotSelected,
    /// Its own policy does not judge the node dead (yet).
    NotJudgedDead,
}
