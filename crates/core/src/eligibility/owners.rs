//! Who owns a pod, and whether the policy lets podha delete it on that account.
//!
//! The rules, in order:
//! 1. **A pod with no controller owner is never deleted**, whatever its annotations say: nothing
//!    would recreate it, so deleting it loses the workload. Only an owner reference with
//!    `controller: true` counts.
//! 2. `podha.io/failover: "false"` opts a pod out. Any value other than `"true"` or `"false"`
//!    (compared ignoring ASCII case and surrounding blanks) is read as `"false"`: someone meant
//!    to configure this pod, and leaving a pod alone is the safe reading of a typo.
//! 3. `podha.io/failover: "true"` opts in a pod of any controller kind, also kinds `owners`
//!    cannot name (DaemonSet, Job, custom controllers).
//! 4. Otherwise the controller kind must be in `owners`. A ReplicaSet owned by a Deployment
//!    counts as `Deployment` and only `Deployment` selects it: `owners: [ReplicaSet]` means bare
//!    ReplicaSets and does not pull in every Deployment. A ReplicaSet the view does not know
//!    (cache not synced yet, just deleted) is not selected: podha cannot tell which of the two
//!    it is, and the next evaluation will know.
//!
//! Only kinds of the `apps` API group count as `StatefulSet`/`ReplicaSet`: a custom resource
//! that reuses the name (OpenKruise's Advanced StatefulSet, `apps.kruise.io`) behaves differently
//! and is left to the opt-in annotation.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use super::SkipReason;
use crate::api::{FAILOVER_ANNOTATION, OwnerKind, PodHAPolicySpec};
use crate::view::{ObjectKey, View};

/// What the pod's annotation asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Annotation {
    Absent,
    OptIn,
    OptOut,
}

fn annotation(pod: &Pod) -> Annotation {
    match pod.annotations().get(FAILOVER_ANNOTATION) {
        None => Annotation::Absent,
        Some(value) if value.trim().eq_ignore_ascii_case("true") => Annotation::OptIn,
        Some(_) => Annotation::OptOut,
    }
}

/// The pod carries `podha.io/failover` with a value other than `"true"`: keep it where it is.
pub fn opted_out(pod: &Pod) -> bool {
    annotation(pod) == Annotation::OptOut
}

/// The pod's controller as podha classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Controller {
    /// A kind `owners` can select (a Deployment's ReplicaSet already resolved to `Deployment`).
    Selectable(OwnerKind),
    /// A ReplicaSet missing from the view: Deployment-owned or bare, podha cannot tell.
    UnknownReplicaSet,
    /// Any other controller; selectable only by the opt-in annotation.
    Other(&'static str),
}

impl Controller {
    fn label(self) -> &'static str {
        match self {
            Self::Selectable(kind) => kind.as_str(),
            Self::UnknownReplicaSet => OwnerKind::ReplicaSet.as_str(),
            Self::Other(label) => label,
        }
    }
}

