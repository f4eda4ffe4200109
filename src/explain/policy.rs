//! A policy: its choices, its conditions, how many of the pods it selects it would fail over
//! now (and why not the others), its recent failovers from its status, and its events while
//! the API server keeps them.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;

use super::{Cluster, Error, human};
use crate::protection::pod::detection_text;
use crate::protection::{Coverage, coverage};

/// How long the API server keeps events unless told otherwise (kube-apiserver `--event-ttl`).
pub const EVENT_TTL_DEFAULT: &str = "1h";

/// The answer about one policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyExplanation {
    pub policy: String,
    /// The spec's choices, one line each.
    pub choices: Vec<(String, String)>,
    pub conditions: Vec<ConditionLine>,
    pub watched_nodes: i32,
    pub failed_nodes: i32,
    pub suspect_nodes: i32,
    pub coverage: Coverage,
    pub failovers: Vec<FailoverLine>,
    pub events: Vec<EventLine>,
    /// Why the events could not be read, if they could not.
    pub events_unread: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionLine {
    pub kind: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// One failover from the policy's status, with each phase's time since the detection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverLine {
    pub node: String,
    pub phase: String,
    pub detected_at: String,
    pub last_seen_alive_before: Option<String>,
    pub acted_after: Option<String>,
    pub detached_after: Option<String>,
    pub recovered_after: Option<String>,
    pub pods: Vec<String>,
    pub message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventLine {
    pub time: String,
    pub kind: String,
    pub reason: String,
    pub count: i32,
    pub message: String,
}

/// `None` when the policy does not exist. `events` are the policy's events as read, or why
/// they could not be.
pub fn explain_policy(
    cluster: &Cluster<'_>,
    name: &str,
    events: Result<Vec<EventLine>, String>,
) -> Option<PolicyExplanation> {
    let policy = *cluster.policies.iter().find(|p| p.name == name)?;
    let spec = policy.spec;
    let status = cluster.statuses.get(name).cloned().unwrap_or_default();
    let choices = vec![
        ("action".to_string(), spec.action.as_str().to_string()),
        (
            "fencing.proof".to_string(),
            spec.fencing.proofs().describe(),
        ),
        ("detection".to_string(), detection_text(policy)),
        (
            "safety".to_string(),
            format!(
                "maxUnhealthy {}, unhealthyWindow {}, requireTarget {}",
                match &spec.safety.max_unhealthy {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) =>
                        n.to_string(),
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) =>
                        s.clone(),
                },
                spec.safety.unhealthy_window,
                spec.safety.require_target
            ),
        ),
        ("dryRun".to_string(), spec.dry_run.to_string()),
    ];
    let conditions = status
        .conditions
        .iter()
        .map(|c| ConditionLine {
            kind: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect();
    Some(PolicyExplanation {
        policy: name.to_string(),
        choices,
        conditions,
        watched_nodes: status.watched_nodes,
        failed_nodes: status.failed_nodes,
        suspect_nodes: status.suspect_nodes,
        coverage: coverage(cluster).remove(name).unwrap_or_default(),
        failovers: status.recent_failovers.iter().map(failover_line).collect(),
        events_unread: events.as_ref().err().cloned(),
        events: events.unwrap_or_default(),
    })
}

fn failover_line(r: &crate::api::FailoverRecord) -> FailoverLine {
    let after = |t: &Option<Time>| {
        t.as_ref().map(|t| {
            let d = t.0.duration_since(r.detected_at.0);
            human(std::time::Duration::try_from(d).unwrap_or_default())
        })
    };
    FailoverLine {
        node: r.node.clone(),
        phase: format!("{:?}", r.phase),
        detected_at: r.detected_at.0.to_string(),
        last_seen_alive_before: r.last_seen_alive.as_ref().map(|t| {
            let d = r.detected_at.0.duration_since(t.0);
            human(std::time::Duration::try_from(d).unwrap_or_default())
        }),
        acted_after: after(&r.acted_at),
        detached_after: after(&r.detached_at),
        recovered_after: after(&r.recovered_at),
        pods: r.pods.clone(),
        message: r.message.clone(),
    }
}

/// The policy's events, oldest first (podha writes them in the `default` namespace: the
/// policy is cluster-scoped).
pub async fn read_events(client: &Client, policy: &str) -> Result<Vec<EventLine>, Error> {
    let fields = format!("involvedObject.kind=PodHAPolicy,involvedObject.name={policy}");
    let list = Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&fields))
        .await
        .map_err(|source| Error::Kube {
            what: format!("listing the events of PodHAPolicy {policy}"),
            source,
        })?;
    let mut events: Vec<(Option<Timestamp>, EventLine)> = list
        .items
        .into_iter()
        .map(|e| {
            let at = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0));
            let line = EventLine {
                time: at.map(|t| t.to_string()).unwrap_or_default(),
                kind: e.type_.unwrap_or_default(),
                reason: e.reason.unwrap_or_default(),
                count: e
                    .series
                    .as_ref()
                    .and_then(|s| s.count)
                    .or(e.count)
                    .unwrap_or(1),
                message: e.message.unwrap_or_default(),
            };
            (at, line)
        })
        .collect();
    events.sort_by_key(|e| e.0);
    Ok(events.into_iter().map(|(_, line)| line).collect())
}
