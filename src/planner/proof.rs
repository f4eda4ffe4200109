//! Whether a dead node is proven fenced, as its policy's `spec.fencing` asks, before podha
//! puts the out-of-service taint on it: what proves it (the cloud's shutdown taint, an
//! acknowledgement of this incident's fence request, an agent's silence past what it
//! advertises) and what podha knows of the node's agent for it.
//!
//! An agent's silence proves its fence only where the agent's own rule would have fenced it:
//! the agent fences when podha stops hearing it while podha hears others, and stays when a
//! strict majority of its peers say podha hears nobody. So podha counts the silence only of an
//! agent it heard right before the silence began, in its current leadership term (an agent
//! it never heard, its port blocked, has nothing to lose and fences nothing), and only while
//! it hears a strict majority of the other agents it expects (then no majority of peers can
//! have vouched for the silent one). The silence counts only from when podha began hearing
//! enough agents without a break (see [`agent_quorum`]): while podha heard too few (the agent
//! port blocked everywhere), an agent cut off meanwhile had its peers vouch for it and stayed
//! up, petting its watchdog; it starts deciding to fence only once podha hears enough of its
//! peers again.
//!
//! Heard means an answer from the agent itself: an HTTP answer naming the node
//! ([`Heartbeat::agent_connected`](super::Heartbeat::agent_connected)). A refused connect, an
//! error status or an answer naming another node says the machine runs (detection counts it),
//! not that its agent does: an agent stopped for good (its watchdog disarmed) leaves its port
//! refusing, and a silence after that proves nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use super::holds::Heartbeats;
use crate::api::{CLOUD_SHUTDOWN_TAINT_KEY, Fencing, FencingProof};
use crate::contract::{AGENT_PROBE_INTERVAL, FENCE_ACK_ANNOTATION, agent_addr, fenced_within};
use crate::view::View;

/// How recently podha must have got an answer from an agent to count it as heard: before its
/// silence began (the silent agent), or now (the other agents). podha sends a round of probes
/// every [`AGENT_PROBE_INTERVAL`] and each answer comes back within the probe's timeout (at
/// most one interval), so an agent that answers every probe was last answered at most two
/// intervals before the round now in flight comes back; a third interval absorbs a round
/// delayed by a slow batch or the decision loop's tick. It must stay within half the shortest
/// silence that can prove a fence (the agent's shortest isolation timeout, 8 s, with any
/// margin): an agent still running then, surveying its peers, counts a peer podha heard that
/// recently as heard (it takes half its own silence) and fences.
pub const AGENT_HEARD_WITHIN: Duration = AGENT_PROBE_INTERVAL.saturating_mul(3);

/// What podha knows of a node's agent for the `Agent` proof, computed by [`agent_evidence`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentEvidence<'a> {
    /// How long the agent has not answered podha's heartbeat; `None` while it answers (or was
    /// never asked).
    pub silent_for: Option<Duration>,
    /// How long before its silence began podha last got an answer from the agent itself (not
    /// its host's refusal); `None` when podha got none in its current leadership term before
    /// the silence.
    pub heard_before_silence: Option<Duration>,
    /// The other nodes advertising an agent whose agent itself answered podha within
    /// [`AGENT_HEARD_WITHIN`].
    pub others_heard: usize,
    /// The other nodes advertising an agent (`podha.io/agent-port`, with an InternalIP).
    pub others_expected: usize,
    /// How long podha has heard enough agents without a break (see [`agent_quorum`]); `None`
    /// while it does not. The silence counts only for this long.
    pub quorum_for: Option<Duration>,
    /// The fence podha asked the agent for in this incident, if it did.
    pub request: Option<&'a str>,
}

impl AgentEvidence<'_> {
    /// Why the agent's silence proves no fence, if it is silent and it does not (see the
    /// module's rule); however long the silence lasts, it will not prove one until this
    /// changes.
    pub fn silence_doubt(&self) -> Option<SilenceDoubt> {
        self.silent_for?;
        match self.heard_before_silence {
            None => Some(SilenceDoubt::NeverHeard),
            Some(gap) if gap > AGENT_HEARD_WITHIN => Some(SilenceDoubt::HeardLongBefore { gap }),
            Some(_) if self.others_heard * 2 <= self.others_expected => {
                Some(SilenceDoubt::FewOthersHeard {
                    heard: self.others_heard,
                    expected: self.others_expected,
                })
            }
            Some(_) => None,
        }
    }
}

