//! When podha holds instead of acting: a policy with too many unhealthy nodes holds everything,
//! and a newly failed node waits until the rest of the cluster has shown it is fine.
//!
//! Nodes cut off together do not look dead together: each kubelet renews its Lease on its own
//! schedule (every quarter of the lease duration, 10 s by default), so their grace periods run
//! out spread over a whole renew interval, and the first of them may be judged Failed while the
//! others still look healthy. Counting only Failed nodes lets that first batch through.
//! So:
//! - **unhealthy** counts Failed and Suspect nodes (a failed probe already) and nodes that
//!   failed within `safety.unhealthyWindow` (so nodes failing one by one cannot each slip in
//!   under the limit);
//! - **settle**: before its first action on a newly failed node, a policy waits until every
//!   other watched node has shown life *after* the instant by which the failed node was
//!   certainly silent (so a node cut off at the same moment cannot pass for alive). That
//!   instant is one renew interval after its last renewal (it missed one by then), or, for a
//!   policy that probes the kubelet port, when its port first stopped answering if that came
//!   sooner. Life is a Lease renewal, or for such a policy a probe the host answered. A node not
//!   heard from since counts as unhealthy meanwhile. With the kubelet port probed every
//!   interval this costs about one interval; on the Lease alone, up to one renew interval
//!   with a short grace (nothing with the default 40 s). A wait that outlasts two renew
//!   intervals is reported as a hold.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{HoldReason, Incident, Intent, PlanInput, PolicyRef};
use crate::api::Signal;
use crate::health::NodeHealth;

/// What the planner needs of podha's own observations of a node's Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The last renewal podha saw, if any.
    pub last_renewal: Option<Instant>,
    /// The instant that last renewal happened no earlier than: when podha saw it, or the start
    /// of the gap in podha's view after which it was seen.
    pub renewal_not_before: Option<Instant>,
    /// Since when the Lease has been silent on podha's clock (the last renewal seen, or the
    /// start of watching, or the end of a gap in podha's view).
    pub silent_since: Instant,
    /// The longest a live node goes between two renewals.
    pub renew_period: Duration,
    /// When the last TCP probe the host answered was sent.
    pub tcp_answered: Option<Instant>,
    /// Since when the kubelet port has not answered, if it does not now.
    pub tcp_silent_since: Option<Instant>,
    /// When the last heartbeat the node's agent (or its host) answered was sent.
    pub agent_answered: Option<Instant>,
    /// When the last heartbeat the node's agent itself answered was sent (not its host's
    /// refusal): the only answers the `Agent` proof counts (see `planner::proof`).
    pub agent_connected: Option<Instant>,
    /// When the last heartbeat was sent whose answer said the agent counts itself heard and
    /// its silence (podha does not hold its node): what the `Agent` proof counts a silence
    /// after; `None` since a heartbeat held the node.
    pub agent_armed: Option<Instant>,
    /// Whether, since podha last counted the agent armed in this term, a heartbeat or an
    /// answer showed it may count no silence (held, never heard by its own word, or its port
    /// answered by something else): no silence counts, and no earlier term's word either.
    pub agent_disarmed: bool,
    /// Since when this process counts what it hears of the node's agent: the start of its
    /// leadership term, or the node's new boot seen since (`None`: not counted yet). A renewal
    /// of the agent's Lease seen since then is an agent running while this term never heard
    /// it (see `planner::proof`).
    pub agent_hearing_from: Option<Instant>,
    /// Since when the node's agent has not answered, if it does not now.
    pub agent_silent_since: Option<Instant>,
    /// When this process first saw podha's taint on the node, if it is on.
    pub tainted_since: Option<Instant>,
    /// How many renewals of the node's Lease podha saw after the fence acknowledgement on the
    /// Node, in the boot it was written in: a node fenced does not renew.
    pub renewals_since_ack: u32,
    /// Whether podha saw the node's Lease renewed in the boot its Node reports, after it saw
    /// that boot ID (see `NodeObservations::renewed_in_boot`): only then does a boot the Node
    /// reported before count as ended.
    pub renewed_in_boot: bool,
    /// The Lease's `renewTime` as podha last saw it: a machine whose Lease says otherwise
    /// right before its `ForceOff` renewed since (see `Intent::PowerOff`).
    pub renew_time: Option<k8s_openapi::jiff::Timestamp>,
    /// Whether podha's view of the node's Lease is in a gap now (its watch restarting, the API
    /// server unreachable): renewals may be going unseen, so no silence of the Lease counts.
    pub lease_view_gap: bool,
}

