//! Fence requests through the API: podha sets [`FENCE_REQUEST_ANNOTATION`] on the Node; the
//! agent, watching its own Node, fences and then sets [`FENCE_ACK_ANNOTATION`] to the same
//! value. The acknowledgement is written only once the fence is confirmed (its
//! `--fence-confirm` check passed: see [`super::fence`]), so it is a proof; a fence nothing
//! confirms is not acknowledged (podha proves it by the agent's silence, if the node went down).
//! A request already acknowledged is not fenced again (the agent restarts on a rebooted node
//! and sees the old request answered).
//!
//! A request names the boot podha asked in, as the Node reported it; that boot ID is written by
//! anyone who may patch the Node's status, not by the node alone. So a request of another boot
//! is acknowledged without a fence only when the node's own boot history (see
//! [`super::boot::BootHistory`]) shows it is an earlier boot of this node, asked before the
//! boot it runs in now.

use std::path::Path;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{error, info, warn};

use super::advert::{ADVERT_RETRY, Advert};
use super::boot::BootHistory;
use super::{AgentError, FenceCause, Fenced, Fencer};
use crate::contract::{
    FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION, internal_ip, requested_at, requested_boot,
};
use crate::listen::Listening;

/// How the agent answers a fence request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Fence, then acknowledge once the fence is confirmed.
    Fence,
    /// Acknowledge without a fence: the request was made in an earlier boot of this node (its
    /// boot history shows it had that boot, and the request is older than the boot it runs in
    /// now), and the reboot since was the fence.
    EarlierBoot,
    /// Neither yet: the request names another boot than the agent's, and the Node (its
    /// `status.nodeInfo.bootID`) does not report the agent's boot either. Either the kubelet
    /// has not reported this boot yet (the Node is delivered again when it does), or the
    /// agent's boot ID is not the kubelet's (a `--boot-id-file` of something else, a node that
    /// poses as a machine), where every request would look like one of an earlier boot. An
    /// acknowledgement would then let podha move the volumes of a node that runs on, and a
    /// fence would reset a node that just booted: podha holds the node meanwhile.
    Wait,
    /// Neither, however long: the request names another boot than the agent's, which the boot
    /// history cannot show is an earlier one of this node (a boot it never had, or one that had
    /// ended before the request was made), while the Node reports the agent's boot. That is
    /// what someone who may patch the Node's status gets by setting its boot ID while podha
    /// decides (the kubelet dead, the node running on) and setting it back: an acknowledgement
    /// would let podha move the volumes of a node that runs on. Nor a fence, though it would be
    /// safe for the data: a history that lost a boot (a new disk, a history kept where a reboot
    /// empties it, a boot whose agent never started) gets such a request after a real reboot
    /// too, and as the request stays on the Node until podha's failover is over, every boot
    /// after would fence again, a reboot loop. Unanswered, podha holds the node, whose volumes
    /// stay where they are (a node that does go down is still proven fenced by its agent's
    /// silence); the agent says why, for whoever decides.
    Unproven,
}

/// How to answer `request` in boot `this_boot` while the Node reports boot `reported`, by the
/// node's boot `history`. Unknown boots on the request's or the agent's side: fence.
pub fn answer_for(
    request: &str,
    this_boot: Option<&str>,
    reported: Option<&str>,
    history: &BootHistory,
) -> Answer {
    match (requested_boot(request), this_boot.filter(|b| !b.is_empty())) {
        (Some(then), Some(now)) if then == now => Answer::Fence,
        (Some(_), Some(now)) if reported != Some(now) => Answer::Wait,
        (Some(then), Some(now)) if history.earlier(then, requested_at(request), now) => {
            Answer::EarlierBoot
        }
        (Some(_), Some(_)) => Answer::Unproven,
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
/// start, after the Node was registered again), and answers fence requests, by the boot
/// history at `boot_history` (with `boot`, this one, recorded there first).
pub async fn follow(
    client: kube::Client,
    name: &str,
    advert: Advert,
    listening: Listening,
    boot: Option<String>,
    boot_history: &Path,
    fencer: Arc<Fencer>,
) -> Result<(), AgentError> {
    let history = BootHistory::record(boot_history, boot.as_deref());
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
                    let boots = (boot.as_deref(), reported_boot(&node), &history);
                    answer(&nodes, name, request, boots, &fencer, &mut waiting).await;
                }
            }
            Ok(None) => return Err(AgentError::WatchEnded),
            Err(e) => warn!(error = %e, "watching this node"),
        }
    }
}

