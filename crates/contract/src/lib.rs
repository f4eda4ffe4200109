//! The contract between podha (the operator, whose leader probes and fences) and `podha agent`
//! (one per node). The two are separate processes, often of different versions during a
//! rollout, so everything here is wire format: changing a name or a field breaks the other
//! side. Both sides import it from here and from nowhere else.
//!
//! On the Node (annotations, see [`NODE_ANNOTATIONS`]):
//! - [`AGENT_PORT_ANNOTATION`] and [`AGENT_FENCED_WITHIN_ANNOTATION`]: written by the agent when
//!   it starts; read by podha's prober (where to probe, [`agent_addr`]) and by the `Agent`
//!   proof (how long a silent agent takes to fence, [`fenced_within`]). Only an agent that pets
//!   a watchdog writes the second: without one its silence proves nothing.
//! - [`AGENT_WATCHDOG_ANNOTATION`]: written by the agent with them: the watchdog it pets, or
//!   why it pets none ([`watchdog_value`], [`no_watchdog_value`]); podha counts the agent's
//!   fenced-within time only beside a watchdog named there ([`fenced_within`]).
//! - [`FENCE_REQUEST_ANNOTATION`]: written by podha's leader ([`fence_request`]); read by the
//!   agent (or the user's fence controller), which learns from it the boot it is for
//!   ([`requested_boot`]).
//! - [`FENCE_ACK_ANNOTATION`]: written by the agent (or the fence controller) once the node is
//!   fenced; read by podha's `Agent` and `External` proofs.
//!
//! In podha's namespace, the agent's Lease ([`agent_lease_name`], labelled
//! [`AGENT_LEASE_LABEL`], `holderIdentity` its node): renewed by the agent every
//! [`AGENT_LEASE_RENEW`] for [`AGENT_LEASE_DURATION`], owned by the agent's Pod and deleted when
//! the agent stops, so an uninstalled agent's advert is gone. podha counts a node's agent only
//! while its Lease is there, and its silence only when the Lease was renewed within its
//! duration before the silence began ([`advertising_node`]).
//!
//! Over HTTP, at the node's InternalIP ([`internal_ip`]) and the advertised port:
//! - `GET` [`HEARTBEAT_PATH`] with a [`HeartbeatQuery`]: sent by podha's leader every
//!   [`AGENT_PROBE_INTERVAL`]; the agent answers a [`HeartbeatAnswer`] naming its node and
//!   saying whether it counts itself heard, and since when. The agent's shortest isolation
//!   timeout follows from that interval.
//! - `GET` [`PEER_PATH`] with a [`PeerQuery`]: one agent surveying another, which answers a
//!   [`PeerAnswer`].
//!
//! Every one of those words is signed by its speaker's key, published on the speaker's Node
//! ([`AGENT_KEY_ANNOTATION`]) or on podha's leader Lease ([`LEADER_KEY_ANNOTATION`]): see
//! [`words`].
#![forbid(unsafe_code)]
// Functions that decide should read in one screen (clippy.toml sets the limit); tests are
// tables and scenarios, and may run longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::Node;

pub mod words;
pub use words::*;

/// The Lease podha's replicas compete for, unless told another (`--leader-lease`): the agents
/// follow it for the leader's key ([`LEADER_KEY_ANNOTATION`]) and its leadership term.
pub const DEFAULT_LEADER_LEASE: &str = "podha-leader";

/// Node annotation podha sets to ask the node's agent to fence the node; its value identifies
/// the request (see [`fence_request`]).
pub const FENCE_REQUEST_ANNOTATION: &str = "podha.io/fence-request";
/// Node annotation the agent sets once it fenced the node for a request: the request's value.
pub const FENCE_ACK_ANNOTATION: &str = "podha.io/fence-ack";

