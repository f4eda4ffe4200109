//! The only code that changes the cluster on podha's behalf: force-deleting pods, adding or
//! removing the out-of-service taint, and powering a node off through its BMC (`power`). Every write is idempotent and re-checks the live object,
//! so a retry, a restart or a second replica never does harm. Leadership is checked right
//! before every request, not once per action: an action may take several requests (a taint
//! retried on conflict reads and writes again), and leadership may be lost between them.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use super::node_lease;
use crate::api::{NodeTaint, TAINT_MARKER_ANNOTATION};
use crate::contract::{FENCE_REQUEST_ANNOTATION, agent_lease_name, fence_request};
use crate::leader::Leadership;
use crate::planner::{AgentLeaseSeen, Intent};
use crate::redfish::ResetType;
use crate::view::ObjectKey;

use super::power::{Power, PowerError, PowerOutcome, Target};

/// What a write found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The change was made.
    Applied,
    /// Nothing to do: the pod is gone or is another object now (UID precondition), the taint
    /// is already there, or there is no podha taint to remove.
    AlreadyDone,
    /// The pod was marked NotReady; the resourceVersion the mark produced.
    Marked { resource_version: Option<String> },
    /// The pod changed since the version its delete was conditioned on (resourceVersion
    /// precondition): not deleted; the watch will show what changed.
    Changed,
    /// The fence request is on the Node, with this value (the one the agent acknowledges).
    FenceRequested { request: String },
    /// What the node's BMC did or said.
    Power(PowerOutcome),
}

#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    #[error("node {0} changed under us too many times")]
    Conflict(String),
    #[error("no answer within {0:?}")]
    TimedOut(std::time::Duration),
    #[error("a hold is not an action")]
    NotAnAction,
    #[error("not the leader any more")]
    NotLeader,
    #[error(
        "the agent Lease of node {node} is no longer the one podha's view holds (version \
         {seen:?}, now {read:?}): the silence counted through its word waits for the view"
    )]
    AgentLeaseChanged {
        node: String,
        seen: Option<String>,
        read: Option<String>,
    },
    #[error(
        "node {node} renewed its Lease since podha planned its fence request: it still reaches \
         the API server, so no fence was asked (the next round decides again)"
    )]
    NodeLeaseRenewed { node: String },
    #[error(transparent)]
    Power(#[from] PowerError),
}

/// What to do with an action that failed, by what failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryPolicy {
    /// The cause may pass: a conflict, a busy or failing API server, a lost connection, no
    /// answer in time, leadership lost for now.
    Retry,
    /// The request itself is refused (RBAC, an invalid object, a request podha cannot build):
    /// the same request fails the same way until someone changes the cluster or podha.
    GiveUp,
    /// The request was answered, and what it waits for has not happened yet (a BMC that does
    /// not say `Off` yet): asked again at a steady [`crate::backoff::POLL_INTERVAL`] (for a
    /// while), so that the moment it happens is seen within that, not after a doubled delay.
    Poll,
}

impl ActError {
    /// A bounded label for the cause (`podha_api_errors_total{operation}` is labelled by
    /// operation).
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Conflict(_) => "conflict",
            Self::TimedOut(_) => "timeout",
            Self::NotAnAction => "not_an_action",
            Self::NotLeader => "not_leader",
            Self::Power(_) => "bmc",
            Self::AgentLeaseChanged { .. } => "agent_lease_changed",
            Self::NodeLeaseRenewed { .. } => "node_lease_renewed",
        }
    }

    /// A read of a BMC that does not say `Off` yet: the normal wait for a reset to apply, not
    /// a failure of the request.
    pub const fn not_off_yet(&self) -> bool {
        matches!(self, Self::Power(PowerError::NotOff { .. }))
    }

    /// Whether a `ForceOff` may have reached the BMC in a power-off that failed so: the action
    /// ran out of time (before or after sending it, podha cannot tell), or the BMC's answer to
    /// it never came. Every other failure of a power-off sent nothing.
    pub const fn force_off_may_have_gone_out(&self) -> bool {
        matches!(
            self,
            Self::TimedOut(_) | Self::Power(PowerError::ForceOffUnanswered { .. })
        )
    }

    /// Whether sending the same action again may succeed.
    pub fn retry(&self) -> RetryPolicy {
        match self {
            Self::Api(error) => api_retry(error),
            Self::Conflict(_) | Self::TimedOut(_) | Self::NotLeader => RetryPolicy::Retry,
            // The watch catches up, and the planner decides again on what it shows.
            Self::AgentLeaseChanged { .. } | Self::NodeLeaseRenewed { .. } => RetryPolicy::Retry,
            Self::Power(PowerError::NotOff { .. }) => RetryPolicy::Poll,
            Self::Power(error) if error.is_transient() => RetryPolicy::Retry,
            Self::Power(_) => RetryPolicy::GiveUp,
            // A hold sent as an action is a bug of podha's; sending it again repeats it.
            Self::NotAnAction => RetryPolicy::GiveUp,
        }
    }
}

