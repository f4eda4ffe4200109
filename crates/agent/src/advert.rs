//! What the agent tells podha about itself, and takes back when it stops:
//! - the advert on its Node ([`Advert`]: the port podha probes, how soon a silent agent fences
//!   its node, which only an agent with a watchdog says, and its watchdog or why it has none),
//!   put back whenever the Node lacks it or carries more;
//! - its Lease in podha's namespace ([`AdvertLease`], see [`crate::contract`]), renewed while
//!   the agent runs and owned by its Pod, so that an agent uninstalled, moved away by a
//!   nodeSelector or stopped for good no longer passes for one that fences: podha counts a
//!   node's silence as a fence only while its agent's Lease is there and was renewed within
//!   its duration before the silence began. The Lease also says whether podha has heard the
//!   agent in this boot, for a podha replica that gains leadership (`planner::proof`); see
//!   `lease`.
//!
//! On SIGTERM the agent withdraws both first ([`advertise_until_withdrawn`]), and disarms its
//! watchdog only once the API server confirmed the withdrawal: from then on nothing fences the
//! node, and podha no longer counts its silence as a fence.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

mod lease;

pub use lease::{AdvertLease, OwnerPod};

use super::error::AgentError;
use super::peer_list::lock;

use crate::contract::{
    AGENT_FENCED_WITHIN_ANNOTATION, AGENT_KEY_ANNOTATION, AGENT_PORT_ANNOTATION,
    AGENT_WATCHDOG_ANNOTATION, PublicKey, fenced_within_value,
};

/// How long one try at the withdrawal on SIGTERM may take, both writes together.
const WITHDRAW_WITHIN: Duration = Duration::from_secs(2);

/// How soon a withdrawal the API server did not confirm is tried again, while the watchdog
/// stays armed and petted by the usual rules.
pub const WITHDRAW_RETRY: Duration = Duration::from_secs(1);

/// How soon an advert the Node refused (the API server unreachable, an admission policy of an
/// older release) is tried again: a Node that took none shows the last agent's, which may name
/// a watchdog this agent does not pet.
pub const ADVERT_RETRY: Duration = Duration::from_secs(5);

/// The field manager of the agent's server-side applies.
pub(crate) const FIELD_MANAGER: &str = "podha-agent";

/// Every annotation an advert may put on its Node: what [`removal`] takes off.
const ANNOTATIONS: [&str; 4] = [
    AGENT_PORT_ANNOTATION,
    AGENT_FENCED_WITHIN_ANNOTATION,
    AGENT_WATCHDOG_ANNOTATION,
    AGENT_KEY_ANNOTATION,
];

/// What the agent tells podha on its Node: that an agent runs here, on this port, how long
/// after podha last heard it its node is fenced at the latest (`fenced_within`: only with a
/// watchdog), and the watchdog it pets or why it pets none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advert {
    pub port: u16,
    /// `None` without a watchdog: the Node must then carry none, or podha would count the
    /// agent's silence as a fence (a frozen node without a watchdog never fences itself).
    pub fenced_within: Option<Duration>,
    /// The value of `podha.io/agent-watchdog` (see [`super::watchdog::advertised`]).
    pub watchdog: String,
    /// The key this agent signs its words with (see `crate::contract::words`).
    pub key: PublicKey,
}