/// Node annotation the agent sets when it starts: the port podha's leader probes it on (at
/// the node's InternalIP). podha probes only nodes that carry it.
pub const AGENT_PORT_ANNOTATION: &str = "podha.io/agent-port";
/// Node annotation the agent sets when it starts, only while it pets a watchdog: how long after
/// podha last heard it the node is fenced at the latest, if podha does not hear it again (its
/// isolation timeout; see `agent::isolation::fenced_within`), as a humantime duration. podha's
/// `Agent` proof adds its margin; without this annotation an agent's silence proves nothing.
pub const AGENT_FENCED_WITHIN_ANNOTATION: &str = "podha.io/agent-fenced-within";
/// Node annotation the agent sets when it starts: the timeout of the watchdog it pets, as a
/// humantime duration ([`watchdog_value`]), or `none: <why>` when it pets none
/// ([`no_watchdog_value`]): what tells an operator why a node has no
/// [`AGENT_FENCED_WITHIN_ANNOTATION`], and so no proof by its agent's silence.
pub const AGENT_WATCHDOG_ANNOTATION: &str = "podha.io/agent-watchdog";

/// Every Node annotation of the contract: podha's cache of Nodes keeps these (and drops the
/// rest), so one added here reaches the decisions.
pub const NODE_ANNOTATIONS: [&str; 6] = [
    AGENT_PORT_ANNOTATION,
    AGENT_FENCED_WITHIN_ANNOTATION,
    AGENT_WATCHDOG_ANNOTATION,
    AGENT_KEY_ANNOTATION,
    FENCE_REQUEST_ANNOTATION,
    FENCE_ACK_ANNOTATION,
];

/// Label of every agent Lease (value `"true"`): what podha's watch selects.
pub const AGENT_LEASE_LABEL: &str = "podha.io/agent-advert";
/// How long an agent Lease lasts after a renewal (its `leaseDurationSeconds`).
pub const AGENT_LEASE_DURATION: Duration = Duration::from_secs(40);
/// How often the agent renews its Lease: four renewals in one duration, so one or two failed
/// writes do not let it lapse.
pub const AGENT_LEASE_RENEW: Duration = Duration::from_secs(10);
const AGENT_LEASE_PREFIX: &str = "podha-agent-";
/// Annotation of an agent Lease, written by the agent at each renewal once podha has heard it
/// in the node's current boot, while podha does not hold its node
/// ([`AGENT_HEEDS_HOLD_ANNOTATION`]): that boot's ID (absent otherwise). A podha replica
/// that gains leadership never heard the agents itself; for an agent whose Lease says it was
/// heard in the boot the Node reports, the replica knows the agent counts its silence since
/// podha's last hearing, which no leader before this one can have given after this one's
/// claim began: it may count the agent's silence from its own first unanswered probe, unless
/// it saw the Lease renewed within its own term (the agent runs and has not heard it: see
/// [`AGENT_HEEDS_TERM_ANNOTATION`]; `planner::proof`).
pub const AGENT_HEARD_IN_BOOT_ANNOTATION: &str = "podha.io/agent-heard-in-boot";

/// Annotation of an agent Lease, `"true"` from an agent that heeds `hold` in podha's heartbeat
/// ([`HeartbeatQuery::hold`]): while the last heartbeat it counted says podha holds its node
/// (the node, or every policy with the `Agent` proof that selects it, is paused; or no such
/// policy selects it), it fences nothing on isolation, and its Lease says nothing of being
/// heard ([`AGENT_HEARD_IN_BOOT_ANNOTATION`]). podha sends `hold` only to such an agent: an
/// older one refuses a heartbeat whose signed word it does not know.
pub const AGENT_HEEDS_HOLD_ANNOTATION: &str = "podha.io/agent-heeds-hold";
/// Annotation of an agent Lease, `"true"` from an agent that heeds the leadership term in
/// podha's heartbeat ([`HeartbeatQuery::term`]): it keeps the term of the last heartbeat it
/// counted, and while the leader Lease shows a later term and its own Lease is renewed often
/// enough that the new leader sees it renewed within the new term, it stays up on isolation,
/// as a new leader that never heard it counts no silence of an agent that renewed its Lease
/// in its term (see docs/agent.md, "A new leader that cannot reach an agent"). podha sends
/// `term` only to such an agent, which heeds `hold` too: an older one refuses a heartbeat
/// whose signed word it does not know.
pub const AGENT_HEEDS_TERM_ANNOTATION: &str = "podha.io/agent-heeds-term";
/// Annotation of an agent Lease, `"true"` from an agent that heeds `renewals` in podha's
/// heartbeat ([`HeartbeatQuery::renewals`]): while the last heartbeat it counted says the
/// leader counts its silence from its last renewal of its Lease seen, it stays up on isolation
/// (and pets its watchdog) as long as its last renewal taken is recent enough
/// (`isolation::renewal_window` in the agent), renewing the Lease more often while podha does
/// not hear it. A node whose agent podha alone cannot reach, while the agent reaches the API
/// server, is then not reset. podha sends `renewals` only to such an agent, which heeds `hold`
/// and `term` too: an older one refuses a heartbeat whose signed word it does not know.
pub const AGENT_HEEDS_RENEWALS_ANNOTATION: &str = "podha.io/agent-heeds-renewals";

