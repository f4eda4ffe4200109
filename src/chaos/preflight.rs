//! Before a fault: would podha move the pod at all, and which other pods on its node must keep
//! their objects? Both are answered with the operator's own rules (`planner::pod_owner`,
//! `eligibility::check_movable`) on a [`View`] built the way the operator builds its own.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use tokio::time::Instant;

use super::Error;
use super::timeline::node_ready;
use crate::api::{PodHAPolicy, PodHAPolicySpec};
use crate::eligibility::{
    SkipReason, check_movable, claim_names, controller_ref, node_selected, opted_out,
};
use crate::planner::{PolicyRef, node_owner, pod_owner};
use crate::runtime::{Change, ClusterState};
use crate::view::View;

/// The policies by name and the decision view, read once.
pub struct Snapshot {
    pub policies: BTreeMap<String, PodHAPolicySpec>,
    pub view: View,
}

impl Snapshot {
    /// Lists what the operator watches and feeds it through the operator's own state, so the
    /// view is exactly what podha would decide on.
    pub async fn read(client: &Client) -> Result<Snapshot, Error> {
        let lp = ListParams::default();
        let what = |kind: &'static str| move |e| Error::kube(format!("listing {kind}"), e);
        let policies = match Api::<PodHAPolicy>::all(client.clone()).list(&lp).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(Error::NoCrd),
            Err(e) => return Err(Error::kube("listing PodHAPolicies", e)),
        };
        let nodes = list_all::<Node>(client, "nodes").await?;
        let pods = list_all::<Pod>(client, "pods").await?;
        let pvcs = list_all::<PersistentVolumeClaim>(client, "persistentvolumeclaims").await?;
        let pvs = list_all::<PersistentVolume>(client, "persistentvolumes").await?;
        let vas = list_all::<VolumeAttachment>(client, "volumeattachments").await?;
        let replica_sets = Api::<ReplicaSet>::all(client.clone())
            .list_metadata(&lp)
            .await
            .map_err(what("replicasets"))?;
        let namespaces = Api::<Namespace>::all(client.clone())
            .list_metadata(&lp)
            .await
            .map_err(what("namespaces"))?;

        let mut state = ClusterState::default();
        let now = Instant::now();
        fn listed<K>(items: Vec<K>, wrap: fn(Event<K>) -> Change) -> Vec<Change> {
            let mut out = vec![wrap(Event::Init)];
            out.extend(items.into_iter().map(|k| wrap(Event::InitApply(k))));
            out.push(wrap(Event::InitDone));
            out
        }
        let changes = [
            listed(nodes, Change::Node),
            listed(pods, Change::Pod),
            listed(pvcs, Change::Pvc),
            listed(pvs, Change::Pv),
            listed(vas, Change::Va),
            listed(replica_sets.items, Change::ReplicaSet),
            listed(namespaces.items, Change::Namespace),
        ];
        for change in changes.into_iter().flatten() {
            state.apply(change, now);
        }
        Ok(Snapshot {
            policies: policies
                .into_iter()
                .map(|p| (p.name_any(), p.spec))
                .collect(),
            view: state.view,
        })
    }

    /// The policies sorted by name, as the planner takes them.
    pub fn policy_refs(&self) -> Vec<PolicyRef<'_>> {
        self.policies
            .iter()
            .map(|(name, spec)| PolicyRef { name, spec })
            .collect()
    }
}

/// Every object of kind `K` in the cluster; `kind` names it in the error.
async fn list_all<K>(client: &Client, kind: &str) -> Result<Vec<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|e| Error::kube(format!("listing {kind}"), e))
}

/// Why podha would not move a pod if its node died: the first rule that refuses, named as the
/// operator names it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("pod {pod} is not scheduled on a node")]
    Unscheduled { pod: String },
    #[error("node {node} of pod {pod} does not exist")]
    NoNode { node: String, pod: String },
    #[error("no PodHAPolicy exists: podha moves nothing")]
    NoPolicy,
    /// `refusals`: each policy's first selector that refuses the pod.
    #[error("no PodHAPolicy selects {subject} ({})", refusals.join("; "))]
    Unselected {
        subject: String,
        refusals: Vec<String>,
    },
    #[error(
        "policy {policy}: dryRun is on (it governs node {node}): podha only says what it would do"
    )]
    NodePolicyDryRun { policy: String, node: String },
    #[error("policy {policy}: dryRun is on: podha only says what it would do")]
    DryRun { policy: String },
    #[error("policy {policy}: {}", reason.as_str())]
    Ineligible { policy: String, reason: SkipReason },
}