impl AgentEvidence<'_> {
    /// How much of the silence counts: the part since podha has heard enough agents (see
    /// [`agent_quorum`]); `None` while the agent answers or podha hears too few.
    pub fn counted_silence(&self) -> Option<Duration> {
        self.silent_for.zip(self.quorum_for).map(|(s, q)| s.min(q))
    }
}

/// Whether podha hears enough of the `expected` agents (nodes advertising one) to count an
/// agent's silence: `heard` of them answered within [`AGENT_HEARD_WITHIN`], a strict majority
/// of the others of any agent it does not hear (`2 * heard > expected - 1`: with two agents,
/// one of them). Then no agent it does not hear can have a strict majority of its peers
/// vouching for it.
pub const fn agent_quorum(heard: usize, expected: usize) -> bool {
    heard * 2 > expected.saturating_sub(1)
}

/// Why a silent agent's silence proves no fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SilenceDoubt {
    /// podha got no answer from the agent in its current leadership term before the silence:
    /// its port may be blocked, or it stopped before this term began.
    NeverHeard,
    /// podha's last answer from the agent came `gap` before its silence began, more than
    /// [`AGENT_HEARD_WITHIN`].
    HeardLongBefore { gap: Duration },
    /// podha hears `heard` of the `expected` other agents, no strict majority.
    FewOthersHeard { heard: usize, expected: usize },
}

impl SilenceDoubt {
    /// The doubt without its figures: what tells two holds of the same node apart.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NeverHeard => "NeverHeard",
            Self::HeardLongBefore { .. } => "HeardLongBefore",
            Self::FewOthersHeard { .. } => "FewOthersHeard",
        }
    }

    /// The doubt in words, about the agent of `node`.
    pub fn describe(self, node: &str) -> String {
        match self {
            Self::NeverHeard => format!(
                "podha never heard the agent of node {node} in this leadership term: an agent \
                 podha never heard (its port blocked, or stopped before this term) may not have \
                 fenced its node"
            ),
            Self::HeardLongBefore { gap } => format!(
                "podha last heard the agent of node {node} {}s before its silence began (more \
                 than {}s): the silence may not be the agent's",
                gap.as_secs(),
                AGENT_HEARD_WITHIN.as_secs()
            ),
            Self::FewOthersHeard { heard, expected: 0 } => format!(
                "podha hears {heard} of the 0 other agents it expects: an agent without peers \
                 stays up when podha stops hearing it, so the silence of node {node}'s agent \
                 proves no fence"
            ),
            Self::FewOthersHeard { heard, expected } => format!(
                "podha hears {heard} of the {expected} other agents it expects: the agent port \
                 may be blocked, and the peers of node {node}'s agent may have kept it up"
            ),
        }
    }
}

/// What podha knows of `node`'s agent now, from its heartbeats and the nodes in `view`
/// (those advertising an agent are the ones podha expects to hear); `request` is the fence
/// this incident asked for. The one place both the planner and the decision loop's report of
/// the proof take it from.
pub fn agent_evidence<'a>(
    node: &str,
    view: &View,
    heartbeats: &Heartbeats,
    quorum_since: Option<Instant>,
    now: Instant,
    request: Option<&'a str>,
) -> AgentEvidence<'a> {
    let own = heartbeats.get(node);
    let silent_since = own.and_then(|hb| hb.agent_silent_since);
    let heard_before_silence = own
        .and_then(|hb| hb.agent_connected)
        .zip(silent_since)
        .map(|(answered, since)| since.saturating_duration_since(answered));
    let others = view
        .nodes
        .iter()
        .filter(|(name, n)| name.as_str() != node && agent_addr(n).is_some());
    let (mut others_heard, mut others_expected) = (0, 0);
    for (name, _) in others {
        others_expected += 1;
        others_heard += usize::from(heard_now(heartbeats, name, now));
    }
    AgentEvidence {
        silent_for: silent_since.map(|since| now.saturating_duration_since(since)),
        heard_before_silence,
        others_heard,
        others_expected,
        quorum_for: quorum_since.map(|since| now.saturating_duration_since(since)),
        request,
    }
}

