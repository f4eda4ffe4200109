//! PostgreSQL through the real nodes' faults (`make bench-postgres`): one sim cluster of four
//! real nodes on the stock profile, podha installed by its chart with every default (its
//! agents fencing through each node's BMC and petting its watchdog there), a policy with the
//! default detection and proof (only its safety window opened, so that faults may follow one
//! another), and PostgreSQL ([`crate::postgres`]) on a volume of the class that does not fence,
//! its client on the leading replica's node, the database on the three others.
//!
//! Each fault is one `podha chaos` trial on the same database, in order, with podha-csi's data
//! check and PostgreSQL's own check (`--check e2e/postgres/check.sh`) before and after: the
//! node killed, frozen, cut off from everything (each fenced by its agent's proof, then booted
//! again), and cut off from the API server only, which podha must hold through.
//!
//! Then the **control**, which shows that the checks can fail: the database's node loses its
//! agent (and so its watchdog), the policy takes `fencing.proof: None` and the Lease alone, and
//! the node freezes. podha moves the database without a proof; when the node thaws, its server
//! and writer go on beside the new ones. The control's row says what the checks saw.
//!
//! It prints a row per fault and writes them as JSON as they come; it asserts nothing, but says
//! so when the control shows no damage.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podha::chaos::{self, ChaosArgs, Expect};
use serde::Serialize;

use crate::chart_install::{self, AgentTimings};
use crate::cluster::{Cluster, ClusterOptions, Profile};
use crate::postgres::{self, Verdict};

const NAMESPACE: &str = "postgres";
const POLICY: &str = "postgres";
const DB: &str = "db";
const CLIENT: &str = "db-client";

#[derive(clap::Args, Debug)]
pub struct PostgresArgs {
    /// The faults, in order, each a `podha chaos` trial on the same database: sim-kill,
    /// sim-freeze, sim-isolate (each should move it), sim-partition (podha should hold).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sim-kill,sim-freeze,sim-isolate,sim-partition"
    )]
    pub faults: Vec<String>,
    /// Leave out the control (the frozen node under `fencing.proof: None`).
    #[arg(long)]
    pub no_control: bool,
    /// Cluster directory.
    #[arg(long, default_value = ".sim-bench-postgres")]
    pub dir: PathBuf,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench-postgres.json")]
    pub out: PathBuf,
    /// podha-sim, which the faults run.
    #[arg(long, default_value = "target/release/podha-sim")]
    pub podha_sim: PathBuf,
    /// podha-csi, which the data check runs.
    #[arg(long, default_value = "target/release/podha-csi")]
    pub podha_csi: PathBuf,
}

/// One fault's figures.
#[derive(Debug, Serialize)]
pub struct Row {
    pub fault: String,
    pub expect: Expect,
    /// From the fault to the replacement Running with its volume attached.
    pub recovered_s: Option<f64>,
    /// Transactions the client was told committed, in all, after the trial.
    pub acknowledged: Option<u64>,
    /// Of them, missing or not whole.
    pub lost: Option<u64>,
    /// Crash recoveries PostgreSQL ran in this trial.
    pub crash_recoveries: Option<u64>,
    /// The last recovery's redo time, as PostgreSQL logged it.
    pub last_redo_s: Option<String>,
    pub amcheck: Option<String>,
    /// Servers that logged after a later one started on the same data directory.
    pub overlapping_servers: Option<u64>,
    /// podha-csi's write log of the volume.
    pub split_brain_writes: Option<usize>,
    /// The invariants `podha chaos` found violated, with why.
    pub violations: Vec<String>,
}

/// The verdict a check printed (on stdout when it passed, with its failure when not).
fn verdict_of(run: Option<&chaos::own_check::CheckRun>) -> Option<Verdict> {
    let run = run?;
    let text = match &run.result {
        Ok(last) => last,
        Err(why) => why,
    };
    Verdict::parse(text).ok()
}

