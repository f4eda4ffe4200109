//! `podha-sim demo`: podha fails a workload over on a sim cluster, and the timeline is printed.
//! The workload is podha-csi's writer, or PostgreSQL (`postgres`) on real nodes.

mod postgres;

use std::path::Path;

use anyhow::Context as _;
use std::time::Duration;

use crate::chart_install::AgentTimings;
use crate::cluster::{Cluster, ClusterOptions, Profile};

/// The demo policy on real nodes: podha's defaults, nothing tuned (`[Lease, AgentHeartbeat]`
/// every 2 s, three failures, a 15 s lease grace; the out-of-service taint once the node's
/// agent proved the fence, `fencing.proof: Agent` with a 6 s margin).
fn demo_policy() -> serde_json::Value {
    serde_json::json!({})
}

/// The demo policy on kwok nodes, which run no agent: Lease and kubelet TCP both dead, probed
/// every second, three failures, a lease grace just above the kubelet's 10 s renew interval;
/// the taint without a proof, chosen explicitly (kwok nodes have no containers that could
/// write on).
fn demo_policy_kwok() -> serde_json::Value {
    serde_json::json!({
        "detection": {
            "interval": "1s",
            "failureThreshold": 3,
            "signals": ["Lease", "KubeletTCP"],
            "leaseGracePeriod": "12s",
            "tcpTimeout": "500ms",
        },
        "action": "OutOfServiceTaint",
        "fencing": { "proof": "None" },
    })
}

/// What the demo fails over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// podha-csi's writer, whose volume's write log says what happened to the data.
    Writer,
    /// PostgreSQL and a client committing transactions, checked by PostgreSQL itself (real
    /// nodes only).
    Postgres,
}

/// `podha-sim demo`: a cluster (real nodes when root, else kwok), podha, a node killed and the
/// failover's timeline; the cluster is taken down after unless `keep`.
pub async fn run(
    dir: &Path,
    profile: Profile,
    operator: &Path,
    crd: &Path,
    keep: bool,
    kwok: bool,
    workload: Workload,
) -> anyhow::Result<()> {
    let real = !kwok && nix::unistd::geteuid().is_root();
    anyhow::ensure!(
        real || workload == Workload::Writer,
        "PostgreSQL runs in a container: the demo needs real nodes for it (root, without --kwok)"
    );
    let started = std::time::Instant::now();
    let mut opts = ClusterOptions::new(dir);
    opts.profile = profile;
    if real {
        println!(
            "== podha demo on real nodes (kubelet, containerd, runc; profile {profile}): podha \
             installed by its chart, a writer on a podha-csi volume, its node killed"
        );
        opts.nodes = 0;
        opts.real_nodes = 3;
        opts.real_node_watchdog = Some(AgentTimings::chart_defaults()?.watchdog);
    } else {
        println!("== podha demo on kwok nodes (profile {profile}), podha, a node killed");
        if !kwok {
            println!(
                "   (real nodes need root: this demo runs kwok nodes, which have no containers)"
            );
        }
    }
    let cluster = Cluster::up(opts).await?;
    println!(
        "cluster up in {:.1?}, kubeconfig {}",
        started.elapsed(),
        cluster.kubeconfig_path().display()
    );
    let result = if real {
        demo_real(&cluster, operator, workload).await
    } else {
        demo_kwok(&cluster, operator, crd).await
    };
    if keep {
        cluster.keep_running();
        println!("cluster kept running in {}", dir.display());
    } else {
        cluster.down()?;
        println!("cluster torn down");
    }
    match result? {
        true => Ok(()),
        false => anyhow::bail!("the pod did not recover"),
    }
}

/// Runs the failover of StatefulSet `sts` in namespace `demo` and prints its timeline.
async fn measure_and_show(
    cluster: &Cluster,
    operator: &Path,
    client: &kube::Client,
    sts: serde_json::Value,
) -> anyhow::Result<podha::chaos::timeline::Timeline> {
    let timeline = crate::failover::measure(
        cluster,
        client,
        "demo",
        sts,
        Duration::from_secs(600),
        None,
        &|subject| explain(cluster, operator, subject),
    )
    .await?;
    println!(
        "\nfailover timeline (from the kill, as seen through the API):\n{}",
        podha::chaos::timeline::render(&timeline)
    );
    Ok(timeline)
}

