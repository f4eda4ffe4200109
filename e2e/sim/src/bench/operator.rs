//! Where the failover benchmark's podha runs. As a process of this machine by default: it
//! reaches the kwok nodes' addresses (this machine's loopback) and runs their agents' words.
//! When a mode on real nodes needs agents, podha is installed by its chart as users run it:
//! one replica on a real node of its own, which no trial kills, and the agent DaemonSet on
//! every real node, fencing and petting its watchdog through the node's BMC stand-ins
//! ([`chart_install::sim_agent_values`]). Such a run has real nodes only: from a real node's
//! network, the kwok nodes' loopback addresses cannot be reached; the cluster's Redfish service
//! can, at the nodes' bridge address, so the `bmc` mode runs beside them. Its agents run with
//! the chart's own timings for the `default` mode, with the shortest the agent accepts for the
//! `agent` mode: one DaemonSet has one set, so the two run apart.

use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use super::failover::{FailoverArgs, Group, Mode, Nodes, SHORTEST_AGENT_TIMINGS};
use crate::chart_install::{self, AgentTimings};
use crate::cluster::{Cluster, ClusterOptions};
use crate::failover::{Operator, install_crd};
use crate::testkit::wait_for;

/// The label of the real node podha's replica runs on when installed by its chart.
const HOME_LABEL: (&str, &str) = ("podha-bench", "podha");

/// podha as the benchmark runs it.
pub enum PodhaUnderTest {
    /// `podha run` on this machine, with the cluster's admin kubeconfig.
    Process(Operator),
    /// Installed by its chart: its one replica, which leads.
    Chart { leader: Box<Pod> },
}

/// Whether the run installs podha by its chart: some mode runs on real nodes with agents.
pub fn by_chart(groups: &[Group]) -> bool {
    groups
        .iter()
        .any(|g| g.kind == Nodes::Real && g.mode.needs_agents())
}

/// The run's modes and kinds of node, refused when podha cannot serve them from where it
/// runs.
pub fn check_run(modes: &[Mode], kinds: &[Nodes]) -> anyhow::Result<()> {
    let agents = modes.iter().find(|m| m.needs_agents());
    if let Some(mode) = agents
        && kinds.contains(&Nodes::Real)
    {
        if kinds.contains(&Nodes::Kwok) {
            bail!(
                "the {} mode on real nodes installs podha by its chart on a real node, which \
                 cannot reach the kwok nodes (on this machine's loopback): run --nodes real and \
                 --nodes kwok apart",
                mode.name()
            );
        }
        if modes.contains(&Mode::Default) && modes.contains(&Mode::Agent) {
            bail!(
                "on real nodes the default mode runs the agents with the chart's own timings \
                 and the agent mode with the shortest ones, and one DaemonSet has one set: run \
                 them apart"
            );
        }
    }
    Ok(())
}

/// The name of the real node podha's replica gets when installed by its chart: the one after
/// the groups' nodes.
pub fn home_node(groups: &[Group]) -> String {
    format!("node-{}", groups.len() * 3 + 1)
}

/// The timings of the agents a run by chart installs: the chart's own for the `default` mode,
/// the shortest for the `agent` mode ([`check_run`] keeps them apart).
pub fn agent_timings(groups: &[Group]) -> anyhow::Result<AgentTimings> {
    if groups
        .iter()
        .any(|g| g.kind == Nodes::Real && g.mode == Mode::Default)
    {
        AgentTimings::chart_defaults()
    } else {
        Ok(SHORTEST_AGENT_TIMINGS)
    }
}

/// A run by chart needs a real node more (podha's home) and the BMC watchdog the chart's agent
/// pets on each real node, with the agents' watchdog timeout.
pub fn cluster_options(opts: &mut ClusterOptions, groups: &[Group]) -> anyhow::Result<()> {
    if by_chart(groups) {
        opts.real_nodes += 1;
        opts.real_node_watchdog = Some(agent_timings(groups)?.watchdog);
    }
    Ok(())
}

