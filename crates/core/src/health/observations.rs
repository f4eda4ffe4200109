//! What podha has seen of one node, on its own clock. Shared by every policy watching the node;
//! the runtime feeds it from the Lease and Node watches, the TCP prober and its own view's gaps.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

/// The node's Ready condition as last observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadyStatus {
    True,
    False,
    Unknown,
    /// The node has no Ready condition (yet): no evidence either way.
    Missing,
}

impl ReadyStatus {
    /// From `status.conditions[type=Ready].status` (`None`: no Ready condition). A value other
    /// than `True` or `False` is read as `Unknown`: only an explicit `True` is a sign of life.
    pub fn from_condition_status(status: Option<&str>) -> Self {
        match status {
            None => Self::Missing,
            Some("True") => Self::True,
            Some("False") => Self::False,
            Some(_) => Self::Unknown,
        }
    }

    pub fn from_node(node: &Node) -> Self {
        let status = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        Self::from_condition_status(status)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
            Self::Missing => "Missing",
        }
    }
}

/// What a TCP connect to the kubelet port found. Only silence is evidence of a dead machine: a
/// refusal is the host's kernel answering (the machine runs, only the kubelet is gone), so its
/// containers may be running too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TcpResult {
    /// The connect succeeded: the kubelet (or something on its port) accepts.
    Connected,
    /// The host answered with a refusal (RST): the machine is up.
    Refused,
    /// No answer within the timeout, or the host is unreachable: what a powered-off or
    /// cut-off machine looks like from here.
    NoAnswer,
}

impl TcpResult {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Refused => "refused",
            Self::NoAnswer => "no answer",
        }
    }
}

/// Which prober a result comes from: the kubelet port's TCP connect, or podha agent's
/// heartbeat (an HTTP answer from the node's agent; see `crate::agent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeKind {
    KubeletTcp,
    Agent,
}

/// What a heartbeat and its answer say of the node's agent counting its silence (and so
/// fencing on isolation), for the `Agent` proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arming {
    /// The agent's own answer, to a probe over a challenge it issued: heard in this boot and
    /// not held. A silence after it counts.
    Armed,
    /// Nothing either way: no answer, or the agent's own answer to a probe over no challenge
    /// (the first of a leadership term or a boot: the agent learnt nothing from it, and a
    /// probe of the last leader held back on its way could still hold the node after it).
    Unsaid,
    /// The probe held the node (whether its answer came or not), or the answer says the agent
    /// is held, or never heard in this boot, or does not say what the probe asked, or came
    /// from something else than the agent: no silence counts until it is armed again.
    Disarmed,
}

/// One prober's results for a node: the latest, when it last got an answer, and since when it
/// has got none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probed {
    /// `None` until the first result: no result is no evidence either way.
    pub result: Option<TcpResult>,
    /// When the last probe that got an answer (connected or refused) was sent: the host was
    /// up at that instant or after it.
    pub answered: Option<Instant>,
    /// When the last probe its target itself answered (`Connected`) was sent: for the agent,
    /// an HTTP answer naming the node from an agent that counts itself heard in this boot (see
    /// [`NodeObservations::observe_agent`]). A refusal is the host's kernel, or something else
    /// on the port, never the agent: it is an answer for detection, not the agent's.
    pub connected: Option<Instant>,
    /// The agent's only: when the last probe was sent whose answer said the agent counts
    /// itself heard and does not take its node as held, so it counts its silence from then
    /// and fences on isolation; `None` since a probe held the node (see
    /// [`NodeObservations::observe_agent`]). What the `Agent` proof counts a silence after.
    pub armed: Option<Instant>,
    /// The agent's only: since podha last counted it armed in this term, a probe or an answer
    /// showed it may count no silence ([`Arming::Disarmed`]): held, never heard in this boot by
    /// its own word, or its port answered by something else than the agent.
    pub disarmed: bool,
    /// When the first unanswered probe of the current run of them came back: the host was
    /// silent by then (it died, or was cut off, at that instant or before).
    pub silent_since: Option<Instant>,
    /// Results of probes sent before this instant are ignored (see
    /// [`NodeObservations::restart_agent_hearing`]).
    pub from: Option<Instant>,
}

