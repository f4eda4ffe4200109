//! The cluster read once, the way the operator reads it: every list fed through the operator's
//! own [`ClusterState`], so the view is exactly what podha would decide on. `podha explain` and
//! `podha chaos` both start from it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ListParams;
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

use crate::api::{ListedPolicy, PodHAPolicySpec, PodHAPolicyStatus};
use crate::contract::AGENT_LEASE_LABEL;
use crate::planner::PolicyRef;
use crate::protection::LeaderLease;
use crate::runtime::{Change, ClusterState};
use crate::view::View;

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "the PodHAPolicy CRD is not installed: install podha first (helm chart, or `podha crd | kubectl apply -f -`)"
    )]
    NoCrd,
    #[error(
        "podha's leader Lease is in several namespaces ({}): say which with --podha-namespace",
        .0.join(", ")
    )]
    SeveralInstalls(Vec<String>),
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReadError {
    let what = what.into();
    move |source| ReadError::Kube { what, source }
}

/// podha's leader Lease as read, its renewal dated on the cluster's clock `wall`.
fn leader_lease_at(lease: Lease, wall: SystemTime) -> LeaderLease {
    let spec = lease.spec.unwrap_or_default();
    LeaderLease {
        namespace: lease.metadata.namespace.unwrap_or_default(),
        name: lease.metadata.name.unwrap_or_default(),
        holder: spec.holder_identity,
        renewed_ago: spec.renew_time.as_ref().map(|t| age_of(t, wall)),
        lasts: Duration::from_secs(
            spec.lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or_default(),
        ),
    }
}

/// The policies by name and the decision view, read once.
pub struct Snapshot {
    pub policies: BTreeMap<String, PodHAPolicySpec>,
    /// Policies that cannot be read, by name, with why: every policy after the first of them
    /// by name holds (as the operator does).
    pub unreadable: BTreeMap<String, String>,
    pub statuses: BTreeMap<String, PodHAPolicyStatus>,
    pub view: View,
    /// podha's leader Lease; `None` when no namespace holds one (podha is not running).
    pub leader: Option<LeaderLease>,
    /// When the lists were read, on the clock the view's instants use.
    pub now: Instant,
    /// podha's namespace: the one given, else the one holding its leader Lease.
    pub podha_namespace: Option<String>,
}

impl Snapshot {
    /// Lists what the operator watches and feeds it through the operator's own state. The agent
    /// Leases are read in podha's namespace: `podha_namespace`, else the one that holds podha's
    /// leader Lease (`leader_lease`).
    pub async fn read(
        client: &Client,
        podha_namespace: Option<&str>,
        leader_lease: &str,
    ) -> Result<Self, ReadError> {
        let lp = ListParams::default();
        let listed_policies = match Api::<ListedPolicy>::all(client.clone()).list(&lp).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(ReadError::NoCrd),
            Err(e) => return Err(kube_error("listing PodHAPolicies")(e)),
        };
        let leader = read_leader(client, podha_namespace, leader_lease).await?;
        let node_leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
            .list(&lp)
            .await
            .map_err(kube_error("listing the node Leases in kube-node-lease"))?
            .items;
        let agent_namespace = podha_namespace
            .map(str::to_string)
            .or_else(|| leader.as_ref().and_then(|l| l.namespace()));
        let agent_leases = match &agent_namespace {
            Some(ns) => {
                Api::<Lease>::namespaced(client.clone(), ns)
                    .list(&ListParams::default().labels(&format!("{AGENT_LEASE_LABEL}=true")))
                    .await
                    .map_err(kube_error(format!("listing the agent Leases in {ns}")))?
                    .items
            }
            None => Vec::new(),
        };
        let nodes = list_all::<Node>(client, "nodes").await?;
        let pods = list_all::<Pod>(client, "pods").await?;
        let pvcs = list_all::<PersistentVolumeClaim>(client, "persistentvolumeclaims").await?;
        let pvs = list_all::<PersistentVolume>(client, "persistentvolumes").await?;
        let vas = list_all::<VolumeAttachment>(client, "volumeattachments").await?;
        let replica_sets = Api::<ReplicaSet>::all(client.clone())
            .list_metadata(&lp)
            .await
            .map_err(kube_error("listing replicasets"))?;
        let namespaces = Api::<Namespace>::all(client.clone())
            .list_metadata(&lp)
            .await
            .map_err(kube_error("listing namespaces"))?;

