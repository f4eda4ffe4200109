//! The writer task: the decision loop sends it actions, events and status updates; it performs
//! them with bounded concurrency, only while this replica leads, and reports action results.
//! Actions and reports (events, status) travel in separate lanes, each with its own channel and
//! its own bound on requests in flight, so an action never waits behind a report: a 50-node
//! failure produces hundreds of events, and the deletes must not queue behind them. Reports
//! also wait while any action is queued or in flight: the API server queues one client's
//! requests in order (API Priority and Fairness), so reports sent beside actions would still
//! slow them down. An action not done within its deadline counts as failed, so the decision
//! loop retries it and the reports go on. The deadline is shorter than the leader's step-down
//! margin and leadership is checked before every request (see [`Actuator`]), so a replica that
//! lost leadership sends nothing more, and a request it sent just before has been given up on the
//! client side before another replica can lead (`src/leader/`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::actuator::{ActError, Actuator, Outcome, RetryPolicy};
use super::events::EventPublisher;
use crate::api::{ListedPolicy, PodHAPolicyStatus};
use crate::leader::Leadership;
use crate::metrics::{ActionKind, ApiOperation, Metrics};
use crate::planner::Intent;

/// Actions in flight at once: enough to delete the pods of many nodes in parallel, few enough
/// not to flood the API server.
const MAX_ACTS_IN_FLIGHT: usize = 32;
/// How long one action may take before it counts as failed (and is retried by the decision
/// loop), given the leader's step-down margin: four fifths of it. Every action is idempotent, so
/// a retry after a request that did land finds the work done. Without a deadline a request the
/// API server never answers would hold its slot, and every report, until the connection fails;
/// a deadline longer than the margin would let a replica that lost leadership send its requests
/// on while another replica already leads.
pub fn action_deadline(step_down_margin: Duration) -> Duration {
    step_down_margin * 4 / 5
}
/// How long an action on a node's BMC may take: a BMC answers in seconds, and a power action
/// takes a few requests (the Secret, the system, the reset). Longer than [`action_deadline`]:
/// what keeps a replica that lost leadership from resetting a machine is the claim asked right
/// before the reset goes out (`redfish::Bmc::reset_if`); the request itself may still take up
/// to the BMC call's timeout to be sent (a new connection), and then says what the new leader
/// would say of the same dead node.
pub const POWER_ACTION_DEADLINE: Duration = Duration::from_secs(25);
/// Events and status patches in flight at once (when no action is).
const MAX_REPORTS_IN_FLIGHT: usize = 4;
/// Room in each lane's channel.
const LANE_CAPACITY: usize = 4096;

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

/// An action and the node it is about, as the decision loop last saw it (a node patch builds
/// on it).
#[derive(Debug)]
pub struct Act {
    intent: Intent,
    node: Option<Arc<Node>>,
}

/// What the writer reports: an event or a policy's status.
#[derive(Debug)]
pub enum Report {
    Event(EventNote),
    Status {
        policy: String,
        status: PodHAPolicyStatus,
    },
}

/// The decision loop's end of the two lanes.
#[derive(Clone)]
pub struct Lanes {
    acts: mpsc::Sender<Act>,
    reports: mpsc::Sender<Report>,
}

/// The writer's end of the two lanes.
pub struct LaneReceivers {
    acts: mpsc::Receiver<Act>,
    reports: mpsc::Receiver<Report>,
}

/// A pair of lanes from the decision loop to the writer.
pub fn lanes() -> (Lanes, LaneReceivers) {
    let (acts_tx, acts) = mpsc::channel(LANE_CAPACITY);
    let (reports_tx, reports) = mpsc::channel(LANE_CAPACITY);
    let tx = Lanes {
        acts: acts_tx,
        reports: reports_tx,
    };
    (tx, LaneReceivers { acts, reports })
}

impl Lanes {
    /// Queues an action, waiting for room. A closed lane means shutdown: the action is dropped.
    pub async fn act(&self, intent: Intent, node: Option<Arc<Node>>) {
        let _ = self.acts.send(Act { intent, node }).await;
    }

    /// Queues a report, waiting for room. A closed lane means shutdown: the report is dropped.
    pub async fn report(&self, report: Report) {
        let _ = self.reports.send(report).await;
    }

    /// Queues a report without waiting; a full lane drops it.
    pub fn try_report(&self, report: Report) {
        let _ = self.reports.try_send(report);
    }
}

impl LaneReceivers {
    /// The events queued in the report lane now (for tests of the decision loop).
    #[cfg(test)]
    pub fn queued_events(&mut self) -> Vec<EventNote> {
        std::iter::from_fn(|| self.reports.try_recv().ok())
            .filter_map(|r| match r {
                Report::Event(note) => Some(note),
                Report::Status { .. } => None,
            })
            .collect()
    }

