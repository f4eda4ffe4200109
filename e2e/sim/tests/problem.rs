//! The problem podha exists to fix, reproduced on the sim cluster (profile `fast`): without
//! podha, a StatefulSet pod on a dead node stays Terminating and is never replaced, and a
//! Deployment's replacement waits on a volume still attached to the dead node. These tests are
//! the ground truth the operator's tests build on.
//!
//! One cluster of 8 nodes serves every scenario; each scenario has its own namespace and its own
//! nodes (pods are pinned with node affinity), so they run in parallel without affecting each
//! other. At most 4 of 8 nodes are dead at once, below the node lifecycle controller's 55 %
//! "partial disruption" threshold, which would stop taint-based eviction.
//!
//! The binaries must have been built with `make k8s`; without them every test fails with that
//! hint (never skips).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Taint};
use libtest_mimic::Arguments;
use podha_sim::testkit::*;

const NODES: usize = 8;
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // The scenarios mostly wait; run them all at once even on a 2-core machine.
    args.test_threads.get_or_insert(4);
    let shared = Arc::new(SharedCluster::new(
        env!("CARGO_TARGET_TMPDIR"),
        "podha-sim-problem",
        NODES,
        Some(env!("CARGO_BIN_EXE_podha-sim").into()),
    ));
    let scenarios: [Scenario; 5] = [
        (
            "statefulset_pod_stays_terminating_and_is_not_replaced",
            statefulset_not_replaced,
        ),
        (
            "deployment_replacement_is_stuck_on_multi_attach",
            deployment_multi_attach,
        ),
        (
            "force_delete_waits_out_of_service_taint_detaches_at_once",
            force_delete_then_taint,
        ),
        ("restarted_node_comes_back_ready", restarted_node_ready),
        (
            "killed_machine_is_silent_killed_kubelet_is_refused",
            machine_vs_kubelet,
        ),
    ];
    run_trials(&args, &shared, scenarios.into())
}

/// A StatefulSet pod with an RWO volume on a node that dies: the node goes NotReady/Unknown, the
/// pod gets a deletionTimestamp (taint eviction) and stays Terminating, and no replacement is
/// created (same name, ordinal slot still taken).
fn statefulset_not_replaced(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "sts", |ctx| async move {
        let ns = ctx.ns.clone();
        ctx.create::<StatefulSet>(statefulset("db", &["node-1", "node-2"]))
            .await?;
        let pod = ctx.wait_app_running("db", secs(120)).await?;
        let node = node_of(&pod).unwrap_or_default().to_string();
        let uid = pod.metadata.uid.clone();
        let pv = ctx.wait_bound_pv("data-db-0").await?;
        ctx.wait_attached(&pv_name(&pv), &node, secs(30)).await?;
        log(
            &ns,
            format!(
                "db-0 runs on {node}, {} attached there; killing {node}",
                pv_name(&pv)
            ),
        );

        ctx.cluster.kill_node(&node)?;
        let t0 = Instant::now();
        let status = ctx.wait_not_ready(&node, secs(90)).await?;
        log(
            &ns,
            format!("{node} Ready={status} after {:.1?}", t0.elapsed()),
        );
        wait_for("db-0 to get a deletionTimestamp", secs(150), || async {
            let p = ctx.pods().get("db-0").await?;
            if p.metadata.uid != uid {
                anyhow::bail!("db-0 was replaced (uid {:?} -> {:?})", uid, p.metadata.uid);
            }
            Ok(terminating(&p).then_some(()))
        })
        .await?;
        log(&ns, format!("db-0 Terminating after {:.1?}", t0.elapsed()));

        let pv_name = pv_name(&pv);
        holds_for(
            "db-0 stays Terminating, unreplaced, attached to the dead node",
            secs(30),
            || {
                let (ctx, uid, node, pv_name) = (&ctx, &uid, &node, &pv_name);
                async move {
                    let pods = ctx.app_pods("db").await?;
                    if pods.len() != 1 {
                        return Ok(Err(format!(
                            "expected only db-0, found {:?}",
                            summary(&pods)
                        )));
                    }
                    let p = &pods[0];
                    if &p.metadata.uid != uid || !terminating(p) {
                        return Ok(Err(format!("db-0 changed: {:?}", summary(&pods))));
                    }
                    let vas = ctx.vas_of(pv_name).await?;
                    if !vas
                        .iter()
                        .any(|va| &va.spec.node_name == node && va_attached(va))
                    {
                        return Ok(Err(format!("{pv_name} no longer attached to {node}")));
                    }
                    Ok(Ok(()))
                }
            },
        )
        .await?;
        log(&ns, "db-0 still Terminating and not replaced after 30 s");
        Ok(())
    })
}