fn row(fault: &str, record: &chaos::invariants::TrialRecord) -> Row {
    let before = verdict_of(record.checks.first());
    let after = verdict_of(record.checks.get(1));
    let count = |v: &Option<Verdict>, key| v.as_ref().and_then(|v| v.count(key).ok());
    let recoveries = count(&after, "crash_recoveries")
        .map(|a| a.saturating_sub(count(&before, "crash_recoveries").unwrap_or(0)));
    Row {
        fault: fault.to_string(),
        expect: record.expect,
        recovered_s: record.timeline.recovered.map(|d| d.as_secs_f64()),
        acknowledged: count(&after, "acknowledged"),
        lost: count(&after, "lost"),
        crash_recoveries: recoveries,
        last_redo_s: after
            .as_ref()
            .and_then(|v| v.0.get("last_redo_seconds").cloned()),
        amcheck: after.as_ref().and_then(|v| v.0.get("amcheck").cloned()),
        overlapping_servers: count(&after, "overlapping_servers"),
        split_brain_writes: record
            .data
            .as_ref()
            .and_then(|d| d.result.as_ref().ok())
            .map(|r| r.split_brain_writes.len()),
        violations: chaos::invariants::check(record)
            .into_iter()
            .map(|v| format!("{}: {}", v.invariant, v.reason))
            .collect(),
    }
}

fn cell<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_string(), ToString::to_string)
}

/// The rows as a table.
pub fn render(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<20} {:>9} {:>6} {:>5} {:>10} {:>7} {:>8} {:>11} {:>11}  result\n",
        "fault",
        "failover",
        "acked",
        "lost",
        "recoveries",
        "redo",
        "amcheck",
        "two servers",
        "split-brain"
    );
    for r in rows {
        let failover = match (r.expect, r.recovered_s) {
            (Expect::Held, None) => "held".to_string(),
            (_, Some(s)) => format!("{s:.1}s"),
            (Expect::Moved, None) => "none".to_string(),
        };
        let result = if r.violations.is_empty() {
            "ok".to_string()
        } else {
            let names: Vec<&str> = r
                .violations
                .iter()
                .filter_map(|v| v.split(':').next())
                .collect();
            format!("FAILED: {}", names.join(", "))
        };
        out += &format!(
            "{:<20} {:>9} {:>6} {:>5} {:>10} {:>7} {:>8} {:>11} {:>11}  {result}\n",
            r.fault,
            failover,
            cell(&r.acknowledged),
            cell(&r.lost),
            cell(&r.crash_recoveries),
            r.last_redo_s
                .as_deref()
                .map_or("-".into(), |s| format!("{s}s")),
            cell(&r.amcheck),
            cell(&r.overlapping_servers),
            cell(&r.split_brain_writes),
        );
    }
    out
}

fn chaos_args(cluster: &Cluster, args: &PostgresArgs, fault: &str) -> ChaosArgs {
    let (expect, restore) = match fault {
        // A fenced node is off: back on after the undo.
        "sim-freeze" | "sim-isolate" => (
            Expect::Moved,
            Some("{restore} && {podha_sim} node start {node} --dir {sim_dir}".to_string()),
        ),
        "sim-partition" => (Expect::Held, None),
        _ => (Expect::Moved, None),
    };
    ChaosArgs {
        kubeconfig: Some(cluster.kubeconfig_path()),
        context: None,
        yes: true,
        namespace: NAMESPACE.to_string(),
        statefulset: Some(DB.to_string()),
        deployment: None,
        trials: 1,
        fault: fault.to_string(),
        restore,
        data_check: Some("podha-csi-sim".to_string()),
        check: Some(postgres::check_command(cluster, NAMESPACE, DB, CLIENT)),
        check_timeout: std::time::Duration::from_secs(300),
        data_settle: Duration::from_secs(5),
        podha_csi: args.podha_csi.display().to_string(),
        sim_dir: Some(cluster.dir().to_path_buf()),
        podha_sim: args.podha_sim.display().to_string(),
        expect,
        hold: Duration::from_secs(60),
        timeout: Duration::from_secs(300),
        settle_timeout: Duration::from_secs(180),
        out: args.out.with_extension(format!("{fault}.json")),
        svg: None,
        podha_namespace: None,
        leader_lease: podha::leader::DEFAULT_LEASE_NAME.to_string(),
    }
}

/// One `podha chaos` trial, its progress printed; its row.
async fn trial(chaos_args: &ChaosArgs, name: &str) -> anyhow::Result<Row> {
    println!("\n== {name}");
    let mut progress = |line: &str| println!("  {line}");
    let outcome = chaos::execute(chaos_args, &mut progress).await;
    if let Some(e) = outcome.error {
        anyhow::bail!("podha chaos ({name}) could not run: {e}");
    }
    let record = outcome.run.records.first().context("one trial")?;
    let row = row(name, record);
    for v in &row.violations {
        println!("  violated: {v}");
    }
    Ok(row)
}