impl Advert {
    /// Each annotation of the advert ([`ANNOTATIONS`], in that order) with the value it must
    /// have on the Node; `None`: it must not be there.
    fn annotations(&self) -> [(&'static str, Option<String>); 4] {
        [
            (AGENT_PORT_ANNOTATION, Some(self.port.to_string())),
            (
                AGENT_FENCED_WITHIN_ANNOTATION,
                self.fenced_within.map(fenced_within_value),
            ),
            (AGENT_WATCHDOG_ANNOTATION, Some(self.watchdog.clone())),
            (AGENT_KEY_ANNOTATION, Some(self.key.encode())),
        ]
    }

    /// Whether `node` lacks this advert, or carries another: a Node deleted and registered
    /// again comes back without it, and podha, which probes only nodes that advertise an
    /// agent, would stop hearing this one (whose node it would then fence). Another is also
    /// an annotation this advert has not, as a `fenced_within` a worker with a watchdog left
    /// before this one started without.
    pub fn missing_from(&self, node: &Node) -> bool {
        let annotations = node.metadata.annotations.as_ref();
        self.annotations()
            .iter()
            .any(|(key, value)| annotations.and_then(|a| a.get(*key)) != value.as_ref())
    }

    /// The merge patch that puts this advert on its Node: each annotation set, or removed
    /// (`null`) where the advert has none.
    fn patch(&self) -> serde_json::Value {
        let annotations: serde_json::Map<String, serde_json::Value> = self
            .annotations()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.map_or(serde_json::Value::Null, Into::into)))
            .collect();
        json!({"metadata": {"annotations": annotations}})
    }

    /// Returns whether the Node took it; the caller tries again after [`ADVERT_RETRY`] until it
    /// does: an older agent's advert (another watchdog, or none) stands meanwhile.
    pub(super) async fn put_on(&self, nodes: &Api<Node>, name: &str) -> bool {
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&self.patch()))
            .await
        {
            Ok(_) => {
                info!(
                    node = name,
                    port = self.port,
                    fenced_within = ?self.fenced_within,
                    watchdog = self.watchdog,
                    "agent advertised on the node"
                );
                true
            }
            Err(e) => {
                warn!(node = name, error = %e, retry = ?ADVERT_RETRY, "cannot advertise the agent on the node yet");
                false
            }
        }
    }

    /// Takes this agent's advert off `node` (the Node `name` as last seen), if it carries any
    /// of it: podha stops probing the agent, and its silence stops counting as a fence.
    pub(super) async fn take_off(&self, nodes: &Api<Node>, name: &str, node: &Node) {
        if !carries_any(node) {
            return;
        }
        if let Err(e) = nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&removal()))
            .await
        {
            warn!(node = name, error = %e, "cannot take the agent's advert off the node");
        }
    }
}

/// Whether `node` carries any annotation of an advert.
fn carries_any(node: &Node) -> bool {
    let annotations = node.metadata.annotations.as_ref();
    ANNOTATIONS
        .iter()
        .any(|key| annotations.is_some_and(|a| a.contains_key(*key)))
}

/// The merge patch that takes an advert off its Node.
fn removal() -> serde_json::Value {
    let annotations: serde_json::Map<String, serde_json::Value> = ANNOTATIONS
        .iter()
        .map(|key| (key.to_string(), serde_json::Value::Null))
        .collect();
    json!({"metadata": {"annotations": annotations}})
}

/// Takes the advert off the Node and deletes the Lease, at most [`WITHDRAW_WITHIN`]: the agent
/// stops and will fence nothing. Whether the withdrawal is settled (see [`settled`]): until it
/// is, podha may still count the agent's silence as a fence.
pub async fn withdraw(nodes: &Api<Node>, node: &str, lease: &AdvertLease) -> bool {
    lock(&lease.hearing).withdraw();
    let patch = removal();
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let both = async { tokio::join!(nodes.patch(node, &params, &patch), lease.delete()) };
    match tokio::time::timeout(WITHDRAW_WITHIN, both).await {
        Ok((Ok(_), Ok(()))) => {
            info!(node, "agent advert and Lease withdrawn");
            true
        }
        Ok((advert, lease)) if settled(&advert) && settled(&lease) => {
            warn!(
                node,
                advert = ?advert.err(),
                lease = ?lease.err(),
                "the API server refuses the agent's withdrawal: its identity or its Node is gone \
                 (uninstalled), and its Lease goes with its Pod"
            );
            true
        }
        Ok((advert, lease)) => {
            warn!(
                node,
                advert = ?advert.err(),
                lease = ?lease.err(),
                "cannot withdraw the agent's advert"
            );
            false
        }
        Err(_) => {
            warn!(
                node,
                "withdrawing the agent's advert took over {WITHDRAW_WITHIN:?}"
            );
            false
        }
    }
}

