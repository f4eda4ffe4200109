//! The `Agent`, `External` and `CloudShutdownTaint` proofs, and what podha knows of an agent.

use super::*;
use crate::api::Proofs;
use crate::contract::{AGENT_FENCED_WITHIN_ANNOTATION, AGENT_WATCHDOG_ANNOTATION};
use crate::test_builders::*;

#[test]
fn the_cloud_shutdown_taint_is_the_proof_and_none_needs_nothing() {
    let spec: crate::api::PodHAPolicySpec =
        serde_json::from_value(serde_json::json!({"fencing": {"proof": "CloudShutdownTaint"}}))
            .unwrap();
    let running = mk_node("n1");
    let off = mk_node("n1").taint(CLOUD_SHUTDOWN_TAINT_KEY, "", "NoSchedule");
    let none = AgentEvidence::default();
    assert_eq!(proven(&spec.fencing, &running, none, false), None);
    assert_eq!(
        proven(&spec.fencing, &off, none, false),
        Some(FenceEvidence::CloudShutdown)
    );
    let unproven = Fencing {
        proof: FencingProof::None,
        ..Fencing::default()
    };
    assert_eq!(
        proven(&unproven, &running, none, false),
        Some(FenceEvidence::NotAsked)
    );
    // The default asks for the agent's proof: a node without an agent never has it.
    assert_eq!(Fencing::default().proof, FencingProof::Agent);
    assert_eq!(proven(&Fencing::default(), &running, none, false), None);
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
    assert_eq!(
        proven(&spec.fencing, &acked, asked(None, None), false),
        None
    );
    assert_eq!(
        proven(&spec.fencing, &acked, asked(Some("p/2"), None), false),
        None
    );
    assert_eq!(
        proven(&spec.fencing, &acked, asked(Some("p/1"), None), false),
        Some(FenceEvidence::ExternalAcknowledged)
    );
    let silent_agent = mk_node("n1")
        .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "1s")
        .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
    assert_eq!(
        proven(
            &spec.fencing,
            &silent_agent,
            asked(Some("p/1"), Some(Duration::from_secs(3600))),
            false
        ),
        None,
        "silence proves nothing to an external fence"
    );
    let requests = |p: FencingProof| Proofs::from(p).requests_fence();
    assert!(requests(FencingProof::External) && requests(FencingProof::Agent));
    assert!(!requests(FencingProof::CloudShutdownTaint) && !requests(FencingProof::Bmc));
}

/// An agent podha heard right before its silence, while it hears both other agents.
fn heard() -> AgentEvidence<'static> {
    AgentEvidence {
        heard_before_silence: Some(Duration::from_secs(2)),
        advert: Some(AdvertAge {
            renewed_before_silence: Duration::from_secs(3),
            lasts: Duration::from_secs(40),
        }),
        others_heard: 2,
        others_expected: 2,
        quorum_for: Some(Duration::from_secs(86_400)),
        ..AgentEvidence::default()
    }
}

/// The agent's proof with a 10 s margin, which these tests count with.
fn agent_spec() -> crate::api::PodHAPolicySpec {
    serde_json::from_value(serde_json::json!({"fencing": {"proof": "Agent", "agentMargin": "10s"}}))
        .unwrap()
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
        proven(&spec.fencing, &acked, asked(None), false),
        None,
        "not asked"
    );
    assert_eq!(
        proven(&spec.fencing, &acked, asked(Some("p/2")), false),
        None,
        "an older request's acknowledgement proves nothing now"
    );
    assert_eq!(
        proven(&spec.fencing, &acked, asked(Some("p/1")), false),
        Some(FenceEvidence::AgentAcknowledged)
    );
}

#[test]
fn an_agent_proves_the_fence_by_its_silence_past_its_timeout_and_the_margin() {
    let spec = agent_spec();
    let with_agent = mk_node("n1")
        .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s")
        .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
    let silent = |secs| AgentEvidence {
        silent_for: Some(Duration::from_secs(secs)),
        ..heard()
    };
    assert_eq!(proven(&spec.fencing, &with_agent, silent(39), false), None);
    assert_eq!(
        proven(&spec.fencing, &with_agent, silent(40), false),
        Some(FenceEvidence::AgentSilent)
    );
    assert_eq!(
        proven(&spec.fencing, &mk_node("n1"), silent(4000), false),
        None,
        "a node that never had an agent proves nothing by silence"
    );
    let garbled = mk_node("n1")
        .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "soon")
        .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
    assert_eq!(proven(&spec.fencing, &garbled, silent(4000), false), None);
}