impl Probed {
    /// `counted`: whether a `Connected` result is the target's own answer (see
    /// [`Self::connected`]). Whether the result counts: not for a probe sent before
    /// [`Self::from`].
    fn observe(
        &mut self,
        result: TcpResult,
        counted: bool,
        sent: Instant,
        received: Instant,
    ) -> bool {
        if self.from.is_some_and(|from| sent < from) {
            return false;
        }
        self.result = Some(result);
        match result {
            TcpResult::Connected | TcpResult::Refused => {
                self.answered = Some(self.answered.map_or(sent, |t| t.max(sent)));
                self.silent_since = None;
                if counted && result == TcpResult::Connected {
                    self.connected = Some(self.connected.map_or(sent, |t| t.max(sent)));
                }
            }
            TcpResult::NoAnswer => {
                self.silent_since.get_or_insert(received);
            }
        }
        true
    }

    fn forget(&mut self) {
        self.result = None;
        self.silent_since = None;
    }
}

/// A fence acknowledgement seen on a Node, and what the node did after it.
#[derive(Clone, Debug)]
struct AckSeen {
    value: String,
    /// Renewals of the node's Lease podha saw after it.
    renewals_since: u32,
    /// The node booted again since (the fence was a reboot, or the node came back).
    rebooted: bool,
}

/// Observations of one node. Every instant is on podha's clock (`tokio::time::Instant`), taken
/// when podha saw something, never derived from a timestamp written by the node.
#[derive(Clone, Debug)]
pub struct NodeObservations {
    /// Where the Lease clock runs from: the latest of creation, an observed renewal and the end
    /// of a gap in podha's view.
    lease_baseline: Instant,
    /// The last renewal actually observed; unlike `lease_baseline`, evidence of life.
    last_renewal: Option<Instant>,
    /// The instant the last observed renewal happened no earlier than: when it was seen, or,
    /// seen at the end of a gap in podha's view, when the gap began (it may have been written
    /// any time in it).
    renewal_not_before: Option<Instant>,
    /// The Lease's `spec.renewTime` as last seen, to tell a renewal from a re-delivery.
    renew_time: Option<MicroTime>,
    /// The Lease's `spec.leaseDurationSeconds` as last seen; the kubelet renews every quarter
    /// of it.
    lease_duration: Option<std::time::Duration>,
    ready: ReadyStatus,
    /// The kubelet port's TCP connects.
    tcp: Probed,
    /// The node agent's heartbeats.
    agent: Probed,
    last_seen_alive: Option<Instant>,
    /// When this process first saw one of podha's taints on the node (cleared once it is gone).
    podha_tainted_since: Option<Instant>,
    /// The node's boot ID (`status.nodeInfo.bootID`) as last seen.
    boot_id: Option<String>,
    /// podha saw the node's Lease renewed in the boot the Node reports: a renewal seen after
    /// it saw that boot ID, with no gap in its view since (one may hide the boot ID changed and
    /// changed back). Anyone who may patch the Node's status can set its boot ID; the Lease
    /// renewals come from its kubelet, so only they show a boot that runs.
    renewed_in_boot: bool,
    /// The fence acknowledgement on the Node as last seen, with the Lease renewals podha saw
    /// since in the same boot.
    fence_ack: Option<AckSeen>,
    gap_since: Option<Instant>,
    /// Bumped whenever a gap begins or ends, so each tracker notices gaps it did not tick
    /// through without the runtime having to reach every tracker.
    gap_epoch: u64,
}

