//! What podha has already done for each dead node, so that one incident never gets two
//! actions and a replacement pod is never taken for the pod it replaces.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::view::View;

/// One node death, from the moment a policy judged the node Failed until the runtime closes it
/// (node healthy again and the failover finished or abandoned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    pub node: String,
    /// When the node was judged Failed.
    pub since: Instant,
    /// UIDs of the pods bound to the node when the incident opened. Only these may be deleted:
    /// a pod bound to the node later is a replacement that the dead kubelet never ran.
    pub pods_at_failure: BTreeSet<String>,
    /// UIDs of the pods podha force-deleted.
    pub deleted: BTreeSet<String>,
    /// The pods podha marked NotReady, by UID: the resourceVersion the mark produced, or
    /// `None` once a delete in that version found the pod changed (the watch decides then).
    pub marked_not_ready: BTreeMap<String, Option<String>>,
    /// podha added the out-of-service taint for this incident.
    pub tainted: bool,
    /// The fence podha asked of the node's agent in this incident (the request's value on the
    /// Node), once the request is written.
    pub fence_request: Option<String>,
}

/// Open incidents by node name, and when recently closed ones opened (for
/// `safety.unhealthyWindow`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    incidents: BTreeMap<String, Incident>,
    /// (node, when its incident opened) of closed incidents, oldest first, kept for
    /// [`RECENT_KEPT_FOR`].
    closed: VecDeque<(String, Instant)>,
}

/// How long a closed incident is remembered: the longest `safety.unhealthyWindow` allowed.
pub const RECENT_KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

impl Ledger {
    /// Opens an incident for `node` unless one is open, snapshotting the pods bound to it now.
    /// Returns whether a new incident was opened.
    pub fn open(&mut self, node: &str, since: Instant, view: &View) -> bool {
        if self.incidents.contains_key(node) {
            return false;
        }
        let pods_at_failure = view
            .pods_on(node)
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        self.incidents.insert(
            node.to_string(),
            Incident {
                node: node.to_string(),
                since,
                pods_at_failure,
                deleted: BTreeSet::new(),
                marked_not_ready: BTreeMap::new(),
                tainted: false,
                fence_request: None,
            },
        );
        true
    }

    pub fn get(&self, node: &str) -> Option<&Incident> {
        self.incidents.get(node)
    }

    pub fn get_mut(&mut self, node: &str) -> Option<&mut Incident> {
        self.incidents.get_mut(node)
    }

    /// Records that the pod `uid` on `node` was deleted (called by the actuator on success).
    pub fn record_deleted(&mut self, node: &str, uid: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.deleted.insert(uid.to_string());
        }
    }

    /// Records that the pod `uid` on `node` was marked NotReady, in `version`.
    pub fn record_marked_not_ready(&mut self, node: &str, uid: &str, version: Option<String>) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.marked_not_ready.insert(uid.to_string(), version);
        }
    }

    /// Records that the pod `uid` on `node` changed after podha marked it: no delete in the
    /// marked version any more.
    pub fn record_changed_since_mark(&mut self, node: &str, uid: &str) {
        if let Some(version) = self
            .incidents
            .get_mut(node)
            .and_then(|incident| incident.marked_not_ready.get_mut(uid))
        {
            *version = None;
        }
    }

    /// Records that podha asked `node`'s agent for a fence, with this request value.
    pub fn record_fence_request(&mut self, node: &str, request: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.fence_request = Some(request.to_string());
        }
    }

    /// Records that podha tainted `node`.
    pub fn record_tainted(&mut self, node: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.tainted = true;
        }
    }

    /// Closes the incident of `node` at `now`, returning it.
    pub fn close(&mut self, node: &str, now: Instant) -> Option<Incident> {
        let incident = self.incidents.remove(node)?;
        self.closed
            .push_back((incident.node.clone(), incident.since));
        while let Some((_, since)) = self.closed.front()
            && since.checked_add(RECENT_KEPT_FOR).is_some_and(|t| t < now)
        {
            self.closed.pop_front();
        }
        Some(incident)
    }

    /// Nodes whose incident opened at or after `cutoff`, open or closed since.
    pub fn failed_since(&self, cutoff: Instant) -> BTreeSet<&str> {
        self.incidents
            .values()
            .map(|i| (i.node.as_str(), i.since))
            .chain(self.closed.iter().map(|(n, since)| (n.as_str(), *since)))
            .filter(|(_, since)| *since >= cutoff)
            .map(|(node, _)| node)
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Incident> {
        self.incidents.values()
    }
}