/// The silence counts only since podha has heard enough agents without a break: an agent
/// cut off while podha heard too few showed half of its peers unheard, and starts deciding to
/// fence only once podha hears enough of them again.
#[test]
fn silence_counts_only_since_podha_hears_enough_agents() {
    let spec = agent_spec();
    let node = mk_node("n1")
        .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s")
        .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
    let secs = Duration::from_secs;
    let silent = |quorum_for| AgentEvidence {
        silent_for: Some(secs(4000)),
        quorum_for,
        ..heard()
    };
    assert_eq!(silent(Some(secs(39))).counted_silence(), Some(secs(39)));
    assert_eq!(
        proven(&spec.fencing, &node, silent(Some(secs(39))), false),
        None
    );
    assert_eq!(
        proven(&spec.fencing, &node, silent(Some(secs(40))), false),
        Some(FenceEvidence::AgentSilent)
    );
    assert_eq!(proven(&spec.fencing, &node, silent(None), false), None);
    let answering = AgentEvidence {
        silent_for: None,
        ..heard()
    };
    assert_eq!(answering.counted_silence(), None);
    // Enough: a strict majority of all the agents podha expects.
    let cases = [
        (0, 0, false),
        (0, 1, false),
        (1, 1, true),
        (1, 2, false),
        (2, 2, true),
        (1, 3, false),
        (2, 3, true),
        (2, 4, false),
        (3, 4, true),
        (2, 5, false),
        (3, 5, true),
    ];
    for (heard, expected, want) in cases {
        assert_eq!(agent_quorum(heard, expected), want, "{heard} of {expected}");
    }
}

/// Silence is no proof where the agent's own rule may have kept it up: an agent podha
/// never heard in this term (a blocked port, a silence from before this term), heard long
/// before the silence, or while podha hears no strict majority of the agents it expects.
#[test]
fn silence_proves_the_fence_only_of_an_agent_heard_before_it_while_others_are_heard() {
    let spec = agent_spec();
    let node = mk_node("n1")
        .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s")
        .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
    let long = Some(Duration::from_secs(4000));
    let cases = [
        ("heard, both others heard", heard(), None),
        (
            "its agent withdrew its Lease (uninstalled), or it went with the agent's Pod",
            AgentEvidence {
                advert: None,
                ..heard()
            },
            Some(SilenceDoubt::NoAdvert),
        ),
        (
            "its Lease renewed just within its duration before the silence",
            AgentEvidence {
                advert: Some(AdvertAge {
                    renewed_before_silence: Duration::from_secs(40),
                    lasts: Duration::from_secs(40),
                }),
                ..heard()
            },
            None,
        ),
        (
            "its Lease lapsed before the silence (the agent stopped renewing it)",
            AgentEvidence {
                advert: Some(AdvertAge {
                    renewed_before_silence: Duration::from_secs(41),
                    lasts: Duration::from_secs(40),
                }),
                ..heard()
            },
            Some(SilenceDoubt::AdvertLapsed {
                gap: Duration::from_secs(41),
            }),
        ),
        (
            "the node renewed its Lease 20 s into the silence, within the agent's 30 s (podha \
             cut off from the agent alone, which fences by then)",
            AgentEvidence {
                node_renewed_after_silence: Some(Duration::from_secs(20)),
                fenced_within: Some(Duration::from_secs(30)),
                ..heard()
            },
            None,
        ),
        (
            "a renewal seen up to 3 s past the agent's time was written before it",
            AgentEvidence {
                node_renewed_after_silence: Some(Duration::from_secs(33)),
                fenced_within: Some(Duration::from_secs(30)),
                ..heard()
            },
            None,
        ),
        (
            "the node renewed its Lease 34 s into the silence, past the agent's 30 s (the agent \
             stopped, the node ran on)",
            AgentEvidence {
                node_renewed_after_silence: Some(Duration::from_secs(34)),
                fenced_within: Some(Duration::from_secs(30)),
                ..heard()
            },
            Some(SilenceDoubt::NodeLivedOn {
                after: Duration::from_secs(34),
            }),
        ),
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
            "two agents, the other heard: half of them, and the silent one stays up",
            AgentEvidence {
                others_heard: 1,
                others_expected: 1,
                ..heard()
            },
            Some(SilenceDoubt::FewOthersHeard {
                heard: 1,
                expected: 1,
            }),
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
        assert_eq!(
            proven(&spec.fencing, &node, evidence, false),
            want,
            "{what}"
        );
    }
    // An answering agent is in no doubt: it is not silent.
    assert_eq!(AgentEvidence::default().silence_doubt(), None);
    // The acknowledgement of this incident's request proves the fence whatever the doubt.
    let acked = node.annotation(FENCE_ACK_ANNOTATION, "p/1");
    let doubted = AgentEvidence {
        silent_for: long,
        request: Some("p/1"),
        heard_before_silence: None,
        ..heard()
    };
    assert_eq!(doubted.silence_doubt(), Some(SilenceDoubt::NeverHeard));
    assert_eq!(
        proven(&spec.fencing, &acked, doubted, false),
        Some(FenceEvidence::AgentAcknowledged)
    );
}

