//! The proof the out-of-service taint waits for, and whether it can be given: the node's
//! agent (its advert, watchdog and Lease, and the other agents podha must hear for a silence
//! to count, as `planner::proof` rules), the cloud provider's shutdown taint, a fence
//! controller, the node's BMC.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::{AgentGap, Check, Checks, Cluster, Outcome, Unprotected, agent_gap, human};
use crate::api::{BMC_NODE_LABEL, FencingProof};
use crate::contract::{AGENT_WATCHDOG_ANNOTATION, agent_addr, fenced_within};
use crate::planner::proof::silence_counts_among;
use crate::planner::{BmcGap, PolicyRef, bmc_target};

/// The proof the taint waits for, and whether the node's agent can give it: worked out once per
/// node (every pod there shares it, and counting the other agents reads every node).
pub fn proof_checks(
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    node_name: &str,
    node: &Node,
    checks: &mut Checks,
) {
    let proof = cluster.proof_of(node_name, || {
        let mut proof = Checks::default();
        node_proof(cluster, node_policy, node_name, node, &mut proof);
        proof.0
    });
    checks.0.extend(proof);
}

fn node_proof(
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    node_name: &str,
    node: &Node,
    checks: &mut Checks,
) {
    let proofs = node_policy.spec.fencing.proofs();
    if let Some(proof) = proofs.single() {
        return member_checks(proof, cluster, node_policy, node_name, node, checks);
    }
    // A combination: each member's checks, under a note that says how they combine.
    let members: Vec<Checks> = proofs
        .members()
        .map(|proof| {
            let mut member = Checks::default();
            member_checks(proof, cluster, node_policy, node_name, node, &mut member);
            member
        })
        .collect();
    let failed = |m: &Checks| m.0.iter().any(Check::failed);
    if proofs.needs_all() {
        checks.note(
            "proof",
            format!("{proofs}: the taint waits for every one of these proofs"),
        );
        members.into_iter().for_each(|m| checks.0.extend(m.0));
    } else if members.iter().all(failed) {
        // An empty list comes here too (`all` holds for no member): it proves nothing.
        checks.note("proof", format!("{proofs}: none of these proofs can come"));
        if members.is_empty() {
            checks.fail(
                "proof",
                Unprotected::NoProof,
                format!(
                    "{proofs} lists no proof that counts: judged dead, the node is held for good"
                ),
            );
        }
        members.into_iter().for_each(|m| checks.0.extend(m.0));
    } else {
        checks.note(
            "proof",
            format!("{proofs}: the first of these proofs to come lets the taint on"),
        );
        // A member that cannot come leaves the others: said, not failed.
        for check in members.into_iter().flat_map(|m| m.0) {
            checks.push(match check.outcome {
                Outcome::Fail => Check::note(
                    check.rule,
                    format!(
                        "{} (another proof of {proofs} can still come)",
                        check.detail
                    ),
                ),
                _ => check,
            });
        }
    }
}

/// The checks of one proof.
fn member_checks(
    proof: FencingProof,
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    node_name: &str,
    node: &Node,
    checks: &mut Checks,
) {
    match proof {
        FencingProof::None => checks.pass(
            "proof",
            "fencing.proof None: the taint follows the judgement alone (a frozen or cut-off \
             node may write on beside the replacement)",
        ),
        FencingProof::Agent => agent_checks(cluster, node_policy, node_name, node, checks),
        FencingProof::AgentAcknowledged if agent_addr(node).is_none() => checks.fail(
            "proof",
            Unprotected::NoProvingAgent,
            format!(
                "AgentAcknowledged: {node_name} advertises no agent to ask for a fence: judged \
                 dead, it is held for good"
            ),
        ),
        FencingProof::AgentAcknowledged => checks.note(
            "proof",
            format!(
                "AgentAcknowledged: held until the agent on {node_name} acknowledges podha's \
                 fence request (podha.io/fence-ack, once its fence is confirmed); its silence \
                 proves nothing, so a machine that dies with its agent is held until someone \
                 fences it"
            ),
        ),
        FencingProof::CloudShutdownTaint if !cloud_managed(node) => checks.fail(
            "proof",
            Unprotected::NoCloudProvider,
            format!(
                "CloudShutdownTaint: {node_name} has no spec.providerID, so no cloud provider \
                 will ever taint it shut down: judged dead, it is held for good"
            ),
        ),
        FencingProof::CloudShutdownTaint => checks.note(
            "proof",
            "CloudShutdownTaint: held until the cloud provider taints the node \
             node.cloudprovider.kubernetes.io/shutdown (the instance is off)",
        ),
        FencingProof::External => checks.note(
            "proof",
            "External: held until a fence controller acknowledges podha.io/fence-request on \
             the node (podha.io/fence-ack); protected only if one runs for this node",
        ),
        FencingProof::Bmc => bmc_checks(cluster, node_policy, node_name, node, checks),
        // Never a member (see `Proofs`).
        FencingProof::AnyOf | FencingProof::AllOf => {}
    }
}

