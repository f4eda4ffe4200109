//! Fence requests through the API: podha sets [`FENCE_REQUEST_ANNOTATION`] on the Node; the
//! agent, watching its own Node, fences and then sets [`FENCE_ACK_ANNOTATION`] to the same
//! value. The acknowledgement is written only once the fence is confirmed (its
//! `--fence-confirm` check passed: see [`super::fence`]), so it is a proof; a fence nothing
//! confirms is not acknowledged (podha proves it by the agent's silence, if the node went down).
//! A request already acknowledged is not fenced again (the agent restarts on a rebooted node
//! and sees the old request answered).

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{error, info, warn};

use super::advert::{ADVERT_RETRY, Advert};
use super::{AgentError, FenceCause, Fenced, Fencer};
use crate::contract::{
    FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION, internal_ip, requested_boot,
};
use crate::listen::Listening;

/// How the agent answers a fence request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Fence, then acknowledge once the fence is confirmed.
    Fence,
    /// Acknowledge without a fence: the request was made in an earlier boot of this node, and
    /// the reboot since was the fence.
    EarlierBoot,
    /// Neither yet: the request names another boot than the agent's, and the Node (its
    /// `status.nodeInfo.bootID`) does not report the agent's boot either. Either the kubelet
    /// has not reported this boot yet (the Node is delivered again when it does), or the
    /// agent's boot ID is not the kubelet's (a `--boot-id-file` of something else, a node that
    /// poses as a machine), where every request would look like one of an earlier boot. An
    /// acknowledgement would then let podha move the volumes of a node that runs on, and a
    /// fence would reset a node that just booted: podha holds the node meanwhile.
    Wait,
}

/// How to answer `request` in boot `this_boot` while the Node reports boot `reported`.
/// Unknown boots on the request's or the agent's side: fence.
pub fn answer_for(request: &str, this_boot: Option<&str>, reported: Option<&str>) -> Answer {
    match (requested_boot(request), this_boot.filter(|b| !b.is_empty())) {
        (Some(then), Some(now)) if then == now => Answer::Fence,
        (Some(_), Some(now)) if reported == Some(now) => Answer::EarlierBoot,
        (Some(_), Some(_)) => Answer::Wait,
        _ => Answer::Fence,
    }
}

/// The boot ID the Node reports.
fn reported_boot(node: &Node) -> Option<&str> {
    let id = node.status.as_ref()?.node_info.as_ref()?.boot_id.as_str();
    (!id.is_empty()).then_some(id)
}

/// The request on this Node still waiting for its acknowledgement, if any.
pub fn unanswered(node: &Node) -> Option<&str> {
    let annotations = node.metadata.annotations.as_ref()?;
    let request = annotations.get(FENCE_REQUEST_ANNOTATION)?;
    (annotations.get(FENCE_ACK_ANNOTATION) != Some(request)).then_some(request.as_str())
}

/// Follows the Node `name` for as long as the agent runs (the watch restarts with backoff
/// while the API server is unreachable): keeps `advert` on it, whenever the Node lacks it (at
/// start, after the Node was registered again), and answers fence requests.
pub async fn follow(
    client: kube::Client,
    name: &str,
    advert: Advert,
    listening: Listening,
    boot: Option<String>,
    fencer: Arc<Fencer>,
) -> Result<(), AgentError> {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(nodes.clone(), config)
        .backoff(crate::backoff::node_watch())
        .applied_objects()
        .boxed();
    // The last advert the Node refused, tried again every `ADVERT_RETRY` until it takes one
    // (the watch may deliver nothing new for minutes).
    let mut refused = false;
    // The request last left unanswered (`Answer::Wait`), said once.
    let mut waiting = None;
    loop {
        let next = if refused {
            tokio::select! {
                next = stream.try_next() => Some(next),
                () = tokio::time::sleep(ADVERT_RETRY) => None,
            }
        } else {
            Some(stream.try_next().await)
        };
        let Some(next) = next else {
            refused = !advert.put_on(&nodes, name).await;
            continue;
        };
        match next {
            Ok(Some(node)) => {
                match internal_ip(&node) {
                    Some(ip) if !listening.serves(ip) => {
                        // podha and the peers would dial an address this agent does not
                        // listen on: its silence must not count as a fence.
                        error!(node = name, %ip, listen = %listening.addr, "podha and the peers dial this node at an address the agent does not listen on: not advertising it");
                        refused = false;
                        advert.take_off(&nodes, name, &node).await;
                    }
                    _ if advert.missing_from(&node) => {
                        refused = !advert.put_on(&nodes, name).await;
                    }
                    _ => refused = false,
                }
                if let Some(request) = unanswered(&node) {
                    let boots = (boot.as_deref(), reported_boot(&node));
                    answer(&nodes, name, request, boots, &fencer, &mut waiting).await;
                }
            }
            Ok(None) => return Err(AgentError::WatchEnded),
            Err(e) => warn!(error = %e, "watching this node"),
        }
    }
}