/// Annotation of an agent Lease, there while the agent cannot reach half of its peers: two
/// checks in a row (every 30 s, a few peers each) got answers from fewer than half of the
/// peers asked, its value `"answered/asked"` of the last. On isolation such an agent could not
/// show that podha hears no majority of the agents, and would fence its node in an outage of
/// podha or of the API server that moves nothing, so podha holds its node (it counts no
/// silence of it and tells the agent, which then fences nothing on isolation) and reports it.
/// Written by the agent; anyone who can write the Lease could only make podha hold a node.
pub const AGENT_PEERS_UNREACHABLE_ANNOTATION: &str = "podha.io/agent-peers-unreachable";

/// The value of [`AGENT_PEERS_UNREACHABLE_ANNOTATION`]: `answered` of the `asked` peers, as
/// `"answered/asked"`.
pub fn peer_count_value(answered: usize, asked: usize) -> String {
    format!("{answered}/{asked}")
}

/// [`peer_count_value`] read back, as `(answered, asked)`; `None` for anything else.
pub fn parse_peer_count(value: &str) -> Option<(usize, usize)> {
    let (answered, asked) = value.split_once('/')?;
    let count = |s: &str| s.parse::<u32>().ok().and_then(|n| usize::try_from(n).ok());
    Some((count(answered)?, count(asked)?))
}

/// The leadership term the leader Lease shows: its `leaseTransitions`, which
/// `kube-lease-manager` raises by one with every acquisition (by another replica, or by the
/// same one after a release), and which no renewal touches; 0 when it has none. A Lease
/// recreated after a deletion starts again from zero. podha's leader reads its own term so
/// (podha's `leader` module), and the agents the term that leads.
pub fn lease_term(spec: Option<&LeaseSpec>) -> u64 {
    spec.and_then(|s| s.lease_transitions)
        .and_then(|t| u64::try_from(t).ok())
        .unwrap_or(0)
}

/// The longest name of an object (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The name of the agent Lease of `node`: `podha-agent-<node>`, or, for a node name too long
/// for that, `podha-agent-<FNV-1a hash of the name, 16 hex digits>` (stable across versions:
/// the agent and podha compute it apart).
pub fn agent_lease_name(node: &str) -> String {
    if AGENT_LEASE_PREFIX.len() + node.len() <= MAX_NAME {
        return format!("{AGENT_LEASE_PREFIX}{node}");
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{AGENT_LEASE_PREFIX}{hash:016x}")
}

/// The node whose agent holds a Lease named `lease` for `holder` (its `holderIdentity`): only
/// a Lease named after its holder counts (another name is no agent's advert).
pub fn advertising_node<'a>(lease: &str, holder: Option<&'a str>) -> Option<&'a str> {
    let holder = holder.filter(|h| !h.is_empty())?;
    (agent_lease_name(holder) == lease).then_some(holder)
}

