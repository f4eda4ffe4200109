//! A real node freezes (a hung machine: its kubelet, containerd and writer stopped, its kernel
//! still accepting connections) while a Deployment's writer runs there on storage that does not
//! fence (podha-csi's `fencing: off` class: a node keeps the access it once had), so podha's
//! fence is what keeps the data whole:
//!
//! - podha has the node's BMC force the machine off (its Redfish system, which the node's BMC
//!   follows, killing every process of the node once the system says `Off`) and taints the
//!   node only once the system says `Off`;
//! - the replacement writer runs on the other real node; the volume's write log shows the
//!   machine was off before the replacement's first write, no split-brain write and no lost
//!   acknowledged write;
//! - with `powerCycle`, podha powers the machine on after the failover: it boots with a new boot
//!   ID and podha takes its taint off; no other machine was powered off.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use podha_sim::cluster::bmc::REDFISH_OFF_REASON;
use podha_sim::csi::workload;
use podha_sim::testkit::{node_of, pvc, ready_status, running_ready, terminating};

use super::*;

const NS: &str = "bmc-real";
/// Acknowledged writes the writer must have before its node freezes, and its replacement after
/// (10 per second).
const WRITES: usize = 20;

fn say(msg: impl AsRef<str>) {
    log(NS, msg);
}

fn uid(pod: &Pod) -> anyhow::Result<String> {
    pod.metadata.uid.clone().context("pod uid")
}

fn boot_id(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
}