/// Whether one write of the withdrawal is settled: the API server did it, or answered that
/// the agent's identity or its object is gone (401, 403, 404). An uninstall (or
/// `agent.enabled=false`) deletes the agent's ServiceAccount and RBAC together with its
/// DaemonSet, so its pods are stopped by then; their Leases go with them (each is owned by its
/// Pod), and podha counts no agent's silence without its Lease. Waiting on would leave every
/// agent to the kubelet's kill with its watchdog armed: every node reset. An API server that
/// does not answer (a node cut off), or answers anything else, settles nothing.
fn settled<T>(write: &Result<T, kube::Error>) -> bool {
    match write {
        Ok(_) => true,
        Err(kube::Error::Api(status)) => matches!(status.code, 401 | 403 | 404),
        Err(_) => false,
    }
}

/// How advertising the agent ended.
#[derive(Debug)]
pub enum Advertising {
    /// Stopped on purpose, and the withdrawal settled (the API server confirmed the advert and
    /// the Lease gone, or that the agent is uninstalled): podha counts none of this agent's
    /// silence, and its watchdog may be disarmed.
    Withdrawn,
    /// `advertise` itself ended.
    Ended(Result<(), AgentError>),
}

impl Advertising {
    /// How the agent ends, and whether its advert is withdrawn.
    pub fn outcome(self) -> (Result<(), AgentError>, bool) {
        match self {
            Self::Withdrawn => (Ok(()), true),
            Self::Ended(result) => (result, false),
        }
    }
}