/// How often podha's leader probes every agent. The agents' own rule (a peer heard within a
/// quarter of the isolation timeout is heard) needs this far shorter than their timeout, so
/// their shortest isolation timeout is derived from it.
pub const AGENT_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How recently podha must have got an answer from an agent to count it as heard: before its
/// silence began (the silent agent), or now (the other agents). podha sends a round of probes
/// every [`AGENT_PROBE_INTERVAL`] and each answer comes back within the probe's timeout (at
/// most one interval), so an agent that answers every probe was last answered at most two
/// intervals before the round now in flight comes back; a third interval absorbs a round
/// delayed by a slow batch or the decision loop's tick.
pub const AGENT_HEARD_WITHIN: Duration = AGENT_PROBE_INTERVAL.saturating_mul(3);

/// How long podha's leader waits for an agent's answer to a heartbeat: one probe interval,
/// whatever the policies say. An agent whose answers take longer is unheard and, past its
/// isolation timeout, fences its node, so no policy's `tcpTimeout` (which may be 10 ms)
/// shortens it for every node: a slow or distant node would reboot for a setting meant for
/// another's detection.
pub const AGENT_HEARTBEAT_TIMEOUT: Duration = AGENT_PROBE_INTERVAL;

/// The quorum podha and its agents share: podha hears enough agents to count any agent's
/// silence only while it heard a strict majority of the `expected` ones (every node that
/// advertises an agent, the silent one included): `2 * heard > expected`. An agent that shows
/// at least half of its peers unheard therefore knows podha cannot prove its silence, and
/// stays up (`agent::isolation::stays_with`); it fences otherwise. With two agents neither's
/// silence ever counts: one cut off from the other cannot tell that from its own death, and
/// only another proof (a BMC, an acknowledgement) fails such a cluster over.
pub const fn agent_quorum(heard: usize, expected: usize) -> bool {
    heard * 2 > expected
}

/// Whether a silent agent's silence may count when `heard` of the `expected` other agents
/// (nodes advertising one) are heard: a strict majority of all the agents podha expects, the
/// silent one included ([`agent_quorum`]). Then no agent podha does not hear can show that half
/// of its peers are unheard, which is when an agent stays up (the agent's `isolation`).
pub const fn silence_counts_among(heard: usize, expected: usize) -> bool {
    agent_quorum(heard, expected + 1)
}

/// A node's InternalIP, where its kubelet and its agent listen: the first the node lists, of
/// either family (the primary family's on a dual-stack node, IPv6 on an IPv6-only one). The
/// agent listens on both families by default and does not advertise itself where this address
/// does not reach it (`agent::listen`).
pub fn internal_ip(node: &Node) -> Option<IpAddr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .parse()
        .ok()
}

/// The podha agent's endpoint on a node: its InternalIP and the port the agent advertised.
/// `None` for a node without an agent.
pub fn agent_addr(node: &Node) -> Option<SocketAddr> {
    let port: u16 = node
        .metadata
        .annotations
        .as_ref()?
        .get(AGENT_PORT_ANNOTATION)?
        .parse()
        .ok()
        .filter(|p| *p != 0)?;
    Some(SocketAddr::new(internal_ip(node)?, port))
}

/// The key the node's agent publishes ([`AGENT_KEY_ANNOTATION`]); `None` without one, or
/// with a garbled one.
pub fn agent_key(node: &Node) -> Option<PublicKey> {
    PublicKey::parse(
        node.metadata
            .annotations
            .as_ref()?
            .get(AGENT_KEY_ANNOTATION)?,
    )
}

/// The value of [`AGENT_FENCED_WITHIN_ANNOTATION`] the agent writes.
pub fn fenced_within_value(fenced_within: Duration) -> String {
    duration_value(fenced_within)
}

