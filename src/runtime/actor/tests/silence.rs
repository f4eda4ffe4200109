//! `fencing.proof: Agent` as the decision loop lives it: an agent's silence proves a fence
//! only from what this leadership term heard.

use super::*;
use crate::api::{Fencing, FencingProof};
use crate::health::{Arming, ProbeKind, TcpResult};
use kube::ResourceExt as _;

/// `node` runs a podha agent that fences within 8 s of podha's last hearing.
fn agent_node(node: Node) -> Node {
    node.agent(Some("8s"))
}

/// One round of agent probes sent now: `silent` nodes do not answer, the others do.
fn agent_round(h: &mut Harness, silent: &[&str]) {
    agent_round_with(h, |n| {
        if silent.contains(&n) {
            TcpResult::NoAnswer
        } else {
            TcpResult::Connected
        }
    });
}

/// One round of agent probes sent now, each node's result from `result`; every agent that
/// answers says it counts itself heard.
fn agent_round_with(h: &mut Harness, result: impl Fn(&str) -> TcpResult) {
    agent_round_heard(h, result, |_| true);
}

/// One round of agent probes sent now, each node's result from `result`, and whether its
/// agent, if it answers, says it counts itself heard from `heard`.
fn agent_round_heard(
    h: &mut Harness,
    result: impl Fn(&str) -> TcpResult,
    heard: impl Fn(&str) -> bool,
) {
    agent_round_holding(h, result, heard, |_| false);
}

/// [`agent_round_heard`], each node's probe holding it (or its agent answering it is held)
/// as `held` says.
fn agent_round_holding(
    h: &mut Harness,
    result: impl Fn(&str) -> TcpResult,
    heard: impl Fn(&str) -> bool,
    held: impl Fn(&str) -> bool,
) {
    let nodes = ["node-1", "node-2", "node-3"];
    let results = nodes
        .into_iter()
        .map(|n| (n.to_string(), Some(result(n))))
        .collect();
    let heard_nodes = nodes
        .into_iter()
        .filter(|n| result(n) == TcpResult::Connected && heard(n))
        .map(str::to_string)
        .collect();
    h.actor.observe_round(crate::runtime::prober::Round {
        kind: ProbeKind::Agent,
        sent: Instant::now(),
        results,
        heard: heard_nodes,
        arming: nodes
            .into_iter()
            .filter_map(|n| {
                let arming = match result(n) {
                    _ if held(n) => Arming::Disarmed,
                    TcpResult::Connected if heard(n) => Arming::Armed,
                    TcpResult::Connected | TcpResult::Refused => Arming::Disarmed,
                    TcpResult::NoAnswer => Arming::Unsaid,
                };
                (arming != Arming::Unsaid).then(|| (n.to_string(), arming))
            })
            .collect(),
        unverified: Default::default(),
        mismatched: Default::default(),
    });
}

/// Runs the loop for `secs` seconds with an agent round every second.
async fn run_with_rounds(h: &mut Harness, secs: u64, silent: &[&str]) {
    for _ in 0..secs {
        agent_round(h, silent);
        h.run_for(1).await;
    }
}

/// Asked for the fence, node-1's agent is silent for 40 s (far past its 8 s and the margin):
/// nothing is tainted, and the hold says why.
async fn silence_proves_nothing(h: &mut Harness, what: &str) {
    assert_eq!(acts(&mut h.writes), ["fence/node-1"]);
    run_with_rounds(h, 40, &["node-1"]).await;
    let sent = acts(&mut h.writes);
    assert!(
        !sent.iter().any(|k| k.starts_with("taint/")),
        "{what} proved the fence: {sent:?}"
    );
    assert!(held(&h.metrics, "AgentSilenceUnproven") >= 1.0);
}

/// The replica loses its lease, runs `secs` seconds as a follower, and gains it again.
async fn leadership_lost_for(h: &mut Harness, secs: u64) {
    h.leader.send(None).expect("leader channel");
    h.run_for(secs).await;
    h.leader
        .send(Some(crate::leader::Claim::for_tests()))
        .expect("leader channel");
}

