//! `podha explain`: why podha would, or would not, fail a pod over, before the fact and after.
//! It reads the live cluster the way the operator does ([`snapshot`]) and answers with the
//! operator's own rules (`crate::protection`): every rule a pod passes or fails, a node's agent,
//! proof and pods ([`node`]), a policy's state, coverage and past failovers ([`policy`]).
//! Printed as a table ([`render`]) or JSON.
//!
//! Exit codes: 0 when the pod (or node) asked about is protected, 1 when it is not, 2 when
//! the question could not be answered (no such object, the cluster unreachable).

mod bmc;
pub mod node;
pub mod policy;
mod render;
pub mod snapshot;

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use serde::Serialize;

pub use crate::protection::{
    Check, Checks, Cluster, LeaderLease, Operator, Outcome, PodExplanation, explain_pod, human,
};
pub use node::{NodeExplanation, explain_node};
pub use policy::{PolicyExplanation, explain_policy};
pub use snapshot::{ReadError, Snapshot};

/// `podha explain`'s options.
#[derive(clap::Args, Clone, Debug)]
pub struct ExplainArgs {
    #[command(subcommand)]
    pub subject: Subject,
    /// Kubeconfig file; without it, $KUBECONFIG / ~/.kube/config or in-cluster config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace podha runs in (default: $POD_NAMESPACE, as in podha's own pod, else the
    /// namespace holding its leader Lease).
    #[arg(long, global = true, env = "POD_NAMESPACE")]
    pub podha_namespace: Option<String>,
    /// The name of podha's leader Lease (the chart's leaderElection.leaseName; in podha's own
    /// pod, $PODHA_LEADER_LEASE).
    #[arg(long, global = true, env = "PODHA_LEADER_LEASE", default_value = crate::leader::DEFAULT_LEASE_NAME)]
    pub leader_lease: String,
    /// `table` or `json`.
    #[arg(long, short = 'o', global = true, default_value = "table")]
    pub output: Output,
}

#[derive(clap::Subcommand, Clone, Debug)]
pub enum Subject {
    /// Would podha fail this pod over if its node died now? NAMESPACE/NAME.
    Pod { pod: String },
    /// A node: its policy, agent and fencing proof, and every pod on it.
    Node { node: String },
    /// A policy: its state, how many pods it protects, its recent failovers and events.
    Policy { policy: String },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// Why a question could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
}

impl Snapshot {
    pub fn cluster(&self) -> Cluster<'_> {
        Cluster::new(
            self.policy_refs(),
            &self.unreadable,
            &self.statuses,
            &self.view,
            Operator::Lease(self.leader.as_ref()),
            self.now,
        )
    }
}

/// What one question produced: the text or JSON to print, and whether the subject is
/// protected.
pub struct Answer {
    pub text: String,
    pub protected: bool,
}

/// Answers one question against the cluster.
pub async fn answer(args: &ExplainArgs, client: &Client) -> Result<Answer, Error> {
    let snapshot =
        Snapshot::read(client, args.podha_namespace.as_deref(), &args.leader_lease).await?;
    let cluster = snapshot.cluster();
    match &args.subject {
        Subject::Pod { pod } => {
            let (namespace, name) = pod
                .split_once('/')
                .ok_or_else(|| Error::Usage(format!("pod {pod:?}: give it as NAMESPACE/NAME")))?;
            let found = Api::<Pod>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|source| Error::Kube {
                    what: format!("reading pod {pod}"),
                    source,
                })?
                .ok_or_else(|| Error::NotFound(format!("pod {pod}")))?;
            let mut explanation = explain_pod(&cluster, &found);
            if let Some(node) = explanation.node.clone()
                && let Some(check) = bmc::check(client, snapshot.namespace(), &cluster, &node).await
            {
                explanation.protected &= !check.failed();
                insert_after_proof(&mut explanation.checks, check);
            }
            Ok(Answer {
                protected: explanation.protected,
                text: match args.output {
                    Output::Table => render::pod(&explanation),
                    Output::Json => to_json(&explanation),
                },
            })
        }
        Subject::Node { node } => {
            let mut explanation = explain_node(&cluster, node)
                .ok_or_else(|| Error::NotFound(format!("node {node}")))?;
            if let Some(check) = bmc::check(client, snapshot.namespace(), &cluster, node).await {
                explanation.protected &= !check.failed();
                insert_after_proof(&mut explanation.checks, check);
            }
            Ok(Answer {
                protected: explanation.protected,
                text: match args.output {
                    Output::Table => render::node(&explanation),
                    Output::Json => to_json(&explanation),
                },
            })
        }
        Subject::Policy { policy } => {
            // Not every reader may list events (podha's own ServiceAccount only writes them):
            // the answer says so instead of failing.
            let events = policy::read_events(client, policy)
                .await
                .map_err(|e| e.to_string());
            let explanation = explain_policy(&cluster, policy, events)
                .ok_or_else(|| Error::NotFound(format!("PodHAPolicy {policy}")))?;
            Ok(Answer {
                protected: true,
                text: match args.output {
                    Output::Table => render::policy(&explanation),
                    Output::Json => to_json(&explanation),
                },
            })
        }
    }
}

/// `check` right after the proof's checks (before the timing note), at the end without them.
fn insert_after_proof(checks: &mut Vec<Check>, check: Check) {
    let at = checks
        .iter()
        .rposition(|c| c.rule == "proof")
        .map_or(checks.len(), |i| i + 1);
    checks.insert(at, check);
}

/// Any explanation as pretty JSON.
fn to_json<T: Serialize>(value: &T) -> String {
    // Plain data (strings, numbers, lists): serialising it cannot fail.
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

/// `podha explain`: prints the answer; exit code 0 protected, 1 not, 2 no answer.
pub async fn cli(args: ExplainArgs) -> ExitCode {
    let client =
        match crate::kubeconfig::reachable(args.kubeconfig.as_deref(), args.context.as_deref())
            .await
        {
            Ok(client) => client,
            Err(e) => {
                eprintln!("podha explain: {e}");
                return ExitCode::from(2);
            }
        };
    match answer(&args, &client).await {
        Ok(answer) => {
            // A closed pipe (`| head`) is the reader's choice, not an error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), answer.text.as_bytes());
            if answer.protected {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("podha explain: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests;