/// Whether podha hears `node`'s agent now: the agent itself answered within
/// [`AGENT_HEARD_WITHIN`].
fn heard_now(heartbeats: &Heartbeats, node: &str, now: Instant) -> bool {
    heartbeats
        .get(node)
        .and_then(|hb| hb.agent_connected)
        .is_some_and(|t| now.saturating_duration_since(t) <= AGENT_HEARD_WITHIN)
}

/// Whether podha hears enough agents now ([`agent_quorum`] over the nodes of `view` that
/// advertise one); the decision loop follows since when it has, without a break.
pub fn hears_agent_quorum(view: &View, heartbeats: &Heartbeats, now: Instant) -> bool {
    let (mut heard, mut expected) = (0, 0);
    for name in view
        .nodes
        .iter()
        .filter(|(_, n)| agent_addr(n).is_some())
        .map(|(name, _)| name)
    {
        expected += 1;
        heard += usize::from(heard_now(heartbeats, name, now));
    }
    expected > 0 && agent_quorum(heard, expected)
}

/// What proved a node fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceEvidence {
    /// The policy asks for no proof.
    NotAsked,
    /// The cloud provider's shutdown taint.
    CloudShutdown,
    /// The agent acknowledged podha's fence request.
    AgentAcknowledged,
    /// The agent has been silent past its isolation timeout and the margin.
    AgentSilent,
    /// The user's fence controller acknowledged podha's fence request.
    ExternalAcknowledged,
}

impl FenceEvidence {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotAsked => "NotAsked",
            Self::CloudShutdown => "CloudShutdownTaint",
            Self::AgentAcknowledged => "AgentAcknowledged",
            Self::AgentSilent => "AgentSilent",
            Self::ExternalAcknowledged => "ExternalAcknowledged",
        }
    }
}

/// The proof `fencing` asks for, if `node` has it (always, with `None`).
pub fn proven(fencing: &Fencing, node: &Node, agent: AgentEvidence<'_>) -> Option<FenceEvidence> {
    match fencing.proof {
        FencingProof::None => Some(FenceEvidence::NotAsked),
        FencingProof::CloudShutdownTaint => node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|taints| taints.iter().any(|t| t.key == CLOUD_SHUTDOWN_TAINT_KEY))
            .then_some(FenceEvidence::CloudShutdown),
        FencingProof::External => {
            acknowledged(node, agent.request).then_some(FenceEvidence::ExternalAcknowledged)
        }
        FencingProof::Agent => {
            let acknowledged = acknowledged(node, agent.request);
            let isolation = fenced_within(node);
            let silent = agent.silence_doubt().is_none()
                && matches!(
                    (agent.counted_silence(), isolation),
                    (Some(silent), Some(timeout)) if silent >= timeout + fencing.agent_margin.get()
                );
            if acknowledged {
                Some(FenceEvidence::AgentAcknowledged)
            } else if silent {
                Some(FenceEvidence::AgentSilent)
            } else {
                None
            }
        }
    }
}

/// Whether `node` carries the acknowledgement of `request` (this incident's fence request).
fn acknowledged(node: &Node, request: Option<&str>) -> bool {
    request.is_some_and(|request| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FENCE_ACK_ANNOTATION))
            .map(String::as_str)
            == Some(request)
    })
}