    /// Every report queued in the report lane now (for tests of the decision loop).
    #[cfg(test)]
    pub fn queued_reports(&mut self) -> Vec<Report> {
        std::iter::from_fn(|| self.reports.try_recv().ok()).collect()
    }

    /// The intents queued in the action lane now (for tests of the decision loop).
    #[cfg(test)]
    pub fn queued_intents(&mut self) -> Vec<Intent> {
        std::iter::from_fn(|| self.acts.try_recv().ok())
            .map(|a| a.intent)
            .collect()
    }
}

/// Where the writer sends action results. Unbounded, because the decision loop, the lanes and
/// this channel form a cycle: the loop waits for room in the action lane while it sends one
/// tick's intents, the writer's action tasks would wait for room here, and the loop reads here
/// only after the tick. With bounded room a tick of more intents than all the buffers hold (a
/// mass failure with many Ready pods) stops all three for good. The loop keeps at most one
/// action per key in flight, so what waits here is bounded by the actions it sent.
pub type ResultSender = mpsc::UnboundedSender<ActResult>;

/// The decision loop's end of [`ResultSender`].
pub type ResultReceiver = mpsc::UnboundedReceiver<ActResult>;

/// A channel for action results; see [`ResultSender`].
pub fn results() -> (ResultSender, ResultReceiver) {
    mpsc::unbounded_channel()
}

/// The result of an action, sent back to the decision loop.
#[derive(Debug)]
pub struct ActResult {
    pub intent: Intent,
    /// `Err` tells what failed and whether a retry may help ([`ActError::retry`]); the metrics
    /// are already counted and the failure logged.
    pub result: Result<Outcome, ActError>,
}

pub struct Writer {
    client: Client,
    actuator: Actuator,
    events: EventPublisher,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    /// See [`action_deadline`].
    action_deadline: Duration,
}

impl Writer {
    /// A writer that acts while `leadership` lets it write; `step_down_margin` is the leader's
    /// ([`crate::leader::LeaderConfig::step_down_margin`]); `namespace` is podha's own, the one
    /// BMC Secrets are read from.
    pub fn new(
        client: Client,
        reporter: Reporter,
        metrics: Arc<Metrics>,
        leadership: Leadership,
        step_down_margin: Duration,
        namespace: &str,
    ) -> Self {
        Self {
            actuator: Actuator::new(client.clone(), leadership.clone(), namespace),
            events: EventPublisher::new(client.clone(), reporter),
            client,
            metrics,
            leadership,
            action_deadline: action_deadline(step_down_margin),
        }
    }

    /// Runs until the decision loop drops its lanes.
    pub async fn run(self, lanes: LaneReceivers, results: ResultSender) {
        let this = Arc::new(self);
        // Actions received and not finished.
        let (busy, idle) = watch::channel(0_usize);
        tokio::join!(
            this.clone().serve_acts(lanes.acts, results, busy),
            this.serve_reports(lanes.reports, idle),
        );
    }