/// Which policy would move `pod` if its node died (its name), or why none would.
pub fn judge(policies: &[PolicyRef<'_>], pod: &Pod, view: &View) -> Result<String, Refusal> {
    let pod_key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Err(Refusal::Unscheduled { pod: pod_key });
    };
    let Some(node) = view.nodes.get(&node_name) else {
        return Err(Refusal::NoNode {
            node: node_name,
            pod: pod_key,
        });
    };
    let Some(owner) = pod_owner(policies, pod, node, view) else {
        return Err(unselected(policies, pod, node, view));
    };
    // The node's policy decides for everything done on the node (planner rule).
    if let Some(node_policy) = node_owner(policies, node)
        && node_policy.spec.dry_run
    {
        return Err(Refusal::NodePolicyDryRun {
            policy: node_policy.name.to_string(),
            node: node_name,
        });
    }
    if owner.spec.dry_run {
        return Err(Refusal::DryRun {
            policy: owner.name.to_string(),
        });
    }
    let usable = |n: &Node| n.name_any() != node_name && node_ready(n);
    match check_movable(owner.spec, pod, view, &usable) {
        Ok(_) => Ok(owner.name.to_string()),
        Err(reason) => Err(Refusal::Ineligible {
            policy: owner.name.to_string(),
            reason,
        }),
    }
}