impl Heartbeat {
    /// A node podha has heard nothing of since `since`, renewing its Lease at most every
    /// `renew_period`: every other observation is absent.
    pub fn silent_since(since: Instant, renew_period: Duration) -> Self {
        Self {
            last_renewal: None,
            renewal_not_before: None,
            silent_since: since,
            renew_period,
            tcp_answered: None,
            tcp_silent_since: None,
            agent_answered: None,
            agent_connected: None,
            agent_armed: None,
            agent_disarmed: false,
            agent_hearing_from: None,
            agent_silent_since: None,
            tainted_since: None,
            renewals_since_ack: 0,
            renewed_in_boot: false,
            renew_time: None,
            lease_view_gap: false,
        }
    }

    /// The instant by which this node was certainly silent: it missed a renewal one renew
    /// interval after its last one; with a probe the policy listens to, that probe stopped
    /// being answered, when that came later than its last renewal (an older silence of a probe
    /// says nothing about when the Lease stopped). A policy that does not listen to the
    /// kubelet's heartbeat judged the node on its probes alone, every one of them silent: the
    /// node was silent once the last of them fell silent, whatever the Lease did.
    fn certainly_silent_by(&self, probes: Probes) -> Instant {
        let missed_renewal = self.silent_since + self.renew_period;
        let silences = self.probe_silences(probes).flatten();
        if !probes.lease {
            return silences.max().unwrap_or(missed_renewal);
        }
        silences
            .filter(|s| *s >= self.silent_since)
            .fold(missed_renewal, Instant::min)
    }

    /// When the node's Lease had certainly missed a renewal, if podha sees none by then and its
    /// view has no gap meanwhile: a renew interval and [`RENEWAL_SLACK`] after the last renewal
    /// podha saw (or after the start of watching, or the end of a gap in its view).
    fn renewal_missed_at(&self) -> Instant {
        self.silent_since + self.renew_period + RENEWAL_SLACK
    }

    /// For each probe the policy listens to besides the Lease, since when it has not been
    /// answered (`None` while it is).
    fn probe_silences(&self, probes: Probes) -> impl Iterator<Item = Option<Instant>> {
        [
            (probes.tcp, self.tcp_silent_since),
            (probes.agent, self.agent_silent_since),
        ]
        .into_iter()
        .filter_map(|(listened, since)| listened.then_some(since))
    }

    /// Since when every probe the policy listens to has been silent (the last of them to fall
    /// silent), if it listens to any and all of them are.
    fn probes_silent_since(&self, probes: Probes) -> Option<Instant> {
        self.probe_silences(probes)
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .max()
    }

    /// Whether the node renewed its Lease after this process saw podha's taint on it: the
    /// proof that it is back. A Ready=True alone is not (after a death it stays True until the
    /// node lifecycle controller's grace, 40 s, runs out), nor is a tracker that just started
    /// (a new leader's, a restarted process's) and has no failure to remember.
    pub(super) fn renewed_since_tainted(&self) -> bool {
        matches!((self.last_renewal, self.tainted_since), (Some(r), Some(t)) if r > t)
    }

    /// Whether this node showed life after `at`, over a path the policy judges by: a policy
    /// that does not listen to the Lease judged on podha's own probes, and a fault of podha's
    /// own path to the nodes (a NetworkPolicy, a firewall) silences those while every kubelet
    /// renews on: only a probe's answer says that path works. A node that answers none of the
    /// policy's probes (no agent under `AgentHeartbeat` alone) is never heard from, and the
    /// policy holds rather than act on a death it cannot tell from its own cut.
    fn alive_after(&self, at: Instant, probes: Probes) -> bool {
        (probes.lease && self.last_renewal.is_some_and(|r| r > at))
            || (probes.tcp && self.tcp_answered.is_some_and(|t| t >= at))
            || (probes.agent && self.agent_answered.is_some_and(|t| t >= at))
    }
}

/// The probes a policy listens to besides the Lease, and whether it listens to the Lease (or
/// to `NodeReady`, which follows it).
#[derive(Clone, Copy, Debug)]
struct Probes {
    lease: bool,
    tcp: bool,
    agent: bool,
}

impl Probes {
    fn of(policy: PolicyRef<'_>) -> Self {
        let detection = &policy.spec.detection;
        Self {
            lease: detection.watches_kubelet_heartbeat(),
            tcp: detection.signals.contains(&Signal::KubeletTCP),
            agent: detection.signals.contains(&Signal::AgentHeartbeat),
        }
    }
}

/// Heartbeats by node name.
pub type Heartbeats = BTreeMap<String, Heartbeat>;