/// The cluster, podha by its chart with every default, the policy, PostgreSQL and its client;
/// returns the leading replica's node.
async fn set_up(cluster: &Cluster, client: &kube::Client) -> anyhow::Result<String> {
    let helm = crate::chart_rbac::helm_path()?;
    let timings = AgentTimings::chart_defaults()?;
    chart_install::install(cluster, &helm, &timings.sim_values(), &[])?;
    let nodes: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let chart_install::Installed {
        leader,
        leader_node,
        ..
    } = chart_install::wait_installed(client, &names, Duration::from_secs(180)).await?;
    println!("podha installed by its chart; {leader} leads, on {leader_node}");
    crate::failover::apply_policy(
        client,
        POLICY,
        serde_json::json!({ "safety": { "unhealthyWindow": "0s" } }),
    )
    .await?;
    postgres::load_image(cluster)?;
    let ip = postgres::serve(client, NAMESPACE, DB, CLIENT, &leader_node).await?;
    let db_nodes: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n != leader_node)
        .collect();
    let sts = postgres::statefulset(DB, &db_nodes, crate::csi::UNFENCED_STORAGE_CLASS)?;
    Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &serde_json::from_value(sts)?)
        .await?;
    let acked =
        postgres::wait_acknowledged(client, NAMESPACE, CLIENT, 30, Duration::from_secs(180))
            .await?;
    println!(
        "PostgreSQL on one of {db_nodes:?} (class {}), its client on {leader_node} through \
         Service {DB} ({ip}): {acked} transactions acknowledged",
        crate::csi::UNFENCED_STORAGE_CLASS
    );
    Ok(leader_node)
}

/// Waits until the client has had 30 more transactions acknowledged: after a fault the
/// database may be out of the Service's endpoints for a while (a node back from a cut reports
/// its pods Ready again on its kubelet's next status update).
async fn client_goes_on(client: &kube::Client) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(180);
    let now = postgres::wait_acknowledged(client, NAMESPACE, CLIENT, 0, timeout).await?;
    postgres::wait_acknowledged(client, NAMESPACE, CLIENT, now + 30, timeout).await?;
    Ok(())
}

/// The control: the database's node without its agent (and watchdog), the policy without a
/// proof, the node frozen and thawed after the move.
async fn control(
    cluster: &Cluster,
    client: &kube::Client,
    args: &PostgresArgs,
) -> anyhow::Result<Row> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let db = pods.get(&format!("{DB}-0")).await?;
    let node = db
        .spec
        .and_then(|s| s.node_name)
        .context("the database's node")?;
    // The agents run on nodes labelled type=real (chart_install::sim_agent_values): its pod
    // is stopped, which withdraws its advert and disarms the watchdog.
    Api::<Node>::all(client.clone())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "type": "control" } } })),
        )
        .await?;
    let started = Instant::now();
    loop {
        let on_node = chart_install::agent_pods(client)
            .await?
            .into_iter()
            .any(|p| p.spec.and_then(|s| s.node_name).as_deref() == Some(node.as_str()));
        if !on_node {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "{node}'s agent still runs 120 s after its label changed"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // A merge patch: it replaces the signals' list, where an apply would add to the defaults.
    let gvk = kube::api::GroupVersionKind::gvk("podha.io", "v1alpha1", "PodHAPolicy");
    Api::<kube::api::DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk(&gvk),
    )
    .patch(
        POLICY,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": {
            "detection": { "signals": ["Lease"] },
            "fencing": { "proof": "None" },
        }})),
    )
    .await
    .context("the control's policy")?;
    println!(
        "\n{node}'s agent stopped (label type=control); policy {POLICY}: fencing.proof None, \
         the Lease alone"
    );
    let mut chaos_args = chaos_args(cluster, args, "sim-freeze");
    // The thaw only (the node was never fenced), and time for its server to go on.
    chaos_args.data_settle = Duration::from_secs(10);
    let fault = chaos_args.fault.clone();
    let thaw = format!(
        "{} node thaw {{node}} --dir {}",
        args.podha_sim.display(),
        cluster.dir().display()
    );
    chaos_args.restore = Some(thaw);
    let mut row = trial(&chaos_args, &format!("{fault} (control)")).await?;
    row.fault = "sim-freeze, no proof".to_string();
    Ok(row)
}