/// `podha explain pod` about the pod about to lose its node, printed as a user sees it; the
/// demo stops if podha says it would not fail the pod over.
fn explain(
    cluster: &Cluster,
    operator: &Path,
    subject: &podha::chaos::timeline::Subject,
) -> anyhow::Result<()> {
    let pod = format!("{}/{}", subject.namespace, subject.pod);
    println!("$ podha explain pod {pod}");
    let out = std::process::Command::new(operator)
        .args(["explain", "pod", &pod, "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .output()
        .with_context(|| format!("running {} explain", operator.display()))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    anyhow::ensure!(
        out.status.success(),
        "podha explain: {pod} is not protected ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// kubectl of the cluster, its output printed.
fn kubectl(cluster: &Cluster, args: &[&str]) -> anyhow::Result<()> {
    let out = crate::chart_install::run(
        std::process::Command::new(cluster.bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .args(args),
    )?;
    print!("{out}");
    Ok(())
}

/// podha helm-installed on three real nodes, a writer StatefulSet, its node killed; the
/// timeline, the write log's verdict and podha's own phase metrics.
async fn demo_real(cluster: &Cluster, operator: &Path, workload: Workload) -> anyhow::Result<bool> {
    use crate::chart_install;
    use crate::failover::{apply_policy, subject_statefulset};
    let client = cluster.client().await?;
    println!("$ kubectl get nodes -o wide");
    kubectl(cluster, &["get", "nodes", "-o", "wide"])?;
    let helm = crate::chart_rbac::helm_path()?;
    let timings = AgentTimings::chart_defaults()?;
    chart_install::install(cluster, &helm, &timings.sim_values(), &[])?;
    println!(
        "$ helm install podha charts/podha -n podha-system --create-namespace -f agent.yaml \
         (image loaded into the nodes; the agent fences through each node's BMC and pets its \
         watchdog there; its timings the chart's defaults: isolationTimeout {}, watchdog {}, \
         surveyTimeout {})",
        humantime::format_duration(timings.isolation),
        humantime::format_duration(timings.watchdog),
        humantime::format_duration(timings.survey),
    );
    let node_names: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    let names: Vec<&str> = node_names.iter().map(String::as_str).collect();
    let chart_install::Installed {
        replicas: pods,
        leader,
        leader_node,
    } = chart_install::wait_installed(&client, &names, Duration::from_secs(120)).await?;
    println!("$ kubectl -n podha-system get pods -o wide   (leader: {leader})");
    kubectl(
        cluster,
        &["-n", "podha-system", "get", "pods", "-o", "wide"],
    )?;
    apply_policy(&client, "demo", demo_policy()).await?;
    println!(
        "$ kubectl apply -f policy.yaml   # PodHAPolicy demo, spec {} (every default)",
        demo_policy()
    );
    let nodes: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    // The workload starts beside the replicas where it can, so that the kill measures a
    // failover, not a leader change as well (the real-node tests cover that one).
    let replica_nodes: Vec<&str> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
        .collect();
    let free: Vec<&String> = nodes
        .iter()
        .filter(|n| !replica_nodes.contains(&n.as_str()))
        .collect();
    if workload == Workload::Postgres {
        return postgres::run(cluster, operator, &client, &leader_node, &free).await;
    }
    let mut sts = subject_statefulset("db", &nodes, true)?;
    prefer(&mut sts, &free);
    println!(
        "starting StatefulSet demo/db: `podha-csi write` on a sim-rwo volume, 10 writes a second"
    );
    let timeline = measure_and_show(cluster, operator, &client, sts).await?;
    let db = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "demo")
        .get("db-0")
        .await?;
    let handle = crate::csi::writer::volume_handle(&client, "demo", &db).await?;
    // Let the replacement write a little before reading the log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = crate::csi::workload::check(cluster.dir(), &handle)?;
    println!(
        "write log of {handle}: {} writes accepted, {} refused (the old node fenced), {} \
         split-brain, {} acknowledged writes lost, from {} writers",
        report.accepted_writes,
        report.refused_writes,
        report.split_brain_writes.len(),
        report.lost_acknowledged_writes.len(),
        report.writers.len()
    );
    let live = chart_install::podha_pods(&client).await?;
    if let Some(leader) = live
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(leader.as_str()))
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let phases =
            crate::failover::phase_means_in(&chart_install::pod_metrics(cluster, leader)?, "demo");
        if !phases.is_empty() {
            println!("podha's own phase metrics (podha_failover_phase_duration_seconds):");
            for (phase, secs) in phases {
                println!("  {phase:>8}: {secs:.1}s");
            }
        }
    }
    anyhow::ensure!(report.clean(), "the write log is not clean: {report:?}");
    Ok(timeline.recovered.is_some())
}

/// `sts`'s pod prefers `nodes`.
fn prefer(sts: &mut serde_json::Value, nodes: &[&String]) {
    sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = serde_json::json!([{
        "weight": 100,
        "preference": { "matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": nodes,
        }]},
    }]);
}

/// The same on kwok nodes, podha as a process of this machine.
async fn demo_kwok(cluster: &Cluster, operator: &Path, crd: &Path) -> anyhow::Result<bool> {
    use crate::failover::{Operator, apply_policy, install_crd, subject_statefulset};
    let client = cluster.client().await?;
    install_crd(&client, crd).await?;
    apply_policy(&client, "demo", demo_policy_kwok()).await?;
    println!("policy demo: {}", demo_policy_kwok());
    let mut podha = Operator::start(operator, cluster)?;
    podha.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "podha running (log {}); starting StatefulSet demo/db with a sim-rwo volume",
        podha.log.display()
    );
    let nodes: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    let sts = subject_statefulset("db", &nodes, false)?;
    let timeline = measure_and_show(cluster, operator, &client, sts).await?;
    // Give podha a tick to record the last phase.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let phases = podha.phase_means("demo")?;
    if !phases.is_empty() {
        println!("podha's own phase metrics (podha_failover_phase_duration_seconds):");
        for (phase, secs) in phases {
            println!("  {phase:>8}: {secs:.1}s");
        }
    }
    Ok(timeline.recovered.is_some())
}
