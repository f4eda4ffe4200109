//! The agent's Lease in podha's namespace ([`AdvertLease`], see [`crate::contract`]): renewed
//! while the agent runs and owned by its Pod, so that an agent uninstalled, moved away by a
//! nodeSelector or stopped for good no longer passes for one that fences. It says whether podha
//! has heard the agent in this boot, for a podha replica that gains leadership
//! (`planner::proof`), and that the agent heeds holds, terms and renewals; while a leader that
//! never heard the agent leads, or podha does not hear it, it is renewed often enough for
//! podha to see it run.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info, warn};

use super::FIELD_MANAGER;
use crate::contract::{
    AGENT_HEARD_IN_BOOT_ANNOTATION, AGENT_HEARD_WITHIN, AGENT_HEEDS_HOLD_ANNOTATION,
    AGENT_HEEDS_RENEWALS_ANNOTATION, AGENT_HEEDS_TERM_ANNOTATION, AGENT_LEASE_DURATION,
    AGENT_LEASE_LABEL, AGENT_LEASE_RENEW, AGENT_PEERS_UNREACHABLE_ANNOTATION, agent_lease_name,
};
use crate::isolation::{RenewalsCount, Silence};
use crate::leader_key::LeaderKey;
use crate::peer_list::lock;
use crate::peers::{SharedReach, lease_value};
use crate::server::SharedHearing;

/// How often the Lease's renewal cadence is looked at again between renewals: podha may stop
/// hearing the agent at any time, and the quicker cadence must start within a second.
const CADENCE_RECHECK: Duration = Duration::from_secs(1);

/// How long one renewal may take before the agent gives it up: a request whose answer never
/// comes (a connection black-holed) must not stop the renewals. While the agent stays up on
/// them, half the renewal window at most (see [`AdvertLease::renewal_timeout`]); a renewal
/// given up but written anyway counts for podha only (later: the side that holds).
const RENEWAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The agent's Pod (from the downward API), owner of its Lease: the garbage collector deletes
/// the Lease with the Pod, even when the agent was killed before it could.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerPod {
    pub name: String,
    pub uid: String,
}

/// The agent's Lease: renewed every [`AGENT_LEASE_RENEW`] for [`AGENT_LEASE_DURATION`]. Each
/// renewal also says whether podha has heard the agent in this boot
/// ([`AGENT_HEARD_IN_BOOT_ANNOTATION`]), so that a podha replica that gains leadership knows
/// the agent counts its silence. While the agent stays up on its renewals (a leader of a later
/// term than the one that last heard it leads, or podha does not hear it and counts from the
/// renewals), it is renewed more often (see [`AdvertLease::following`]).
pub struct AdvertLease {
    leases: Api<Lease>,
    node: String,
    owner: Option<OwnerPod>,
    /// This node's boot ID, if the agent could read it (without it the Lease says nothing of
    /// being heard).
    boot: Option<String>,
    pub(super) hearing: SharedHearing,
    /// The leader Lease as the agent follows it: its term.
    leader: Arc<LeaderKey>,
    /// How recent a renewal must be for podha to count no silence of the agent
    /// ([`crate::isolation::renewal_window`]).
    window: Duration,
    /// Whether the agent reaches its peers (see `crate::peers`): said on each renewal.
    reach: SharedReach,
}