fn api_retry(error: &kube::Error) -> RetryPolicy {
    match error {
        // 401: kube reloads a rotated token for the next request. 408, 409 (a change in
        // between), 429 (API Priority and Fairness) and 5xx: the API server's state or load.
        kube::Error::Api(status) => match status.code {
            401 | 408 | 409 | 429 => RetryPolicy::Retry,
            400..=499 => RetryPolicy::GiveUp,
            _ => RetryPolicy::Retry,
        },
        // The request could not even be built: the same one never can.
        kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => RetryPolicy::GiveUp,
        // The way there or back (connection, TLS, reading or decoding the answer, credentials
        // being refreshed): nothing says the request was wrong.
        _ => RetryPolicy::Retry,
    }
}

/// How often a taint write is retried when the node changed between read and write.
const CONFLICT_RETRIES: usize = 5;

#[derive(Clone)]
pub struct Actuator {
    client: Client,
    leadership: Leadership,
    power: Power,
    /// The agent Leases, in podha's namespace.
    agent_leases: Api<Lease>,
}

impl Actuator {
    /// An actuator that sends a request only while `leadership` lets it write, and reads BMC
    /// Secrets in `namespace` (podha's own) only.
    pub fn new(client: Client, leadership: Leadership, namespace: &str) -> Self {
        Self {
            power: Power::new(client.clone(), namespace),
            agent_leases: Api::namespaced(client.clone(), namespace),
            client,
            leadership,
        }
    }

    /// Whether node `node`'s agent Lease, read now from the API server, is the one podha's view
    /// held when it planned an action resting on its word (see [`AgentLeaseSeen`]). Read by a
    /// list of that one name with no `resourceVersion`: a consistent read (as current as etcd),
    /// with the list and watch podha's role already has on the agent Leases (a `get` of them it
    /// does not have).
    async fn agent_lease_unchanged(
        &self,
        node: &str,
        seen: &AgentLeaseSeen,
    ) -> Result<(), ActError> {
        self.ensure_leading()?;
        let name = agent_lease_name(node);
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        let leases = self.agent_leases.list(&params).await?;
        let read = leases
            .items
            .into_iter()
            .find(|l| l.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|l| l.metadata.resource_version);
        if seen.matches(read.as_deref()) {
            Ok(())
        } else {
            Err(ActError::AgentLeaseChanged {
                node: node.to_string(),
                seen: seen.resource_version.clone(),
                read,
            })
        }
    }

    /// Called right before every request: a replica that lost leadership, or whose claim ran
    /// out, sends nothing more.
    fn ensure_leading(&self) -> Result<(), ActError> {
        if self.leadership.may_write(Instant::now()) {
            Ok(())
        } else {
            Err(ActError::NotLeader)
        }
    }

