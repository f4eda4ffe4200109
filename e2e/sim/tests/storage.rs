//! What a failover does to the data, on the real storage path (podha-csi behind the real
//! csi-provisioner and csi-attacher): a StatefulSet pod writes to its volume (the writer's
//! simulated twin, since kwok nodes run no containers); its node's kubelet dies while the host
//! keeps running the writer; the pod is failed over as podha does it (force-delete, then the
//! out-of-service taint so the attach/detach controller detaches at once) and the replacement
//! writes from the other node. The store's checker then reads the volume's write log:
//!
//! - storage that fences on ControllerUnpublishVolume: the old writer is refused from the
//!   detach on, so no split-brain write;
//! - storage that does not fence (StorageClass `sim-rwo-unfenced`): the old writer's writes
//!   after the new writer's first are split-brain writes, and the checker must report them.
//!
//! Needs `make k8s` and `make csi-sidecars`; without them every test fails with that hint.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Taint;
use libtest_mimic::Arguments;
use podha_csi::checker::Report;
use podha_sim::csi::sidecars::Layout;
use podha_sim::csi::writer::{self, SimulatedWriter};
use podha_sim::csi::{RWO_DRIVER, RWO_STORAGE_CLASS, UNFENCED_STORAGE_CLASS, attacher_finalizer};
use podha_sim::testkit::*;

const NODES: usize = 4;
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
const WRITE_INTERVAL: Duration = Duration::from_millis(100);

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(2);
    let shared = Arc::new(SharedCluster::new(
        env!("CARGO_TARGET_TMPDIR"),
        "podha-sim-storage",
        NODES,
        Some(env!("CARGO_BIN_EXE_podha-sim").into()),
    ));
    let scenarios: [Scenario; 2] = [
        ("fenced_storage_refuses_the_old_node_no_split_brain", fenced),
        (
            "unfenced_storage_lets_the_old_node_write_split_brain_reported",
            unfenced,
        ),
    ];
    run_trials(&args, &shared, scenarios.into())
}

fn fenced(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "fenced", |ctx| async move {
        let report =
            fail_over_while_writing(&ctx, RWO_STORAGE_CLASS, &["node-1", "node-2"]).await?;
        anyhow::ensure!(
            report.split_brain_writes.is_empty(),
            "fenced storage let split-brain writes through: {report:?}"
        );
        anyhow::ensure!(
            report.refused_writes > 0,
            "the old node's writer was never refused, so fencing was not exercised: {report:?}"
        );
        anyhow::ensure!(report.lost_acknowledged_writes.is_empty(), "{report:?}");
        Ok(())
    })
}

fn unfenced(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "unfenced", |ctx| async move {
        let report =
            fail_over_while_writing(&ctx, UNFENCED_STORAGE_CLASS, &["node-3", "node-4"]).await?;
        anyhow::ensure!(
            !report.split_brain_writes.is_empty(),
            "both nodes wrote, yet the checker reported no split-brain write: {report:?}"
        );
        let old = &report.writers[0].0;
        anyhow::ensure!(
            report.split_brain_writes.iter().all(|w| &w.node == old),
            "split-brain writes must come from the old node {old}: {report:?}"
        );
        anyhow::ensure!(report.refused_writes == 0, "{report:?}");
        anyhow::ensure!(report.lost_acknowledged_writes.is_empty(), "{report:?}");
        Ok(())
    })
}

/// Runs StatefulSet `db` with a claim of `class` on `nodes`, writes from its pod, kills its
/// node's kubelet stand-ins (the writer keeps going, as on a host whose kubelet died), fails the
/// pod over and writes from the replacement for a while; returns the checker's report.
async fn fail_over_while_writing(
    ctx: &Ctx<'_>,
    class: &str,
    nodes: &[&str],
) -> anyhow::Result<Report> {
    let ns = ctx.ns.clone();
    let mut sts = statefulset("db", nodes);
    sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] = class.into();
    ctx.create::<StatefulSet>(sts).await?;
    let old = ctx.wait_app_running("db", secs(120)).await?;
    let dead = node_of(&old).unwrap_or_default().to_string();
    let pv = pv_name(&ctx.wait_bound_pv("data-db-0").await?);
    ctx.wait_attached(&pv, &dead, secs(30)).await?;
    let finalizer = attacher_finalizer(RWO_DRIVER);
    let vas = ctx.vas_of(&pv).await?;
    anyhow::ensure!(
        vas.iter().all(|va| va
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == &finalizer)),
        "the VolumeAttachments of {pv} lack the real attacher's finalizer {finalizer}"
    );

    let store = Layout::new(ctx.cluster.dir()).store;
    let acks = ctx.cluster.dir().join("acks").join(&ns);
    let first =
        SimulatedWriter::start(&ctx.client, &store, &ns, "db-0", &acks, WRITE_INTERVAL).await?;
    wait_for("the first writer's writes", secs(10), || async {
        Ok(writer::check(first.volume(), &[first.acks()])?
            .accepted_writes
            .ge(&5)
            .then_some(()))
    })
    .await?;
    log(
        &ns,
        format!("db-0 writes {pv} through {dead}; killing {dead}'s kubelet"),
    );

    ctx.cluster.kill_node(&dead)?;
    ctx.wait_not_ready(&dead, secs(90)).await?;
    ctx.force_delete(&old).await?;
    let taint = Taint {
        key: OUT_OF_SERVICE.into(),
        value: Some("nodeshutdown".into()),
        effect: "NoExecute".into(),
        time_added: None,
    };
    ctx.add_taint(&dead, taint).await?;
    let target = nodes
        .iter()
        .find(|n| **n != dead)
        .copied()
        .unwrap_or_default();
    let replacement = wait_for("db-0's replacement to run", secs(120), || async {
        let p = ctx.pods().get_opt("db-0").await?;
        Ok(p.filter(|p| {
            p.metadata.uid != old.metadata.uid && running_ready(p) && node_of(p) == Some(target)
        }))
    })
    .await?;
    log(
        &ns,
        format!("db-0 runs again on {target}; writing from both hosts"),
    );
    let second =
        SimulatedWriter::start(&ctx.client, &store, &ns, "db-0", &acks, WRITE_INTERVAL).await?;
    anyhow::ensure!(
        second.volume().id() == first.volume().id(),
        "the replacement {:?} got another volume",
        replacement.metadata.uid
    );
    tokio::time::sleep(secs(3)).await;
    let (second_acks, first_acks) = (second.acks().to_path_buf(), first.acks().to_path_buf());
    let volume = second.volume().clone();
    let old_stats = first.stop().await?;
    let new_stats = second.stop().await?;
    log(
        &ns,
        format!("old writer {old_stats:?}, new writer {new_stats:?}"),
    );
    ctx.remove_taint(&dead, OUT_OF_SERVICE).await?;
    let report = writer::check(&volume, &[first_acks.as_path(), Path::new(&second_acks)])?;
    log(
        &ns,
        format!(
            "checker: {} accepted, {} refused, {} split-brain, {} lost acknowledged",
            report.accepted_writes,
            report.refused_writes,
            report.split_brain_writes.len(),
            report.lost_acknowledged_writes.len()
        ),
    );
    Ok(report)
}