        let now = Instant::now();
        let mut state = ClusterState::default();
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
            listed(agent_leases, Change::AgentLease),
        ];
        for change in changes.into_iter().flatten() {
            state.apply(change, now);
        }
        let mut view = state.view;
        let wall = cluster_now(&node_leases, SystemTime::now());
        age_adverts(&mut view, now, wall);
        let leader = leader.map(|l| leader_lease_at(l, wall));
        let (policies, statuses, unreadable) = split_policies(listed_policies);
        Ok(Snapshot {
            policies,
            unreadable,
            statuses,
            view,
            leader,
            now,
            podha_namespace: agent_namespace,
        })
    }

    pub fn namespace(&self) -> Option<&str> {
        self.podha_namespace.as_deref()
    }

    /// The policies sorted by name, as the planner takes them.
    pub fn policy_refs(&self) -> Vec<PolicyRef<'_>> {
        self.policies
            .iter()
            .map(|(name, spec)| PolicyRef { name, spec })
            .collect()
    }
}

/// The policies read whole, by name, with their statuses; and those that cannot be read, with
/// why.
type Policies = (
    BTreeMap<String, PodHAPolicySpec>,
    BTreeMap<String, PodHAPolicyStatus>,
    BTreeMap<String, String>,
);

fn split_policies(listed: Vec<ListedPolicy>) -> Policies {
    let (mut policies, mut statuses, mut unreadable) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for policy in listed {
        match policy {
            ListedPolicy::Valid(p) => {
                statuses.insert(p.name_any(), p.status.clone().unwrap_or_default());
                policies.insert(p.name_any(), p.spec);
            }
            ListedPolicy::Unreadable(u) => {
                let name = u.metadata.name.clone().unwrap_or_default();
                unreadable.insert(name, u.error.clone());
            }
        }
    }
    (policies, statuses, unreadable)
}

/// The operator counts an agent Lease fresh for its duration after it saw it renewed; a single
/// read sees every Lease "now". Each advert is dated back by its `renewTime`'s age on this
/// machine's clock instead, so a Lease its agent stopped renewing reads as stale.
fn age_adverts(view: &mut View, now: Instant, wall: SystemTime) {
    for advert in view.agent_adverts.values_mut() {
        let age = advert
            .renew_time
            .as_ref()
            .map_or(Duration::MAX, |renew| age_of(renew, wall));
        // Never renewed, or longer ago than this clock can go back: stale.
        advert.renewed_seen = now
            .checked_sub(age)
            .or_else(|| now.checked_sub(advert.lasts + Duration::from_secs(1)))
            .unwrap_or(now);
    }
}

/// The cluster's clock as well as this machine can tell: its own, or the newest node Lease
/// renewal when that is later (this clock is behind the cluster's). A clock ahead makes every
/// Lease look older: a false alarm, never a stopped leader or agent taken for alive.
fn cluster_now(node_leases: &[Lease], local: SystemTime) -> SystemTime {
    node_leases
        .iter()
        .filter_map(|l| l.spec.as_ref()?.renew_time.as_ref())
        .map(|t| SystemTime::from(t.0))
        .fold(local, SystemTime::max)
}

/// How long before `wall` the time was (zero for a time ahead of this clock).
fn age_of(time: &MicroTime, wall: SystemTime) -> Duration {
    wall.duration_since(SystemTime::from(time.0))
        .unwrap_or_default()
}