    /// Carries out one intent. `seen` is the intent's node as the decision loop last saw it, if
    /// any (a taint or untaint builds on it). Holds are not actions.
    pub async fn execute(&self, intent: &Intent, seen: Option<&Node>) -> Result<Outcome, ActError> {
        match intent {
            Intent::MarkPodNotReady { pod, uid, node, .. } => {
                self.mark_not_ready(pod, uid, node).await
            }
            Intent::ForceDeletePod {
                pod,
                uid,
                resource_version,
                ..
            } => {
                self.force_delete_pod(pod, uid, resource_version.as_deref())
                    .await
            }
            Intent::TaintNode {
                node,
                policy,
                taint,
                agent_lease_seen,
            } => {
                // After the read, one write: a conflict is sent again by the writer, read anew.
                let tries = match agent_lease_seen {
                    Some(lease) => {
                        self.agent_lease_unchanged(node, lease).await?;
                        1
                    }
                    None => CONFLICT_RETRIES,
                };
                self.taint(node, policy, *taint, seen, tries).await
            }
            Intent::RemoveTaint { node } => self.untaint(node, seen).await,
            Intent::RequestFence {
                node,
                policy,
                lease_seen,
            } => self.request_fence(node, policy, *lease_seen, seen).await,
            Intent::WithdrawFenceRequest { node } => {
                self.patch_node(node, seen, CONFLICT_RETRIES, withdrawal_patch)
                    .await
            }
            Intent::PowerOff {
                node,
                secret,
                system_uuid,
                ..
            }
            | Intent::PowerOn {
                node,
                secret,
                system_uuid,
                ..
            } => {
                self.ensure_leading()?;
                let mut target = power_target(node, secret, system_uuid);
                if let Intent::PowerOff { lease_seen, .. } = intent {
                    target.lease_seen = *lease_seen;
                }
                let reset = match intent {
                    Intent::PowerOn { .. } => ResetType::On,
                    _ => ResetType::ForceOff,
                };
                let leading = || self.leadership.may_write(Instant::now());
                let outcome = self.power.reset(&target, reset, leading).await?;
                outcome.map(Outcome::Power).ok_or(ActError::NotLeader)
            }
            Intent::ConfirmPowerOff {
                node,
                secret,
                system_uuid,
                ..
            } => {
                let target = power_target(node, secret, system_uuid);
                Ok(Outcome::Power(self.power.read(&target).await?))
            }
            Intent::Hold { .. } => Err(ActError::NotAnAction),
        }
    }

    /// Deletes the pod at once (grace 0), only if it is still the object with `uid` (a
    /// replacement with the same name, a StatefulSet pod, is never touched) and, when
    /// `resource_version` is given, has not changed since that version (`Changed` if it has).
    pub async fn force_delete_pod(
        &self,
        pod: &ObjectKey,
        uid: &str,
        resource_version: Option<&str>,
    ) -> Result<Outcome, ActError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: resource_version.map(str::to_string),
            }),
            ..DeleteParams::default()
        };
        self.ensure_leading()?;
        match api.delete(&pod.name, &params).await {
            Ok(_) => Ok(Outcome::Applied),
            // Gone.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Outcome::AlreadyDone),
            // The pod changed since the marked version, or the name is another pod now; with a
            // version both read as "changed" and the watch decides what follows.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(match resource_version {
                Some(_) => Outcome::Changed,
                None => Outcome::AlreadyDone,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Sets the pod's Ready condition to False, as the node lifecycle controller does for pods
    /// of an unreachable node, guarded by the pod's UID. The version the mark produced comes
    /// back so that the delete can follow at once rather than after the watch shows the mark
    /// (under load the pod watch lags by seconds).
    pub async fn mark_not_ready(
        &self,
        pod: &ObjectKey,
        uid: &str,
        node: &str,
    ) -> Result<Outcome, ActError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let now = k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second);
        let patch = json!({
            "metadata": { "uid": uid },
            "status": { "conditions": [{
                "type": "Ready",
                "status": "False",
                "reason": "NodeFailed",
                "message": format!("podha judged node {node} dead"),
                "lastTransitionTime": now.map(|t| t.to_string()).unwrap_or_default(),
            }]}
        });
        self.ensure_leading()?;
        match api
            .patch_status(
                &pod.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(marked) => Ok(Outcome::Marked {
                resource_version: marked.metadata.resource_version,
            }),
            // Gone, or the name is another pod now (the UID in the patch does not match).
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                Ok(Outcome::AlreadyDone)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Adds the taint and podha's marker (see [`taint_patch`]).
    pub async fn taint(
        &self,
        node: &str,
        policy: &str,
        kind: NodeTaint,
        seen: Option<&Node>,
        tries: usize,
    ) -> Result<Outcome, ActError> {
        self.patch_node(node, seen, tries, |current| {
            (!kind.on(current)).then(|| (taint_patch(current, policy, kind), Outcome::Applied))
        })
        .await
    }

    /// Asks the node's agent for a fence: a new request value on the Node,
    /// `<policy>/<unix ms>/<bootID>`: unique per request (an acknowledgement of an older one
    /// proves nothing now), and naming the boot it is for (an agent of a later boot answers
    /// without fencing: the reboot was the fence). The boot ID is the Node's as last seen, read
    /// here when the decision loop had none. Only while the node's Lease still says what
    /// podha planned on (`lease_seen`): a kubelet that renewed since reaches the API server.
    pub async fn request_fence(
        &self,
        node: &str,
        policy: &str,
        lease_seen: Option<k8s_openapi::jiff::Timestamp>,
        seen: Option<&Node>,
    ) -> Result<Outcome, ActError> {
        self.ensure_leading()?;
        let leases = Api::namespaced(self.client.clone(), super::NODE_LEASE_NAMESPACE);
        if node_lease::renewed_since(&leases, node, lease_seen).await? {
            return Err(ActError::NodeLeaseRenewed {
                node: node.to_string(),
            });
        }
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        self.patch_node(node, seen, CONFLICT_RETRIES, |current| {
            Some(request_patch(current, policy, millis))
        })
        .await
    }

    /// Removes podha's taints (out-of-service, fence) and the marker (see [`untaint_patch`]).
    pub async fn untaint(&self, node: &str, seen: Option<&Node>) -> Result<Outcome, ActError> {
        self.patch_node(node, seen, CONFLICT_RETRIES, untaint_patch)
            .await
    }

    /// Changes `node` with one merge patch that `change` builds on a version of it and guards
    /// with that version's resourceVersion (a merge patch replaces the taint list whole; the
    /// precondition makes that exact). The first try builds on `seen`, the node as the decision
    /// loop last saw it, so the usual case is one request; a conflict reads the node and tries
    /// again, `tries` writes in all. `change` gives the patch and the outcome it stands for, or
    /// `None` when there is nothing to do.
    async fn patch_node(
        &self,
        node: &str,
        seen: Option<&Node>,
        tries: usize,
        change: impl Fn(&Node) -> Option<(serde_json::Value, Outcome)>,
    ) -> Result<Outcome, ActError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut base = seen
            .filter(|n| n.metadata.resource_version.is_some())
            .cloned();
        for _ in 0..tries {
            let current = match base.take() {
                Some(seen) => seen,
                None => {
                    self.ensure_leading()?;
                    api.get(node).await?
                }
            };
            let Some((patch, outcome)) = change(&current) else {
                return Ok(Outcome::AlreadyDone);
            };
            self.ensure_leading()?;
            match api
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(outcome),
                // The node changed since `current`: read it again.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(ActError::Conflict(node.to_string()))
    }
}