impl PodhaUnderTest {
    /// Starts podha, with the CRD installed, and waits until it leads (and, by chart, until
    /// every real node's agent is Running and Ready).
    pub async fn start(
        args: &FailoverArgs,
        cluster: &Cluster,
        client: &kube::Client,
        groups: &[Group],
    ) -> anyhow::Result<Self> {
        if !by_chart(groups) {
            install_crd(client, &args.crd).await?;
            let mut podha = Operator::start(&args.operator, cluster)?;
            podha.wait_ready(Duration::from_secs(60)).await?;
            return Ok(Self::Process(podha));
        }
        let home = home_node(groups);
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let label = serde_json::json!({"metadata": {"labels": {HOME_LABEL.0: HOME_LABEL.1}}});
        nodes
            .patch(
                &home,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&label),
            )
            .await
            .with_context(|| format!("labelling {home} as podha's node"))?;
        let helm = crate::chart_rbac::helm_path()?;
        let timings = agent_timings(groups)?;
        let agent = timings.sim_values();
        let home_selector = format!("nodeSelector.{}={}", HOME_LABEL.0, HOME_LABEL.1);
        eprintln!(
            "installing podha by its chart: one replica on {home}, agents on every real node \
             ({timings:?})"
        );
        // The BMC Secrets are read by podha in its own namespace (`fencing.proof: BMC`).
        let bmc_secrets = groups.iter().any(|g| g.mode.needs_bmcs());
        let bmc_secrets = format!("rbac.bmcSecrets={bmc_secrets}");
        chart_install::install(
            cluster,
            &helm,
            &agent,
            &[
                "replicaCount=1",
                home_selector.as_str(),
                bmc_secrets.as_str(),
            ],
        )?;
        let replicas = chart_install::wait_replicas(client, 1, Duration::from_secs(180)).await?;
        let real: Vec<String> = cluster
            .nodes()
            .into_iter()
            .filter(|n| n.real)
            .map(|n| n.name)
            .collect();
        let real: Vec<&str> = real.iter().map(String::as_str).collect();
        chart_install::wait_agents(client, &real, Duration::from_secs(180)).await?;
        let leader = chart_install::wait_leader(client, &replicas, Duration::from_secs(60)).await?;
        let leader = replicas
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(leader.as_str()))
            .context("the leader is not among the replicas")?;
        Ok(Self::Chart {
            leader: Box::new(leader),
        })
    }

    /// The namespace podha runs in: its Lease's, and its BMC Secrets'.
    pub fn namespace(&self) -> &'static str {
        match self {
            Self::Process(_) => crate::failover::PROCESS_NAMESPACE,
            Self::Chart { .. } => chart_install::NAMESPACE,
        }
    }

    /// podha's `/metrics`.
    pub fn metrics(&self, cluster: &Cluster) -> anyhow::Result<String> {
        match self {
            Self::Process(podha) => podha.get("/metrics"),
            Self::Chart { leader } => chart_install::pod_metrics(cluster, leader),
        }
    }

    /// After `node` was started again at `since`: by chart, waits until its agent is back (its
    /// pod Running and Ready, its Lease renewed since), so that the next trial's node has an
    /// agent that can prove its fence. A process's agents on kwok nodes start with the node.
    pub async fn agent_back(
        &self,
        client: &kube::Client,
        node: &str,
        since: Timestamp,
    ) -> anyhow::Result<()> {
        if let Self::Process(_) = self {
            return Ok(());
        }
        chart_install::wait_agents(client, &[node], Duration::from_secs(120)).await?;
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), self.namespace());
        let name = podha::contract::agent_lease_name(node);
        wait_for(
            &format!("{node}'s agent to renew its Lease {name} after the node's restart"),
            Duration::from_secs(60),
            || async {
                let renewed = leases
                    .get_opt(&name)
                    .await?
                    .and_then(|l| l.spec?.renew_time)
                    .is_some_and(|t| t.0 > since);
                Ok(renewed.then_some(()))
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::failover::groups;
    use super::*;

    #[test]
    fn agents_on_real_nodes_bring_the_chart_and_a_node_of_its_own() {
        let kwok = groups(&[Mode::Agent, Mode::Fast], &[Nodes::Kwok]);
        assert!(!by_chart(&kwok));
        let real_fast = groups(&[Mode::Fast, Mode::Bmc], &[Nodes::Real]);
        assert!(!by_chart(&real_fast));
        let real = groups(&[Mode::Agent, Mode::Fast, Mode::IomeshLike], &[Nodes::Real]);
        assert!(by_chart(&real));
        // The groups take node-1 to node-9; podha's home is the next, never a trial's.
        assert_eq!(home_node(&real), "node-10");
        assert!(real.iter().all(|g| !g.nodes.contains(&home_node(&real))));

        let mut opts = ClusterOptions::new(std::path::Path::new("/nonexistent"));
        opts.real_nodes = 9;
        cluster_options(&mut opts, &real).unwrap();
        assert_eq!(opts.real_nodes, 10);
        assert_eq!(
            opts.real_node_watchdog,
            Some(SHORTEST_AGENT_TIMINGS.watchdog)
        );
        let mut opts = ClusterOptions::new(std::path::Path::new("/nonexistent"));
        cluster_options(&mut opts, &real_fast).unwrap();
        assert_eq!((opts.real_nodes, opts.real_node_watchdog), (0, None));

        // The default mode's agents keep the chart's timings, its BMC watchdog theirs.
        let default = groups(&[Mode::Default, Mode::Fast], &[Nodes::Real]);
        let chart = AgentTimings::chart_defaults().unwrap();
        assert_eq!(agent_timings(&default).unwrap(), chart);
        let mut opts = ClusterOptions::new(std::path::Path::new("/nonexistent"));
        cluster_options(&mut opts, &default).unwrap();
        assert_eq!(opts.real_node_watchdog, Some(chart.watchdog));
    }

    #[test]
    fn a_run_podha_cannot_serve_from_where_it_runs_is_refused() {
        let agent_real_and_kwok = check_run(&[Mode::Agent], &[Nodes::Kwok, Nodes::Real]);
        assert!(
            agent_real_and_kwok
                .unwrap_err()
                .to_string()
                .contains("--nodes real and --nodes kwok apart")
        );
        let default_and_agent = check_run(&[Mode::Default, Mode::Agent], &[Nodes::Real]);
        assert!(
            default_and_agent
                .unwrap_err()
                .to_string()
                .contains("run them apart")
        );
        for (modes, kinds) in [
            (&[Mode::Agent, Mode::Bmc][..], &[Nodes::Kwok][..]),
            (&[Mode::Agent, Mode::Fast][..], &[Nodes::Real][..]),
            (&[Mode::Default, Mode::Fast][..], &[Nodes::Real][..]),
            (
                &[Mode::Default, Mode::Bmc, Mode::Fast][..],
                &[Nodes::Real][..],
            ),
            (&[Mode::Agent, Mode::Bmc][..], &[Nodes::Real][..]),
            (&[Mode::Default, Mode::Agent][..], &[Nodes::Kwok][..]),
            (
                &[Mode::Bmc, Mode::Fast][..],
                &[Nodes::Kwok, Nodes::Real][..],
            ),
        ] {
            check_run(modes, kinds).unwrap();
        }
    }
}