/// Starts Deployment `app` with claim `data` on `nodes`, waits until its pod runs with the volume
/// attached, kills that node and waits for the old pod to be Terminating and a replacement to be
/// scheduled. Returns (old pod, replacement, dead node, PV name).
async fn deployment_failover_setup(
    ctx: &Ctx<'_>,
    app: &str,
    nodes: &[&str],
) -> anyhow::Result<(Pod, Pod, String, String)> {
    let ns = ctx.ns.clone();
    ctx.create::<PersistentVolumeClaim>(pvc("data", podha_sim::csi::RWO_STORAGE_CLASS))
        .await?;
    ctx.create::<Deployment>(deployment(app, nodes, Some("data")))
        .await?;
    let old = ctx.wait_app_running(app, secs(120)).await?;
    let dead = node_of(&old).unwrap_or_default().to_string();
    let pv = ctx.wait_bound_pv("data").await?;
    let pv_name = pv_name(&pv);
    ctx.wait_attached(&pv_name, &dead, secs(30)).await?;
    let unique = unique_name(&pv)?;
    wait_for(
        &format!("{unique} in volumesInUse of {dead}"),
        secs(30),
        || async {
            let n = ctx.nodes().get(&dead).await?;
            Ok(volumes_in_use(&n).contains(&unique).then_some(()))
        },
    )
    .await?;
    log(
        &ns,
        format!(
            "{} runs on {dead} with {pv_name} attached and in use; killing {dead}",
            name_of(&old)
        ),
    );

    ctx.cluster.kill_node(&dead)?;
    let t0 = Instant::now();
    let status = ctx.wait_not_ready(&dead, secs(90)).await?;
    log(
        &ns,
        format!("{dead} Ready={status} after {:.1?}", t0.elapsed()),
    );
    let old_uid = old.metadata.uid.clone();
    let old_name = name_of(&old).to_string();
    wait_for(
        &format!("{old_name} to get a deletionTimestamp"),
        secs(150),
        || async {
            let p = ctx.pods().get(&old_name).await?;
            Ok((p.metadata.uid == old_uid && terminating(&p)).then_some(()))
        },
    )
    .await?;
    log(
        &ns,
        format!("{old_name} Terminating after {:.1?}", t0.elapsed()),
    );
    let replacement = wait_for("a scheduled replacement pod", secs(60), || async {
        let pods = ctx.app_pods(app).await?;
        Ok(pods
            .into_iter()
            .find(|p| p.metadata.uid != old_uid && !terminating(p) && node_of(p).is_some()))
    })
    .await?;
    let target = node_of(&replacement).unwrap_or_default().to_string();
    if target == dead {
        anyhow::bail!(
            "replacement {} was scheduled on the dead node {dead}",
            name_of(&replacement)
        );
    }
    log(
        &ns,
        format!(
            "replacement {} scheduled on {target}",
            name_of(&replacement)
        ),
    );
    let old = ctx.pods().get(&old_name).await?;
    Ok((old, replacement, dead, pv_name))
}

