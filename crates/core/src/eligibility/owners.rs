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
//! 4. Otherwise the controller's kind, API group included, must be in `owners`. A pod
//!    controlled by a ReplicaSet counts as that ReplicaSet's own controller: a Deployment's as
//!    `Deployment` (and only `Deployment` selects it), an Argo Rollout's as
//!    `Rollout.argoproj.io`; `owners: [ReplicaSet]` means ReplicaSets nothing controls and
//!    does not pull in every Deployment. A ReplicaSet the view does not know (cache not synced
//!    yet, just deleted) is not selected: podha cannot tell whose it is, and the next
//!    evaluation will know.
//!
//! Listing a kind is the user's word that its controller recreates a deleted pod (a
//! StatefulSet, a ReplicaSet, CloudNativePG's `Cluster`, Strimzi's `StrimziPodSet` do); podha
//! cannot check it. A kind is its group and name: a custom resource that reuses `StatefulSet`
//! (OpenKruise's Advanced StatefulSet, `apps.kruise.io`) is `StatefulSet.apps.kruise.io`,
//! not `StatefulSet`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
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

/// The pod's controller owner reference, if any.
pub fn controller_ref(pod: &Pod) -> Option<&OwnerReference> {
    pod.owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// Whose a ReplicaSet is, as `View::replica_set_owners` keeps it: its controller's kind,
/// `None` when nothing controls it.
pub fn replica_set_controller(meta: &ObjectMeta) -> Option<OwnerKind> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| OwnerKind::of_reference(&r.api_version, &r.kind))
}

/// The kind the pod counts as (rule 4): its controller's, or for a ReplicaSet the
/// ReplicaSet's controller's. `None` for a ReplicaSet the view does not know.
pub fn counted_kind(pod: &Pod, owner: &OwnerReference, view: &View) -> Option<OwnerKind> {
    let kind = OwnerKind::of_reference(&owner.api_version, &owner.kind);
    if kind != OwnerKind::REPLICA_SET {
        return Some(kind);
    }
    let key = ObjectKey::new(pod.namespace().unwrap_or_default(), owner.name.clone());
    match view.replica_set_owners.get(&key)? {
        Some(controller) => Some(controller.clone()),
        None => Some(OwnerKind::REPLICA_SET),
    }
}

/// How the pod's owner made it eligible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerMatch {
    /// The kind it counts as (`counted_kind`); a ReplicaSet unknown to the view, as such.
    pub kind: OwnerKind,
    /// Its policy's `owners` lists the kind (otherwise the pod opted in).
    pub listed: bool,
}

impl OwnerMatch {
    /// The `owner_kind` metric label: the kind as written in `owners` when listed (bounded by
    /// the policies), and for a pod that opted in the kind if it is a well-known one,
    /// `Other` if not.
    pub fn label(&self) -> String {
        const WELL_KNOWN: [(&str, &str); 6] = [
            ("apps", "StatefulSet"),
            ("apps", "Deployment"),
            ("apps", "ReplicaSet"),
            ("apps", "DaemonSet"),
            ("batch", "Job"),
            ("", "ReplicationController"),
        ];
        let well_known = WELL_KNOWN.contains(&(self.kind.group(), self.kind.kind()));
        match (self.listed, well_known) {
            (true, _) => self.kind.to_string(),
            (false, true) => self.kind.kind().to_string(),
            (false, false) => "Other".to_string(),
        }
    }
}