impl NodeObservations {
    /// A node podha has just started watching. The Lease clock starts now: podha cannot have
    /// seen a renewal before it looked.
    pub fn new(now: Instant) -> Self {
        Self {
            lease_baseline: now,
            last_renewal: None,
            renewal_not_before: None,
            renew_time: None,
            lease_duration: None,
            ready: ReadyStatus::Missing,
            tcp: Probed::default(),
            agent: Probed::default(),
            last_seen_alive: None,
            podha_tainted_since: None,
            boot_id: None,
            renewed_in_boot: false,
            fence_ack: None,
            gap_since: None,
            gap_epoch: 0,
        }
    }

    /// podha saw the node's Lease renewed at `at`.
    pub fn lease_renewed(&mut self, at: Instant) {
        if let Some(ack) = &mut self.fence_ack {
            ack.renewals_since += 1;
        }
        let not_before = self.gap_since.unwrap_or(at);
        self.renewal_not_before = Some(
            self.renewal_not_before
                .map_or(not_before, |r| r.max(not_before)),
        );
        self.lease_baseline = self.lease_baseline.max(at);
        self.last_renewal = Some(self.last_renewal.map_or(at, |r| r.max(at)));
        if self.boot_id.is_some() && self.gap_since.is_none() {
            self.renewed_in_boot = true;
        }
        self.saw_alive(at);
    }

    /// The Lease as delivered by a watch event at `at`. Counts as a renewal only when
    /// `renewTime` differs from the one seen before, so a re-list or an update of another field
    /// does not pass for a sign of life. Any change counts, not just a later time: a kubelet
    /// whose clock stepped back is still renewing. The first `renewTime` seen is recorded
    /// without counting: podha cannot tell when it was written. Returns whether it counted.
    pub fn observe_lease(&mut self, renew_time: Option<&MicroTime>, at: Instant) -> bool {
        let Some(renew_time) = renew_time else {
            return false;
        };
        let renewed = self
            .renew_time
            .as_ref()
            .is_some_and(|seen| seen != renew_time);
        self.renew_time = Some(renew_time.clone());
        if renewed {
            self.lease_renewed(at);
        }
        renewed
    }

    /// The Ready condition as seen at `at`. Only a change to True is a sign of life: the Node
    /// object is also updated by others (taints, labels) and a stale True re-delivered with
    /// such an update says nothing about the kubelet.
    pub fn observe_ready(&mut self, status: ReadyStatus, at: Instant) {
        if status == ReadyStatus::True && self.ready != ReadyStatus::True {
            self.saw_alive(at);
        }
        self.ready = status;
    }

    /// The result of the latest probe of `kind`: sent at `sent`, its result in at `received`.
    pub fn observe_probe(
        &mut self,
        kind: ProbeKind,
        result: TcpResult,
        sent: Instant,
        received: Instant,
    ) {
        self.probed_mut(kind).observe(result, true, sent, received);
    }

    /// The result of the latest heartbeat of the node's agent, sent at `sent`, in at
    /// `received`; `heard`: the agent said that, after this probe, it counts itself heard in
    /// this boot. An answer it does not know was heard (the first of a boot, or an agent too old
    /// to say) is an answer for detection (the agent runs), but not for the `Agent` proof: an
    /// agent cut off right after it counts itself never heard, and never fences on isolation.
    /// `arming`: what the probe and its answer say of the agent counting its silence, for the
    /// `Agent` proof ([`Arming`]).
    pub fn observe_agent(
        &mut self,
        result: TcpResult,
        heard: bool,
        arming: Arming,
        sent: Instant,
        received: Instant,
    ) {
        if !self.agent.observe(result, heard, sent, received) {
            return;
        }
        match arming {
            Arming::Armed => {
                self.agent.armed = Some(self.agent.armed.map_or(sent, |t| t.max(sent)));
                self.agent.disarmed = false;
            }
            Arming::Disarmed => {
                self.agent.armed = None;
                self.agent.disarmed = true;
            }
            Arming::Unsaid => {}
        }
    }

    /// The node no longer publishes an endpoint for `kind`: no evidence either way.
    pub fn forget_probe(&mut self, kind: ProbeKind) {
        self.probed_mut(kind).forget();
    }

