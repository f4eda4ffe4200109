//! A process on a real node forging podha's words to the node's own agent:
//! `podha-sim forge-heartbeats` run in the node's network namespace (where the node's
//! InternalIP answers even while the node is cut off from everything), sending unsigned
//! heartbeats, heartbeats signed with random bytes and randomly signed peer surveys.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use podha_sim::forge::Summary;
use podha_sim::testkit::Ctx;
use tokio::process::{Child, Command};

/// The most forged requests a second.
const RATE: u32 = 50;
/// The fewest answers that show the forger reached the agent.
const MIN_ANSWERS: u64 = 20;

/// Where `node`'s agent listens: its InternalIP and advertised port, as its Node says.
pub(super) async fn agent_address(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<SocketAddr> {
    let node_object = ctx.nodes().get(node).await?;
    podha::contract::agent_addr(&node_object)
        .with_context(|| format!("{node} advertises no agent (InternalIP and agent port)"))
}

/// A running `podha-sim forge-heartbeats`; killed if dropped before [`Self::all_refused`].
pub(super) struct Forger {
    node: String,
    agent: SocketAddr,
    process: Child,
}

impl Forger {
    /// Starts forging, from inside `node`'s network namespace, heartbeats and surveys from
    /// `claimed_peer` to `agent` (the node's own), for `duration`.
    pub(super) fn start(
        ctx: &Ctx<'_>,
        node: &str,
        agent: SocketAddr,
        claimed_peer: &str,
        duration: Duration,
    ) -> anyhow::Result<Self> {
        let netns = ctx.cluster.node_netns(node)?;
        let process = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .arg(env!("CARGO_BIN_EXE_podha-sim"))
            .arg("forge-heartbeats")
            .args(["--to", &agent.to_string()])
            .args(["--peer-name", claimed_peer])
            .args(["--for", &humantime::format_duration(duration).to_string()])
            .args(["--rate", &RATE.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("start podha-sim forge-heartbeats in the node's network namespace")?;
        Ok(Self {
            node: node.to_string(),
            agent,
            process,
        })
    }

    /// Waits (up to `wait`) for the forger to end and checks its summary: it reached the agent
    /// (at least [`MIN_ANSWERS`] answers) and every answer was 401 Unauthorized.
    pub(super) async fn all_refused(self, wait: Duration) -> anyhow::Result<Summary> {
        let Self {
            node,
            agent,
            process,
        } = self;
        let output = tokio::time::timeout(wait, process.wait_with_output())
            .await
            .with_context(|| format!("the forger on {node} still ran {wait:?} after its end"))??;
        let stderr = String::from_utf8_lossy(&output.stderr);
        ensure!(
            output.status.success(),
            "the forger on {node} failed ({}): {stderr}",
            output.status
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let summary: Summary = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("no summary")
            .and_then(|line| serde_json::from_str(line).context("not a summary"))
            .with_context(|| format!("the forger on {node}'s output: {stdout:?} {stderr}"))?;
        ensure!(
            summary.answered() >= MIN_ANSWERS,
            "a process on {node} did not reach its agent at {agent}: {} answers, fewer than \
             {MIN_ANSWERS} ({summary:?}; {stderr})",
            summary.answered()
        );
        ensure!(
            summary.not_unauthorized() == 0,
            "{node}'s agent at {agent} answered forged heartbeats or surveys with a status other \
             than 401: {:?} (of {summary:?})",
            summary
                .status
                .iter()
                .filter(|(status, _)| **status != 401)
                .collect::<Vec<_>>()
        );
        Ok(summary)
    }
}