/// `boots`: the boot the agent runs in, the one the Node reports, and the node's boot history;
/// `waiting`: the request last left unanswered, whose warning is not said again.
async fn answer(
    nodes: &Api<Node>,
    name: &str,
    request: &str,
    (boot, reported, history): (Option<&str>, Option<&str>, &BootHistory),
    fencer: &Fencer,
    waiting: &mut Option<String>,
) {
    let answer = answer_for(request, boot, reported, history);
    if matches!(answer, Answer::Wait | Answer::Unproven) {
        if waiting.as_deref() != Some(request) {
            *waiting = Some(request.to_string());
            say_unanswered(name, request, answer, (boot, reported));
        }
        return;
    }
    if answer == Answer::Fence && !asked_still(nodes, name, request).await {
        return;
    }
    match answer {
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
        Answer::Wait | Answer::Unproven => return,
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

/// Whether the Node, read anew from the API server, still holds `request` unanswered. The watch
/// may deliver an event long after it happened: a connection that stalled through a partition
/// drains once the network heals, request first, its withdrawal after. A request podha has
/// withdrawn since (the node alive again) must not reset a node that runs on. A Node that
/// cannot be read is not fenced for now: the watch lists it anew once the API server answers.
async fn asked_still(nodes: &Api<Node>, name: &str, request: &str) -> bool {
    match nodes.get(name).await {
        Ok(fresh) if still_asked(&fresh, request) => true,
        Ok(_) => {
            info!(
                node = name,
                request,
                "the fence request was withdrawn or answered since it was seen: not fencing"
            );
            false
        }
        Err(e) => {
            warn!(node = name, request, error = %e, "cannot read the Node anew before fencing: not fencing yet");
            false
        }
    }
}

/// Whether `fresh` holds `request` unanswered.
fn still_asked(fresh: &Node, request: &str) -> bool {
    unanswered(fresh) == Some(request)
}

/// Says why `request` is left unanswered (`answer`: [`Answer::Wait`] or [`Answer::Unproven`]).
fn say_unanswered(
    name: &str,
    request: &str,
    answer: Answer,
    (boot, reported): (Option<&str>, Option<&str>),
) {
    if answer == Answer::Unproven {
        warn!(
            node = name,
            request,
            boot,
            "a fence asked of another boot than this agent's, which this node's boot history \
             does not show as an earlier one asked before this boot (never this node's, or \
             ended before the request): not answered, podha holds the node; someone who may \
             patch the Node's status may have changed its bootID. Find out, then fence the \
             node or remove the request"
        );
        return;
    }
    warn!(
        node = name,
        request,
        boot,
        reported,
        "a fence asked of another boot than this agent's, while the Node does not report this \
         agent's boot either: not answered until it does (is --boot-id-file the boot ID the \
         kubelet reports?)"
    );
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

    /// A request is fenced only while the Node, read anew, still holds it unanswered: one
    /// withdrawn (or answered, or replaced) since the watch delivered it is not.
    #[test]
    fn only_a_request_the_node_still_holds_unanswered_is_fenced() {
        let request = "p/1/b2";
        assert!(still_asked(
            &node(&[(FENCE_REQUEST_ANNOTATION, request)]),
            request
        ));
        assert!(!still_asked(&node(&[]), request), "withdrawn");
        assert!(
            !still_asked(
                &node(&[
                    (FENCE_REQUEST_ANNOTATION, request),
                    (FENCE_ACK_ANNOTATION, request)
                ]),
                request
            ),
            "answered"
        );
        assert!(
            !still_asked(&node(&[(FENCE_REQUEST_ANNOTATION, "p/2/b2")]), request),
            "another request"
        );
    }

    /// The node had b1 (its first agent started at 100) and runs in b2 (from 200).
    fn history() -> BootHistory {
        BootHistory::parse("b1 100\nb2 200\n")
    }

    #[test]
    fn a_request_of_this_boot_or_of_none_known_is_carried_out() {
        let (b1, b2, h) = (Some("b1"), Some("b2"), &history());
        assert_eq!(
            answer_for("p/150/b1", b1, b1, h),
            Answer::Fence,
            "this boot"
        );
        assert_eq!(
            answer_for("p/150/", b2, b2, h),
            Answer::Fence,
            "the request names no boot"
        );
        assert_eq!(
            answer_for("p/150/b1", None, b2, h),
            Answer::Fence,
            "this boot unknown"
        );
        assert_eq!(
            answer_for("p/150/b1", Some(""), b2, h),
            Answer::Fence,
            "this boot unknown"
        );
    }

    #[test]
    fn a_request_of_an_earlier_boot_the_history_shows_needs_no_fence() {
        let b2 = Some("b2");
        assert_eq!(
            answer_for("p/150/b1", b2, b2, &history()),
            Answer::EarlierBoot,
            "asked in b1, rebooted since"
        );
        let longer = BootHistory::parse("b0 50\nb1 100\nb2 200\n");
        assert_eq!(
            answer_for("p/60/b0", b2, b2, &longer),
            Answer::EarlierBoot,
            "two reboots since"
        );
    }

    #[test]
    fn a_request_of_a_boot_the_history_does_not_show_earlier_is_not_answered() {
        let (b2, h) = (Some("b2"), &history());
        // The Node's boot ID set to a boot this node never had while podha asked, then back.
        assert_eq!(answer_for("p/250/zz", b2, b2, h), Answer::Unproven);
        // The same with a boot it had, long over: the request is younger than this boot.
        assert_eq!(answer_for("p/250/b1", b2, b2, h), Answer::Unproven);
        // A request whose time cannot be read cannot be placed before this boot.
        assert_eq!(answer_for("p/soon/b1", b2, b2, h), Answer::Unproven);
        // A history that lost b1 (or never had it): not answered either, never fenced anew.
        let lost = BootHistory::parse("b2 200\n");
        assert_eq!(answer_for("p/150/b1", b2, b2, &lost), Answer::Unproven);
        assert_eq!(
            answer_for("p/150/b1", b2, b2, &BootHistory::default()),
            Answer::Unproven
        );
    }

    #[test]
    fn another_boot_is_an_earlier_one_only_when_the_node_reports_the_agents_boot() {
        let h = &history();
        // The agent's boot ID is not the kubelet's (a container's /proc on a node that poses
        // as a machine): the request names the boot the Node reports; no acknowledgement.
        assert_eq!(
            answer_for("p/250/posed", Some("host"), Some("posed"), h),
            Answer::Wait
        );
        // Rebooted, but the kubelet has not reported the new boot yet: wait for it.
        assert_eq!(
            answer_for("p/150/b1", Some("b2"), Some("b1"), h),
            Answer::Wait
        );
        assert_eq!(answer_for("p/150/b1", Some("b2"), None, h), Answer::Wait);
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