/// Node `name`, advertising an agent at its InternalIP.
fn agent_at(name: &str) -> Node {
    let mut n = mk_node(name).annotation(crate::contract::AGENT_PORT_ANNOTATION, "9441");
    n.status.get_or_insert_with(Default::default).addresses =
        Some(vec![k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        }]);
    n
}

/// What podha heard of a node at `now`: its agent answered (itself) at `answered`, silent
/// since `silent_since`; nothing else.
fn agent_heartbeat(
    now: Instant,
    answered: Option<Instant>,
    silent_since: Option<Instant>,
) -> crate::planner::Heartbeat {
    crate::planner::Heartbeat {
        agent_answered: answered,
        agent_connected: answered,
        agent_armed: answered,
        agent_silent_since: silent_since,
        ..crate::planner::Heartbeat::silent_since(now, Duration::from_secs(10))
    }
}

/// The evidence, from podha's heartbeats: the agent's silence and its last answer before
/// it, and the other agents podha expects (nodes advertising one) and hears now.
#[test]
fn agent_evidence_reads_the_heartbeats_of_the_node_and_of_the_other_agents() {
    use crate::planner::Heartbeat;
    let now = Instant::now() + Duration::from_secs(100);
    let secs = Duration::from_secs;
    let agent = agent_at;
    let mut view = crate::view::View::default()
        .with(agent("n1"))
        .with(agent("n2"))
        .with(agent("n3"))
        .with(agent("n4"))
        .with(agent("n6"))
        .with(agent("n7"))
        .with(mk_node("plain"));
    for node in ["n1", "n2", "n3", "n4", "n6"] {
        view.agent_adverts
            .insert(node.into(), agent_advert(now - secs(65)));
    }
    let hb = |answered, silent_since| agent_heartbeat(now, answered, silent_since);
    // The host refused (the agent not running): an answer, not the agent's.
    let refused = |at: Instant, silent_since: Option<Instant>| Heartbeat {
        agent_connected: None,
        agent_armed: None,
        agent_disarmed: false,
        agent_hearing_from: None,
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
            node_renewed_after_silence: None,
            renewed_during_silence: None,
            fenced_within: None,
            advert: Some(AdvertAge {
                renewed_before_silence: secs(5),
                lasts: secs(40),
            }),
            others_heard: 1,
            others_expected: 5,
            quorum_for: Some(secs(30)),
            request: Some("p/1"),
            renewals_since_ack: 0,
            renewed_in_boot: false,
            heard_in_boot_earlier: false,
            renewed_in_term: false,
            disarmed: false,
        },
        "n2 heard, n3 too long ago, n4 never, n6 only refused, n7 (no Lease: the agents still \
         count it among their peers) never; a node without an agent is not expected"
    );
    assert_eq!(
        agent_evidence("n7", &view, &heartbeats, quorum, now, None).advert,
        None
    );
    // n1's kubelet renewed its Lease 15 s into its agent's silence (seen then, or at the end
    // of a gap in podha's view that began then): past the 8 s its agent advertises and 3 s.
    let n1 = (*view.nodes["n1"])
        .clone()
        .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "8s")
        .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
    view.nodes.insert("n1".into(), n1.into());
    let mut lived_on = heartbeats.clone();
    lived_on.insert(
        "n1".to_string(),
        Heartbeat {
            last_renewal: Some(now - secs(30)),
            renewal_not_before: Some(now - secs(45)),
            ..hb(Some(now - secs(62)), Some(now - secs(60)))
        },
    );
    let evidence = agent_evidence("n1", &view, &lived_on, quorum, now, None);
    assert_eq!(
        (evidence.node_renewed_after_silence, evidence.fenced_within),
        (Some(secs(15)), Some(secs(8)))
    );
    assert_eq!(
        evidence.silence_doubt(),
        Some(SilenceDoubt::NodeLivedOn { after: secs(15) })
    );
    // n1's agent renewed its Lease 20 s into its silence (podha alone cannot reach it): the
    // silence counts from that renewal, and so does the node's renewal (15 s after the
    // silence began, before the agent's: nothing lived on past it).
    let mut renewing = view.clone();
    renewing
        .agent_adverts
        .insert("n1".into(), agent_advert(now - secs(40)));
    let evidence = agent_evidence("n1", &renewing, &lived_on, Some(now - secs(60)), now, None);
    assert_eq!(
        (
            evidence.silent_for,
            evidence.renewed_during_silence,
            evidence.counted_silence()
        ),
        (Some(secs(60)), Some(secs(40)), Some(secs(40)))
    );
    assert_eq!(evidence.node_renewed_after_silence, None);
    assert_eq!(
        evidence.heard_before_silence,
        Some(secs(2)),
        "heard right before"
    );
    assert!(
        matches!(
            evidence.silence_doubt(),
            Some(SilenceDoubt::FewOthersHeard { .. })
        ),
        "not NodeLivedOn (only one other agent is heard here): {:?}",
        evidence.silence_doubt()
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
    // Of the six agents, n2 heard: not enough; n3 and n4 heard too: three of six, half, still
    // no strict majority; n6 too: enough.
    assert!(!hears_agent_quorum(&view, &heartbeats, now));
    let mut more = heartbeats.clone();
    more.insert("n3".to_string(), hb(Some(now), None));
    more.insert("n4".to_string(), hb(Some(now), None));
    assert!(!hears_agent_quorum(&view, &more, now));
    more.insert("n6".to_string(), hb(Some(now), None));
    assert!(hears_agent_quorum(&view, &more, now));
    assert!(
        !hears_agent_quorum(&View::default(), &more, now),
        "no agent"
    );
}