fn held(metrics: &Metrics, reason: &str) -> f64 {
    let text = metrics.encode().expect("encode");
    text.lines()
        .filter(|l| l.starts_with("podha_actions_held_total{") && l.contains(reason))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// node-1 dead (its kubelet) with its pods, node-2 and node-3 alive, each with an agent; the
/// policy asks for the agent's proof.
fn agent_proof_harness() -> Harness {
    agent_proof_harness_with(mk_node("node-1").ready(false))
}

/// [`agent_proof_harness`] with node-1 as given (an agent added).
fn agent_proof_harness_with(node_1: Node) -> Harness {
    let mut objects = dead_node_with_pods("node-1");
    objects[0] = agent_node(node_1).into();
    objects.push(agent_node(mk_node("node-2")).into());
    objects.push(agent_node(mk_node("node-3")).into());
    let mut spec = quick_spec();
    // The margin these tests count with (8 s and 10 s: 18 s of silence), not the default's.
    spec.fencing = Fencing {
        proof: FencingProof::Agent,
        agent_margin: crate::api::HumanDuration::from_secs(10),
        ..Fencing::default()
    };
    harness_with(objects, Some(spec))
}

/// A replica heard node-1's agent go silent, lost the lease, and gains it again long after:
/// the silence began before this term (while another replica held it, and may have heard the
/// agent),
/// so it proves nothing, however long it looks; podha holds and says why.
#[tokio::test(start_paused = true)]
async fn a_silence_that_began_in_an_earlier_leadership_term_proves_no_fence() {
    let mut h = agent_proof_harness();
    // The kubelet is dead, the agent still answers: podha asks it for the fence.
    run_with_rounds(&mut h, 3, &[]).await;
    assert_eq!(acts(&mut h.writes), ["fence/node-1"]);
    // The agent goes silent, for less than its 8 s and the 10 s margin.
    run_with_rounds(&mut h, 5, &["node-1"]).await;
    leadership_lost_for(&mut h, 30).await;
    run_with_rounds(&mut h, 5, &["node-1"]).await;
    let sent = acts(&mut h.writes);
    assert!(
        !sent.iter().any(|k| k.starts_with("taint/")),
        "silence from before this term proved the fence: {sent:?}"
    );
    assert!(held(&h.metrics, "AgentSilenceUnproven") >= 1.0);
    // Silent through this term's own 18 s: podha never heard it in this term, still no proof.
    run_with_rounds(&mut h, 20, &["node-1"]).await;
    let sent = acts(&mut h.writes);
    assert!(!sent.iter().any(|k| k.starts_with("taint/")), "{sent:?}");
}

/// The same, but the agent's Lease says podha heard it in the node's current boot (the node
/// died with podha's leading replica, say): the agent counts its silence from its last
/// hearing, which no earlier leader gave after this term began, so this term counts the
/// silence from its own first unanswered probe and proves the fence once it lasted the
/// agent's 8 s and the margin. A Lease that names another boot proves nothing.
#[tokio::test(start_paused = true)]
async fn a_new_term_counts_the_silence_of_an_agent_heard_in_this_boot_from_its_first_probe() {
    for (lease_boot, proves) in [("boot-1", true), ("boot-0", false)] {
        let mut h = agent_proof_harness_with(mk_node("node-1").ready(false).boot("boot-1"));
        run_with_rounds(&mut h, 3, &[]).await;
        assert_eq!(acts(&mut h.writes), ["fence/node-1"]);
        // The agent renews its Lease, saying podha heard it in its boot, then falls silent.
        let mut lease = mk_agent_lease("node-1", 200);
        lease.annotations_mut().insert(
            crate::contract::AGENT_HEARD_IN_BOOT_ANNOTATION.into(),
            lease_boot.into(),
        );
        h.actor
            .state
            .apply(Change::AgentLease(Event::Apply(lease)), Instant::now());
        run_with_rounds(&mut h, 5, &["node-1"]).await;
        leadership_lost_for(&mut h, 20).await;
        run_with_rounds(&mut h, 16, &["node-1"]).await;
        let sent = acts(&mut h.writes);
        assert!(
            !sent.iter().any(|k| k.starts_with("taint/")),
            "not 18 s of this term's silence yet: {sent:?}"
        );
        run_with_rounds(&mut h, 4, &["node-1"]).await;
        let tainted = acts(&mut h.writes).contains(&"taint/node-1".to_string());
        assert_eq!(tainted, proves, "Lease heard in {lease_boot}");
        if !proves {
            assert!(held(&h.metrics, "AgentSilenceUnproven") >= 1.0);
        }
    }
}

/// The same agent heard in this term before it went silent: its silence past 8 s and the
/// margin proves the fence.
#[tokio::test(start_paused = true)]
async fn a_silence_this_term_heard_begin_proves_the_fence() {
    let mut h = agent_proof_harness();
    run_with_rounds(&mut h, 3, &[]).await;
    assert_eq!(acts(&mut h.writes), ["fence/node-1"]);
    run_with_rounds(&mut h, 16, &["node-1"]).await;
    assert!(acts(&mut h.writes).is_empty(), "not 18 s yet");
    run_with_rounds(&mut h, 4, &["node-1"]).await;
    assert!(acts(&mut h.writes).contains(&"taint/node-1".to_string()));
    assert_eq!(held(&h.metrics, "AgentSilenceUnproven"), 0.0);
}

/// node-1's agent stopped (its watchdog disarmed) and its replacement never started: the port
/// refuses for a while, then the node is cut off. A refusal is the host, not the agent: the
/// silence after it is not an agent's silence after an answer, and proves nothing.
#[tokio::test(start_paused = true)]
async fn a_silence_after_refusals_proves_no_fence() {
    let mut h = agent_proof_harness();
    let refused = |n: &str| {
        if n == "node-1" {
            TcpResult::Refused
        } else {
            TcpResult::Connected
        }
    };
    for _ in 0..5 {
        agent_round_with(&mut h, refused);
        h.run_for(1).await;
    }
    silence_proves_nothing(&mut h, "a silence after refusals").await;
}

/// The heartbeat prober learns each node's boot from its plan, so that it forgets what it
/// heard of an agent whose node booted again.
#[tokio::test(start_paused = true)]
async fn the_agent_probe_plan_names_each_nodes_boot() {
    let mut booted = agent_node(mk_node("node-1"));
    booted.status.get_or_insert_with(Default::default).node_info =
        Some(k8s_openapi::api::core::v1::NodeSystemInfo {
            boot_id: "boot-1".into(),
            ..Default::default()
        });
    let mut h = harness_with(
        vec![booted.into(), agent_node(mk_node("node-2")).into()],
        Some(quick_spec()),
    );
    h.run_for(1).await;
    let plan = h._plans[1].borrow().clone();
    let boots: Vec<_> = plan
        .targets
        .iter()
        .map(|t| (t.node.as_str(), t.boot_id.as_deref()))
        .collect();
    assert_eq!(boots, [("node-1", Some("boot-1")), ("node-2", None)]);
}

/// Every agent is asked within the contract's heartbeat timeout, not a policy's `tcpTimeout`:
/// one policy that detects within 10 ms must not make a slow or distant node unheard, and
/// fence it.
#[tokio::test(start_paused = true)]
async fn no_policys_tcp_timeout_shortens_the_agent_heartbeat() {
    let mut spec = quick_spec();
    spec.detection.signals = vec![
        crate::api::Signal::AgentHeartbeat,
        crate::api::Signal::KubeletTCP,
    ];
    spec.detection.tcp_timeout = crate::api::HumanDuration::from_millis(10);
    let mut h = harness_with(
        vec![
            agent_node(mk_node("node-1")).into(),
            agent_node(mk_node("node-2")).into(),
        ],
        Some(spec),
    );
    h.run_for(1).await;
    let kubelet = h._plans[0].borrow().clone();
    let agent = h._plans[1].borrow().clone();
    assert!(
        kubelet
            .targets
            .iter()
            .all(|t| t.timeout == Duration::from_millis(10)),
        "the kubelet's connect is the policy's: {kubelet:?}"
    );
    assert_eq!(agent.targets.len(), 2);
    assert!(
        agent
            .targets
            .iter()
            .all(|t| t.timeout == crate::contract::AGENT_HEARTBEAT_TIMEOUT),
        "{agent:?}"
    );
}

/// The agent port blocked everywhere for a while: podha hears no agent, and an agent cut off
/// meanwhile shows half of its peers unheard and stays up. node-1's silence began in that window;
/// once podha hears the others again its agent only starts deciding to fence, so its silence
/// counts from then, not from when it began.
#[tokio::test(start_paused = true)]
async fn a_silence_counts_only_since_podha_hears_enough_agents_again() {
    let mut h = agent_proof_harness();
    run_with_rounds(&mut h, 3, &[]).await;
    assert_eq!(acts(&mut h.writes), ["fence/node-1"]);
    run_with_rounds(&mut h, 30, &["node-1", "node-2", "node-3"]).await;
    // The others are heard again; node-1 has been silent 30 s, past its 8 s and the 10 s
    // margin, but its agent only now sees that podha hears its peers.
    run_with_rounds(&mut h, 15, &["node-1"]).await;
    let sent = acts(&mut h.writes);
    assert!(
        !sent.iter().any(|k| k.starts_with("taint/")),
        "a silence that began while podha heard too few agents proved the fence: {sent:?}"
    );
    run_with_rounds(&mut h, 5, &["node-1"]).await;
    assert!(acts(&mut h.writes).contains(&"taint/node-1".to_string()));
}

/// node-1's agent answers, but does not know it was heard (its first answer of the boot,
/// cut off before the next probe could tell it): it counts itself never heard and does not
/// fence on isolation, so its silence after that answer proves nothing.
#[tokio::test(start_paused = true)]
async fn a_silence_after_answers_the_agent_does_not_know_were_heard_proves_no_fence() {
    let mut h = agent_proof_harness();
    for _ in 0..3 {
        agent_round_heard(&mut h, |_| TcpResult::Connected, |n| n != "node-1");
        h.run_for(1).await;
    }
    silence_proves_nothing(
        &mut h,
        "a silence after answers the agent did not know were heard",
    )
    .await;
}

/// node-1's agent was uninstalled (it withdrew its Lease) right before the node was cut off:
/// its silence, however long, proves no fence; and an agent whose Lease lapsed before its
/// silence began (it had stopped renewing it) proves none either.
#[tokio::test(start_paused = true)]
async fn the_silence_of_an_agent_without_a_fresh_lease_proves_no_fence() {
    for withdrawn in [true, false] {
        let mut h = agent_proof_harness();
        if withdrawn {
            run_with_rounds(&mut h, 3, &[]).await;
            let lease = mk_agent_lease("node-1", 100);
            h.actor
                .state
                .apply(Change::AgentLease(Event::Delete(lease)), Instant::now());
        } else {
            // Answering, but its Lease last renewed when the harness started: lapsed at 40 s.
            run_with_rounds(&mut h, 45, &[]).await;
        }
        let what = if withdrawn {
            "the silence of an agent that withdrew its Lease"
        } else {
            "a silence after its Lease lapsed"
        };
        silence_proves_nothing(&mut h, what).await;
    }
}

/// node-2 is up, but podha never hears its agent (its port blocked from boot): podha asks it
/// for nothing and says so once, on the node, with `podha_agents_unreachable`; node-3's agent,
/// heard, is not reported. Heard again, node-2 is no longer counted.
#[tokio::test(start_paused = true)]
async fn an_agent_podha_never_hears_on_a_ready_node_is_reported_once() {
    let mut h = agent_proof_harness();
    let unreachable = |h: &Harness| gauge(h, "podha_agents_unreachable");
    let reported = |h: &mut Harness| {
        node_events(h, "AgentUnreachable")
            .into_iter()
            .map(|(node, _)| node)
            .collect::<Vec<_>>()
    };
    // The harness's view is VIEW_AGE old already.
    run_with_rounds(&mut h, 25 - VIEW_AGE.as_secs(), &["node-2"]).await;
    assert_eq!(reported(&mut h), Vec::<String>::new(), "not 30 s yet");
    run_with_rounds(&mut h, 10, &["node-2"]).await;
    // node-1 (dead, not Ready) is no healthy node's agent.
    assert_eq!(reported(&mut h), ["node-2"]);
    assert_eq!(unreachable(&h).as_deref(), Some("1"));
    run_with_rounds(&mut h, 10, &["node-2"]).await;
    assert_eq!(reported(&mut h), Vec::<String>::new(), "once");
    run_with_rounds(&mut h, 3, &[]).await;
    assert_eq!(unreachable(&h).as_deref(), Some("0"));
    assert!(
        !acts(&mut h.writes).iter().any(|k| k.ends_with("node-2")),
        "nothing asked of node-2"
    );
}

/// node-1 was held (paused) when podha last heard its agent, or its last heartbeat held it and
/// the answer was lost: the agent fences nothing on isolation, so its silence after podha lets
/// go of the node proves nothing, however long; podha holds and says why. Answered again
/// without the hold, before it falls silent, its silence counts.
#[tokio::test(start_paused = true)]
async fn a_silence_after_a_heartbeat_that_held_the_node_proves_no_fence() {
    for (answered, armed_again) in [(true, false), (false, false), (true, true)] {
        let mut h = agent_proof_harness();
        run_with_rounds(&mut h, 3, &[]).await;
        assert_eq!(acts(&mut h.writes), ["fence/node-1"]);
        let result = |n: &str| match n {
            "node-1" if !answered => TcpResult::NoAnswer,
            _ => TcpResult::Connected,
        };
        agent_round_holding(&mut h, result, |_| true, |n| n == "node-1");
        h.run_for(1).await;
        if armed_again {
            run_with_rounds(&mut h, 2, &[]).await;
        }
        run_with_rounds(&mut h, 40, &["node-1"]).await;
        let tainted = acts(&mut h.writes).contains(&"taint/node-1".to_string());
        assert_eq!(
            tainted, armed_again,
            "held heartbeat answered: {answered}, answered after it: {armed_again}"
        );
        if !armed_again {
            assert!(held(&h.metrics, "AgentSilenceUnproven") >= 1.0);
        }
    }
}

/// What the leader's next heartbeat to `node`'s agent says of a hold (`None`: no probe).
fn told_hold(h: &Harness, node: &str) -> Option<Option<bool>> {
    let (_, agents) = super::super::judge::probe_plans(&h.actor.state, true);
    agents
        .targets
        .iter()
        .find(|t| t.node == node)
        .map(|t| t.hold)
}

/// The value of the unlabelled gauge `name`, as exported.
fn gauge(h: &Harness, name: &str) -> Option<String> {
    let text = h.metrics.encode().expect("encode");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().to_string())
}