    /// Performs actions in order of arrival, at most [`MAX_ACTS_IN_FLIGHT`] at once.
    async fn serve_acts(
        self: Arc<Self>,
        mut lane: mpsc::Receiver<Act>,
        results: ResultSender,
        busy: watch::Sender<usize>,
    ) {
        let busy = Arc::new(busy);
        let mut tasks = JoinSet::new();
        while let Some(act) = lane.recv().await {
            // An action on a BMC asks the API server for one Secret: the reports need not wait
            // for it (a BMC that does not answer holds it for seconds).
            let counted = usize::from(!act.intent.is_power());
            busy.send_modify(|n| *n += counted);
            while tasks.len() >= MAX_ACTS_IN_FLIGHT {
                tasks.join_next().await;
            }
            let this = self.clone();
            let results = results.clone();
            let busy = busy.clone();
            tasks.spawn(async move {
                this.perform_act(act, &results).await;
                busy.send_modify(|n| *n -= counted);
            });
            // Reap finished tasks so the set does not grow while the loop is busy.
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Performs reports in order of arrival, at most [`MAX_REPORTS_IN_FLIGHT`] at once, and
    /// none while an action is queued or in flight.
    async fn serve_reports(
        self: Arc<Self>,
        mut lane: mpsc::Receiver<Report>,
        mut idle: watch::Receiver<usize>,
    ) {
        let mut tasks = JoinSet::new();
        while let Some(report) = lane.recv().await {
            while tasks.len() >= MAX_REPORTS_IN_FLIGHT {
                tasks.join_next().await;
            }
            // The sender lives as long as the action lane; if it is gone, so is the writer.
            let _ = idle.wait_for(|busy| *busy == 0).await;
            let this = self.clone();
            tasks.spawn(async move { this.perform_report(report).await });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    }

    fn leading(&self) -> bool {
        self.leadership.may_write(Instant::now())
    }

    async fn perform_act(&self, act: Act, results: &ResultSender) {
        let Act { intent, node } = act;
        let result = if self.leading() {
            self.act(&intent, node.as_deref()).await
        } else {
            Err(ActError::NotLeader)
        };
        // Refused before the action or during it: either way the claim no longer covered it.
        if matches!(result, Err(ActError::NotLeader)) {
            count_dropped(&self.metrics, &intent);
        }
        // The decision loop ending first is a shutdown; nothing to report to.
        let _ = results.send(ActResult { intent, result });
    }

    async fn perform_report(&self, report: Report) {
        if !self.leading() {
            return;
        }
        match report {
            Report::Event(note) => self.publish(note).await,
            Report::Status { policy, status } => self.patch_status(&policy, status).await,
        }
    }

    async fn act(&self, intent: &Intent, seen: Option<&Node>) -> Result<Outcome, ActError> {
        // The decision loop reports holds and never sends them; one sent anyway asks nothing
        // of the API server, so it is neither timed nor counted as an error.
        let Some(kind) = intent_kind(intent) else {
            return Err(ActError::NotAnAction);
        };
        let started = tokio::time::Instant::now();
        let deadline = if intent.is_power() {
            POWER_ACTION_DEADLINE
        } else {
            self.action_deadline
        };
        let result = tokio::time::timeout(deadline, self.actuator.execute(intent, seen))
            .await
            .unwrap_or(Err(ActError::TimedOut(deadline)));
        self.metrics
            .writes
            .observe_action_requests(kind, started.elapsed());
        match result {
            Ok(outcome) => {
                debug!(?intent, ?outcome, "action done");
                Ok(outcome)
            }
            Err(ActError::NotLeader) => {
                debug!(?intent, "leadership lost during the action; dropped");
                Err(ActError::NotLeader)
            }
            Err(e) if e.not_off_yet() => {
                debug!(?intent, error = %e, "the BMC does not say Off yet; will read again");
                Err(e)
            }
            Err(e) => {
                self.metrics
                    .writes
                    .inc_api_errors(ApiOperation::Action(kind));
                let cause = e.metric_label();
                match e.retry() {
                    RetryPolicy::Retry | RetryPolicy::Poll => {
                        warn!(?intent, error = %e, cause, "action failed; will retry");
                    }
                    // RBAC or an invalid request: only a change to the cluster or to podha helps.
                    RetryPolicy::GiveUp => {
                        error!(?intent, error = %e, cause, "action refused; no retry can fix it");
                    }
                }
                Err(e)
            }
        }
    }

    async fn publish(&self, note: EventNote) {
        if let Err(e) = self.events.publish(&note).await {
            self.metrics
                .writes
                .inc_api_errors(ApiOperation::CreateEvent);
            debug!(error = %e, reason = note.reason, "event not published");
        }
    }

    async fn patch_status(&self, policy: &str, status: PodHAPolicyStatus) {
        let api: Api<ListedPolicy> = Api::all(self.client.clone());
        let patch = serde_json::json!({ "status": status });
        if let Err(e) = api
            .patch_status(policy, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            self.metrics
                .writes
                .inc_api_errors(ApiOperation::PatchStatus);
            warn!(policy, error = %e, "status not written");
        }
    }
}

/// Counts an intent this replica does not carry out because it does not lead: planned while
/// following (the decision loop), or refused by the claim before or during its action (the
/// writer). The one place `podha_intents_dropped_total` is counted.
pub fn count_dropped(metrics: &Metrics, intent: &Intent) {
    if let Some(kind) = intent_kind(intent) {
        metrics.actions.inc_intents_dropped(kind);
    }
}

/// The kind of action an intent asks for; none for a hold, which asks for nothing.
pub const fn intent_kind(intent: &Intent) -> Option<ActionKind> {
    match intent {
        Intent::MarkPodNotReady { .. } => Some(ActionKind::MarkPodNotReady),
        Intent::ForceDeletePod { .. } => Some(ActionKind::DeletePod),
        Intent::TaintNode { .. } => Some(ActionKind::TaintNode),
        Intent::RemoveTaint { .. } => Some(ActionKind::UntaintNode),
        Intent::RequestFence { .. } => Some(ActionKind::RequestFence),
        Intent::WithdrawFenceRequest { .. } => Some(ActionKind::WithdrawFenceRequest),
        Intent::PowerOff { .. } => Some(ActionKind::PowerOff),
        Intent::ConfirmPowerOff { .. } => Some(ActionKind::ConfirmPowerOff),
        Intent::PowerOn { .. } => Some(ActionKind::PowerOn),
        Intent::Hold { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use podha_fake_api::{FakeApi, Reply};

    fn note() -> EventNote {
        EventNote {
            regarding: ObjectReference::default(),
            warning: false,
            reason: "Test",
            action: "Test",
            note: String::new(),
        }
    }

    /// A writer on a fake API server that holds requests for nodes until `release` is
    /// notified, and answers everything 404.
    fn writer_on_fake_api(release: Arc<tokio::sync::Notify>) -> (Writer, FakeApi) {
        let (claim, leadership) = crate::leader::channel();
        claim.send_replace(Some(crate::leader::Claim::for_tests()));
        let api = fake_api(release);
        (writer_on(api.client(), leadership), api)
    }

    /// The API server of [`writer_on_fake_api`].
    fn fake_api(release: Arc<tokio::sync::Notify>) -> FakeApi {
        let held = release.clone();
        FakeApi::new()
            .on(Method::GET, "/api/v1/nodes/*", move |_| {
                Reply::status(404, "NotFound").after(held.clone())
            })
            .on(Method::PATCH, "/api/v1/nodes/*", move |_| {
                Reply::status(404, "NotFound").after(release.clone())
            })
    }

    /// The default leader settings' step-down margin.
    fn margin() -> Duration {
        crate::leader::LeaderConfig::new("podha-system", "me").step_down_margin()
    }

    fn writer_on(client: Client, leadership: Leadership) -> Writer {
        let reporter = Reporter {
            controller: "podha-test".into(),
            instance: None,
        };
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        Writer::new(client, reporter, metrics, leadership, margin(), "default")
    }

    #[tokio::test]
    async fn no_report_is_sent_while_an_action_is_in_flight() {
        let release = Arc::new(tokio::sync::Notify::new());
        let (writer, api) = writer_on_fake_api(release.clone());
        let (tx, rx) = lanes();
        let (results_tx, mut results) = results();
        tokio::spawn(writer.run(rx, results_tx));

        let untaint = Intent::RemoveTaint {
            node: "node-1".into(),
        };
        tx.act(untaint, None).await;
        tx.report(Report::Event(note())).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            api.lines(),
            ["GET /api/v1/nodes/node-1"],
            "the event waits while the action is in flight"
        );

        release.notify_one();
        let result = results.recv().await.expect("the action's result");
        assert!(result.result.is_err(), "the fake API answers 404");
        for _ in 0..50 {
            if api.requests().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seen = api.lines();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(
            seen[1].starts_with("POST ") && seen[1].ends_with("/events"),
            "{seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_action_fails_within_the_step_down_margin_and_frees_the_reports() {
        // Never notified: the API server never answers for nodes.
        let release = Arc::new(tokio::sync::Notify::new());
        let (writer, api) = writer_on_fake_api(release);
        let (tx, rx) = lanes();
        let (results_tx, mut results) = results();
        tokio::spawn(writer.run(rx, results_tx));

        let started = tokio::time::Instant::now();
        let untaint = Intent::RemoveTaint {
            node: "node-1".into(),
        };
        tx.act(untaint, None).await;
        tx.report(Report::Event(note())).await;
        // A replica that lost leadership while its request hangs must have given up on it
        // before another replica can lead.
        let result = tokio::time::timeout(margin(), results.recv())
            .await
            .expect("the action gives up within the step-down margin")
            .expect("the action's result");
        let error = result.result.expect_err("no answer is a failure");
        assert!(error.to_string().contains("no answer"), "{error}");
        assert_eq!(error.retry(), RetryPolicy::Retry);
        assert_eq!(started.elapsed(), action_deadline(margin()));
        for _ in 0..50 {
            if api.requests().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seen = api.lines();
        assert!(
            seen.get(1)
                .is_some_and(|l| l.starts_with("POST ") && l.ends_with("/events")),
            "the event goes out once the action gave up: {seen:?}"
        );
    }

    /// Leadership is lost while a taint is refused with a conflict: the writer must not read the
    /// node and patch it again.
    #[tokio::test]
    async fn a_taint_retried_on_conflict_stops_once_leadership_is_lost() {
        let (leader_tx, leadership) = crate::leader::channel();
        leader_tx.send_replace(Some(crate::leader::Claim::for_tests()));
        let api = FakeApi::new()
            .on(Method::PATCH, "/api/v1/nodes/node-1", move |_| {
                // Leadership goes while the API server refuses the first write.
                leader_tx.send_replace(None);
                Reply::status(409, "Conflict")
            })
            .on(Method::GET, "/api/v1/nodes/node-1", |_| {
                Reply::json(
                    200,
                    serde_json::json!({"kind": "Node", "apiVersion": "v1",
                        "metadata": {"name": "node-1", "resourceVersion": "2"}}),
                )
            });
        let writer = writer_on(api.client(), leadership);
        let (tx, rx) = lanes();
        let (results_tx, mut results) = results();
        tokio::spawn(writer.run(rx, results_tx));

        let mut node = Node::default();
        node.metadata.name = Some("node-1".into());
        node.metadata.resource_version = Some("1".into());
        let taint = Intent::TaintNode {
            node: "node-1".into(),
            policy: "p".into(),
            taint: crate::api::NodeTaint::OutOfService,
            agent_lease_seen: None,
        };
        tx.act(taint, Some(Arc::new(node))).await;
        let result = results.recv().await.expect("the action's result");
        let error = result.result.expect_err("the taint is not applied");
        assert!(error.to_string().contains("not the leader"), "{error}");
        assert_eq!(
            api.lines(),
            ["PATCH /api/v1/nodes/node-1"],
            "no request after leadership was lost"
        );
    }

    /// A claim past its expiry that the election has not withdrawn yet (its task late): the
    /// writer sends neither the action nor the report, and counts the intent as dropped.
    #[tokio::test(start_paused = true)]
    async fn an_expired_claim_sends_nothing() {
        let release = Arc::new(tokio::sync::Notify::new());
        let (claim, leadership) = crate::leader::channel();
        let expires = tokio::time::Instant::now() + Duration::from_secs(1);
        claim.send_replace(Some(crate::leader::Claim::until(expires)));
        let api = fake_api(release);
        let writer = writer_on(api.client(), leadership);
        let metrics = writer.metrics.clone();
        let (tx, rx) = lanes();
        let (results_tx, mut results) = results();
        tokio::spawn(writer.run(rx, results_tx));

        tokio::time::sleep_until(expires).await;
        let untaint = Intent::RemoveTaint {
            node: "node-1".into(),
        };
        tx.act(untaint, None).await;
        tx.report(Report::Event(note())).await;
        let result = results.recv().await.expect("the action's result");
        let error = result.result.expect_err("refused");
        assert!(matches!(error, ActError::NotLeader), "{error}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(api.requests().is_empty(), "no request at all");
        let text = metrics.encode().expect("metrics");
        assert!(
            text.lines()
                .any(|l| l == r#"podha_intents_dropped_total{kind="untaint_node"} 1"#),
            "{text}"
        );
        drop(claim);
    }

    /// The decision loop sends one tick's intents before it reads any result. A tick of more
    /// intents than the action lane, the actions in flight and the result channel hold together
    /// must still go through, not stop the loop and the writer for good.
    #[tokio::test]
    async fn a_tick_of_more_intents_than_the_buffers_hold_goes_through() {
        let release = Arc::new(tokio::sync::Notify::new());
        let (writer, _api) = writer_on_fake_api(release);
        let (tx, rx) = lanes();
        let (results_tx, mut results) = results();
        tokio::spawn(writer.run(rx, results_tx));

        // Pod marks, answered at once (404: the fake API holds only requests for nodes).
        let intents = 3 * LANE_CAPACITY + MAX_ACTS_IN_FLIGHT;
        let tick = async {
            for i in 0..intents {
                let mark = Intent::MarkPodNotReady {
                    pod: crate::view::ObjectKey::new("ns", format!("pod-{i}")),
                    uid: format!("uid-{i}"),
                    node: "node-1".into(),
                    policy: "p".into(),
                };
                tx.act(mark, None).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), tick)
            .await
            .expect("the decision loop stalled sending one tick's intents");
        for _ in 0..intents {
            results.recv().await.expect("a result for every intent");
        }
    }

    #[tokio::test]
    async fn actions_and_reports_travel_in_separate_lanes() {
        let (tx, mut rx) = lanes();
        for _ in 0..3 {
            tx.report(Report::Event(note())).await;
        }
        let untaint = Intent::RemoveTaint {
            node: "node-1".into(),
        };
        tx.act(untaint, None).await;
        assert_eq!(
            rx.queued_intents().len(),
            1,
            "the action is first in its lane, not behind the events"
        );
        assert_eq!(std::iter::from_fn(|| rx.reports.try_recv().ok()).count(), 3);
    }
}