/// `boots`: the boot the agent runs in, and the one the Node reports; `waiting`: the request
/// last left unanswered, whose warning is not said again.
async fn answer(
    nodes: &Api<Node>,
    name: &str,
    request: &str,
    (boot, reported): (Option<&str>, Option<&str>),
    fencer: &Fencer,
    waiting: &mut Option<String>,
) {
    match answer_for(request, boot, reported) {
        Answer::Fence => {
            let why = format!("podha asked for it (request {request})");
            let cause = FenceCause::Request(request.to_string());
            if fencer.fence(cause, &why).await != Fenced::Confirmed {
                return;
            }
        }
        Answer::EarlierBoot => info!(
            node = name,
            request, "a fence asked of an earlier boot: the reboot was the fence"
        ),
        Answer::Wait => {
            if waiting.as_deref() == Some(request) {
                return;
            }
            *waiting = Some(request.to_string());
            warn!(
                node = name,
                request,
                boot,
                reported,
                "a fence asked of another boot than this agent's, while the Node does not report \
                 this agent's boot either: not answered until it does (is --boot-id-file the \
                 boot ID the kubelet reports?)"
            );
            return;
        }
    }
    let patch = json!({"metadata": {"annotations": {FENCE_ACK_ANNOTATION: request}}});
    match nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => info!(node = name, request, "fence acknowledged"),
        Err(e) => warn!(node = name, error = %e, "cannot acknowledge the fence"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        n
    }

    #[test]
    fn a_request_of_an_earlier_boot_needs_no_fence_and_an_unknown_boot_does() {
        let b2 = Some("b2");
        assert_eq!(
            answer_for("p/1/b1", Some("b1"), Some("b1")),
            Answer::Fence,
            "this boot"
        );
        assert_eq!(
            answer_for("p/1/b1", b2, b2),
            Answer::EarlierBoot,
            "rebooted since"
        );
        assert_eq!(
            answer_for("p/1/", b2, b2),
            Answer::Fence,
            "the request names no boot"
        );
        assert_eq!(
            answer_for("p/1/b1", None, b2),
            Answer::Fence,
            "this boot unknown"
        );
        assert_eq!(
            answer_for("p/1/b1", Some(""), b2),
            Answer::Fence,
            "this boot unknown"
        );
    }

    #[test]
    fn another_boot_is_an_earlier_one_only_when_the_node_reports_the_agents_boot() {
        // The agent's boot ID is not the kubelet's (a container's /proc on a node that poses
        // as a machine): the request names the boot the Node reports; no acknowledgement.
        assert_eq!(
            answer_for("p/1/posed", Some("host"), Some("posed")),
            Answer::Wait
        );
        // Rebooted, but the kubelet has not reported the new boot yet: wait for it.
        assert_eq!(answer_for("p/1/b1", Some("b2"), Some("b1")), Answer::Wait);
        assert_eq!(answer_for("p/1/b1", Some("b2"), None), Answer::Wait);
    }

    #[test]
    fn only_a_request_without_its_acknowledgement_is_answered() {
        assert_eq!(unanswered(&node(&[])), None);
        assert_eq!(
            unanswered(&node(&[(FENCE_REQUEST_ANNOTATION, "r1")])),
            Some("r1")
        );
        assert_eq!(
            unanswered(&node(&[
                (FENCE_REQUEST_ANNOTATION, "r1"),
                (FENCE_ACK_ANNOTATION, "r1")
            ])),
            None
        );
        assert_eq!(
            unanswered(&node(&[
                (FENCE_REQUEST_ANNOTATION, "r2"),
                (FENCE_ACK_ANNOTATION, "r1")
            ])),
            Some("r2"),
            "a new request after an old acknowledgement"
        );
    }
}