/// The events queued with `reason` since the last look: each one's node and note.
fn node_events(h: &mut Harness, reason: &str) -> Vec<(String, String)> {
    h.writes
        .queued_events()
        .into_iter()
        .filter(|e| e.reason == reason)
        .map(|e| (e.regarding.name.unwrap_or_default(), e.note))
        .collect()
}

/// `node`'s agent renews its Lease, saying it heeds holds.
fn heeds_holds(h: &mut Harness, node: &str) {
    let mut lease = mk_agent_lease(node, 200);
    lease.annotations_mut().insert(
        crate::contract::AGENT_HEEDS_HOLD_ANNOTATION.into(),
        "true".into(),
    );
    h.actor
        .state
        .apply(Change::AgentLease(Event::Apply(lease)), Instant::now());
}

/// The leader tells an agent that heeds holds whether podha holds its node: not while an
/// unpaused policy asking for the `Agent` proof selects it; held when that policy or the node
/// is paused, or the policy asks for another proof. An agent whose Lease does not say it
/// heeds holds is told nothing (an older one would refuse the word).
#[tokio::test(start_paused = true)]
async fn the_agents_of_nodes_no_unpaused_agent_proof_selects_are_told_they_are_held() {
    let mut h = agent_proof_harness();
    heeds_holds(&mut h, "node-1");
    let holds = |h: &Harness| {
        let (_, agents) = super::super::judge::probe_plans(&h.actor.state, true);
        agents
            .targets
            .iter()
            .map(|t| (t.node.clone(), t.hold))
            .collect::<Vec<_>>()
    };
    let told = |hold| {
        vec![
            ("node-1".to_string(), Some(hold)),
            ("node-2".to_string(), None),
            ("node-3".to_string(), None),
        ]
    };
    assert_eq!(holds(&h), told(false));
    let policy = h
        .actor
        .state
        .policies
        .values()
        .next()
        .expect("policy")
        .clone();
    let with = |h: &mut Harness, change: &dyn Fn(&mut PodHAPolicy)| {
        let mut p = (*policy).clone();
        change(&mut p);
        h.actor
            .state
            .policies
            .insert(p.name_any(), std::sync::Arc::new(p));
    };
    with(&mut h, &|p| p.spec.paused = true);
    assert_eq!(holds(&h), told(true), "its policy paused");
    with(&mut h, &|p| p.spec.fencing.proof = FencingProof::Bmc);
    assert_eq!(
        holds(&h),
        told(true),
        "no policy asks for the agent's proof"
    );
    with(&mut h, &|p| p.spec.fencing.proof = FencingProof::Agent);
    assert_eq!(holds(&h), told(false));
    let paused = h.actor.state.view.nodes["node-1"]
        .as_ref()
        .clone()
        .annotation(crate::api::PAUSE_ANNOTATION, "true");
    h.actor
        .state
        .apply(Change::Node(Event::Apply(paused)), Instant::now());
    assert_eq!(holds(&h), told(true), "the node paused");
}