/// The pod's controller owner reference, if any.
pub fn controller_ref(pod: &Pod) -> Option<&OwnerReference> {
    pod.owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The API group of an `apiVersion` (`apps/v1` → `apps`, `v1` → the core group, `""`).
fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

fn classify(pod: &Pod, owner: &OwnerReference, view: &View) -> Controller {
    match (api_group(&owner.api_version), owner.kind.as_str()) {
        ("apps", "StatefulSet") => Controller::Selectable(OwnerKind::StatefulSet),
        ("apps", "ReplicaSet") => {
            let key = ObjectKey::new(pod.namespace().unwrap_or_default(), owner.name.clone());
            match view.replica_set_owners.get(&key) {
                Some(Some(kind)) => Controller::Selectable(*kind),
                Some(None) => Controller::Selectable(OwnerKind::ReplicaSet),
                None => Controller::UnknownReplicaSet,
            }
        }
        // Bounded metric labels: well-known kinds by name, everything else as `Other`.
        ("apps", "DaemonSet") => Controller::Other("DaemonSet"),
        ("batch", "Job") => Controller::Other("Job"),
        ("", "ReplicationController") => Controller::Other("ReplicationController"),
        _ => Controller::Other("Other"),
    }
}

/// Steps 1–4 of the module rules. `Ok` carries the `owner_kind` metric label.
pub(crate) fn check_owner(
    spec: &PodHAPolicySpec,
    pod: &Pod,
    view: &View,
) -> Result<&'static str, SkipReason> {
    let owner = controller_ref(pod).ok_or(SkipReason::NoControllerOwner)?;
    let annotation = annotation(pod);
    if annotation == Annotation::OptOut {
        return Err(SkipReason::OptedOut);
    }
    let controller = classify(pod, owner, view);
    let selected = match controller {
        Controller::Selectable(kind) => spec.owners.contains(&kind),
        Controller::UnknownReplicaSet | Controller::Other(_) => false,
    };
    if selected || annotation == Annotation::OptIn {
        Ok(controller.label())
    } else {
        Err(SkipReason::OwnerKindNotSelected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;

    use OwnerKind::{Deployment, ReplicaSet, StatefulSet};

    fn view() -> View {
        view_with([
            mk_rs("ns", "web-1").owned_by_deployment("web").into(),
            mk_rs("ns", "bare").into(),
        ])
    }

    #[test]
    fn owner_rules() {
        const ALL: &[OwnerKind] = &[StatefulSet, Deployment, ReplicaSet];
        const DEFAULT: &[OwnerKind] = &[StatefulSet, Deployment];
        type Case = (
            &'static str,
            Pod,
            &'static [OwnerKind],
            Result<&'static str, SkipReason>,
        );
        let cases: Vec<Case> = vec![
            (
                "no owner",
                mk_pod("ns", "p"),
                ALL,
                Err(SkipReason::NoControllerOwner),
            ),
            (
                "owner that is not the controller",
                mk_pod("ns", "p").owned_by_non_controller("apps/v1", "StatefulSet", "db"),
                ALL,
                Err(SkipReason::NoControllerOwner),
            ),
            (
                "opt-in never rescues a pod without controller",
                mk_pod("ns", "p").annotation(FAILOVER_ANNOTATION, "true"),
                ALL,
                Err(SkipReason::NoControllerOwner),
            ),
            (
                "statefulset",
                mk_pod("ns", "p").owned_by_sts("db"),
                DEFAULT,
                Ok("StatefulSet"),
            ),
            (
                "statefulset not listed",
                mk_pod("ns", "p").owned_by_sts("db"),
                &[Deployment],
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "opted out",
                mk_pod("ns", "p")
                    .owned_by_sts("db")
                    .annotation(FAILOVER_ANNOTATION, "false"),
                ALL,
                Err(SkipReason::OptedOut),
            ),
            (
                "opt-out ignores case",
                mk_pod("ns", "p")
                    .owned_by_sts("db")
                    .annotation(FAILOVER_ANNOTATION, " False"),
                ALL,
                Err(SkipReason::OptedOut),
            ),
            (
                "unreadable annotation value opts out",
                mk_pod("ns", "p")
                    .owned_by_sts("db")
                    .annotation(FAILOVER_ANNOTATION, "yes"),
                ALL,
                Err(SkipReason::OptedOut),
            ),
            (
                "opt-out is checked before the owner kind",
                mk_pod("ns", "p")
                    .owned_by_sts("db")
                    .annotation(FAILOVER_ANNOTATION, "false"),
                &[],
                Err(SkipReason::OptedOut),
            ),
            (
                "deployment through its replicaset",
                mk_pod("ns", "p").owned_by_rs("web-1"),
                DEFAULT,
                Ok("Deployment"),
            ),
            (
                "deployment's replicaset is not selected by ReplicaSet",
                mk_pod("ns", "p").owned_by_rs("web-1"),
                &[ReplicaSet],
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "bare replicaset not selected by default",
                mk_pod("ns", "p").owned_by_rs("bare"),
                DEFAULT,
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "bare replicaset selected by ReplicaSet",
                mk_pod("ns", "p").owned_by_rs("bare"),
                &[ReplicaSet],
                Ok("ReplicaSet"),
            ),
            (
                "replicaset unknown to the view",
                mk_pod("ns", "p").owned_by_rs("gone"),
                ALL,
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "replicaset of the same name in another namespace does not count",
                mk_pod("other", "p").owned_by_rs("web-1"),
                ALL,
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "opt-in of a replicaset unknown to the view",
                mk_pod("ns", "p")
                    .owned_by_rs("gone")
                    .annotation(FAILOVER_ANNOTATION, "true"),
                &[],
                Ok("ReplicaSet"),
            ),
            (
                "opt-in of a deployment pod when Deployment is not listed",
                mk_pod("ns", "p")
                    .owned_by_rs("web-1")
                    .annotation(FAILOVER_ANNOTATION, "TRUE"),
                &[StatefulSet],
                Ok("Deployment"),
            ),
            (
                "daemonset not selectable",
                mk_pod("ns", "p").owned_by("apps/v1", "DaemonSet", "agent"),
                ALL,
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "daemonset opted in",
                mk_pod("ns", "p")
                    .owned_by("apps/v1", "DaemonSet", "agent")
                    .annotation(FAILOVER_ANNOTATION, "true"),
                &[],
                Ok("DaemonSet"),
            ),
            (
                "job opted in",
                mk_pod("ns", "p")
                    .owned_by("batch/v1", "Job", "backup")
                    .annotation(FAILOVER_ANNOTATION, "true"),
                DEFAULT,
                Ok("Job"),
            ),
            (
                "custom controller opted in",
                mk_pod("ns", "p")
                    .owned_by("example.com/v1", "Database", "pg")
                    .annotation(FAILOVER_ANNOTATION, "true"),
                DEFAULT,
                Ok("Other"),
            ),
            (
                "a StatefulSet of another API group is not a StatefulSet",
                mk_pod("ns", "p").owned_by("apps.kruise.io/v1beta1", "StatefulSet", "db"),
                ALL,
                Err(SkipReason::OwnerKindNotSelected),
            ),
        ];
        let view = view();
        for (name, pod, owners, want) in cases {
            let spec = mk_spec().owners(owners);
            assert_eq!(check_owner(&spec, &pod, &view), want, "{name}");
        }
    }
}
