//! The node's BMC, asked now, before the node dies: under a proof that powers the node off
//! through its BMC (`BMC`, alone or in `anyOf`/`allOf`), `podha explain` reads the node's
//! Secret and asks the BMC for the system's power state and identity, as podha does at the
//! death ([`Power::check`]). Nothing is powered.
//!
//! What podha explain cannot see from where it runs is said, not failed: a Secret this user
//! may not read, and a BMC this host cannot reach (podha's pod may), each with how to ask
//! from podha's own pod.

use kube::Client;

use super::{Check, Cluster};
use crate::api::FencingProof;
use crate::planner::{bmc_target, node_owner};
use crate::protection::Unprotected;
use crate::redfish;
use crate::runtime::power::{Power, PowerError, Target};

/// The rule's name in the answer.
const RULE: &str = "bmc";

/// The BMC check of `node_name`, when its policy's proof asks its BMC and podha can name the
/// node's Secret (otherwise the proof check already says why not). `namespace`: podha's.
pub async fn check(
    client: &Client,
    namespace: Option<&str>,
    cluster: &Cluster<'_>,
    node_name: &str,
) -> Option<Check> {
    let node = cluster.view.nodes.get(node_name)?;
    let policy = node_owner(&cluster.policies, node)?;
    let fencing = &policy.spec.fencing;
    let proofs = fencing.proofs();
    if !proofs.asks(FencingProof::Bmc) {
        return None;
    }
    let (secret, system_uuid) = bmc_target(fencing, node_name, node, cluster.view).ok()?;
    let ask_there = format!(
        "ask from podha's pod: kubectl exec -n {} deploy/podha -- /podha explain node {node_name}",
        namespace.unwrap_or("<podha's namespace>")
    );
    let Some(namespace) = namespace else {
        return Some(Check::note(
            RULE,
            format!(
                "not asked: podha's namespace, which holds Secret {secret}, is not known (no \
                 leader Lease found; give --podha-namespace)"
            ),
        ));
    };
    let target = Target {
        node: node_name,
        secret: &secret,
        system_uuid: system_uuid.as_deref(),
        lease_seen: None,
    };
    let power = Power::new(client.clone(), namespace);
    Some(match power.check(&target).await {
        Ok(state) => Check::pass(
            RULE,
            format!(
                "asked now: the BMC behind Secret {secret} answers for {node_name}'s system, \
                 PowerState {state}{}",
                if system_uuid.is_some() {
                    ", its UUID the node's systemUUID"
                } else {
                    ""
                }
            ),
        ),
        Err(PowerError::SecretUnread { error, .. }) => Check::note(
            RULE,
            format!(
                "asked now: Secret {namespace}/{secret} could not be read here ({error}): {ask_there}"
            ),
        ),
        Err(PowerError::Bmc {
            error: error @ redfish::Error::Unreachable { .. },
            ..
        }) => Check::note(
            RULE,
            format!(
                "asked now: {error}, from where podha explain runs; podha's pod may reach it: \
                 {ask_there}"
            ),
        ),
        Err(error) if proofs.requires(FencingProof::Bmc) => Check::fail(
            RULE,
            Unprotected::NoBmc,
            format!(
                "asked now: {error}: judged dead, {node_name} would be held until this is mended"
            ),
        ),
        Err(error) => Check::note(
            RULE,
            format!(
                "asked now: {error}: judged dead, {node_name} waits for the policy's other \
                 proofs"
            ),
        ),
    })
}