/// Whether podha asks for the fence on the Node (`podha.io/fence-request`) and takes an
/// acknowledgement of it as the proof.
pub const fn requests_fence(proof: FencingProof) -> bool {
    matches!(proof, FencingProof::Agent | FencingProof::External)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::AGENT_FENCED_WITHIN_ANNOTATION;
    use crate::test_builders::*;

    #[test]
    fn the_cloud_shutdown_taint_is_the_proof_and_none_needs_nothing() {
        let spec: crate::api::PodHAPolicySpec =
            serde_json::from_value(serde_json::json!({"fencing": {"proof": "CloudShutdownTaint"}}))
                .unwrap();
        let running = mk_node("n1");
        let off = mk_node("n1").taint(CLOUD_SHUTDOWN_TAINT_KEY, "", "NoSchedule");
        let none = AgentEvidence::default();
        assert_eq!(proven(&spec.fencing, &running, none), None);
        assert_eq!(
            proven(&spec.fencing, &off, none),
            Some(FenceEvidence::CloudShutdown)
        );
        assert_eq!(
            proven(&Fencing::default(), &running, none),
            Some(FenceEvidence::NotAsked)
        );
        assert!(
            serde_json::from_value::<crate::api::PodHAPolicySpec>(
                serde_json::json!({"fencing": {"proof": "Hope"}})
            )
            .is_err()
        );
    }

    #[test]
    fn an_external_fence_is_proven_by_the_acknowledgement_of_this_incidents_request_only() {
        let spec: crate::api::PodHAPolicySpec =
            serde_json::from_value(serde_json::json!({"fencing": {"proof": "External"}})).unwrap();
        let acked = mk_node("n1").annotation(FENCE_ACK_ANNOTATION, "p/1");
        let asked = |request, silent_for| AgentEvidence {
            silent_for,
            request,
            ..heard()
        };
        assert_eq!(proven(&spec.fencing, &acked, asked(None, None)), None);
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/2"), None)),
            None
        );
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/1"), None)),
            Some(FenceEvidence::ExternalAcknowledged)
        );
        let silent_agent = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "1s");
        assert_eq!(
            proven(
                &spec.fencing,
                &silent_agent,
                asked(Some("p/1"), Some(Duration::from_secs(3600)))
            ),
            None,
            "silence proves nothing to an external fence"
        );
        assert!(requests_fence(FencingProof::External) && requests_fence(FencingProof::Agent));
        assert!(!requests_fence(FencingProof::CloudShutdownTaint));
    }

    /// An agent podha heard right before its silence, while it hears both other agents.
    fn heard() -> AgentEvidence<'static> {
        AgentEvidence {
            heard_before_silence: Some(Duration::from_secs(2)),
            others_heard: 2,
            others_expected: 2,
            quorum_for: Some(Duration::from_secs(86_400)),
            ..AgentEvidence::default()
        }
    }

    fn agent_spec() -> crate::api::PodHAPolicySpec {
        serde_json::from_value(serde_json::json!({"fencing": {"proof": "Agent"}})).unwrap()
    }

    #[test]
    fn an_agent_proves_the_fence_by_its_acknowledgement_of_this_incidents_request() {
        let spec = agent_spec();
        let acked = mk_node("n1").annotation(FENCE_ACK_ANNOTATION, "p/1");
        let asked = |request| AgentEvidence {
            silent_for: None,
            request,
            ..AgentEvidence::default()
        };
        assert_eq!(
            proven(&spec.fencing, &acked, asked(None)),
            None,
            "not asked"
        );
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/2"))),
            None,
            "an older request's acknowledgement proves nothing now"
        );
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/1"))),
            Some(FenceEvidence::AgentAcknowledged)
        );
    }

    #[test]
    fn an_agent_proves_the_fence_by_its_silence_past_its_timeout_and_the_margin() {
        let spec = agent_spec();
        let with_agent = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s");
        let silent = |secs| AgentEvidence {
            silent_for: Some(Duration::from_secs(secs)),
            ..heard()
        };
        assert_eq!(proven(&spec.fencing, &with_agent, silent(39)), None);
        assert_eq!(
            proven(&spec.fencing, &with_agent, silent(40)),
            Some(FenceEvidence::AgentSilent)
        );
        assert_eq!(
            proven(&spec.fencing, &mk_node("n1"), silent(4000)),
            None,
            "a node that never had an agent proves nothing by silence"
        );
        let garbled = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "soon");
        assert_eq!(proven(&spec.fencing, &garbled, silent(4000)), None);
    }

    /// The silence counts only since podha has heard enough agents without a break: an agent
    /// cut off while podha heard too few had its peers vouch for it, and starts deciding to
    /// fence only once podha hears enough of them again.
    #[test]
    fn silence_counts_only_since_podha_hears_enough_agents() {
        let spec = agent_spec();
        let node = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s");
        let secs = Duration::from_secs;
        let silent = |quorum_for| AgentEvidence {
            silent_for: Some(secs(4000)),
            quorum_for,
            ..heard()
        };
        assert_eq!(silent(Some(secs(39))).counted_silence(), Some(secs(39)));
        assert_eq!(proven(&spec.fencing, &node, silent(Some(secs(39)))), None);
        assert_eq!(
            proven(&spec.fencing, &node, silent(Some(secs(40)))),
            Some(FenceEvidence::AgentSilent)
        );
        assert_eq!(proven(&spec.fencing, &node, silent(None)), None);
        let answering = AgentEvidence {
            silent_for: None,
            ..heard()
        };
        assert_eq!(answering.counted_silence(), None);
        // Enough: a strict majority of the others of any agent podha does not hear.
        let cases = [
            (0, 0, false),
            (0, 1, false),
            (1, 1, true),
            (1, 2, true),
            (1, 3, false),
            (2, 3, true),
            (1, 4, false),
            (2, 4, true),
            (2, 5, false),
            (3, 5, true),
        ];
        for (heard, expected, want) in cases {
            assert_eq!(agent_quorum(heard, expected), want, "{heard} of {expected}");
        }
    }

    /// Silence is no proof where the agent's own rule may have kept it up: an agent podha
    /// never heard in this term (a blocked port, a silence from before this term), heard long
    /// before the silence, or while podha hears no strict majority of the other agents.
    #[test]
    fn silence_proves_the_fence_only_of_an_agent_heard_before_it_while_others_are_heard() {
        let spec = agent_spec();
        let node = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s");
        let long = Some(Duration::from_secs(4000));
        let cases = [
            ("heard, both others heard", heard(), None),
            (
                "never heard in this term",
                AgentEvidence {
                    heard_before_silence: None,
                    ..heard()
                },
                Some(SilenceDoubt::NeverHeard),
            ),
            (
                "heard within the window",
                AgentEvidence {
                    heard_before_silence: Some(AGENT_HEARD_WITHIN),
                    ..heard()
                },
                None,
            ),
            (
                "heard long before",
                AgentEvidence {
                    heard_before_silence: Some(AGENT_HEARD_WITHIN + Duration::from_millis(1)),
                    ..heard()
                },
                Some(SilenceDoubt::HeardLongBefore {
                    gap: AGENT_HEARD_WITHIN + Duration::from_millis(1),
                }),
            ),
            (
                "1 of 4 others heard (the port blocked)",
                AgentEvidence {
                    others_heard: 1,
                    others_expected: 4,
                    ..heard()
                },
                Some(SilenceDoubt::FewOthersHeard {
                    heard: 1,
                    expected: 4,
                }),
            ),
            (
                "2 of 4: no strict majority",
                AgentEvidence {
                    others_heard: 2,
                    others_expected: 4,
                    ..heard()
                },
                Some(SilenceDoubt::FewOthersHeard {
                    heard: 2,
                    expected: 4,
                }),
            ),
            (
                "3 of 4",
                AgentEvidence {
                    others_heard: 3,
                    others_expected: 4,
                    ..heard()
                },
                None,
            ),
            (
                "two agents, the other heard",
                AgentEvidence {
                    others_heard: 1,
                    others_expected: 1,
                    ..heard()
                },
                None,
            ),
            (
                "no other agent: one without peers stays up",
                AgentEvidence {
                    others_heard: 0,
                    others_expected: 0,
                    ..heard()
                },
                Some(SilenceDoubt::FewOthersHeard {
                    heard: 0,
                    expected: 0,
                }),
            ),
        ];
        for (what, evidence, doubt) in cases {
            let evidence = AgentEvidence {
                silent_for: long,
                ..evidence
            };
            assert_eq!(evidence.silence_doubt(), doubt, "{what}");
            let want = doubt.is_none().then_some(FenceEvidence::AgentSilent);
            assert_eq!(proven(&spec.fencing, &node, evidence), want, "{what}");
        }
        // An answering agent is in no doubt: it is not silent.
        assert_eq!(AgentEvidence::default().silence_doubt(), None);
        // The acknowledgement of this incident's request proves the fence whatever the doubt.
        let acked = node.annotation(FENCE_ACK_ANNOTATION, "p/1");
        let doubted = AgentEvidence {
            silent_for: long,
            request: Some("p/1"),
            ..AgentEvidence::default()
        };
        assert_eq!(doubted.silence_doubt(), Some(SilenceDoubt::NeverHeard));
        assert_eq!(
            proven(&spec.fencing, &acked, doubted),
            Some(FenceEvidence::AgentAcknowledged)
        );
    }

    /// The evidence, from podha's heartbeats: the agent's silence and its last answer before
    /// it, and the other agents podha expects (nodes advertising one) and hears now.
    #[test]
    fn agent_evidence_reads_the_heartbeats_of_the_node_and_of_the_other_agents() {
        use crate::contract::AGENT_PORT_ANNOTATION;
        use crate::planner::Heartbeat;
        let now = Instant::now() + Duration::from_secs(100);
        let secs = Duration::from_secs;
        let agent = |name: &str| {
            let mut n = mk_node(name).annotation(AGENT_PORT_ANNOTATION, "9441");
            n.status.get_or_insert_with(Default::default).addresses =
                Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.0.0.1".into(),
                }]);
            n
        };
        let view = crate::view::View::default()
            .with(agent("n1"))
            .with(agent("n2"))
            .with(agent("n3"))
            .with(agent("n4"))
            .with(agent("n6"))
            .with(mk_node("plain"));
        let hb = |answered: Option<Instant>, silent_since: Option<Instant>| Heartbeat {
            last_renewal: None,
            silent_since: now,
            renew_period: secs(10),
            tcp_answered: None,
            tcp_silent_since: None,
            agent_answered: answered,
            agent_connected: answered,
            agent_silent_since: silent_since,
            tainted_since: None,
        };
        // The host refused (the agent not running): an answer, not the agent's.
        let refused = |at: Instant, silent_since: Option<Instant>| Heartbeat {
            agent_connected: None,
            ..hb(Some(at), silent_since)
        };
        let heartbeats = crate::planner::Heartbeats::from([
            (
                "n1".to_string(),
                hb(Some(now - secs(62)), Some(now - secs(60))),
            ),
            ("n2".to_string(), hb(Some(now - AGENT_HEARD_WITHIN), None)),
            ("n3".to_string(), hb(Some(now - secs(4)), None)),
            ("plain".to_string(), hb(Some(now), None)),
            (
                "n5".to_string(),
                refused(now - secs(62), Some(now - secs(60))),
            ),
            ("n6".to_string(), refused(now, None)),
        ]);
        let quorum = Some(now - secs(30));
        let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, Some("p/1"));
        assert_eq!(
            evidence,
            AgentEvidence {
                silent_for: Some(secs(60)),
                heard_before_silence: Some(secs(2)),
                others_heard: 1,
                others_expected: 4,
                quorum_for: Some(secs(30)),
                request: Some("p/1"),
            },
            "n2 heard, n3 too long ago, n4 never, n6 only refused; a node without an agent is \
             not expected"
        );
        let never = agent_evidence("n4", &view, &heartbeats, quorum, now, None);
        assert_eq!((never.silent_for, never.heard_before_silence), (None, None));
        let refused_before = agent_evidence("n5", &view, &heartbeats, quorum, now, None);
        assert_eq!(
            (
                refused_before.silent_for,
                refused_before.heard_before_silence
            ),
            (Some(secs(60)), None),
            "a refusal right before the silence is no answer from the agent"
        );
        // Of the five agents, n2 heard: not enough; n3 heard too: two of the other four of an
        // agent podha does not hear, still no strict majority; n4 too: enough.
        assert!(!hears_agent_quorum(&view, &heartbeats, now));
        let mut more = heartbeats.clone();
        more.insert("n3".to_string(), hb(Some(now), None));
        assert!(!hears_agent_quorum(&view, &more, now));
        more.insert("n4".to_string(), hb(Some(now), None));
        assert!(hears_agent_quorum(&view, &more, now));
        assert!(
            !hears_agent_quorum(&View::default(), &more, now),
            "no agent"
        );
    }
}