/// node-1's agent counts its silence and falls silent; its policy is then paused: the agent is
/// not told podha holds the node until it answers again. A hold sent now could reach it (its
/// answers lost) and stop its fence, and would leave the failover under way unprovable.
#[tokio::test(start_paused = true)]
async fn a_silent_armed_agent_is_not_held_until_it_answers_again() {
    let mut h = agent_proof_harness();
    heeds_holds(&mut h, "node-1");
    run_with_rounds(&mut h, 3, &[]).await;
    run_with_rounds(&mut h, 2, &["node-1"]).await;
    let mut paused = (**h.actor.state.policies.values().next().expect("policy")).clone();
    paused.spec.paused = true;
    h.actor
        .state
        .policies
        .insert(paused.name_any(), std::sync::Arc::new(paused));
    let hold_of_node_1 = |h: &Harness| told_hold(h, "node-1");
    assert_eq!(hold_of_node_1(&h), Some(Some(false)), "silent: not held");
    run_with_rounds(&mut h, 1, &[]).await;
    assert_eq!(hold_of_node_1(&h), Some(Some(true)), "answered: held");
}

/// node-1's agent says on its Lease that it cannot reach half of its peers: it is told podha
/// holds its node, once reported on the node and counted in `podha_agents_peers_unreachable`;
/// once it reaches them again, it is let go of and the count drops.
#[tokio::test(start_paused = true)]
async fn an_agent_that_cannot_reach_its_peers_is_held_and_reported_once() {
    let mut h = agent_proof_harness();
    let says = |h: &mut Harness, unreachable: Option<&str>| {
        let mut lease = mk_agent_lease("node-1", 200);
        let annotations = lease.annotations_mut();
        annotations.insert(
            crate::contract::AGENT_HEEDS_HOLD_ANNOTATION.into(),
            "true".into(),
        );
        if let Some(value) = unreachable {
            annotations.insert(
                crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION.into(),
                value.into(),
            );
        }
        h.actor
            .state
            .apply(Change::AgentLease(Event::Apply(lease)), Instant::now());
    };
    let told = |h: &Harness| told_hold(h, "node-1");
    let count = |h: &Harness| gauge(h, "podha_agents_peers_unreachable");
    let reported = |h: &mut Harness| node_events(h, "AgentPeersUnreachable");
    says(&mut h, None);
    run_with_rounds(&mut h, 2, &[]).await;
    assert_eq!(told(&h), Some(Some(false)));
    assert_eq!(count(&h).as_deref(), Some("0"));
    says(&mut h, Some("1/8"));
    assert_eq!(told(&h), Some(Some(true)), "held");
    run_with_rounds(&mut h, 2, &[]).await;
    let events = reported(&mut h);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "node-1");
    assert!(events[0].1.contains("1/8"), "{}", events[0].1);
    assert_eq!(count(&h).as_deref(), Some("1"));
    says(&mut h, Some("0/8"));
    run_with_rounds(&mut h, 2, &[]).await;
    assert_eq!(reported(&mut h), [], "once per episode");
    says(&mut h, None);
    assert_eq!(told(&h), Some(Some(false)), "let go of");
    run_with_rounds(&mut h, 2, &[]).await;
    assert_eq!(count(&h).as_deref(), Some("0"));
}
