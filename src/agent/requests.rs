//! Fence requests through the API: podha sets [`FENCE_REQUEST_ANNOTATION`] on the Node; the
//! agent, watching its own Node, fences and then sets [`FENCE_ACK_ANNOTATION`] to the same
//! value. The acknowledgement is written only after the fence succeeded, so it is a proof; a
//! request already acknowledged is not fenced again (the agent restarts on a rebooted node and
//! sees the old request answered).

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{info, warn};

use super::{AgentError, FenceCause, Fencer};
use crate::contract::{
    AGENT_FENCED_WITHIN_ANNOTATION, AGENT_PORT_ANNOTATION, FENCE_ACK_ANNOTATION,
    FENCE_REQUEST_ANNOTATION, fenced_within_value, requested_boot,
};

/// What the agent tells podha on its Node: that an agent runs here, on this port, and how long
/// after podha last heard it its node is fenced at the latest (`fenced_within`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advert {
    pub port: u16,
    pub fenced_within: Duration,
}

impl Advert {
    fn annotations(&self) -> [(&'static str, String); 2] {
        [
            (AGENT_PORT_ANNOTATION, self.port.to_string()),
            (
                AGENT_FENCED_WITHIN_ANNOTATION,
                fenced_within_value(self.fenced_within),
            ),
        ]
    }

    /// Whether `node` lacks this advert, or carries another: a Node deleted and registered
    /// again comes back without it, and podha, which probes only nodes that advertise an
    /// agent, would stop hearing this one (whose node it would then fence).
    pub fn missing_from(&self, node: &Node) -> bool {
        let annotations = node.metadata.annotations.as_ref();
        self.annotations()
            .iter()
            .any(|(key, value)| annotations.and_then(|a| a.get(*key)) != Some(value))
    }

    async fn put_on(&self, nodes: &Api<Node>, name: &str) {
        let annotations: serde_json::Map<String, serde_json::Value> = self
            .annotations()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        let patch = json!({"metadata": {"annotations": annotations}});
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => info!(
                node = name,
                port = self.port,
                "agent advertised on the node"
            ),
            // The watch delivers the Node again (or podha's next write does): tried then.
            Err(e) => warn!(node = name, error = %e, "cannot advertise the agent on the node yet"),
        }
    }
}

/// Whether the request must be answered with a fence: unless it was made in another boot of
/// this node (the reboot since was the fence). Unknown boots on either side: fence.
pub fn needs_fence(request: &str, this_boot: Option<&str>) -> bool {
    match (requested_boot(request), this_boot.filter(|b| !b.is_empty())) {
        (Some(then), Some(now)) => then == now,
        _ => true,
    }
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
    boot: Option<String>,
    fencer: Arc<Fencer>,
) -> Result<(), AgentError> {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(nodes.clone(), config)
        .backoff(crate::backoff::node_watch())
        .applied_objects()
        .boxed();
    loop {
        match stream.try_next().await {
            Ok(Some(node)) => {
                if advert.missing_from(&node) {
                    advert.put_on(&nodes, name).await;
                }
                if let Some(request) = unanswered(&node) {
                    answer(&nodes, name, request, boot.as_deref(), &fencer).await;
                }
            }
            Ok(None) => return Err(AgentError::WatchEnded),
            Err(e) => warn!(error = %e, "watching this node"),
        }
    }
}

async fn answer(nodes: &Api<Node>, name: &str, request: &str, boot: Option<&str>, fencer: &Fencer) {
    if needs_fence(request, boot) {
        info!(node = name, request, "podha asks for a fence");
        let why = format!("podha asked for it (request {request})");
        if !fencer
            .fence(FenceCause::Request(request.to_string()), &why)
            .await
        {
            return;
        }
    } else {
        info!(
            node = name,
            request, "a fence asked of an earlier boot: the reboot was the fence"
        );
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
    fn a_node_without_the_agents_advert_or_with_another_one_is_advertised_again() {
        let advert = Advert {
            port: 9441,
            fenced_within: Duration::from_secs(30),
        };
        let carried = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_FENCED_WITHIN_ANNOTATION, "30s"),
            (FENCE_ACK_ANNOTATION, "r1"),
        ]);
        assert!(!advert.missing_from(&carried));
        // Registered again: no annotations at all.
        assert!(advert.missing_from(&Node::default()));
        assert!(advert.missing_from(&node(&[(AGENT_PORT_ANNOTATION, "9441")])));
        let older = node(&[
            (AGENT_PORT_ANNOTATION, "9441"),
            (AGENT_FENCED_WITHIN_ANNOTATION, "46s"),
        ]);
        assert!(advert.missing_from(&older), "another agent's timing");
    }

    #[test]
    fn a_request_of_an_earlier_boot_needs_no_fence_and_an_unknown_boot_does() {
        assert!(needs_fence("p/1/b1", Some("b1")), "this boot");
        assert!(!needs_fence("p/1/b1", Some("b2")), "rebooted since");
        assert!(needs_fence("p/1/", Some("b2")), "the request names no boot");
        assert!(needs_fence("p/1/b1", None), "this boot unknown");
        assert!(needs_fence("p/1/b1", Some("")), "this boot unknown");
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