    fn probed_mut(&mut self, kind: ProbeKind) -> &mut Probed {
        match kind {
            ProbeKind::KubeletTcp => &mut self.tcp,
            ProbeKind::Agent => &mut self.agent,
        }
    }

    /// What the prober of `kind` found.
    pub fn probed(&self, kind: ProbeKind) -> &Probed {
        match kind {
            ProbeKind::KubeletTcp => &self.tcp,
            ProbeKind::Agent => &self.agent,
        }
    }

    /// podha gained leadership at `at`: what it heard of the node's agent before (as an
    /// earlier leader, or from a round still in flight) is no evidence in this term, so it is
    /// forgotten, and results of probes sent before `at` are ignored. An agent's silence then
    /// counts only from this term's own probes (and its answers before the silence only from
    /// this term: see `planner::proof`), never from a silence that began while another
    /// replica held the lease and may have heard it.
    pub fn restart_agent_hearing(&mut self, at: Instant) {
        self.agent = Probed {
            from: Some(at),
            ..Probed::default()
        };
    }

    /// The node's boot ID as seen at `at`. A new boot's agent is another agent: what podha
    /// heard of the last boot's is forgotten, as at a new leadership term, so that a silence
    /// counts only after this boot's agent answered. (An agent whose port podha cannot reach
    /// from boot does not fence on isolation: podha must not count the silence that began when
    /// the previous boot ended.)
    pub fn observe_boot_id(&mut self, boot_id: Option<&str>, at: Instant) {
        let Some(now) = boot_id.filter(|b| !b.is_empty()) else {
            return;
        };
        if self.boot_id.as_deref().is_some_and(|before| before != now) {
            self.restart_agent_hearing(at);
            self.renewed_in_boot = false;
            // A new boot after the fence: its renewals contradict nothing.
            if let Some(ack) = &mut self.fence_ack {
                ack.rebooted = true;
            }
        }
        self.boot_id = Some(now.to_string());
    }

    /// The fence acknowledgement on the Node (`podha.io/fence-ack`) as seen now (after the
    /// Node's boot ID): a new one starts counting the Lease renewals seen after it, unless it
    /// answers a request of another boot than the node's current one (the reboot was the
    /// fence, or it is an old acknowledgement found by a new podha process).
    pub fn observe_fence_ack(&mut self, ack: Option<&str>) {
        match ack {
            None => self.fence_ack = None,
            Some(value) if self.fence_ack.as_ref().is_some_and(|a| a.value == value) => {}
            Some(value) => {
                let of_another_boot = crate::contract::requested_boot(value)
                    .is_some_and(|then| self.boot_id.as_deref().is_some_and(|now| now != then));
                self.fence_ack = Some(AckSeen {
                    value: value.to_string(),
                    renewals_since: 0,
                    rebooted: of_another_boot,
                });
            }
        }
    }

    /// How many renewals of the node's Lease podha saw after the fence acknowledgement now on
    /// the Node, in the boot it was written in (0 without one, or once the node rebooted).
    pub fn renewals_since_ack(&self) -> u32 {
        self.fence_ack
            .as_ref()
            .filter(|a| !a.rebooted)
            .map_or(0, |a| a.renewals_since)
    }

    /// Whether podha saw the node's Lease renewed in the boot the Node reports (see
    /// `renewed_in_boot`): what shows that boot runs, and so that a boot the Node reported
    /// before ended.
    pub fn renewed_in_boot(&self) -> bool {
        self.renewed_in_boot
    }

    /// The instant the last renewal podha saw happened no earlier than (see
    /// `renewal_not_before`): what shows a node ran on after some instant.
    pub fn renewal_not_before(&self) -> Option<Instant> {
        self.renewal_not_before
    }

    /// Whether the Node object carries one of podha's taints, as seen at `at`.
    pub fn observe_podha_taint(&mut self, present: bool, at: Instant) {
        if !present {
            self.podha_tainted_since = None;
        } else if self.podha_tainted_since.is_none() {
            self.podha_tainted_since = Some(at);
        }
    }