/// Steps 1–4 of the module rules.
pub(crate) fn check_owner(
    spec: &PodHAPolicySpec,
    pod: &Pod,
    view: &View,
) -> Result<OwnerMatch, SkipReason> {
    let owner = controller_ref(pod).ok_or(SkipReason::NoControllerOwner)?;
    let annotation = annotation(pod);
    if annotation == Annotation::OptOut {
        return Err(SkipReason::OptedOut);
    }
    let counted = counted_kind(pod, owner, view);
    let listed = counted.as_ref().is_some_and(|k| spec.owners.contains(k));
    if listed || annotation == Annotation::OptIn {
        Ok(OwnerMatch {
            kind: counted.unwrap_or(OwnerKind::REPLICA_SET),
            listed,
        })
    } else {
        Err(SkipReason::OwnerKindNotSelected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;

    const STATEFUL_SET: OwnerKind = OwnerKind::STATEFUL_SET;
    const DEPLOYMENT: OwnerKind = OwnerKind::DEPLOYMENT;
    const REPLICA_SET: OwnerKind = OwnerKind::REPLICA_SET;

    fn view() -> View {
        view_with([
            mk_rs("ns", "web-1").owned_by_deployment("web").into(),
            mk_rs("ns", "bare").into(),
            mk_rs("ns", "canary-1")
                .owned_by("argoproj.io/v1alpha1", "Rollout", "canary")
                .into(),
        ])
    }

    fn kinds(written: &[&str]) -> Vec<OwnerKind> {
        written.iter().map(|w| w.parse().unwrap()).collect()
    }

    #[test]
    fn owner_rules() {
        const ALL: &[OwnerKind] = &[STATEFUL_SET, DEPLOYMENT, REPLICA_SET];
        const DEFAULT: &[OwnerKind] = &[STATEFUL_SET, DEPLOYMENT];
        const ONLY_STS: &[OwnerKind] = &[STATEFUL_SET];
        const ONLY_DEPLOYMENT: &[OwnerKind] = &[DEPLOYMENT];
        const ONLY_RS: &[OwnerKind] = &[REPLICA_SET];
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
                ONLY_DEPLOYMENT,
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
                ONLY_RS,
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
                ONLY_RS,
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
                ONLY_STS,
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
            let got = check_owner(&spec, &pod, &view).map(|m| m.label());
            assert_eq!(got.as_deref(), want.as_ref().map(|w| *w), "{name}");
        }
    }

    /// Any controller by its API group and kind, and the ReplicaSets other controllers own.
    #[test]
    fn owners_of_any_group() {
        let pg = || mk_pod("ns", "pg-1").owned_by("postgresql.cnpg.io/v1", "Cluster", "pg");
        let kruise = || mk_pod("ns", "p").owned_by("apps.kruise.io/v1beta1", "StatefulSet", "db");
        let canary = || mk_pod("ns", "c").owned_by_rs("canary-1");
        type Case = (
            &'static str,
            Pod,
            Vec<OwnerKind>,
            Result<&'static str, SkipReason>,
        );
        let cases: Vec<Case> = vec![
            (
                "a custom controller listed by kind and group",
                pg(),
                kinds(&["StatefulSet", "Cluster.postgresql.cnpg.io"]),
                Ok("Cluster.postgresql.cnpg.io"),
            ),
            (
                "the same kind in another group is another kind",
                pg(),
                kinds(&["Cluster.example.com"]),
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "a custom controller that opted in, unlisted: a bounded label",
                pg().annotation(FAILOVER_ANNOTATION, "true"),
                kinds(&["StatefulSet"]),
                Ok("Other"),
            ),
            (
                "a StatefulSet of another group, named with its group",
                kruise(),
                kinds(&["StatefulSet.apps.kruise.io"]),
                Ok("StatefulSet.apps.kruise.io"),
            ),
            (
                "StatefulSet.apps is the StatefulSet",
                mk_pod("ns", "p").owned_by_sts("db"),
                kinds(&["StatefulSet.apps"]),
                Ok("StatefulSet"),
            ),
            (
                "a ReplicaSet another controller owns counts as that controller",
                canary(),
                kinds(&["Rollout.argoproj.io"]),
                Ok("Rollout.argoproj.io"),
            ),
            (
                "and is no bare ReplicaSet",
                canary(),
                kinds(&["ReplicaSet", "Deployment"]),
                Err(SkipReason::OwnerKindNotSelected),
            ),
            (
                "a core-group controller, opted in",
                mk_pod("ns", "p")
                    .owned_by("v1", "ReplicationController", "rc")
                    .annotation(FAILOVER_ANNOTATION, "true"),
                vec![],
                Ok("ReplicationController"),
            ),
        ];
        let view = view();
        for (name, pod, owners, want) in cases {
            let spec = mk_spec().owners(&owners);
            let got = check_owner(&spec, &pod, &view).map(|m| m.label());
            assert_eq!(got.as_deref(), want.as_ref().map(|w| *w), "{name}");
        }
    }
}
