//! The writer task: the decision loop sends it actions, events and status updates; it performs
//! them with bounded concurrency, only while this replica leads, and reports action results.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::actuator::{Actuator, Outcome};
use crate::api::{PodHAPolicy, PodHAPolicyStatus};
use crate::metrics::Metrics;
use crate::planner::Intent;

/// Writes in flight at once: enough to delete the pods of many nodes in parallel, few enough
/// not to flood the API server.
const MAX_IN_FLIGHT: usize = 32;

/// A Kubernetes Event to publish.
#[derive(Clone, Debug)]
pub struct EventNote {
    pub regarding: ObjectReference,
    pub warning: bool,
    /// CamelCase reason, e.g. `PodForceDeleted`.
    pub reason: &'static str,
    /// What podha did or would do, e.g. `ForceDelete`.
    pub action: &'static str,
    pub note: String,
}

#[derive(Debug)]
pub enum Write {
    Act(Intent),
    Event(EventNote),
    Status {
        policy: String,
        status: PodHAPolicyStatus,
    },
}

/// The result of an action, sent back to the decision loop.
#[derive(Debug)]
pub struct ActResult {
    pub intent: Intent,
    /// `Err` carries the error text for logs; the metric is already counted.
    pub result: Result<Outcome, String>,
}

pub struct Writer {
    client: Client,
    actuator: Actuator,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    is_leader: watch::Receiver<bool>,
}

impl Writer {
    pub fn new(
        client: Client,
        reporter: Reporter,
        metrics: Arc<Metrics>,
        is_leader: watch::Receiver<bool>,
    ) -> Self {
        Self {
            actuator: Actuator::new(client.clone()),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            is_leader,
        }
    }

    /// Runs until the decision loop drops its sender.
    pub async fn run(self, mut writes: mpsc::Receiver<Write>, results: mpsc::Sender<ActResult>) {
        let this = Arc::new(self);
        let mut tasks = JoinSet::new();
        while let Some(write) = writes.recv().await {
            while tasks.len() >= MAX_IN_FLIGHT {
                tasks.join_next().await;
            }
            let this = this.clone();
            let results = results.clone();
            tasks.spawn(async move { this.perform(write, &results).await });
            // Reap finished tasks so the set does not grow while the loop is busy.
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    }

    fn leading(&self) -> bool {
        *self.is_leader.borrow()
    }

    async fn perform(&self, write: Write, results: &mpsc::Sender<ActResult>) {
        match write {
            Write::Act(intent) => {
                let result = if self.leading() {
                    self.act(&intent).await
                } else {
                    self.metrics.inc_intents_dropped(intent_kind(&intent));
                    Err("not the leader any more".to_string())
                };
                // The decision loop ending first is a shutdown; nothing to report to.
                let _ = results.send(ActResult { intent, result }).await;
            }
            Write::Event(note) => {
                if self.leading() {
                    self.publish(note).await;
                }
            }
            Write::Status { policy, status } => {
                if self.leading() {
                    self.patch_status(&policy, status).await;
                }
            }
        }
    }

    async fn act(&self, intent: &Intent) -> Result<Outcome, String> {
        match self.actuator.execute(intent).await {
            Ok(outcome) => {
                debug!(?intent, ?outcome, "action done");
                Ok(outcome)
            }
            Err(e) => {
                self.metrics.inc_api_errors(intent_kind(intent));
                warn!(?intent, error = %e, cause = e.label(), "action failed; will retry");
                Err(e.to_string())
            }
        }
    }

    async fn publish(&self, note: EventNote) {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.to_string(),
            note: Some(note.note),
            action: note.action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &note.regarding).await {
            self.metrics.inc_api_errors("create_event");
            debug!(error = %e, reason = note.reason, "event not published");
        }
    }

    async fn patch_status(&self, policy: &str, status: PodHAPolicyStatus) {
        let api: Api<PodHAPolicy> = Api::all(self.client.clone());
        let patch = serde_json::json!({ "status": status });
        if let Err(e) = api
            .patch_status(policy, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            self.metrics.inc_api_errors("patch_status");
            warn!(policy, error = %e, "status not written");
        }
    }
}

/// Bounded label for an intent.
pub const fn intent_kind(intent: &Intent) -> &'static str {
    match intent {
        Intent::MarkPodNotReady { .. } => "mark_pod_not_ready",
        Intent::ForceDeletePod { .. } => "delete_pod",
        Intent::TaintNode { .. } => "taint_node",
        Intent::RemoveTaint { .. } => "untaint_node",
        Intent::Hold { .. } => "hold",
    }
}