impl AdvertLease {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        node: &str,
        owner: Option<OwnerPod>,
        boot: Option<String>,
        hearing: SharedHearing,
    ) -> Self {
        Self {
            leases: Api::namespaced(client, namespace),
            node: node.to_string(),
            owner,
            boot,
            hearing,
            leader: Arc::default(),
            window: Duration::ZERO,
            reach: SharedReach::default(),
        }
    }

    /// The Lease following the leader Lease's term as `leader` reads it: while the agent may
    /// stay up on its renewals (a leader of a later term than any heartbeat the agent counted
    /// leads, one that never heard it; or podha has not heard the agent for
    /// [`AGENT_HEARD_WITHIN`] and its leader counts from the renewals), the Lease is renewed
    /// every third of `window` (but not more often than every second), so that podha sees it
    /// renewed and counts no silence of it, and the agent, which stays up only while its last
    /// renewal is within `window`, does (see [`crate::isolation::Renewing`]).
    pub fn following(mut self, leader: Arc<LeaderKey>, window: Duration) -> Self {
        self.leader = leader;
        self.window = window;
        self
    }

    /// The Lease saying, on each renewal, whether the agent reaches its peers as `reach` holds
    /// it ([`AGENT_PEERS_UNREACHABLE_ANNOTATION`]).
    pub fn reporting(mut self, reach: SharedReach) -> Self {
        self.reach = reach;
        self
    }

    /// Whether the agent may stay up on its renewals now (see [`crate::isolation::Renewing`]):
    /// a leader that never heard it leads, or podha has not heard it for
    /// [`AGENT_HEARD_WITHIN`] and counts from the renewals. Then its Lease is renewed often.
    /// So it is while podha has not heard it for as long and the watch of the leader Lease is
    /// failing: the term the agent then reads may be one whose leader never heard it, and the
    /// renewal that keeps it up must be recent already.
    fn staying_on_renewals(&self) -> bool {
        let hearing = lock(&self.hearing);
        let now = tokio::time::Instant::now();
        let unheard = matches!(hearing.silence(now), Silence::For(d) if d >= AGENT_HEARD_WITHIN);
        match hearing.renewing(self.leader.term(), now, Duration::MAX) {
            Some(r) if matches!(r.why, RenewalsCount::NewTerm { .. }) => true,
            Some(_) => unheard,
            None => unheard && hearing.counts_silence() && !self.leader.fresh(),
        }
    }

    /// Whether the agent stays up now on a renewal within the window: a failed renewal is then
    /// tried again a second later.
    fn renewal_keeps_it_up(&self) -> bool {
        lock(&self.hearing)
            .renewing(self.leader.term(), tokio::time::Instant::now(), self.window)
            .is_some()
    }

    /// How long a renewal may take: [`RENEWAL_TIMEOUT`], or half the window while the agent
    /// may stay up on its renewals, so that one that hangs leaves time for another within the
    /// window.
    fn renewal_timeout(&self) -> Duration {
        self.while_staying(RENEWAL_TIMEOUT, 2)
    }

    /// How long until the next renewal: [`AGENT_LEASE_RENEW`], or a third of the window while
    /// the agent may stay up on its renewals.
    fn next_renewal(&self) -> Duration {
        self.while_staying(AGENT_LEASE_RENEW, 3)
    }

    /// `usual`, or while the agent may stay up on its renewals the window's `share`th part if
    /// that is shorter (but at least a second).
    fn while_staying(&self, usual: Duration, share: u32) -> Duration {
        if self.staying_on_renewals() {
            usual.min((self.window / share).max(Duration::from_secs(1)))
        } else {
            usual
        }
    }

    /// The Lease as renewed at `now`, for a server-side apply, saying in which boot podha has
    /// heard this agent, if it has and does not hold its node (while it does, or asks to, the
    /// agent counts no silence, and a new leader must not count it either; a server-side
    /// apply without the word takes an earlier one off); and whether a hold waits for this
    /// renewal (its body then lacks the word: written, the hold is taken). Read at once, so
    /// the two agree.
    fn renewal(&self, now: Timestamp) -> (serde_json::Value, bool) {
        let hearing = lock(&self.hearing);
        let counts = hearing.heard_ago(tokio::time::Instant::now()).is_some() && !hearing.holding();
        let heard_in_boot = self.boot.as_deref().filter(|_| counts);
        (self.body_saying(now, heard_in_boot), hearing.hold_pending())
    }

    /// The Lease as renewed at `now`, saying podha heard the agent in `heard_in_boot`, if any.
    fn body_saying(&self, now: Timestamp, heard_in_boot: Option<&str>) -> serde_json::Value {
        let mut annotations = json!({
            AGENT_HEEDS_HOLD_ANNOTATION: "true",
            AGENT_HEEDS_TERM_ANNOTATION: "true",
            AGENT_HEEDS_RENEWALS_ANNOTATION: "true",
        });
        if let Some(boot) = heard_in_boot {
            annotations[AGENT_HEARD_IN_BOOT_ANNOTATION] = json!(boot);
        }
        if let Some(round) = lock(&self.reach).unreachable() {
            annotations[AGENT_PEERS_UNREACHABLE_ANNOTATION] = json!(lease_value(round));
        }
        let mut metadata = json!({
            "name": agent_lease_name(&self.node),
            "labels": {AGENT_LEASE_LABEL: "true"},
            "annotations": annotations,
        });
        if let Some(pod) = &self.owner {
            // No blockOwnerDeletion: setting it needs a right on the Pod the agent lacks.
            metadata["ownerReferences"] = json!([{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "uid": pod.uid,
            }]);
        }
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": AGENT_LEASE_DURATION.as_secs(),
                "renewTime": MicroTime(now),
            },
        })
    }

    /// Renews the Lease every [`AGENT_LEASE_RENEW`] (or more often, [`Self::next_renewal`])
    /// for as long as the agent runs; at once when podha starts or stops holding the node.
    /// When the agent may stay up on its renewals (the leader Lease shows a new term while
    /// podha counts this agent's silence, or podha stopped hearing it), the renewals follow the
    /// quicker cadence (a third of the renewal window) from the last one sent, at once if that
    /// one is older: podha must see the agent renewed before the agent's watchdog, unpetted
    /// once the silence passes the isolation timeout less the watchdog's, resets the node (see
    /// [`crate::isolation::Renewing`]). The cadence is looked at again every
    /// [`CADENCE_RECHECK`] and whenever the term changes. With the chart's timings
    /// it is the 10 s one, so a leader change adds no write; at the shortest it is 1.3 s, and
    /// terms that change faster (a leader crash-looping, a person editing the Lease) add no
    /// more than one write per cadence. A renewal is given up after [`RENEWAL_TIMEOUT`]; a
    /// failed one is tried again at the next cadence (three may fail before the Lease lapses),
    /// or a second later while the agent stays up on a renewal still within the window.
    pub async fn keep(&self) {
        let name = agent_lease_name(&self.node);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let held_changed = lock(&self.hearing).held_changed();
        let term_changed = self.leader.term_changed();
        // Whether the last renewal went through (`None` before the first): a change is said
        // once, not every failure (they may come every second).
        let mut last_written: Option<bool> = None;
        loop {
            let sent = tokio::time::Instant::now();
            let (body, pending) = self.renewal(Timestamp::now());
            let apply = Patch::Apply(&body);
            let patch = self.leases.patch(&name, &params, &apply);
            let timeout = self.renewal_timeout();
            let written = match tokio::time::timeout(timeout, patch).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            if written.is_ok() {
                let mut hearing = lock(&self.hearing);
                hearing.hold_written(pending);
                hearing.lease_renewed(sent);
            }
            match (&written, last_written) {
                (Ok(()), Some(true)) => {}
                (Ok(()), _) => {
                    info!(lease = %name, "agent Lease renewed: podha counts this agent");
                }
                (Err(error), Some(false)) => {
                    debug!(lease = %name, error, "cannot renew the agent Lease yet");
                }
                (Err(error), _) => warn!(lease = %name, error, "cannot renew the agent Lease"),
            }
            last_written = Some(written.is_ok());
            // Staying up on a renewal still within the window, the agent tries again a second
            // after a failure (past the window, one more try no longer keeps it up: the
            // cadence goes back, and an API server that is down is not asked every second).
            let cadence = |lease: &Self| match written {
                Err(_) if lease.renewal_keeps_it_up() => CADENCE_RECHECK,
                _ => lease.next_renewal(),
            };
            let next = tokio::time::sleep(cadence(self));
            tokio::pin!(next);
            loop {
                tokio::select! {
                    () = &mut next => break,
                    () = held_changed.notified() => break,
                    () = term_changed.notified() => {}
                    () = tokio::time::sleep(CADENCE_RECHECK) => {}
                }
                let due = sent + cadence(self);
                if due <= tokio::time::Instant::now() {
                    break;
                }
                next.as_mut().reset(due);
            }
        }
    }

    pub(super) async fn delete(&self) -> Result<(), kube::Error> {
        match self
            .leases
            .delete(&agent_lease_name(&self.node), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