/// The node's BMC under the `BMC` proof, as the planner reaches it (`planner::bmc_target`).
fn bmc_checks(
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    node_name: &str,
    node: &Node,
    checks: &mut Checks,
) {
    let fencing = &node_policy.spec.fencing;
    let why = match bmc_target(fencing, node_name, node, cluster.view) {
        Ok((secret, _)) => {
            checks.note(
                "proof",
                format!(
                    "BMC: podha powers {node_name} off through its BMC (Secret {secret} in \
                     podha's namespace, labelled {BMC_NODE_LABEL}={node_name}) and holds it \
                     until the BMC says the machine is off"
                ),
            );
            return;
        }
        Err(BmcGap::NotConfigured) => "fencing.bmc is missing".to_string(),
        Err(BmcGap::NoSecretName) => format!(
            "{node_name} has no label {}, which names its BMC's Secret",
            fencing
                .bmc
                .as_ref()
                .and_then(|b| b.secret_name_label.as_deref())
                .unwrap_or("(none)")
        ),
        Err(BmcGap::SharedSystemUuid { with }) => format!(
            "{node_name}'s systemUUID is reported by {with} too: it does not tell their \
             machines apart, so podha powers neither off (fix the firmware's UUIDs)"
        ),
    };
    checks.fail(
        "proof",
        Unprotected::NoBmc,
        format!("BMC: {why}: judged dead, the node is held for good"),
    );
}

/// How many other nodes advertise an agent, and how many of those have one with a watchdog
/// and a fresh Lease (what podha can hear, as far as a reader of the API can tell). The whole
/// cluster's counts are taken once; each node takes its own agent out of them.
fn other_agents(cluster: &Cluster<'_>, node_name: &str, node: &Node) -> (usize, usize) {
    let (advertised, fresh) = *cluster.agents.get_or_init(|| {
        let advertised: Vec<(&String, &std::sync::Arc<Node>)> = cluster
            .view
            .nodes
            .iter()
            .filter(|(_, n)| agent_addr(n).is_some())
            .collect();
        let fresh = advertised
            .iter()
            .filter(|(name, n)| {
                agent_gap(name, n, cluster.view, cluster.now).is_none_or(AgentGap::heard)
            })
            .count();
        (advertised.len(), fresh)
    });
    let own_advertised = usize::from(agent_addr(node).is_some());
    let own_fresh = usize::from(
        agent_gap(node_name, node, cluster.view, cluster.now).is_none_or(AgentGap::heard),
    );
    (
        fresh.saturating_sub(own_fresh),
        advertised.saturating_sub(own_advertised),
    )
}

/// A cloud provider manages the node (it has a `spec.providerID`).
fn cloud_managed(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|id| !id.is_empty())
}

/// The node's agent under the `Agent` proof: is there one whose silence proves its fence?
fn agent_checks(
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    node_name: &str,
    node: &Node,
    checks: &mut Checks,
) {
    let within = fenced_within(node);
    let (fresh, others) = other_agents(cluster, node_name, node);
    match agent_gap(node_name, node, cluster.view, cluster.now) {
        None if !silence_counts_among(fresh, others) => {
            checks.pass("agent", format!("the agent on {node_name} pets a watchdog"));
            checks.fail(
                "proof",
                Unprotected::TooFewAgentsHeard,
                format!(
                    "Agent: a silent agent's silence counts only while podha hears a strict \
                     majority of the agents, the silent one included, and {fresh} of {others} \
                     other nodes have an agent with a watchdog and a fresh Lease: judged dead, \
                     {node_name} is held until its agent acknowledges a fence request"
                ),
            );
        }
        None => {
            let lease = cluster.view.agent_adverts.get(node_name);
            let ago = lease.map(|l| cluster.now.saturating_duration_since(l.renewed_seen));
            checks.pass(
                "agent",
                format!(
                    "the agent on {node_name} pets a watchdog ({}) and renewed its Lease {} ago",
                    node.annotations()
                        .get(AGENT_WATCHDOG_ANNOTATION)
                        .map_or("", String::as_str),
                    human(ago.unwrap_or_default())
                ),
            );
            checks.pass(
                "proof",
                format!(
                    "Agent: a silence of {} plus agentMargin {} (counted from the last renewal of \
                     the agent's Lease, if later) proves the fence",
                    human(within.unwrap_or_default()),
                    node_policy.spec.fencing.agent_margin
                ),
            );
        }
        Some(gap) => {
            let why = match cluster.view.agent_adverts.get(node_name) {
                Some(lease) if gap == AgentGap::PeersUnreachable => format!(
                    " ({} of the peers its last check asked answered): on isolation it could \
                     not show that podha hears no majority, so podha holds the node",
                    lease.peers_unreachable.as_deref().unwrap_or_default()
                ),
                _ => node
                    .annotations()
                    .get(AGENT_WATCHDOG_ANNOTATION)
                    .filter(|_| within.is_none())
                    .map_or_else(String::new, |w| {
                        format!(" ({AGENT_WATCHDOG_ANNOTATION}: {w})")
                    }),
            };
            checks.fail(
                "agent",
                Unprotected::NoProvingAgent,
                format!("{}{why}", gap.describe()),
            );
            checks.fail(
                "proof",
                Unprotected::NoProvingAgent,
                format!(
                    "Agent: {node_name} has no agent whose silence proves its fence: judged \
                     dead, it is held until its agent acknowledges a fence request ({}, or \
                     choose another fencing.proof in {})",
                    gap.remedy(),
                    node_policy.name
                ),
            );
        }
    }
}