/// A duration as the agent's annotations say it (humantime: `10s`, `1m 16s`).
fn duration_value(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// The value of [`AGENT_WATCHDOG_ANNOTATION`] of an agent that pets a watchdog whose timeout
/// (the one the agent goes by) is `timeout`.
pub fn watchdog_value(timeout: Duration) -> String {
    duration_value(timeout)
}

/// What [`AGENT_WATCHDOG_ANNOTATION`] starts with for an agent that pets no watchdog.
const NO_WATCHDOG_PREFIX: &str = "none: ";
/// How many characters of why an agent pets no watchdog its annotation keeps: the gist of an
/// error (the agent's log has all of it), short enough to read in `kubectl describe node`.
const NO_WATCHDOG_REASON_MAX: usize = 200;

/// The value of [`AGENT_WATCHDOG_ANNOTATION`] of an agent that pets no watchdog, for `why`:
/// on one line, at most [`NO_WATCHDOG_REASON_MAX`] characters of it (the last an ellipsis when
/// cut).
pub fn no_watchdog_value(why: &str) -> String {
    let why = why.split_whitespace().collect::<Vec<_>>().join(" ");
    let reason = if why.chars().count() > NO_WATCHDOG_REASON_MAX {
        let mut cut: String = why.chars().take(NO_WATCHDOG_REASON_MAX - 1).collect();
        cut.push('…');
        cut
    } else {
        why
    };
    format!("{NO_WATCHDOG_PREFIX}{reason}")
}

/// What the node's agent advertises in [`AGENT_FENCED_WITHIN_ANNOTATION`]; `None` without an
/// agent, when the value is not a duration, or unless [`AGENT_WATCHDOG_ANNOTATION`] names the
/// watchdog the agent pets (a duration): a time left on the Node by an agent from before that
/// annotation, or beside an agent that says it pets none (its advert not yet replaced), proves
/// nothing.
pub fn fenced_within(node: &Node) -> Option<Duration> {
    let annotations = node.metadata.annotations.as_ref()?;
    let watchdog = annotations.get(AGENT_WATCHDOG_ANNOTATION)?;
    humantime::parse_duration(watchdog).ok()?;
    humantime::parse_duration(annotations.get(AGENT_FENCED_WITHIN_ANNOTATION)?).ok()
}

/// The value of [`FENCE_REQUEST_ANNOTATION`] podha writes: `<policy>/<unix ms>/<bootID>`,
/// unique per request (an acknowledgement of an older one proves nothing now) and naming the
/// boot it is for, as the Node reported it (empty when unknown).
pub fn fence_request(policy: &str, unix_ms: u128, boot_id: &str) -> String {
    format!("{policy}/{unix_ms}/{boot_id}")
}

/// The policy a request was made for: its first `/`-separated part (see [`fence_request`];
/// a policy's name has no `/`).
pub fn requested_policy(request: &str) -> &str {
    request.split('/').next().unwrap_or_default()
}

/// The boot a request was made in: its last `/`-separated part (see [`fence_request`]);
/// `None` when it names none.
pub fn requested_boot(request: &str) -> Option<&str> {
    request
        .rsplit_once('/')
        .map(|(_, boot)| boot)
        .filter(|boot| !boot.is_empty())
}

/// When a request was made, in unix milliseconds on podha's clock: its middle part (see
/// [`fence_request`]); `None` when it has none.
pub fn requested_at(request: &str) -> Option<u128> {
    match request.split('/').collect::<Vec<_>>()[..] {
        [_, millis, _] => millis.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Node named `name`, with no annotation.
    fn mk_node(name: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_string());
        node
    }

    /// Annotates a Node.
    trait Annotate {
        fn annotation(self, key: &str, value: &str) -> Self;
    }

    impl Annotate for Node {
        fn annotation(mut self, key: &str, value: &str) -> Self {
            self.metadata
                .annotations
                .get_or_insert_default()
                .insert(key.to_string(), value.to_string());
            self
        }
    }

    /// The chart's admission policy on the agent Leases restates this module's rules in CEL:
    /// their name, and how long they may last.
    #[test]
    fn the_chart_binds_agent_leases_by_this_modules_rules() {
        let policy = include_str!("../../../charts/podha/templates/admission-policies.yaml");
        let longest = MAX_NAME - AGENT_LEASE_PREFIX.len();
        for rule in [
            format!("size(variables.agentNode) <= {longest}"),
            format!(
                "variables.lease.metadata.name == '{AGENT_LEASE_PREFIX}' + variables.agentNode"
            ),
            format!("matches('^{AGENT_LEASE_PREFIX}[0-9a-f]{{16}}$')"),
            format!(
                "leaseDurationSeconds.orValue(0) <= {}",
                AGENT_LEASE_DURATION.as_secs()
            ),
        ] {
            assert!(policy.contains(&rule), "the chart's policy lacks {rule}");
        }
        assert!(agent_lease_name(&"n".repeat(longest + 1)).len() == AGENT_LEASE_PREFIX.len() + 16);
    }

    /// The chart's node-annotations policy guards every Node annotation of the contract, and
    /// lets an agent write all but the fence request.
    #[test]
    fn the_charts_policy_guards_every_node_annotation_of_the_contract() {
        let policy = include_str!("../../../charts/podha/templates/admission-policies.yaml");
        let flat = policy.split_whitespace().collect::<Vec<_>>().join(" ");
        let list = |keys: &[&str]| {
            let quoted: Vec<String> = keys.iter().map(|k| format!("'{k}'")).collect();
            format!("[{}]", quoted.join(", "))
        };
        let agent_keys: Vec<&str> = NODE_ANNOTATIONS
            .into_iter()
            .filter(|k| *k != FENCE_REQUEST_ANNOTATION)
            .collect();
        let agent_writes = format!("name: agentKeys expression: \"{}\"", list(&agent_keys));
        assert!(
            flat.contains(&agent_writes),
            "the chart's policy lacks {agent_writes}"
        );
        let guarded = format!("{}.filter(k,", list(&NODE_ANNOTATIONS));
        assert!(
            flat.contains(&guarded),
            "the chart's policy lacks {guarded}"
        );
    }

    fn node_at(addresses: &[(&str, &str)], port: Option<&str>) -> Node {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"addresses": addresses
                .iter()
                .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
                .collect::<Vec<_>>()}
        }))
        .expect("node");
        if let Some(port) = port {
            node.metadata.annotations = Some([(AGENT_PORT_ANNOTATION.into(), port.into())].into());
        }
        node
    }

    #[test]
    fn the_agent_is_dialed_at_the_first_internal_ip_of_either_family() {
        let v6_only = node_at(
            &[("Hostname", "n1"), ("InternalIP", "fd00::5")],
            Some("9441"),
        );
        assert_eq!(
            agent_addr(&v6_only),
            Some("[fd00::5]:9441".parse().expect("addr"))
        );
        let v6_first = node_at(
            &[("InternalIP", "fd00::5"), ("InternalIP", "10.0.0.5")],
            Some("9441"),
        );
        assert_eq!(internal_ip(&v6_first), Some("fd00::5".parse().expect("ip")));
        let v4_first = node_at(
            &[
                ("ExternalIP", "203.0.113.5"),
                ("InternalIP", "10.0.0.5"),
                ("InternalIP", "fd00::5"),
            ],
            Some("9441"),
        );
        assert_eq!(
            agent_addr(&v4_first),
            Some("10.0.0.5:9441".parse().expect("addr"))
        );
        assert_eq!(
            agent_addr(&node_at(&[("InternalIP", "10.0.0.5")], None)),
            None,
            "no agent"
        );
        assert_eq!(
            agent_addr(&node_at(&[("ExternalIP", "203.0.113.5")], Some("9441"))),
            None
        );
        assert_eq!(
            agent_addr(&node_at(&[("InternalIP", "10.0.0.5")], Some("0"))),
            None
        );
    }

    #[test]
    fn the_annotations_keep_their_names() {
        assert_eq!(FENCE_REQUEST_ANNOTATION, "podha.io/fence-request");
        assert_eq!(FENCE_ACK_ANNOTATION, "podha.io/fence-ack");
        assert_eq!(AGENT_PORT_ANNOTATION, "podha.io/agent-port");
        assert_eq!(
            AGENT_FENCED_WITHIN_ANNOTATION,
            "podha.io/agent-fenced-within"
        );
        assert_eq!(AGENT_WATCHDOG_ANNOTATION, "podha.io/agent-watchdog");
    }

    #[test]
    fn an_agent_names_its_watchdogs_timeout_or_why_it_has_none_on_one_short_line() {
        assert_eq!(watchdog_value(Duration::from_secs(10)), "10s");
        assert_eq!(watchdog_value(Duration::from_millis(9_500)), "9s 500ms");
        assert_eq!(no_watchdog_value("not configured"), "none: not configured");
        assert_eq!(
            no_watchdog_value("refusing the watchdog /dev/watchdog:\n  its driver\thas nowayout"),
            "none: refusing the watchdog /dev/watchdog: its driver has nowayout"
        );
        let long = "é".repeat(NO_WATCHDOG_REASON_MAX + 1);
        let value = no_watchdog_value(&long);
        let reason = value.strip_prefix(NO_WATCHDOG_PREFIX).expect("prefix");
        assert_eq!(reason.chars().count(), NO_WATCHDOG_REASON_MAX);
        assert!(reason.ends_with("é…"), "{reason}");
        let fits = "é".repeat(NO_WATCHDOG_REASON_MAX);
        assert_eq!(no_watchdog_value(&fits), format!("none: {fits}"));
    }

    #[test]
    fn an_agent_lease_counts_only_under_the_name_of_its_holder() {
        assert_eq!(agent_lease_name("n1"), "podha-agent-n1");
        assert_eq!(advertising_node("podha-agent-n1", Some("n1")), Some("n1"));
        assert_eq!(advertising_node("podha-agent-n1", Some("n2")), None);
        assert_eq!(advertising_node("podha-agent-", Some("")), None);
        assert_eq!(advertising_node("podha-leader", Some("n1")), None);
        assert_eq!(advertising_node("podha-agent-n1", None), None);
        // A node name too long to follow the prefix: a hash of it, at most 253 characters.
        let long = format!("{}.example", "a".repeat(240));
        let name = agent_lease_name(&long);
        assert_eq!(name, agent_lease_name(&long), "stable");
        assert!(
            name.len() <= 253 && name.starts_with("podha-agent-"),
            "{name}"
        );
        assert_eq!(name.len(), "podha-agent-".len() + 16);
        assert_eq!(advertising_node(&name, Some(&long)), Some(long.as_str()));
        let fits = "b".repeat(241);
        assert_eq!(agent_lease_name(&fits), format!("podha-agent-{fits}"));
        assert_eq!(AGENT_LEASE_LABEL, "podha.io/agent-advert");
    }

    #[test]
    fn a_fence_request_names_the_boot_it_is_for() {
        assert_eq!(
            fence_request("p", 1_700_000_000_000, "b1"),
            "p/1700000000000/b1"
        );
        assert_eq!(requested_boot("p/1700000000000/b1"), Some("b1"));
        assert_eq!(requested_boot(&fence_request("p", 1, "")), None);
        assert_eq!(requested_boot("p/1700000000000/"), None);
        assert_eq!(requested_policy(&fence_request("db", 1, "b1")), "db");
        assert_eq!(requested_at(&fence_request("db", 17, "b1")), Some(17));
        assert_eq!(requested_at("p/1"), None);
        assert_eq!(requested_at("p/soon/b1"), None);
    }

    #[test]
    fn the_agents_endpoint_and_timeout_come_from_its_node() {
        let with_agent = mk_node("n1")
            .annotation(
                AGENT_FENCED_WITHIN_ANNOTATION,
                &fenced_within_value(Duration::from_secs(38)),
            )
            .annotation(AGENT_PORT_ANNOTATION, "9441");
        // The time counts only beside the watchdog the agent pets: an advert left by an agent
        // from before the watchdog annotation, or beside one that says none, proves nothing.
        assert_eq!(fenced_within(&with_agent), None);
        let unwatched = with_agent.clone().annotation(
            AGENT_WATCHDOG_ANNOTATION,
            &no_watchdog_value("not configured"),
        );
        assert_eq!(fenced_within(&unwatched), None);
        let watched = with_agent.annotation(
            AGENT_WATCHDOG_ANNOTATION,
            &watchdog_value(Duration::from_secs(10)),
        );
        assert_eq!(fenced_within(&watched), Some(Duration::from_secs(38)));
        assert_eq!(fenced_within(&mk_node("n1")), None);
        let garbled = mk_node("n1")
            .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "soon")
            .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
        assert_eq!(fenced_within(&garbled), None);
        assert_eq!(agent_addr(&mk_node("n1")), None, "no agent");
    }
}