    /// When this process first saw podha's taint on the node, if it is on.
    pub fn podha_tainted_since(&self) -> Option<Instant> {
        self.podha_tainted_since
    }

    /// When the last answered TCP probe was sent (see [`Probed::answered`]).
    pub fn tcp_answered(&self) -> Option<Instant> {
        self.tcp.answered
    }

    /// Since when the kubelet port has not answered, if it does not now.
    pub fn tcp_silent_since(&self) -> Option<Instant> {
        self.tcp.silent_since
    }

    /// podha's own view of the node stops being trustworthy (watch restarting, API server
    /// unreachable, leadership changing). Until [`Self::end_gap`], probes count nothing.
    /// Idempotent: a gap already open stays open from its first start.
    pub fn begin_gap(&mut self, at: Instant) {
        self.renewed_in_boot = false;
        if self.gap_since.is_none() {
            self.gap_since = Some(at);
            self.gap_epoch += 1;
        }
    }

    /// podha's view is whole again at `at` (watch re-listed, leadership gained): restart the
    /// Lease clock as if a renewal had been seen now, since renewals may have been missed.
    /// Without an open gap this is a one-point gap: re-baselining is always safe, it only
    /// delays detection, so a missed `begin_gap` must not skip it.
    pub fn end_gap(&mut self, at: Instant) {
        self.gap_since = None;
        self.gap_epoch += 1;
        self.lease_baseline = self.lease_baseline.max(at);
    }

    /// A gap with no duration, e.g. leadership just gained with warm caches. Within an open gap
    /// it does nothing: that gap ends when the view is whole again, not now.
    pub fn gap(&mut self, at: Instant) {
        if !self.in_gap() {
            self.begin_gap(at);
            self.end_gap(at);
        }
    }

    pub fn in_gap(&self) -> bool {
        self.gap_since.is_some()
    }

    /// When the open gap began.
    pub fn gap_since(&self) -> Option<Instant> {
        self.gap_since
    }

    pub(super) fn gap_epoch(&self) -> u64 {
        self.gap_epoch
    }

    /// The Lease's duration as last seen (`spec.leaseDurationSeconds`).
    pub fn observe_lease_duration(&mut self, seconds: Option<i32>) {
        if let Some(secs) = seconds
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
        {
            self.lease_duration = Some(std::time::Duration::from_secs(secs));
        }
    }

    /// The longest a live node goes between two renewals: the kubelet renews every quarter of
    /// the lease duration, with up to 4 % jitter; 40 s (the kubelet's default) when unknown.
    pub fn renew_period_bound(&self) -> std::time::Duration {
        let duration = self
            .lease_duration
            .unwrap_or(std::time::Duration::from_secs(40));
        duration.mul_f64(0.25 * 1.05)
    }

    pub fn lease_baseline(&self) -> Instant {
        self.lease_baseline
    }

    pub fn last_renewal(&self) -> Option<Instant> {
        self.last_renewal
    }

    /// The Lease's `spec.renewTime` as last seen: for equality only, never ordered against
    /// podha's clock (a kubelet's clock may be off).
    pub fn renew_time(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.renew_time.as_ref().map(|t| t.0)
    }

    pub fn ready(&self) -> ReadyStatus {
        self.ready
    }

    pub fn tcp(&self) -> Option<TcpResult> {
        self.tcp.result
    }

    /// The last sign of life: an observed Lease renewal or a change of Ready to True. The
    /// `detect` phase of a failover runs from here to the instant the node was judged Failed.
    pub fn last_seen_alive(&self) -> Option<Instant> {
        self.last_seen_alive
    }

    fn saw_alive(&mut self, at: Instant) {
        self.last_seen_alive = Some(self.last_seen_alive.map_or(at, |t| t.max(at)));
    }
}

#[cfg(test)]
mod tests;
