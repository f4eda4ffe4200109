//! podha's force deletes beside Kubernetes' taint eviction, on a node with the out-of-service
//! taint.
//!
//! The taint eviction controller (`pkg/controller/tainteviction`) deletes every pod of a
//! tainted node that does not tolerate the taint, by name: each of its up to 5 attempts reads
//! the pod by name, marks it (condition `DisruptionTarget`, reason `DeletionByTaintManager`)
//! and deletes it without a UID precondition. A pod podha force-deleted first fails that
//! attempt, and the retry finds the StatefulSet's new pod of the same name, the replacement,
//! and deletes it. So podha lets the controller's delete land first: after its out-of-service
//! taint landed it waits, at most [`TAINT_EVICTION_WAIT`], until the pod shows a deletion
//! timestamp, then force-deletes it by its UID (the pod, marked NotReady before the taint,
//! is deleted whatever version the controller's writes left it in). An update of a pod on the tainted node would have the controller queue another
//! delete by name; podha's last update, its NotReady mark, goes out before the taint (see
//! `plan_fence`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use crate::api::NodeTaint;
use crate::incident::Incident;

/// How long after its out-of-service taint landed podha leaves a pod's delete to the taint
/// eviction controller, which acts on the taint within a second on a healthy control plane.
/// Past it, podha deletes the pod itself (a controller manager that is down, slow, or runs
/// without taint eviction): the failover waits no longer than this for it.
pub const TAINT_EVICTION_WAIT: Duration = Duration::from_secs(3);

/// Whether podha's force delete of `pod`, on `incident`'s node, waits for the taint eviction
/// controller's own delete at `now`.
pub(super) fn awaits_eviction(pod: &Pod, incident: &Incident, now: Instant) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && incident.tainted.is_some_and(|tainted| {
            tainted.taint == NodeTaint::OutOfService
                && now < crate::deadline::after(tainted.at, TAINT_EVICTION_WAIT)
        })
}