/// Policies that hold every action: those with more unhealthy nodes than `safety.maxUnhealthy`
/// allows, and those that come after a policy podha cannot read. Nodes and pods go to the
/// first policy by name that selects them; an unreadable policy may select any of them, and
/// what it would decide is unknown, so no policy after it may act in its place (one before it
/// owns its nodes and pods whatever it says).
pub(super) fn held_policies<'a>(
    policies: &[PolicyRef<'a>],
    input: &PlanInput<'_>,
) -> BTreeMap<&'a str, HoldReason> {
    let mut held = BTreeMap::new();
    let first_unreadable = input.unreadable.iter().min();
    for policy in policies {
        if let Some(unreadable) = first_unreadable.filter(|u| u.as_str() < policy.name) {
            held.insert(
                policy.name,
                HoldReason::PolicyUnreadable {
                    unreadable: unreadable.clone(),
                },
            );
            continue;
        }
        let Some(nodes) = input.health.get(policy.name) else {
            continue;
        };
        let watched = nodes.len();
        let window = policy.spec.safety.unhealthy_window.get();
        let recent = input
            .now
            .checked_sub(window)
            .map(|cutoff| input.ledger.failed_since(cutoff))
            .unwrap_or_default();
        let unhealthy = nodes
            .iter()
            .filter(|(name, h)| !matches!(h, NodeHealth::Healthy) || recent.contains(name.as_str()))
            .count();
        if let Some(hold) = unhealthy_hold(*policy, unhealthy, watched) {
            held.insert(policy.name, hold);
        }
    }
    held
}

/// The hold of `policy` with `unhealthy` of its `watched` nodes unhealthy, if that is more
/// than `safety.maxUnhealthy` allows.
pub fn unhealthy_hold(
    policy: PolicyRef<'_>,
    unhealthy: usize,
    watched: usize,
) -> Option<HoldReason> {
    let max = policy.spec.max_unhealthy_nodes(watched);
    (unhealthy > max).then_some(HoldReason::TooManyUnhealthy {
        failed: unhealthy,
        watched,
        max,
    })
}

/// How much later than its renew interval a node's renewal may reach podha and still be on
/// time: the kubelet's request and podha's watch each take their time, and it varies (the
/// kubelet itself renews up to 4 % late).
pub const RENEWAL_SLACK: Duration = Duration::from_secs(3);

/// Whether `policy` may take its first action on `incident`'s node yet.
pub(super) enum Settle {
    /// Act (or podha acted on this incident already: no reason to stop half-way).
    Go,
    /// Wait; with a hold to report when the wait has gone on for too long.
    Wait(Option<Intent>),
}

pub(super) fn settle(policy: PolicyRef<'_>, incident: &Incident, input: &PlanInput<'_>) -> Settle {
    if incident.acted() {
        return Settle::Go;
    }
    settled(policy, incident, input)
}

/// Whether the settle rule lets a first action on `incident`'s node go now, whatever podha did
/// there already: what a request of another kind, asked for the first time in a failover under
/// way (a `ForceOff` beside an agent's fence request), must pass too.
pub(super) fn settled(policy: PolicyRef<'_>, incident: &Incident, input: &PlanInput<'_>) -> Settle {
    let (Some(nodes), Some(dead)) = (
        input.health.get(policy.name),
        input.heartbeats.get(&incident.node),
    ) else {
        return Settle::Go;
    };
    let probes = Probes::of(policy);
    // A fault of podha's own path to the node (a firewall, a NetworkPolicy, a switch between
    // podha and a rack) silences its probes while its kubelet renews on through the API
    // server: nothing is asked of the machine, and nothing moves, until its Lease missed a
    // renewal. A policy judging by the Lease with its default grace waits for no more than
    // that already; one judging on probes alone waits up to a renew interval.
    if dead.lease_view_gap || input.now < dead.renewal_missed_at() {
        let renewed_after_probes = dead
            .probes_silent_since(probes)
            .zip(dead.last_renewal)
            .and_then(|(silent, renewed)| (renewed > silent).then_some(renewed));
        return Settle::Wait(renewed_after_probes.map(|renewed| Intent::Hold {
            policy: policy.name.to_string(),
            node: Some(incident.node.clone()),
            reason: HoldReason::LeaseRenewing {
                renewed_ago: input.now.saturating_duration_since(renewed),
            },
        }));
    }
    // Anyone cut off together with the dead node has been silent since then too.
    let cutoff = dead.certainly_silent_by(probes);
    let unhealthy = nodes
        .values()
        .filter(|h| !matches!(h, NodeHealth::Healthy))
        .count();
    let unheard = nodes
        .iter()
        .filter(|(name, h)| {
            matches!(h, NodeHealth::Healthy)
                && input
                    .heartbeats
                    .get(name.as_str())
                    .is_none_or(|hb| !hb.alive_after(cutoff, probes))
        })
        .count();
    let max = policy.spec.max_unhealthy_nodes(nodes.len());
    if unhealthy + unheard <= max {
        return Settle::Go;
    }
    let overdue = cutoff + dead.renew_period * 2 <= input.now;
    Settle::Wait(overdue.then(|| Intent::Hold {
        policy: policy.name.to_string(),
        node: Some(incident.node.clone()),
        reason: HoldReason::Unconfirmed {
            unheard,
            watched: nodes.len(),
        },
    }))
}
