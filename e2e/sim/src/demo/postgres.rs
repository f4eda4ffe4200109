//! `make demo DEMO_WORKLOAD=postgres`: the demo's failover with PostgreSQL for its workload
//! (`crate::postgres`), on a volume of the class that does not fence, so that only podha's proof
//! keeps a second server off the data directory; a client commits numbered transactions through
//! the Service from the leading replica's node. After the timeline, PostgreSQL's own verdict
//! (`e2e/postgres/check.sh`).

use std::time::Duration;

use crate::cluster::Cluster;
use crate::postgres::{self, Verdict};

const NAMESPACE: &str = "demo";
const DB: &str = "db";
const CLIENT: &str = "db-client";
/// Transactions the client must have seen acknowledged before the kill, and again after.
const TRANSACTIONS: usize = 30;

/// The verdict in words.
fn said(v: &Verdict) -> String {
    let f = |k: &str| v.0.get(k).map_or("?", String::as_str);
    format!(
        "{} transactions acknowledged, {} present whole, {} lost, {} torn; counter {} for {} \
         transactions; pg_amcheck --heapallindexed: {}; checksum failures: {} (data checksums \
         {}); crash recoveries: {} (the last one's redo {} s); servers that ran beside a later \
         one: {}",
        f("acknowledged"),
        f("present"),
        f("lost"),
        f("torn"),
        f("counter"),
        f("transactions"),
        f("amcheck"),
        f("checksum_failures"),
        f("data_checksums"),
        f("crash_recoveries"),
        f("last_redo_seconds"),
        f("overlapping_servers"),
    )
}

/// Starts PostgreSQL and its client, kills the database's node, prints the timeline and the
/// database's verdict; whether the database came back (a failed check is an error).
pub(super) async fn run(
    cluster: &Cluster,
    operator: &std::path::Path,
    client: &kube::Client,
    leader_node: &str,
    free: &[&String],
) -> anyhow::Result<bool> {
    postgres::load_image(cluster)?;
    let ip = postgres::serve(client, NAMESPACE, DB, CLIENT, leader_node).await?;
    let nodes: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    let db_nodes: Vec<&str> = nodes
        .iter()
        .map(String::as_str)
        .filter(|n| *n != leader_node)
        .collect();
    let mut sts = postgres::statefulset(DB, &db_nodes, crate::csi::UNFENCED_STORAGE_CLASS)?;
    super::prefer(&mut sts, free);
    println!(
        "starting StatefulSet demo/db: PostgreSQL 15 (Debian's, initdb --data-checksums) on a \
         {} volume (storage that does not fence), and a client on {leader_node} committing \
         numbered transactions through Service db ({ip})",
        crate::csi::UNFENCED_STORAGE_CLASS
    );
    let subject = crate::failover::start_subject(client, NAMESPACE, sts).await?;
    let timeout = Duration::from_secs(180);
    let before =
        postgres::wait_acknowledged(client, NAMESPACE, CLIENT, TRANSACTIONS, timeout).await?;
    println!("{before} transactions acknowledged to the client");
    super::explain(cluster, operator, &subject)?;
    let timeline =
        crate::failover::kill_and_follow(cluster, client, &subject, Duration::from_secs(600))
            .await?;
    println!(
        "\nfailover timeline (from the kill, as seen through the API):\n{}",
        podha::chaos::timeline::render(&timeline)
    );
    if timeline.recovered.is_none() {
        return Ok(false);
    }
    let after =
        postgres::wait_acknowledged(client, NAMESPACE, CLIENT, before + TRANSACTIONS, timeout)
            .await?;
    println!("{after} transactions acknowledged, the client through the Service to the new server");
    let verdict = postgres::check(cluster, NAMESPACE, DB, CLIENT)?;
    println!(
        "PostgreSQL's own check (e2e/postgres/check.sh): {}",
        said(&verdict)
    );
    Ok(true)
}