/// `podha-bench postgres`.
pub async fn run(args: PostgresArgs) -> anyhow::Result<()> {
    for exe in [&args.podha_sim, &args.podha_csi] {
        anyhow::ensure!(
            exe.is_file(),
            "{} is missing: `make bench-postgres` builds it",
            exe.display()
        );
    }
    let mut opts = ClusterOptions::new(&args.dir);
    opts.profile = Profile::Stock;
    opts.nodes = 0;
    opts.real_nodes = 4;
    opts.real_node_watchdog = Some(AgentTimings::chart_defaults()?.watchdog);
    let started = Instant::now();
    let cluster = Cluster::up(opts).await?;
    println!("cluster of 4 real nodes up in {:.1?}", started.elapsed());
    let result = async {
        let client = cluster.client().await?;
        set_up(&cluster, &client).await?;
        let mut rows = Vec::new();
        // Each row saved as it comes; a trial that cannot run (a check that fails before its
        // fault: the database was not whole any more) is a row, and ends the run.
        for fault in &args.faults {
            let row = match client_goes_on(&client).await {
                Ok(()) => trial(&chaos_args(&cluster, &args, fault), fault).await,
                Err(e) => Err(e),
            };
            let ran = row.is_ok();
            rows.push(row.unwrap_or_else(|e| not_run(fault, &e)));
            save(&args.out, &rows)?;
            if !ran {
                return anyhow::Ok(rows);
            }
        }
        if !args.no_control {
            let row = match client_goes_on(&client).await {
                Ok(()) => control(&cluster, &client, &args).await,
                Err(e) => Err(e),
            };
            let row = row.unwrap_or_else(|e| not_run("sim-freeze, no proof", &e));
            if row.violations.is_empty() {
                println!(
                    "the control showed no damage: the checks did not see the second server \
                     (a check that cannot fail proves nothing)"
                );
            }
            rows.push(row);
            save(&args.out, &rows)?;
        }
        anyhow::Ok(rows)
    }
    .await;
    cluster.down()?;
    let rows = result?;
    println!("\n{}", render(&rows));
    println!("results in {}", args.out.display());
    Ok(())
}

/// A row for a trial that could not run, and why.
fn not_run(fault: &str, why: &anyhow::Error) -> Row {
    println!("  could not run: {why:#}");
    Row {
        fault: fault.to_string(),
        expect: Expect::Moved,
        recovered_s: None,
        acknowledged: None,
        lost: None,
        crash_recoveries: None,
        last_redo_s: None,
        amcheck: None,
        overlapping_servers: None,
        split_brain_writes: None,
        violations: vec![format!("not-run: {why:#}")],
    }
}

fn save(out: &std::path::Path, rows: &[Row]) -> anyhow::Result<()> {
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(rows)? + "\n")
        .with_context(|| format!("writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fault: &str, expect: Expect, recovered_s: Option<f64>, violations: &[&str]) -> Row {
        Row {
            fault: fault.into(),
            expect,
            recovered_s,
            acknowledged: Some(120),
            lost: Some(0),
            crash_recoveries: Some(1),
            last_redo_s: Some("0.01".into()),
            amcheck: Some("clean".into()),
            overlapping_servers: Some(0),
            split_brain_writes: Some(0),
            violations: violations.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn the_table_says_held_moved_or_failed_and_names_what_failed() {
        let text = render(&[
            row("sim-kill", Expect::Moved, Some(24.13), &[]),
            row("sim-partition", Expect::Held, None, &[]),
            row(
                "control",
                Expect::Moved,
                Some(20.0),
                &[
                    "check-passes: check after the trial FAILED",
                    "no-split-brain: 3",
                ],
            ),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[1].contains("24.1s") && lines[1].ends_with("ok"),
            "{text}"
        );
        assert!(
            lines[2].contains("held") && lines[2].ends_with("ok"),
            "{text}"
        );
        assert!(
            lines[3].ends_with("FAILED: check-passes, no-split-brain"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_checks_verdict_is_read_from_its_failure() {
        let run = chaos::own_check::CheckRun {
            when: chaos::own_check::When::After,
            command: "check.sh".into(),
            result: Err(
                "command failed (exit code 1): check.sh: 1 server(s) logged after a \
                         later one started\nverdict lost=0 overlapping_servers=1"
                    .into(),
            ),
            took: Duration::from_secs(1),
        };
        let v = verdict_of(Some(&run)).unwrap();
        assert_eq!(v.count("overlapping_servers").unwrap(), 1);
    }
}