pub(super) fn powered_off_before_its_volume_moves(
    shared: &SharedCluster,
) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, NS, |ctx| async move {
        let [frozen, refuge] = REAL_NODES;
        let (access, secrets, podha) = start_podha(&ctx, &REAL_NODES).await?;
        // Lease alone: a frozen machine's kernel still accepts a connection to its kubelet.
        apply_bmc_policy(
            &ctx.client,
            "bare-metal-real",
            json!({ "matchLabels": { "type": "real" } }),
            NS,
            &["Lease"],
            None,
        )
        .await?;
        let (writer, volume) = start_writer(&ctx, frozen, refuge).await?;
        // Asked before any death, podha explain reaches each BMC as podha will; a BMC that
        // refuses podha's password makes its node unprotected under the BMC proof alone.
        bmc_explained(&ctx, frozen, "pass", "its UUID the node's systemUUID")?;
        let mut refused = bmc_secret(&access, refuge, refuge)?;
        set_key(&mut refused, "password", "not-the-password");
        replace_secret(&secrets, refused).await?;
        let protected = bmc_explained(&ctx, refuge, "fail", "HTTP 401")?;
        ensure!(
            !protected,
            "podha explain calls {refuge} protected with its BMC refusing"
        );
        replace_secret(&secrets, bmc_secret(&access, refuge, refuge)?).await?;
        let old_boot = boot_id(&ctx.nodes().get(frozen).await?);
        let fences_before = ctx.cluster.fences()?.len();

        ctx.cluster.freeze_node(frozen)?;
        let frozen_at = Instant::now();
        say(format!("{frozen} frozen with its writer"));
        let state = state_at_taint(&ctx.client, &access, frozen, secs(120)).await;
        if state.is_err() {
            // A frozen node left behind would hide what happened from its logs.
            ctx.cluster.thaw_node(frozen)?;
        }
        let state = state?;
        ensure!(
            state == PowerState::Off,
            "{frozen} was tainted while its system said {state}"
        );
        say(format!(
            "{frozen} powered off through its BMC and tainted {:.1?} after it froze",
            frozen_at.elapsed()
        ));
        told_power_off(&ctx.client, frozen).await?;

        // The node's BMC saw the system `Off` and killed every process of the machine.
        let fence = wait_for(
            &format!("{frozen}'s BMC to power the machine off"),
            secs(10),
            || async {
                Ok(ctx
                    .cluster
                    .fences()?
                    .into_iter()
                    .skip(fences_before)
                    .find(|f| f.node == frozen && f.reason == REDFISH_OFF_REASON))
            },
        )
        .await?;
        ensure!(
            ctx.cluster.node_pids(frozen)?.is_empty(),
            "the powered-off {frozen}'s cgroup still holds processes"
        );

        let replacement = wait_for(
            &format!("the writer's replacement Running on {refuge}"),
            secs(120),
            || async {
                let pods = ctx.app_pods("writer").await?;
                Ok(pods.into_iter().find(|p| {
                    p.metadata.uid != writer.metadata.uid && running_ready(p) && !terminating(p)
                }))
            },
        )
        .await?;
        ensure!(
            node_of(&replacement) == Some(refuge),
            "the replacement runs on {:?}, not {refuge}",
            node_of(&replacement)
        );
        say(format!(
            "replacement Running on {refuge} {:.1?} after {frozen} froze",
            frozen_at.elapsed()
        ));
        ctx.wait_writes(&replacement, WRITES).await?;

        // The write log: the machine was off before the replacement first wrote, and the
        // volume is whole.
        let entries = workload::write_log(ctx.cluster.dir(), &volume)?;
        let replacement_uid = uid(&replacement)?;
        let first_new = entries
            .iter()
            .find(|e| e.accepted && e.pod_uid == replacement_uid)
            .context("the replacement's first write")?;
        let first_new_ms = u128::from(first_new.time_us / 1000);
        ensure!(
            first_new_ms > fence.at_ms,
            "the replacement wrote ({} µs) before {frozen} was powered off ({} ms)",
            first_new.time_us,
            fence.at_ms
        );
        let report = workload::check(ctx.cluster.dir(), &volume)?;
        ensure!(report.clean(), "the writer's volume: {report:?}");
        ensure!(
            report.writers.len() == 2,
            "both writers should have written: {report:?}"
        );
        say(format!(
            "{frozen} off {:.1?} before the replacement's first write; write log: {} accepted, \
             0 split-brain, 0 lost",
            Duration::from_millis(
                u64::try_from(first_new_ms.saturating_sub(fence.at_ms)).unwrap_or(0)
            ),
            report.accepted_writes
        ));

        // powerCycle: podha powers the machine on once the failover is done; it boots and
        // podha takes its taint off.
        wait_for(
            &format!("{frozen} booted again and untainted"),
            secs(150),
            || async {
                let node = ctx.nodes().get(frozen).await?;
                let booted =
                    boot_id(&node) != old_boot && ready_status(&node).as_deref() == Some("True");
                Ok((booted && !has_taint(&ctx.client, frozen).await?).then_some(()))
            },
        )
        .await?;
        powered_on_after(&ctx.client, frozen, ready_since(&replacement)?).await?;
        others_on(&access, frozen).await?;
        ensure!(
            ctx.cluster
                .fences()?
                .iter()
                .skip(fences_before)
                .all(|f| f.node == frozen),
            "another machine was powered off"
        );
        say(format!(
            "{frozen} powered on by podha, booted and untainted; no other machine off"
        ));
        ctx.remove_workloads(secs(120)).await?;
        podha.stop().await
    })
}

/// The writer Deployment on its own claim of the unfenced class, started on `on` (`refuge`
/// cordoned meanwhile, where its replacement may go); returns the running pod and its volume
/// handle once it has written.
async fn start_writer(ctx: &Ctx<'_>, on: &str, refuge: &str) -> anyhow::Result<(Pod, String)> {
    let claim = "writer-data";
    ctx.create::<PersistentVolumeClaim>(pvc(claim, podha_sim::csi::UNFENCED_STORAGE_CLASS))
        .await?;
    ctx.cordon(refuge, true).await?;
    ctx.create::<Deployment>(workload::writer_deployment("writer", &[on, refuge], claim)?)
        .await?;
    let pod = ctx.wait_app_running("writer", secs(120)).await;
    ctx.cordon(refuge, false).await?;
    let pod = pod?;
    ensure!(node_of(&pod) == Some(on), "the writer does not run on {on}");
    ctx.wait_writes(&pod, WRITES).await?;
    let handle = podha_sim::csi::writer::volume_handle(&ctx.client, &ctx.ns, &pod).await?;
    say(format!("writer running on {on}, writing"));
    Ok((pod, handle))
}