/// A replica that gains leadership never heard the agents itself. An agent whose Lease says it
/// was heard in the node's current boot counts its silence (it is not a never-heard agent that
/// stays up), so its silence proves the fence, counted from this term's first unanswered
/// probe; one whose Lease names another boot, or says nothing, proves nothing.
#[test]
fn a_new_term_counts_the_silence_of_an_agent_its_lease_says_was_heard_in_this_boot() {
    let secs = Duration::from_secs;
    let now = Instant::now();
    let agent = |name: &str| agent_at(name).boot("boot-2");
    let mut view = crate::view::View::default()
        .with(agent("n1"))
        .with(agent("n2"))
        .with(agent("n3"));
    // This term began 61 s ago, after the last renewal of n1's agent Lease it saw.
    let heartbeat = |connected, silent_since| crate::planner::Heartbeat {
        agent_hearing_from: Some(now - secs(61)),
        ..agent_heartbeat(now, connected, silent_since)
    };
    let mut heartbeats = crate::planner::Heartbeats::new();
    heartbeats.insert("n1".into(), heartbeat(None, Some(now - secs(60))));
    for other in ["n2", "n3"] {
        heartbeats.insert(other.into(), heartbeat(Some(now), None));
    }
    let quorum = Some(now - secs(61));
    let cases = [
        (None, false, Some(SilenceDoubt::NeverHeard)),
        (Some("boot-1"), false, Some(SilenceDoubt::NeverHeard)),
        (Some("boot-2"), true, None),
    ];
    for (heard_in, earlier, doubt) in cases {
        let mut advert = agent_advert(now - secs(62));
        advert.heard_in_boot = heard_in.map(str::to_string);
        view.agent_adverts.insert("n1".into(), advert);
        let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, None);
        assert_eq!(evidence.heard_in_boot_earlier, earlier, "{heard_in:?}");
        assert_eq!(evidence.heard_before_silence, None);
        assert_eq!(evidence.silence_doubt(), doubt, "{heard_in:?}");
    }
    // Found by a process that just started, never seen renewed: its age is unknown.
    let mut found = agent_advert(now - secs(62));
    found.heard_in_boot = Some("boot-2".into());
    found.renewal_observed = false;
    view.agent_adverts.insert("n1".into(), found);
    let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, None);
    assert_eq!(evidence.silence_doubt(), Some(SilenceDoubt::NeverHeard));
    let mut renewed = agent_advert(now - secs(62));
    renewed.heard_in_boot = Some("boot-2".into());
    view.agent_adverts.insert("n1".into(), renewed);
    // Still only while podha hears a strict majority of the agents.
    heartbeats.insert("n3".into(), heartbeat(None, Some(now - secs(5))));
    assert_eq!(
        agent_evidence("n1", &view, &heartbeats, quorum, now, None).silence_doubt(),
        Some(SilenceDoubt::FewOthersHeard {
            heard: 1,
            expected: 2
        })
    );
    // A refusal in this term (the agent not running) before the silence: the Lease's word no
    // longer counts.
    heartbeats.insert("n3".into(), heartbeat(Some(now), None));
    let mut refused = heartbeat(None, Some(now - secs(60)));
    refused.agent_answered = Some(now - secs(61));
    refused.agent_disarmed = true;
    heartbeats.insert("n1".into(), refused);
    let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, None);
    assert!(!evidence.heard_in_boot_earlier);
    assert_eq!(evidence.silence_doubt(), Some(SilenceDoubt::Disarmed));
    // The agent's own answer to this term's first probe, which says nothing of its counting
    // (it took no challenge), then the silence: the Lease's word still counts.
    let mut unsaid = heartbeat(None, Some(now - secs(60)));
    unsaid.agent_answered = Some(now - secs(61));
    unsaid.agent_connected = Some(now - secs(61));
    heartbeats.insert("n1".into(), unsaid);
    let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, None);
    assert!(evidence.heard_in_boot_earlier);
    assert_eq!(evidence.silence_doubt(), None);
    // The agent renewed its Lease in this term: it runs without hearing this leader, and
    // stays up while it renews (an agent that heeds terms): held for the term, however long
    // ago the last renewal seen. An older agent fences as it always did: its silence counts.
    let renewed = |ago: u64, heeds_term| {
        let mut advert = agent_advert(now - secs(ago));
        advert.heard_in_boot = Some("boot-2".into());
        advert.heeds_term = heeds_term;
        advert
    };
    let cases = [
        (5, true, true, Some(SilenceDoubt::RenewedUnheard)),
        (61, true, true, Some(SilenceDoubt::RenewedUnheard)),
        (30, false, false, None),
        (62, true, false, None),
    ];
    for (ago, heeds_term, in_term, doubt) in cases {
        view.agent_adverts
            .insert("n1".into(), renewed(ago, heeds_term));
        let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, None);
        let what = format!("renewed {ago} s ago, heeds terms: {heeds_term}");
        assert_eq!(evidence.renewed_in_term, in_term, "{what}");
        assert_eq!(evidence.silence_doubt(), doubt, "{what}");
    }
    // This process has not begun counting the agent's hearing: any renewal seen counts.
    let mut not_begun = heartbeats.clone();
    not_begun.get_mut("n1").expect("n1").agent_hearing_from = None;
    view.agent_adverts.insert("n1".into(), renewed(62, true));
    let evidence = agent_evidence("n1", &view, &not_begun, quorum, now, None);
    assert_eq!(evidence.silence_doubt(), Some(SilenceDoubt::RenewedUnheard));
    // Answered in this term: this term's own hearing decides, not the Lease.
    heartbeats.insert("n3".into(), heartbeat(Some(now), None));
    heartbeats.insert(
        "n1".into(),
        heartbeat(Some(now - secs(70)), Some(now - secs(60))),
    );
    let evidence = agent_evidence("n1", &view, &heartbeats, quorum, now, None);
    assert!(!evidence.heard_in_boot_earlier);
    assert_eq!(
        evidence.silence_doubt(),
        Some(SilenceDoubt::HeardLongBefore { gap: secs(10) })
    );
}