async fn read_leader(
    client: &Client,
    podha_namespace: Option<&str>,
    name: &str,
) -> Result<Option<Lease>, ReadError> {
    let leases: Vec<Lease> = match podha_namespace {
        Some(ns) => Api::<Lease>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(kube_error(format!("reading Lease {ns}/{name}")))?
            .into_iter()
            .collect(),
        None => {
            Api::<Lease>::all(client.clone())
                .list(&ListParams::default().fields(&format!("metadata.name={name}")))
                .await
                .map_err(kube_error(format!("listing Leases named {name}")))?
                .items
        }
    };
    if leases.len() > 1 {
        return Err(ReadError::SeveralInstalls(
            leases
                .iter()
                .map(|l| l.namespace().unwrap_or_default())
                .collect(),
        ));
    }
    Ok(leases.into_iter().next())
}

/// Every object of kind `K` in the cluster; `kind` names it in the error.
async fn list_all<K>(client: &Client, kind: &str) -> Result<Vec<K>, ReadError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(kube_error(format!("listing {kind}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::AgentAdvert;

    fn micro(wall: SystemTime) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::try_from(wall).expect("in range"))
    }

    #[test]
    fn an_advert_is_dated_back_by_its_renewals_age() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = Instant::now() + Duration::from_secs(3600);
        let fresh = micro(wall - Duration::from_secs(5));
        let stale = micro(wall - Duration::from_secs(300));
        let mut view = View::default();
        for (node, renew) in [("fresh", &fresh), ("stale", &stale)] {
            view.agent_adverts.insert(
                node.into(),
                AgentAdvert {
                    renew_time: Some(renew.clone()),
                    renewed_seen: now,
                    lasts: Duration::from_secs(40),
                    heard_in_boot: None,
                    heeds_hold: false,
                    heeds_term: false,
                    heeds_renewals: false,
                    peers_unreachable: None,
                    renewal_observed: false,
                    resource_version: None,
                },
            );
        }
        view.agent_adverts.insert(
            "never".into(),
            AgentAdvert {
                renew_time: None,
                renewed_seen: now,
                lasts: Duration::from_secs(40),
                heard_in_boot: None,
                heeds_hold: false,
                heeds_term: false,
                heeds_renewals: false,
                peers_unreachable: None,
                renewal_observed: false,
                resource_version: None,
            },
        );
        age_adverts(&mut view, now, wall);
        assert_eq!(
            now - view.agent_adverts["fresh"].renewed_seen,
            Duration::from_secs(5)
        );
        assert_eq!(
            now - view.agent_adverts["stale"].renewed_seen,
            Duration::from_secs(300)
        );
        assert!(now - view.agent_adverts["never"].renewed_seen > Duration::from_secs(40));
    }

    #[test]
    fn a_clock_behind_the_clusters_reads_the_newest_node_lease_instead() {
        let local = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let lease = |at: SystemTime| Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                renew_time: Some(micro(at)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ahead = local + Duration::from_secs(300);
        assert_eq!(
            cluster_now(
                &[lease(local - Duration::from_secs(5)), lease(ahead)],
                local
            ),
            ahead
        );
        // A clock ahead is kept: Leases look older (a false alarm, never a false "alive").
        assert_eq!(
            cluster_now(&[lease(local - Duration::from_secs(300))], local),
            local
        );
        assert_eq!(cluster_now(&[], local), local);
    }

    #[test]
    fn the_leader_lease_counts_only_while_held_and_renewed() {
        let lease = |holder: Option<&str>, ago: Option<u64>| LeaderLease {
            namespace: "podha-system".into(),
            name: "podha-leader".into(),
            holder: holder.map(str::to_string),
            renewed_ago: ago.map(Duration::from_secs),
            lasts: Duration::from_secs(15),
        };
        assert!(lease(Some("podha-0"), Some(3)).held());
        assert!(!lease(Some("podha-0"), Some(60)).held());
        assert!(!lease(None, Some(3)).held());
        assert!(!lease(Some(""), Some(3)).held());
        assert!(!lease(Some("podha-0"), None).held());
    }
}
