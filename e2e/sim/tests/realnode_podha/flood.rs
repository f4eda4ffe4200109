//! An unprivileged pod flooding a real node's agent port: `podha-csi flood` (many connections
//! at once, each sending nothing, or its request head or an announced body a byte at a time,
//! reopened as soon as the agent closes it), run as a plain pod (no host network, no
//! privilege, every capability dropped, not root). The agent's port limits (docs/agent.md,
//! "The agent's port") must close what is over them, count the refusals, and keep answering
//! podha and its peers: the node is neither fenced nor reset.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use podha_csi::flood::Flooded;
use podha_sim::chart_install;
use podha_sim::testkit::*;
use serde_json::json;

/// Connections the pod keeps open at once: three times the agent's limit, so every limit is met.
const CONNECTIONS: usize = 1500;

/// A flood pod and its target.
pub(super) struct Flood {
    pod: String,
    on: String,
    pub(super) target: String,
    agent: SocketAddr,
    refused_before: u64,
}

impl Flood {
    /// Starts a pod on `on` flooding `target`'s agent for `duration`, once it runs.
    pub(super) async fn start(
        ctx: &Ctx<'_>,
        on: &str,
        target: &str,
        duration: Duration,
    ) -> anyhow::Result<Self> {
        let agent = super::forged_words::agent_address(ctx, target).await?;
        let refused_before = refusals(ctx, target, agent)?;
        let pod = "agent-flood";
        let spec = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": pod },
            "spec": {
                "nodeName": on,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "securityContext": { "runAsNonRoot": true, "runAsUser": 65534 },
                "containers": [{
                    "name": "flood",
                    "image": podha_sim::cluster::realnode::csi::csi_image()?,
                    "imagePullPolicy": "IfNotPresent",
                    "args": [
                        "flood",
                        format!("--target={agent}"),
                        format!("--connections={CONNECTIONS}"),
                        format!("--for={}", humantime::format_duration(duration)),
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": { "drop": ["ALL"] },
                    },
                }],
            },
        });
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        pods.create(&PostParams::default(), &serde_json::from_value(spec)?)
            .await
            .context("create the flood pod")?;
        wait_for("the flood pod to run", secs(60), || async {
            let p = pods.get(pod).await?;
            let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
            Ok((phase == "Running").then_some(()))
        })
        .await?;
        Ok(Self {
            pod: pod.to_string(),
            on: on.to_string(),
            target: target.to_string(),
            agent,
            refused_before,
        })
    }

    /// Waits for the flood to end; checks that the agent closed and counted connections over
    /// its limits; returns what the pod saw and the refusals the agent counted.
    pub(super) async fn finish(self, ctx: &Ctx<'_>) -> anyhow::Result<(Flooded, u64)> {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        wait_for("the flood pod to end", secs(120), || async {
            let p = pods.get(&self.pod).await?;
            let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
            Ok((phase == "Succeeded" || phase == "Failed").then_some(phase))
        })
        .await?;
        let prefix = format!("{}_{}_", ctx.ns, self.pod);
        let logs = chart_install::pod_log(ctx.cluster, &self.on, &prefix, "flood")?;
        let _ = pods.delete(&self.pod, &DeleteParams::default()).await;
        let flooded: Flooded = logs
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l.split_once(" F ")?.1).ok())
            .with_context(|| format!("the flood pod printed no summary: {logs}"))?;
        let refused = refusals(ctx, &self.target, self.agent)? - self.refused_before;
        ensure!(
            flooded.opened > CONNECTIONS as u64 && flooded.closed_by_target > 0,
            "the flood did not reach {}'s agent: {flooded:?}",
            self.target
        );
        ensure!(
            refused > 0,
            "{}'s agent counted no refused connection: {flooded:?}",
            self.target
        );
        Ok((flooded, refused))
    }
}

/// The connections `node`'s agent (at `agent`) refused, from its `/metrics`, read from inside
/// the node's network namespace.
fn refusals(ctx: &Ctx<'_>, node: &str, agent: SocketAddr) -> anyhow::Result<u64> {
    let text = chart_install::curl_in_node(ctx.cluster, node, [format!("http://{agent}/metrics")])?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("podha_agent_connections_refused_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum())
}