/// The replacement of a Deployment pod whose node died is created at once, but stays not
/// Running: the volume is still attached to the dead node (the attach/detach controller reports
/// a Multi-Attach error) and no VolumeAttachment for the new node is attached.
fn deployment_multi_attach(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "deploy", |ctx| async move {
        let ns = ctx.ns.clone();
        let (_old, replacement, dead, pv) =
            deployment_failover_setup(&ctx, "web", &["node-3", "node-4"]).await?;
        let rname = name_of(&replacement).to_string();
        let target = node_of(&replacement).unwrap_or_default().to_string();
        let event = wait_for(
            "a Multi-Attach FailedAttachVolume event on the replacement",
            secs(60),
            || async {
                let events = events_for(&ctx, &rname).await?;
                Ok(events.into_iter().find(|e| {
                    e.reason.as_deref() == Some("FailedAttachVolume")
                        && e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("Multi-Attach"))
                }))
            },
        )
        .await?;
        log(&ns, format!("event: {}", event.message.unwrap_or_default()));
        holds_for(
            "replacement stays not Running, volume stays on the dead node",
            secs(30),
            || {
                let (ctx, rname, dead, target, pv) = (&ctx, &rname, &dead, &target, &pv);
                async move {
                    let p = ctx.pods().get(rname).await?;
                    if phase(&p) == "Running" {
                        return Ok(Err(format!("{rname} is Running")));
                    }
                    let vas = ctx.vas_of(pv).await?;
                    if vas
                        .iter()
                        .any(|va| &va.spec.node_name == target && va_attached(va))
                    {
                        return Ok(Err(format!("{pv} got attached to {target}")));
                    }
                    if !vas.iter().any(|va| &va.spec.node_name == dead) {
                        return Ok(Err(format!("{pv} is no longer attached to {dead}")));
                    }
                    Ok(Ok(()))
                }
            },
        )
        .await?;
        log(
            &ns,
            format!(
                "{rname} still {} after 30 s",
                phase(&ctx.pods().get(&rname).await?)
            ),
        );
        Ok(())
    })
}

/// Force-deleting the old pod is not enough: the dead node's volumesInUse is frozen, so the
/// attach/detach controller waits (6 minutes) before detaching; it does not detach within 60 s.
/// The out-of-service taint makes it detach at once, and the replacement then runs on the
/// healthy node with its volume attached there.
fn force_delete_then_taint(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "oos", |ctx| async move {
        let ns = ctx.ns.clone();
        let (old, replacement, dead, pv) =
            deployment_failover_setup(&ctx, "app", &["node-5", "node-6"]).await?;
        let rname = name_of(&replacement).to_string();
        let target = node_of(&replacement).unwrap_or_default().to_string();

        ctx.force_delete(&old).await?;
        let old_name = name_of(&old).to_string();
        wait_for(&format!("{old_name} to be gone"), secs(30), || async {
            Ok(ctx.pods().get_opt(&old_name).await?.is_none().then_some(()))
        })
        .await?;
        log(
            &ns,
            format!("{old_name} force-deleted; watching {pv} for 60 s"),
        );
        holds_for(
            "no detach from the dead node without the taint",
            secs(60),
            || {
                let (ctx, rname, dead, pv) = (&ctx, &rname, &dead, &pv);
                async move {
                    let vas = ctx.vas_of(pv).await?;
                    if !vas.iter().any(|va| {
                        &va.spec.node_name == dead && va.metadata.deletion_timestamp.is_none()
                    }) {
                        return Ok(Err(format!("{pv} was detached from {dead}")));
                    }
                    let p = ctx.pods().get(rname).await?;
                    if phase(&p) == "Running" {
                        return Ok(Err(format!("{rname} is Running")));
                    }
                    Ok(Ok(()))
                }
            },
        )
        .await?;

        let taint = Taint {
            key: OUT_OF_SERVICE.into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            time_added: None,
        };
        ctx.add_taint(&dead, taint).await?;
        let t0 = Instant::now();
        wait_for(
            &format!("{pv} to be detached from {dead}"),
            secs(20),
            || async {
                let vas = ctx.vas_of(&pv).await?;
                Ok((!vas.iter().any(|va| va.spec.node_name == dead)).then_some(()))
            },
        )
        .await?;
        log(
            &ns,
            format!(
                "{pv} detached from {dead} {:.1?} after the taint",
                t0.elapsed()
            ),
        );
        ctx.wait_attached(&pv, &target, secs(60)).await?;
        wait_for(&format!("{rname} to run on {target}"), secs(60), || async {
            let p = ctx.pods().get(&rname).await?;
            Ok((running_ready(&p) && node_of(&p) == Some(target.as_str())).then_some(()))
        })
        .await?;
        log(
            &ns,
            format!(
                "{rname} Running on {target} {:.1?} after the taint",
                t0.elapsed()
            ),
        );
        ctx.remove_taint(&dead, OUT_OF_SERVICE).await?;
        Ok(())
    })
}

