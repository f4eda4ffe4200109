//! What the decision loop did about failed nodes: pods deleted or left alone, taints added and
//! removed, actions withheld or dropped, and how long each action took from the loop's side.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::{ACTION_BUCKETS, POLICY, register, remove_policy};
use crate::planner::{HoldKind, Skip};

/// A kind of action podha performs against the API server (`runtime::writer::intent_kind`):
/// the `kind` of `podha_intents_dropped_total` and of the action histograms, and an
/// `operation` of `podha_api_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionKind {
    MarkPodNotReady,
    DeletePod,
    TaintNode,
    UntaintNode,
    RequestFence,
    WithdrawFenceRequest,
    PowerOff,
    ConfirmPowerOff,
    PowerOn,
}

impl ActionKind {
    pub const ALL: [ActionKind; 9] = [
        ActionKind::MarkPodNotReady,
        ActionKind::DeletePod,
        ActionKind::TaintNode,
        ActionKind::UntaintNode,
        ActionKind::RequestFence,
        ActionKind::WithdrawFenceRequest,
        ActionKind::PowerOff,
        ActionKind::ConfirmPowerOff,
        ActionKind::PowerOn,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ActionKind::MarkPodNotReady => "mark_pod_not_ready",
            ActionKind::DeletePod => "delete_pod",
            ActionKind::TaintNode => "taint_node",
            ActionKind::UntaintNode => "untaint_node",
            ActionKind::RequestFence => "request_fence",
            ActionKind::WithdrawFenceRequest => "withdraw_fence_request",
            ActionKind::PowerOff => "power_off",
            ActionKind::ConfirmPowerOff => "confirm_power_off",
            ActionKind::PowerOn => "power_on",
        }
    }
}

/// What podha did with the out-of-service taint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaintOperation {
    Add,
    Remove,
}

impl TaintOperation {
    pub const ALL: [TaintOperation; 2] = [TaintOperation::Add, TaintOperation::Remove];

    pub const fn as_str(self) -> &'static str {
        match self {
            TaintOperation::Add => "add",
            TaintOperation::Remove => "remove",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Actions {
    pods_deleted: IntCounterVec,
    pods_skipped: IntCounterVec,
    taints: IntCounterVec,
    actions_held: IntCounterVec,
    intents_dropped: IntCounterVec,
    action_latency: HistogramVec,
}

impl Actions {
    /// Registers the families in `registry`, with the dropped-intent counter of every
    /// [`ActionKind`] at 0: a counter that appears at its first increment is missed by
    /// `increase()`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
        };
        let pods_deleted = counter(
            "podha_pods_deleted_total",
            "Pods force-deleted from a failed node so that their controller recreates them \
             elsewhere, by the kind of their owning controller.",
            &[POLICY, "owner_kind"],
        )?;
        let pods_skipped = counter(
            "podha_pods_skipped_total",
            "Pods on a failed node that podha deliberately left alone, by reason.",
            &[POLICY, "reason"],
        )?;
        let taints = counter(
            "podha_taints_total",
            "Out-of-service taints podha added to failed nodes or removed from recovered ones.",
            &[POLICY, "operation"],
        )?;
        let actions_held = counter(
            "podha_actions_held_total",
            "Failover actions withheld by a safety check (for example more failed nodes than \
             safety.maxUnhealthy allows), by reason.",
            &[POLICY, "reason"],
        )?;
        let intents_dropped = counter(
            "podha_intents_dropped_total",
            "Actions computed while this replica was not the leader, and therefore not \
             performed, by kind of action.",
            &["kind"],
        )?;
        let action_latency = register(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "podha_action_latency_seconds",
                    "Time from the decision loop sending an action to it handling the result: \
                     the requests plus the waits in the writer's queue and the loop's, by kind \
                     of action.",
                )
                .buckets(ACTION_BUCKETS.to_vec()),
                &["kind"],
            )?,
        )?;
        for kind in ActionKind::ALL {
            intents_dropped.with_label_values(&[kind.as_str()]);
        }
        Ok(Self {
            pods_deleted,
            pods_skipped,
            taints,
            actions_held,
            intents_dropped,
            action_latency,
        })
    }

    /// `owner_kind` is bounded by the owner kinds a policy selects.
    pub fn inc_pods_deleted(&self, policy: &str, owner_kind: &str) {
        self.pods_deleted
            .with_label_values(&[policy, owner_kind])
            .inc();
    }

    pub fn inc_pods_skipped(&self, policy: &str, reason: Skip) {
        self.pods_skipped
            .with_label_values(&[policy, reason.as_str()])
            .inc();
    }

    pub fn inc_taints(&self, policy: &str, operation: TaintOperation) {
        self.taints
            .with_label_values(&[policy, operation.as_str()])
            .inc();
    }

    pub fn inc_actions_held(&self, policy: &str, reason: HoldKind) {
        self.actions_held
            .with_label_values(&[policy, reason.as_str()])
            .inc();
    }

    pub fn inc_intents_dropped(&self, kind: ActionKind) {
        self.intents_dropped
            .with_label_values(&[kind.as_str()])
            .inc();
    }

    pub fn observe_action_latency(&self, kind: ActionKind, duration: Duration) {
        self.action_latency
            .with_label_values(&[kind.as_str()])
            .observe(duration.as_secs_f64());
    }

    /// Exports `policy`'s hold counters at 0 until they count.
    pub(super) fn touch_policy(&self, policy: &str) {
        for reason in HoldKind::ALL {
            self.actions_held
                .with_label_values(&[policy, reason.as_str()]);
        }
    }

    pub(super) fn forget_policy(&self, policy: &str) {
        remove_policy(&self.pods_deleted, policy);
        remove_policy(&self.pods_skipped, policy);
        remove_policy(&self.taints, policy);
        remove_policy(&self.actions_held, policy);
    }
}