/// Why no policy selects the pod: each policy's first selector that refuses it.
fn unselected(policies: &[PolicyRef<'_>], pod: &Pod, node: &Node, view: &View) -> Refusal {
    let namespace = pod.namespace().unwrap_or_default();
    let node_name = node.name_any();
    if policies.is_empty() {
        return Refusal::NoPolicy;
    }
    let no_labels = BTreeMap::new();
    let ns_labels = view.namespace_labels.get(&namespace).unwrap_or(&no_labels);
    let refusals: Vec<(&str, String)> = policies
        .iter()
        .map(|p| {
            if !node_selected(p.spec, node) {
                ("node", format!("policy {}: nodeSelector", p.name))
            } else if !crate::eligibility::selects(&p.spec.namespace_selector, ns_labels) {
                ("namespace", format!("policy {}: namespaceSelector", p.name))
            } else {
                ("pod", format!("policy {}: podSelector", p.name))
            }
        })
        .collect();
    let subject = match refusals[0].0 {
        kind if refusals.iter().all(|(k, _)| *k == kind) => match kind {
            "node" => format!("node {node_name}"),
            "namespace" => format!("namespace {namespace}"),
            _ => format!("pod {namespace}/{}", pod.name_any()),
        },
        _ => format!("pod {namespace}/{} on node {node_name}", pod.name_any()),
    };
    Refusal::Unselected {
        subject,
        refusals: refusals
            .into_iter()
            .map(|(_, r)| format!("{r} does not select it"))
            .collect(),
    }
}

/// Faults one after another count against the node policy's `safety.maxUnhealthy` for
/// `safety.unhealthyWindow` each: a note when `trials` would exceed it, as podha would hold.
pub fn window_note(
    policies: &[PolicyRef<'_>],
    view: &View,
    node: &str,
    trials: usize,
) -> Option<String> {
    let policy = node_owner(policies, view.nodes.get(node)?)?;
    let watched = view
        .nodes
        .values()
        .filter(|n| node_owner(policies, n).is_some_and(|p| p.name == policy.name))
        .count();
    let max = policy.spec.max_unhealthy_nodes(watched);
    (trials > max).then(|| {
        format!(
            "note: policy {} acts on at most {max} failed node(s) of {watched} within its \
             safety.unhealthyWindow ({}); trials beyond that within the window are held \
             (raise safety.maxUnhealthy or shorten the window for a chaos run)",
            policy.name, policy.spec.safety.unhealthy_window
        )
    })
}

/// A pod on the faulted node that podha's rules say must stay, recorded before the fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bystander {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Why podha must leave it alone.
    pub why: String,
}

/// The pods on `node` other than `exclude` (the workload's) that podha must not move and whose
/// objects must survive the failover: the same pods that keep podha from putting the
/// out-of-service taint on the node. A stateless pod with a controller is not one of them: its
/// controller replaces it, and the taint may evict it.
pub fn bystanders(
    policies: &[PolicyRef<'_>],
    view: &View,
    node: &str,
    exclude: &dyn Fn(&Pod) -> bool,
) -> Vec<Bystander> {
    let Some(node_obj) = view.nodes.get(node) else {
        return Vec::new();
    };
    let usable = |n: &Node| n.name_any() != node && node_ready(n);
    view.pods_on(node)
        .iter()
        .filter(|pod| !exclude(pod) && pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let replaced = controller_ref(pod).is_some() && !opted_out(pod);
            if replaced && claim_names(pod).is_empty() {
                return None;
            }
            let why = match pod_owner(policies, pod, node_obj, view) {
                None if controller_ref(pod).is_none() => {
                    "no PodHAPolicy selects it; NoControllerOwner".to_string()
                }
                None => "no PodHAPolicy selects it".to_string(),
                Some(owner) => match check_movable(owner.spec, pod, view, &usable) {
                    Ok(_) => return None,
                    Err(reason) => format!("policy {}: {}", owner.name, reason.as_str()),
                },
            };
            Some(Bystander {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                why,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn view_of(pods: Vec<Pod>) -> View {
        let nodes = ["n1", "n2"].map(|n| Obj::from(mk_node(n).ready(true)));
        view_with(nodes.into_iter().chain(pods.into_iter().map(Obj::from)))
    }

    fn db() -> Pod {
        mk_pod("shop", "db-0").on("n1").owned_by_sts("db")
    }

    #[test]
    fn no_policy_no_selection_and_dry_run_are_refusals_that_name_the_rule() {
        let view = view_of(vec![db()]);
        assert_eq!(
            judge(&[], &db(), &view).unwrap_err().to_string(),
            "no PodHAPolicy exists: podha moves nothing"
        );
        let other_ns = mk_spec().namespace_selector(LabelSelector {
            match_labels: Some(BTreeMap::from([("team".to_string(), "x".to_string())])),
            ..LabelSelector::default()
        });
        let refs = [PolicyRef {
            name: "p",
            spec: &other_ns,
        }];
        let e = judge(&refs, &db(), &view).unwrap_err().to_string();
        assert_eq!(
            e,
            "no PodHAPolicy selects namespace shop (policy p: namespaceSelector does not select it)"
        );
        let mut dry = mk_spec();
        dry.dry_run = true;
        let refs = [PolicyRef {
            name: "d",
            spec: &dry,
        }];
        let e = judge(&refs, &db(), &view).unwrap_err().to_string();
        assert!(e.starts_with("policy d: dryRun is on"), "{e}");
    }

    #[test]
    fn an_eligibility_refusal_names_the_policy_and_the_reason() {
        let view = view_of(vec![db()]);
        let spec = mk_spec();
        let refs = [PolicyRef {
            name: "p",
            spec: &spec,
        }];
        let e = judge(&refs, &db(), &view).unwrap_err().to_string();
        assert_eq!(e, "policy p: NoPersistentVolumeClaim");
    }

    #[test]
    fn more_trials_than_max_unhealthy_allows_get_a_note() {
        let view = view_of(vec![db()]);
        let spec = mk_spec();
        let refs = [PolicyRef {
            name: "p",
            spec: &spec,
        }];
        // 30 % of two nodes rounds down, but a policy always tolerates one dead node.
        assert_eq!(window_note(&refs, &view, "n1", 1), None);
        let note = window_note(&refs, &view, "n1", 3).unwrap();
        assert!(
            note.starts_with("note: policy p acts on at most 1 failed node(s) of 2")
                && note.contains("(10m)"),
            "{note}"
        );
        assert_eq!(window_note(&[], &view, "n1", 3), None);
    }

    #[test]
    fn bystanders_are_the_pods_podha_must_leave_alone() {
        let bare = mk_pod("shop", "decoy").on("n1");
        let stateless = mk_pod("shop", "web-1").on("n1").owned_by_rs("web-abc");
        let opted_out = mk_pod("shop", "cache-0")
            .on("n1")
            .owned_by_sts("cache")
            .annotation("podha.io/failover", "false");
        let view = view_of(vec![bare, stateless, opted_out, db()]);
        let spec = mk_spec();
        let refs = [PolicyRef {
            name: "p",
            spec: &spec,
        }];
        let found = bystanders(&refs, &view, "n1", &|p| p.name_any() == "db-0");
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|b| (b.name.as_str(), b.why.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("decoy", "policy p: NoControllerOwner"),
                ("cache-0", "policy p: OptedOut"),
            ]
        );
        let unselected = bystanders(&[], &view, "n1", &|p| p.name_any() == "db-0");
        assert_eq!(unselected.len(), 2, "{unselected:?}");
        assert_eq!(
            unselected[0].why,
            "no PodHAPolicy selects it; NoControllerOwner"
        );
    }
}