/// A killed node that is started again becomes Ready, renews its lease and runs pods again.
fn restarted_node_ready(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "restart", |ctx| async move {
        let ns = ctx.ns.clone();
        let node = "node-7";
        // A pod without CSI volumes starts at once (the node agent marks it volumes-ready).
        ctx.create::<Deployment>(deployment("plain", &[node], None))
            .await?;
        ctx.wait_app_running("plain", secs(90)).await?;
        let info = ctx.cluster.node(node)?;
        let addr = std::net::SocketAddr::from((info.ip, info.kubelet_port));
        std::net::TcpStream::connect_timeout(&addr, secs(2))
            .map_err(|e| anyhow::anyhow!("kubelet endpoint {addr} of live {node}: {e}"))?;

        ctx.cluster.kill_node(node)?;
        let t0 = Instant::now();
        expect_connect(addr, std::io::ErrorKind::TimedOut, "of the killed machine")?;
        let status = ctx.wait_not_ready(node, secs(90)).await?;
        log(
            &ns,
            format!("{node} Ready={status} after {:.1?}", t0.elapsed()),
        );
        let boot_before = ctx
            .nodes()
            .get(node)
            .await?
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.boot_id);

        let t1 = Instant::now();
        ctx.cluster.start_node(node).await?;
        // Ready once the restarted kwok reports again; the machine may be loaded.
        ctx.wait_ready(node, secs(60)).await?;
        log(
            &ns,
            format!("{node} Ready again {:.1?} after start", t1.elapsed()),
        );
        let n = ctx.nodes().get(node).await?;
        let boot_after = n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone());
        if boot_after == boot_before {
            anyhow::bail!("bootID did not change across the restart ({boot_after:?})");
        }
        // Ready is written by the new kwok, which may not listen yet: wait, as for the pod.
        wait_accepts(addr, "after restart").await?;
        ctx.wait_app_running("plain", secs(90)).await?;
        log(&ns, format!("a pod of plain runs on {node} again"));
        Ok(())
    })
}

/// What a connect to `addr` must run into.
fn expect_connect(
    addr: std::net::SocketAddr,
    want: std::io::ErrorKind,
    what: &str,
) -> anyhow::Result<()> {
    match std::net::TcpStream::connect_timeout(&addr, secs(2)) {
        Ok(_) => anyhow::bail!("kubelet endpoint {addr} {what} accepted a connection"),
        Err(e) if e.kind() == want => Ok(()),
        Err(e) => anyhow::bail!("kubelet endpoint {addr} {what}: want {want:?}, got {e}"),
    }
}

/// A dead machine does not answer (a connect times out); a machine whose kubelet alone died
/// still does (its kernel refuses the connect). podha reads the two differently, so the sim
/// must make them differ as real machines do.
fn machine_vs_kubelet(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "faults", |ctx| async move {
        let ns = ctx.ns.clone();
        let node = "node-8";
        let info = ctx.cluster.node(node)?;
        let addr = std::net::SocketAddr::from((info.ip, info.kubelet_port));
        std::net::TcpStream::connect_timeout(&addr, secs(2))
            .map_err(|e| anyhow::anyhow!("kubelet endpoint {addr} of live {node}: {e}"))?;

        ctx.cluster.kill_kubelet(node)?;
        expect_connect(
            addr,
            std::io::ErrorKind::ConnectionRefused,
            "with only the kubelet killed",
        )?;
        // The node never went NotReady: start_node returns before the new kwok listens.
        ctx.cluster.start_node(node).await?;
        wait_accepts(addr, "after the kubelet's restart").await?;

        ctx.cluster.kill_node(node)?;
        expect_connect(addr, std::io::ErrorKind::TimedOut, "of the killed machine")?;
        ctx.cluster.start_node(node).await?;
        wait_accepts(addr, "after the machine's restart").await?;
        log(
            &ns,
            format!("{node}: refused with the kubelet killed, silent with the machine killed"),
        );
        Ok(())
    })
}

async fn wait_accepts(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + secs(30);
    loop {
        match std::net::TcpStream::connect_timeout(&addr, secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                anyhow::bail!("kubelet endpoint {addr} {what}: {e}")
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}