/// The merge patch that adds `kind` and podha's marker to `node` as it is in this version.
fn taint_patch(node: &Node, policy: &str, kind: NodeTaint) -> serde_json::Value {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.push(Taint {
        key: kind.key().to_string(),
        value: Some(kind.value().to_string()),
        effect: kind.effect().to_string(),
        time_added: None,
    });
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": { TAINT_MARKER_ANNOTATION: policy },
        },
        "spec": { "taints": taints },
    })
}

/// The merge patch that removes podha's taints and marker from `node` as it is in this
/// version, and what it stands for: `Applied` when a taint of podha's goes, `AlreadyDone` when
/// only the marker is left. `None` without the marker: a taint somebody else put on the node
/// stays.
/// The merge patch that takes podha's fence request off `node` (guarded by its
/// resourceVersion: a request written meanwhile is not lost unseen); `None` without one.
/// The BMC a power intent names.
fn power_target<'a>(node: &'a str, secret: &'a str, system_uuid: &'a Option<String>) -> Target<'a> {
    Target {
        node,
        secret,
        system_uuid: system_uuid.as_deref(),
        lease_seen: None,
    }
}

/// The merge patch that asks for a fence of `node` in the boot this version of it reports,
/// guarded by its resourceVersion: the request names the boot it is for, and an agent takes a
/// request of another boot as answered by the reboot. Built on a stale version (the decision
/// loop's view lagging behind a reboot), it would name the last boot and the new boot's agent
/// would acknowledge it without a fence; the precondition makes that a conflict, and the
/// request is built again on the node as it is.
fn request_patch(node: &Node, policy: &str, millis: u128) -> (serde_json::Value, Outcome) {
    let boot = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map_or("", |i| i.boot_id.as_str());
    let request = fence_request(policy, millis, boot);
    let patch = json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": { FENCE_REQUEST_ANNOTATION: &request },
        },
    });
    (patch, Outcome::FenceRequested { request })
}

fn withdrawal_patch(node: &Node) -> Option<(serde_json::Value, Outcome)> {
    let requested = node.annotations().contains_key(FENCE_REQUEST_ANNOTATION);
    requested.then(|| {
        let patch = json!({
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": { FENCE_REQUEST_ANNOTATION: null },
            },
        });
        (patch, Outcome::Applied)
    })
}