/// Runs `advertise` (the Lease's renewals, the Node's advert, the fence requests) until `stop`,
/// then withdraws the advert, again every [`WITHDRAW_RETRY`] until the withdrawal is settled
/// (`withdraw` true: see [`settled`]).
/// Until then the agent keeps serving and petting its watchdog by the usual rules (the caller
/// runs those beside this), so a node cut off from the API server when its agent is stopped is
/// fenced like any other cut-off node: a watchdog disarmed before the withdrawal would leave an
/// advert behind whose silence podha counts as a fence of a node that runs on. A kill ends it
/// all with the watchdog armed.
pub async fn advertise_until_withdrawn<W: Future<Output = bool>>(
    advertise: impl Future<Output = Result<(), AgentError>>,
    stop: impl Future<Output = ()>,
    mut withdraw: impl FnMut() -> W,
) -> Advertising {
    tokio::select! {
        ended = advertise => return Advertising::Ended(ended),
        () = stop => info!("SIGTERM: withdrawing the advert, then stopping"),
    }
    let mut said = false;
    while !withdraw().await {
        if !std::mem::replace(&mut said, true) {
            warn!(
                "stopping, but the advert is not withdrawn: the watchdog stays armed and is \
                 petted by the usual rules until the API server confirms the withdrawal or the \
                 agent is killed"
            );
        }
        tokio::time::sleep(WITHDRAW_RETRY).await;
    }
    Advertising::Withdrawn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::FENCE_ACK_ANNOTATION;

    /// Node `n1` with `annotations`.
    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node
    }

    fn advert(fenced_within: Option<Duration>, watchdog: &str) -> Advert {
        Advert {
            port: 9441,
            fenced_within,
            watchdog: watchdog.into(),
            key: crate::contract::Identity::generate().expect("key").public(),
        }
    }

    #[test]
    fn a_node_without_the_agents_advert_or_with_another_one_is_advertised_again() {
        let advert = advert(Some(Duration::from_secs(30)), "10s");
        let key = advert.key.encode();
        let carried = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_FENCED_WITHIN_ANNOTATION, "30s"),
            (AGENT_WATCHDOG_ANNOTATION, "10s"),
            (AGENT_KEY_ANNOTATION, &key),
            (FENCE_ACK_ANNOTATION, "r1"),
        ]);
        assert!(!advert.missing_from(&carried));
        // Registered again: no annotations at all.
        assert!(advert.missing_from(&Node::default()));
        assert!(advert.missing_from(&node(&[(AGENT_PORT_ANNOTATION, "9441")])));
        let older = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_FENCED_WITHIN_ANNOTATION, "46s"),
            (AGENT_WATCHDOG_ANNOTATION, "10s"),
            (AGENT_KEY_ANNOTATION, &key),
        ]);
        assert!(advert.missing_from(&older), "another agent's timing");
        let rekeyed = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_FENCED_WITHIN_ANNOTATION, "30s"),
            (AGENT_WATCHDOG_ANNOTATION, "10s"),
            (AGENT_KEY_ANNOTATION, "another-key"),
        ]);
        assert!(advert.missing_from(&rekeyed), "another agent's key");
        let unwatched = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_WATCHDOG_ANNOTATION, "none: not configured"),
            (AGENT_KEY_ANNOTATION, &key),
        ]);
        assert!(advert.missing_from(&unwatched), "no fenced-within");
    }

    /// An agent without a watchdog: the Node must carry no fenced-within, and one left there
    /// (by a worker that had a watchdog) is taken off.
    #[test]
    fn an_agent_without_a_watchdog_advertises_no_fenced_within_and_takes_an_old_one_off() {
        let advert = advert(
            None,
            "none: there is no watchdog /dev/watchdog on this node",
        );
        let key = advert.key.encode();
        let unwatched = [
            (AGENT_PORT_ANNOTATION, "9441"),
            (
                AGENT_WATCHDOG_ANNOTATION,
                "none: there is no watchdog /dev/watchdog on this node",
            ),
            (AGENT_KEY_ANNOTATION, key.as_str()),
        ];
        assert!(!advert.missing_from(&node(&unwatched)));
        let left_behind =
            node(&[&unwatched[..], &[(AGENT_FENCED_WITHIN_ANNOTATION, "30s")]].concat());
        assert!(
            advert.missing_from(&left_behind),
            "a fenced-within it does not advertise"
        );
        let watched = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_WATCHDOG_ANNOTATION, "10s"),
            (AGENT_KEY_ANNOTATION, &key),
        ]);
        assert!(advert.missing_from(&watched), "another watchdog word");
        assert_eq!(
            advert.patch(),
            json!({"metadata": {"annotations": {
                AGENT_PORT_ANNOTATION: "9441",
                AGENT_FENCED_WITHIN_ANNOTATION: null,
                AGENT_WATCHDOG_ANNOTATION: "none: there is no watchdog /dev/watchdog on this node",
                AGENT_KEY_ANNOTATION: key,
            }}})
        );
    }

    #[test]
    fn an_agent_with_a_watchdog_advertises_its_timeout_and_how_soon_its_node_is_fenced() {
        let advert = advert(Some(Duration::from_secs(30)), "10s");
        assert_eq!(
            advert.patch(),
            json!({"metadata": {"annotations": {
                AGENT_PORT_ANNOTATION: "9441",
                AGENT_FENCED_WITHIN_ANNOTATION: "30s",
                AGENT_WATCHDOG_ANNOTATION: "10s",
                AGENT_KEY_ANNOTATION: advert.key.encode(),
            }}})
        );
    }

    #[test]
    fn the_withdrawal_takes_off_every_annotation_an_advert_writes() {
        let written = advert(Some(Duration::from_secs(30)), "10s").patch();
        let removed = removal();
        let keys = |patch: &serde_json::Value| {
            patch["metadata"]["annotations"]
                .as_object()
                .map(|a| a.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(keys(&written), keys(&removed));
        assert!(
            removed["metadata"]["annotations"]
                .as_object()
                .is_some_and(|a| a.values().all(serde_json::Value::is_null)),
            "{removed}"
        );
        assert!(carries_any(&node(&[(AGENT_WATCHDOG_ANNOTATION, "10s")])));
        assert!(!carries_any(&node(&[(FENCE_ACK_ANNOTATION, "r1")])));
    }

    /// On SIGTERM the advert goes first, and the agent stops (and may disarm) only once the
    /// API server confirmed it: a withdrawal that does not reach it is tried again for as long
    /// as the agent runs, never given up for a disarmed watchdog.
    #[tokio::test(start_paused = true)]
    async fn a_stop_withdraws_first_and_ends_only_once_the_withdrawal_is_confirmed() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let tries = AtomicUsize::new(0);
        let refused_until = AtomicUsize::new(usize::MAX);
        let withdraw = || async {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            n >= refused_until.load(Ordering::SeqCst)
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async {
            let _ = stop_rx.await;
        };
        let advertising = advertise_until_withdrawn(std::future::pending(), stop, withdraw);
        tokio::pin!(advertising);
        let a_while = Duration::from_secs(600);
        // No stop: it advertises, and withdraws nothing.
        assert!(
            tokio::time::timeout(a_while, &mut advertising)
                .await
                .is_err()
        );
        assert_eq!(tries.load(Ordering::SeqCst), 0);
        // Stopped while the API server is out of reach: still running ten minutes on, trying.
        stop_tx.send(()).expect("stop");
        assert!(
            tokio::time::timeout(a_while, &mut advertising)
                .await
                .is_err()
        );
        let tried = tries.load(Ordering::SeqCst);
        assert!(tried >= 500, "tried {tried} times");
        // The API server answers: withdrawn, and only now does it end.
        refused_until.store(tried + 2, Ordering::SeqCst);
        let ended = tokio::time::timeout(WITHDRAW_RETRY * 5, &mut advertising)
            .await
            .expect("ends once confirmed");
        assert!(matches!(ended, Advertising::Withdrawn), "{ended:?}");
        assert_eq!(tries.load(Ordering::SeqCst), tried + 3);
    }

    /// A write the API server did is settled, and so is one it refuses because the agent's
    /// identity or object is gone (an uninstall); one it never answered, or refused otherwise,
    /// is not.
    #[test]
    fn a_withdrawal_is_settled_by_the_api_servers_word_not_by_its_silence() {
        let answered = |code: u16| -> Result<(), kube::Error> {
            Err(kube::Error::Api(
                kube::core::Status {
                    code,
                    ..kube::core::Status::default()
                }
                .boxed(),
            ))
        };
        assert!(settled(&Ok::<(), kube::Error>(())));
        for gone in [401, 403, 404] {
            assert!(settled(&answered(gone)), "{gone}");
        }
        for unsettled in [409, 429, 500, 503] {
            assert!(!settled(&answered(unsettled)), "{unsettled}");
        }
        let unreachable: Result<(), kube::Error> = Err(kube::Error::Service(Box::new(
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "cut off"),
        )));
        assert!(!settled(&unreachable));
    }

    /// Advertising that ends by itself (its Node watch ended) is no stop: nothing withdrawn.
    #[tokio::test(start_paused = true)]
    async fn advertising_that_ends_by_itself_withdraws_nothing() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let tries = AtomicUsize::new(0);
        let ended = advertise_until_withdrawn(
            async { Err(AgentError::WatchEnded) },
            std::future::pending(),
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                true
            },
        )
        .await;
        assert!(
            matches!(ended, Advertising::Ended(Err(AgentError::WatchEnded))),
            "{ended:?}"
        );
        assert_eq!(tries.load(Ordering::SeqCst), 0);
    }
}