fn untaint_patch(node: &Node) -> Option<(serde_json::Value, Outcome)> {
    let marked = node.annotations().contains_key(TAINT_MARKER_ANNOTATION);
    if !marked {
        return None;
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let before = taints.len();
    let kept: Vec<Taint> = taints
        .into_iter()
        .filter(|t| !NodeTaint::ALL.iter().any(|k| k.key() == t.key))
        .collect();
    let mut patch = json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": { TAINT_MARKER_ANNOTATION: null },
        },
    });
    if kept.len() == before {
        return Some((patch, Outcome::AlreadyDone));
    }
    patch["spec"] = json!({ "taints": kept });
    Some((patch, Outcome::Applied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use podha_fake_api::{FakeApi, Reply};

    #[test]
    fn conflicts_outages_and_lost_leadership_are_retried_refusals_are_not() {
        let api = |code| {
            ActError::Api(kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            ))
        };
        for code in [401, 408, 409, 429, 500, 503, 504] {
            assert_eq!(api(code).retry(), RetryPolicy::Retry, "{code}");
        }
        for code in [400, 403, 404, 405, 422] {
            assert_eq!(api(code).retry(), RetryPolicy::GiveUp, "{code}");
        }
        let unreachable = ActError::Api(kube::Error::Service("connection refused".into()));
        assert_eq!(unreachable.retry(), RetryPolicy::Retry);
        let retried = [
            ActError::Conflict("n".into()),
            ActError::TimedOut(std::time::Duration::from_secs(2)),
            ActError::NotLeader,
        ];
        for error in retried {
            assert_eq!(error.retry(), RetryPolicy::Retry, "{error}");
        }
        assert_eq!(ActError::NotAnAction.retry(), RetryPolicy::GiveUp);
        let labels = [
            api(500).metric_label(),
            ActError::Conflict("n".into()).metric_label(),
            ActError::TimedOut(std::time::Duration::ZERO).metric_label(),
            ActError::NotAnAction.metric_label(),
            ActError::NotLeader.metric_label(),
        ];
        assert_eq!(
            labels,
            ["api", "conflict", "timeout", "not_an_action", "not_leader"]
        );
    }

    /// A fence request planned on a Lease the kubelet renewed since (a watch that lagged) is
    /// not written: the node still reaches the API server. Planned on the Lease as it is, it
    /// goes out.
    #[tokio::test]
    async fn a_lease_renewed_since_the_plan_stops_the_fence_request() {
        let api = FakeApi::new()
            .on(
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n",
                |_| {
                    Reply::json(
                        200,
                        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                               "metadata": {"name": "n", "namespace": "kube-node-lease"},
                               "spec": {"holderIdentity": "n",
                                        "renewTime": "2026-11-27T05:00:10.000000Z"}}),
                    )
                },
            )
            .on(Method::GET, "/api/v1/nodes/n", |_| {
                Reply::json(
                    200,
                    json!({"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": "n", "resourceVersion": "5"}}),
                )
            })
            .on(Method::PATCH, "/api/v1/nodes/n", |_| {
                Reply::json(
                    200,
                    json!({"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": "n", "resourceVersion": "6"}}),
                )
            });
        let actuator = leading_on(&api);
        let request = |seen: &str| Intent::RequestFence {
            node: "n".into(),
            policy: "p".into(),
            lease_seen: Some(seen.parse().expect("time")),
        };
        let stale = actuator
            .execute(&request("2026-11-27T05:00:00.000000Z"), None)
            .await;
        assert!(
            matches!(stale, Err(ActError::NodeLeaseRenewed { .. })),
            "{stale:?}"
        );
        assert!(
            !api.lines().iter().any(|l| l.starts_with("PATCH")),
            "{:?}",
            api.lines()
        );
        let current = actuator
            .execute(&request("2026-11-27T05:00:10.000000Z"), None)
            .await;
        assert!(current.is_ok(), "{current:?}");
        assert!(
            api.lines()
                .iter()
                .any(|l| l.starts_with("PATCH /api/v1/nodes/n")),
            "{:?}",
            api.lines()
        );
    }

    /// The agent Leases of `podha-system`.
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/podha-system/leases";

    /// An actuator that leads for the next hour, on `api`.
    fn leading_on(api: &FakeApi) -> Actuator {
        let (claim, leadership) = crate::leader::channel();
        claim.send_replace(Some(crate::leader::Claim::until(
            Instant::now() + std::time::Duration::from_secs(3600),
        )));
        Actuator::new(api.client(), leadership, "podha-system")
    }

    /// An API server that lists node `n`'s agent Lease at version `version` (`None`: no such
    /// Lease), serves node `n` in version 5, answers every patch of it with a conflict (409)
    /// and anything else with 404.
    fn serving_agent_lease(version: Option<&'static str>) -> (Actuator, FakeApi) {
        let api = FakeApi::new()
            .on(Method::GET, LEASES, move |_| {
                let items: Vec<serde_json::Value> = version
                    .map(|v| {
                        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": "podha-agent-n", "namespace": "podha-system",
                                         "resourceVersion": v}})
                    })
                    .into_iter()
                    .collect();
                Reply::json(
                    200,
                    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                           "metadata": {"resourceVersion": "99"}, "items": items}),
                )
            })
            .on(Method::GET, "/api/v1/nodes/n", |_| {
                Reply::json(200, node_json("5"))
            })
            .on(Method::PATCH, "/api/v1/nodes/n", |_| {
                Reply::status(409, "Conflict")
            });
        (leading_on(&api), api)
    }

    /// Node `n` in version `version`, with no taint.
    fn node_json(version: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "n", "resourceVersion": version}})
    }

    /// The read of node `n`'s agent Lease: a list of that one name, with no `resourceVersion`
    /// (a consistent read).
    fn assert_lease_read(request: &podha_fake_api::Request) {
        assert_eq!(request.line(), format!("GET {LEASES}"));
        assert_eq!(
            request.param("fieldSelector"),
            Some("metadata.name%3Dpodha-agent-n")
        );
        assert_eq!(request.param("resourceVersion"), None, "{request:?}");
    }

    /// A taint resting on the agent Lease's word goes out only while a read from the API
    /// server finds the Lease podha's view held: another version, no Lease, or no version seen
    /// stop it before anything is written, and it is retried.
    #[tokio::test]
    async fn a_taint_on_the_agent_leases_word_waits_for_a_view_the_api_server_confirms() {
        let taint = |seen: Option<&str>| Intent::TaintNode {
            node: "n".into(),
            policy: "p".into(),
            taint: NodeTaint::OutOfService,
            agent_lease_seen: Some(AgentLeaseSeen {
                resource_version: seen.map(str::to_string),
            }),
        };
        let stopped = [
            (Some("8"), Some("7"), "renewed since the view"),
            (None, Some("7"), "no Lease now"),
            (Some("7"), None, "no version seen"),
        ];
        for (serving, seen, what) in stopped {
            let (actuator, api) = serving_agent_lease(serving);
            let result = actuator.execute(&taint(seen), None).await;
            let Err(error) = result else {
                panic!("{what}: {result:?}");
            };
            assert!(
                matches!(&error, ActError::AgentLeaseChanged { node, .. } if node == "n"),
                "{what}: {error}"
            );
            assert_eq!(error.retry(), RetryPolicy::Retry, "{what}");
            assert_eq!(error.metric_label(), "agent_lease_changed");
            let requests = api.requests();
            assert_eq!(requests.len(), 1, "{what}: nothing written: {requests:?}");
            assert_lease_read(&requests[0]);
        }
        // The same version: the taint goes on to the node, one write only (a conflict after
        // the read is the writer's to send again, with a new read).
        let (actuator, api) = serving_agent_lease(Some("7"));
        let result = actuator.execute(&taint(Some("7")), None).await;
        assert!(matches!(result, Err(ActError::Conflict(_))), "{result:?}");
        let requests = api.requests();
        assert_lease_read(&requests[0]);
        assert_eq!(
            api.lines()[1..],
            ["GET /api/v1/nodes/n", "PATCH /api/v1/nodes/n"],
            "{requests:?}"
        );
    }

    /// A claim past its expiry that the election has not withdrawn yet: every kind of action
    /// is refused before its first request.
    #[tokio::test(start_paused = true)]
    async fn an_expired_claim_sends_no_request() {
        let api = FakeApi::new();
        let (claim, leadership) = crate::leader::channel();
        let expires = Instant::now() + std::time::Duration::from_secs(1);
        claim.send_replace(Some(crate::leader::Claim::until(expires)));
        let actuator = Actuator::new(api.client(), leadership, "default");
        tokio::time::sleep_until(expires).await;

        let pod = ObjectKey::new("ns", "db-0");
        let intents = [
            Intent::MarkPodNotReady {
                pod: pod.clone(),
                uid: "u".into(),
                node: "n".into(),
                policy: "p".into(),
            },
            Intent::ForceDeletePod {
                pod,
                uid: "u".into(),
                resource_version: None,
                node: "n".into(),
                policy: "p".into(),
                owner_kind: "StatefulSet".to_string(),
            },
            Intent::TaintNode {
                node: "n".into(),
                policy: "p".into(),
                taint: NodeTaint::OutOfService,
                agent_lease_seen: None,
            },
            Intent::TaintNode {
                node: "n".into(),
                policy: "p".into(),
                taint: NodeTaint::OutOfService,
                agent_lease_seen: Some(AgentLeaseSeen {
                    resource_version: Some("7".into()),
                }),
            },
            Intent::RemoveTaint { node: "n".into() },
            Intent::RequestFence {
                node: "n".into(),
                policy: "p".into(),
                lease_seen: None,
            },
        ];
        for intent in intents {
            let result = actuator.execute(&intent, None).await;
            assert!(
                matches!(result, Err(ActError::NotLeader)),
                "{intent:?}: {result:?}"
            );
        }
        assert!(api.requests().is_empty(), "{:?}", api.lines());
    }

    /// What the API server gets for each write to a pod: a delete at once (grace 0) only of
    /// the pod with the planned UID, and of the version the mark produced when there is one;
    /// a NotReady mark guarded by the UID in the patch itself.
    #[tokio::test]
    async fn pod_writes_carry_their_uid_and_version_preconditions() {
        let pod = "/api/v1/namespaces/ns/pods/db-0";
        let api = FakeApi::new()
            .on(Method::DELETE, pod, |_| {
                Reply::json(200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))
            })
            .on(Method::PATCH, &format!("{pod}/status"), |_| {
                Reply::json(
                    200,
                    json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "db-0", "namespace": "ns", "resourceVersion": "12"}}),
                )
            });
        let actuator = leading_on(&api);
        let key = ObjectKey::new("ns", "db-0");
        let marked = actuator.mark_not_ready(&key, "u-1", "n").await;
        assert!(
            matches!(&marked, Ok(Outcome::Marked { resource_version: Some(v) }) if v == "12"),
            "{marked:?}"
        );
        for version in [None, Some("12")] {
            let deleted = actuator.force_delete_pod(&key, "u-1", version).await;
            assert!(matches!(deleted, Ok(Outcome::Applied)), "{deleted:?}");
        }
        let requests = api.requests();
        assert_eq!(
            api.lines(),
            [
                format!("PATCH {pod}/status"),
                format!("DELETE {pod}"),
                format!("DELETE {pod}")
            ]
        );
        let mark = &requests[0].body;
        assert_eq!(mark["metadata"]["uid"], "u-1", "{mark}");
        let ready = &mark["status"]["conditions"][0];
        assert_eq!(
            (&ready["type"], &ready["status"], &ready["reason"]),
            (&json!("Ready"), &json!("False"), &json!("NodeFailed")),
            "{mark}"
        );
        for (request, version) in requests[1..].iter().zip([None, Some("12")]) {
            let options = &request.body;
            assert_eq!(options["gracePeriodSeconds"], 0, "{options}");
            assert_eq!(options["preconditions"]["uid"], "u-1", "{options}");
            assert_eq!(
                options["preconditions"]
                    .get("resourceVersion")
                    .and_then(|v| v.as_str()),
                version,
                "{options}"
            );
        }
    }

    /// A taint is one merge patch on the node as the decision loop saw it, guarded by that
    /// version; a conflict reads the node and patches the version read.
    #[tokio::test]
    async fn a_taint_is_guarded_by_the_version_it_was_built_on() {
        let patches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let api = FakeApi::new()
            .on(Method::GET, "/api/v1/nodes/n", |_| {
                Reply::json(200, node_json("6"))
            })
            .on(Method::PATCH, "/api/v1/nodes/n", move |_| {
                // The version the loop saw is stale: the first patch conflicts.
                match patches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                    0 => Reply::status(409, "Conflict"),
                    _ => Reply::json(200, node_json("7")),
                }
            });
        let actuator = leading_on(&api);
        let seen: Node = serde_json::from_value(node_json("5")).expect("a Node");
        let taint = Intent::TaintNode {
            node: "n".into(),
            policy: "p".into(),
            taint: NodeTaint::OutOfService,
            agent_lease_seen: None,
        };
        let result = actuator.execute(&taint, Some(&seen)).await;
        assert!(matches!(result, Ok(Outcome::Applied)), "{result:?}");
        assert_eq!(
            api.lines(),
            [
                "PATCH /api/v1/nodes/n",
                "GET /api/v1/nodes/n",
                "PATCH /api/v1/nodes/n"
            ]
        );
        let requests = api.requests();
        for (request, version) in [(&requests[0], "5"), (&requests[2], "6")] {
            let patch = &request.body;
            assert_eq!(patch["metadata"]["resourceVersion"], version, "{patch}");
            assert_eq!(
                patch["metadata"]["annotations"][TAINT_MARKER_ANNOTATION], "p",
                "{patch}"
            );
            assert_eq!(
                patch["spec"]["taints"][0]["key"], "node.kubernetes.io/out-of-service",
                "{patch}"
            );
        }
    }

    #[test]
    fn the_taint_patch_keeps_the_other_taints_and_is_guarded_by_the_version() {
        let mut node = Node::default();
        node.metadata.resource_version = Some("42".into());
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![Taint {
                key: "node.kubernetes.io/unreachable".into(),
                effect: "NoExecute".into(),
                time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time"),
                )),
                value: None,
            }]),
            ..Default::default()
        });
        let patch = taint_patch(&node, "p", NodeTaint::OutOfService);
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(
            patch["metadata"]["annotations"][TAINT_MARKER_ANNOTATION],
            "p"
        );
        let taints = patch["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0]["key"], "node.kubernetes.io/unreachable");
        assert_eq!(
            taints[0]["timeAdded"], "2023-11-14T22:13:20Z",
            "another's taint is written back unchanged"
        );
        assert_eq!(taints[1]["key"], NodeTaint::OutOfService.key());
        assert_eq!(taints[1]["effect"], "NoExecute");
    }

    #[test]
    fn the_untaint_patch_removes_only_podhas_taints_and_marker() {
        let mut node = Node::default();
        node.metadata.resource_version = Some("42".into());
        let foreign = Taint {
            key: "node.kubernetes.io/unreachable".into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        };
        let ours = Taint {
            key: NodeTaint::OutOfService.key().into(),
            effect: NodeTaint::OutOfService.effect().into(),
            ..Taint::default()
        };
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![foreign, ours]),
            ..Default::default()
        });
        assert!(
            untaint_patch(&node).is_none(),
            "without podha's marker nothing is removed"
        );

        node.metadata.annotations = Some([(TAINT_MARKER_ANNOTATION.into(), "p".into())].into());
        let (patch, outcome) = untaint_patch(&node).expect("marked");
        assert_eq!(outcome, Outcome::Applied);
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert!(patch["metadata"]["annotations"][TAINT_MARKER_ANNOTATION].is_null());
        let taints = patch["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0]["key"], "node.kubernetes.io/unreachable");

        // The taint gone already, the marker left: remove the marker, nothing else.
        node.spec = None;
        let (patch, outcome) = untaint_patch(&node).expect("marked");
        assert_eq!(outcome, Outcome::AlreadyDone);
        assert!(patch.get("spec").is_none());
    }

    #[test]
    fn a_withdrawal_takes_off_the_request_alone_in_the_version_seen() {
        let mut node = Node::default();
        node.metadata.resource_version = Some("7".into());
        assert!(
            withdrawal_patch(&node).is_none(),
            "no request: nothing to do"
        );
        node.metadata.annotations = Some(
            [
                (FENCE_REQUEST_ANNOTATION.into(), "p/1/b".into()),
                (crate::contract::FENCE_ACK_ANNOTATION.into(), "p/1/b".into()),
            ]
            .into(),
        );
        let (patch, outcome) = withdrawal_patch(&node).expect("requested");
        assert_eq!(outcome, Outcome::Applied);
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let annotations = patch["metadata"]["annotations"]
            .as_object()
            .expect("annotations");
        assert_eq!(annotations.len(), 1, "{patch}");
        assert!(annotations[FENCE_REQUEST_ANNOTATION].is_null());
        assert!(patch.get("spec").is_none());
    }

    /// The request names the boot of the version it is built on, and is guarded by that
    /// version: built on a view from before a reboot it conflicts, and is built again on the
    /// node as it is (naming the new boot).
    #[test]
    fn a_fence_request_names_the_boot_of_the_version_it_is_guarded_by() {
        let mut node = Node::default();
        node.metadata.resource_version = Some("9".into());
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id: "boot-2".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let (patch, outcome) = request_patch(&node, "p", 1234);
        assert_eq!(
            outcome,
            Outcome::FenceRequested {
                request: "p/1234/boot-2".into()
            }
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "9");
        assert_eq!(
            patch["metadata"]["annotations"][FENCE_REQUEST_ANNOTATION],
            "p/1234/boot-2"
        );
    }
}
