//! The attacher: what external-attacher does for both drivers, with a simulated backend whose
//! ControllerPublish/ControllerUnpublish take `attach_delay`/`detach_delay` and never fail.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::PersistentVolume,
        storage::v1::{CSINode, VolumeAttachment},
    },
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use tokio::time::Instant;

use super::{ControllerConfig, DRIVERS, Error, attacher_finalizer, is_not_found, is_sim_driver};

/// Annotation in which external-attacher records the CSI node ID a VA was published to, so it
/// can unpublish even when the node's CSINode is gone.
pub(super) const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";
/// Retry period after an attach error or a failed write.
const ERROR_RETRY: Duration = Duration::from_secs(2);
/// Retry period after a write lost a race (409 Conflict).
const CONFLICT_RETRY: Duration = Duration::from_millis(200);
/// Retry period while our own cache has not caught up (e.g. a PV created a moment ago).
const CACHE_RETRY: Duration = Duration::from_millis(500);

/// Which half of a VA's life a timer measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Phase {
    Attach,
    Detach,
}

/// The phase a VA is in.
pub(super) fn phase(va: &VolumeAttachment) -> Phase {
    if va.metadata.deletion_timestamp.is_some() {
        Phase::Detach
    } else {
        Phase::Attach
    }
}

/// One write, in the order external-attacher performs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum VaStep {
    /// Add our finalizer to the VA's PersistentVolume.
    AddPvFinalizer,
    /// Add our finalizer and the node-id annotation to the VA.
    PrepareVa { node_id: String },
    /// `status.attached=true`, attach error cleared.
    MarkAttached,
    /// Record why the VA cannot be attached (the attach/detach controller reads it).
    SaveAttachError(String),
    /// `status.attached=false`, then remove our finalizer.
    MarkDetached,
}

/// What to do with a VA now, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct VaPlan {
    pub steps: Vec<VaStep>,
    pub requeue_after: Option<Duration>,
}

impl VaPlan {
    fn wait(after: Duration) -> Self {
        Self {
            steps: Vec::new(),
            requeue_after: Some(after),
        }
    }
}

fn has_finalizer(meta: &kube::api::ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// The CSI node ID `csinode` registers for `driver`.
fn node_id<'a>(csinode: Option<&'a CSINode>, driver: &str) -> Option<&'a str> {
    csinode?
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.node_id.as_str())
}

/// Decides the next writes for `va`.
///
/// `pv` is the VA's source PV from the cache, `csinode` the CSINode of `va.spec.nodeName`, and
/// `elapsed` the time since this process first saw the VA in its current [`phase`].
pub(super) fn plan_va(
    va: &VolumeAttachment,
    pv: Option<&PersistentVolume>,
    csinode: Option<&CSINode>,
    elapsed: Duration,
    cfg: &ControllerConfig,
) -> VaPlan {
    let driver = va.spec.attacher.as_str();
    if !is_sim_driver(driver) {
        return VaPlan::default();
    }
    let finalizer = attacher_finalizer(driver);
    let status = va.status.as_ref();
    let attached = status.is_some_and(|s| s.attached);

    if phase(va) == Phase::Detach {
        // ControllerUnpublish needs no node: it works the same for a dead node.
        if !has_finalizer(&va.metadata, &finalizer) && !attached {
            return VaPlan::default();
        }
        return match cfg
            .detach_delay
            .checked_sub(elapsed)
            .filter(|d| !d.is_zero())
        {
            Some(remaining) => VaPlan::wait(remaining),
            None => VaPlan {
                steps: vec![VaStep::MarkDetached],
                requeue_after: None,
            },
        };
    }

    if attached {
        return VaPlan::default();
    }
    let error = |message: String| {
        let known = status
            .and_then(|s| s.attach_error.as_ref())
            .and_then(|e| e.message.as_ref());
        let steps = if known == Some(&message) {
            Vec::new()
        } else {
            vec![VaStep::SaveAttachError(message)]
        };
        VaPlan {
            steps,
            requeue_after: Some(ERROR_RETRY),
        }
    };
    let Some(pv_name) = va.spec.source.persistent_volume_name.as_deref() else {
        return error("sim-csi attaches only PersistentVolumes, not inline volumes".to_owned());
    };
    let Some(pv) = pv else {
        // The attach/detach controller only creates VAs for PVs that exist: our cache is behind.
        return VaPlan::wait(CACHE_RETRY);
    };
    if pv.metadata.deletion_timestamp.is_some() {
        return error(format!(
            "PersistentVolume {pv_name:?} is marked for deletion"
        ));
    }
    if pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_none_or(|c| c.driver != driver)
    {
        return error(format!(
            "PersistentVolume {pv_name:?} is not a {driver} volume"
        ));
    }
    let node = va.spec.node_name.as_str();
    let Some(node_id) = node_id(csinode, driver) else {
        return error(match csinode {
            Some(_) => format!("CSINode {node} does not contain driver {driver}"),
            None => format!("csinode.storage.k8s.io {node:?} not found"),
        });
    };

    let mut steps = Vec::new();
    if !has_finalizer(&pv.metadata, &finalizer) {
        steps.push(VaStep::AddPvFinalizer);
    }
    if !has_finalizer(&va.metadata, &finalizer)
        || va.annotations().get(NODE_ID_ANNOTATION).map(String::as_str) != Some(node_id)
    {
        steps.push(VaStep::PrepareVa {
            node_id: node_id.to_owned(),
        });
    }
    match cfg
        .attach_delay
        .checked_sub(elapsed)
        .filter(|d| !d.is_zero())
    {
        Some(remaining) => VaPlan {
            steps,
            requeue_after: Some(remaining),
        },
        None => {
            steps.push(VaStep::MarkAttached);
            VaPlan {
                steps,
                requeue_after: None,
            }
        }
    }
}

/// What to do with a PV's attacher finalizers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PvPlan {
    Nothing,
    /// The PV is being deleted but a VA still refers to it.
    Blocked,
    /// Remove these finalizers.
    Remove(Vec<String>),
}

/// external-attacher keeps its finalizer on a PV until the PV is being deleted and no VA
/// refers to it any more.
pub(super) fn plan_pv_finalizers<'a>(
    pv: &PersistentVolume,
    vas: impl IntoIterator<Item = &'a VolumeAttachment>,
) -> PvPlan {
    if pv.metadata.deletion_timestamp.is_none() {
        return PvPlan::Nothing;
    }
    let ours: Vec<String> = DRIVERS
        .iter()
        .map(|d| attacher_finalizer(d))
        .filter(|f| has_finalizer(&pv.metadata, f))
        .collect();
    if ours.is_empty() {
        return PvPlan::Nothing;
    }
    let name = pv.name_any();
    let used = vas
        .into_iter()
        .any(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name.as_str()));
    if used {
        PvPlan::Blocked
    } else {
        PvPlan::Remove(ours)
    }
}

struct Ctx {
    client: Client,
    cfg: ControllerConfig,
    volumes: Store<PersistentVolume>,
    attachments: Store<VolumeAttachment>,
    csinodes: Store<CSINode>,
    /// When this process first saw a VA (by UID) in a phase; the delays count from there.
    first_seen: Mutex<HashMap<(String, Phase), Instant>>,
}

impl Ctx {
    fn elapsed(&self, uid: &str, phase: Phase) -> Duration {
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.entry((uid.to_owned(), phase))
            .or_insert_with(Instant::now)
            .elapsed()
    }

    fn forget(&self, uid: &str, phase: Phase) {
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.remove(&(uid.to_owned(), phase));
    }
}

/// A merge patch of finalizers carrying the resourceVersion they were computed from, so a
/// concurrent change makes it fail (409) instead of being overwritten.
fn finalizers_patch(
    meta: &kube::api::ObjectMeta,
    finalizers: Vec<String>,
) -> Patch<serde_json::Value> {
    Patch::Merge(json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": meta.resource_version },
    }))
}

async fn reconcile_va(va: Arc<VolumeAttachment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if !is_sim_driver(&va.spec.attacher) {
        return Ok(Action::await_change());
    }
    let uid = va.uid().unwrap_or_default();
    let phase = phase(&va);
    if phase == Phase::Detach {
        // An attach that never finished leaves its timer behind.
        ctx.forget(&uid, Phase::Attach);
    }
    let pv = va
        .spec
        .source
        .persistent_volume_name
        .as_deref()
        .and_then(|name| ctx.volumes.get(&ObjectRef::new(name)));
    let csinode = ctx.csinodes.get(&ObjectRef::new(&va.spec.node_name));
    let plan = plan_va(
        &va,
        pv.as_deref(),
        csinode.as_deref(),
        ctx.elapsed(&uid, phase),
        &ctx.cfg,
    );

    let api = Api::<VolumeAttachment>::all(ctx.client.clone());
    let finalizer = attacher_finalizer(&va.spec.attacher);
    let name = va.name_any();
    let pp = PatchParams::default();
    let mut current = (*va).clone();
    for step in plan.steps {
        let res = match step {
            VaStep::AddPvFinalizer => {
                let Some(pv) = pv.as_deref() else { continue };
                let mut finalizers = pv.finalizers().to_vec();
                finalizers.push(finalizer.clone());
                Api::<PersistentVolume>::all(ctx.client.clone())
                    .patch(
                        &pv.name_any(),
                        &pp,
                        &finalizers_patch(&pv.metadata, finalizers),
                    )
                    .await
                    .map(|_| ())
            }
            VaStep::PrepareVa { node_id } => {
                let mut finalizers = current.finalizers().to_vec();
                if !finalizers.contains(&finalizer) {
                    finalizers.push(finalizer.clone());
                }
                let patch = Patch::Merge(json!({
                    "metadata": {
                        "finalizers": finalizers,
                        "annotations": { NODE_ID_ANNOTATION: node_id },
                        "resourceVersion": current.metadata.resource_version,
                    },
                }));
                api.patch(&name, &pp, &patch).await.map(|va| current = va)
            }
            VaStep::MarkAttached => {
                let patch = Patch::Merge(json!({
                    "status": {
                        "attached": true,
                        "attachmentMetadata": { "devicePath": format!("/dev/sim/{name}") },
                        "attachError": null,
                    },
                }));
                let res = api
                    .patch_status(&name, &pp, &patch)
                    .await
                    .map(|va| current = va);
                if res.is_ok() {
                    ctx.forget(&uid, Phase::Attach);
                    tracing::info!(va = %name, node = %va.spec.node_name, "attached");
                }
                res
            }
            VaStep::SaveAttachError(message) => {
                tracing::warn!(va = %name, %message, "cannot attach");
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                let patch = Patch::Merge(json!({
                    "status": { "attachError": { "message": message, "time": now } },
                }));
                api.patch_status(&name, &pp, &patch)
                    .await
                    .map(|va| current = va)
            }
            VaStep::MarkDetached => {
                let status = Patch::Merge(json!({
                    "status": { "attached": false, "detachError": null, "attachmentMetadata": null },
                }));
                let res = async {
                    current = api.patch_status(&name, &pp, &status).await?;
                    let finalizers = current
                        .finalizers()
                        .iter()
                        .filter(|f| **f != finalizer)
                        .cloned()
                        .collect();
                    api.patch(&name, &pp, &finalizers_patch(&current.metadata, finalizers))
                        .await
                }
                .await;
                match res {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
                ctx.forget(&uid, Phase::Detach);
                tracing::info!(va = %name, node = %va.spec.node_name, "detached");
                Ok(())
            }
        };
        match res {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(plan
        .requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

async fn reconcile_pv(pv: Arc<PersistentVolume>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let vas = ctx.attachments.state();
    match plan_pv_finalizers(&pv, vas.iter().map(|va| &**va)) {
        PvPlan::Nothing => Ok(Action::await_change()),
        // The VA cache is a different watch from the one that triggered us: look again soon
        // rather than trust that a later VA event will arrive.
        PvPlan::Blocked => Ok(Action::requeue(ERROR_RETRY)),
        PvPlan::Remove(ours) => {
            let finalizers = pv
                .finalizers()
                .iter()
                .filter(|f| !ours.contains(f))
                .cloned()
                .collect();
            let api = Api::<PersistentVolume>::all(ctx.client.clone());
            match api
                .patch(
                    &pv.name_any(),
                    &PatchParams::default(),
                    &finalizers_patch(&pv.metadata, finalizers),
                )
                .await
            {
                Ok(_) => tracing::info!(pv = %pv.name_any(), "removed attacher finalizer"),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
    }
}

fn retry<K>(_: Arc<K>, err: &Error, _: Arc<Ctx>) -> Action {
    // Our finalizer patches carry a resourceVersion; a conflict only means our cache was a
    // little behind, so look again at once rather than delay the attach.
    if err.is_conflict() {
        tracing::debug!(error = %err, "attacher: conflict, retrying");
        return Action::requeue(CONFLICT_RETRY);
    }
    tracing::warn!(error = %err, "attacher: retrying");
    Action::requeue(ERROR_RETRY)
}

/// Runs the VA and PV loops; returns when one of them ends.
pub(super) async fn run(client: Client, cfg: ControllerConfig) -> anyhow::Result<()> {
    let (csinodes, writer) = reflector::store();
    let csinode_watch = watcher(
        Api::<CSINode>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .for_each(|ev| {
        if let Err(e) = ev {
            tracing::warn!(error = %e, "csinode watch");
        }
        futures::future::ready(())
    });
    let pv_controller = Controller::new(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<VolumeAttachment>::all(client.clone()),
        watcher::Config::default(),
        |va| {
            va.spec
                .source
                .persistent_volume_name
                .map(|pv| ObjectRef::<PersistentVolume>::new(&pv))
        },
    );
    let va_controller = Controller::new(
        Api::<VolumeAttachment>::all(client.clone()),
        watcher::Config::default(),
    );
    let ctx = Arc::new(Ctx {
        client,
        cfg,
        volumes: pv_controller.store(),
        attachments: va_controller.store(),
        csinodes: csinodes.clone(),
        first_seen: Mutex::default(),
    });
    let volumes = ctx.volumes.clone();
    let vas = {
        let ctx = ctx.clone();
        async move {
            // Attach decisions read both caches; an empty one would look like missing objects.
            csinodes.wait_until_ready().await?;
            volumes.wait_until_ready().await?;
            va_controller
                .run(reconcile_va, retry, ctx)
                .for_each(|res| {
                    if let Err(e) = res {
                        tracing::debug!(error = %e, "volume attachment loop");
                    }
                    futures::future::ready(())
                })
                .await;
            anyhow::Ok(())
        }
    };
    let pvs = pv_controller.run(reconcile_pv, retry, ctx).for_each(|res| {
        if let Err(e) = res {
            tracing::debug!(error = %e, "attacher volume loop");
        }
        futures::future::ready(())
    });
    tokio::select! {
        () = csinode_watch => anyhow::bail!("csinode watch ended"),
        res = vas => res.and(Err(anyhow::anyhow!("volume attachment loop ended"))),
        () = pvs => anyhow::bail!("attacher volume loop ended"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{
        core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec},
        storage::v1::{
            CSINodeDriver, CSINodeSpec, VolumeAttachmentSource, VolumeAttachmentSpec,
            VolumeAttachmentStatus, VolumeError,
        },
    };
    use kube::api::ObjectMeta;

    use super::*;
    use crate::csi::{OTHER_DRIVER, RWO_DRIVER};

    const CFG: ControllerConfig = ControllerConfig {
        attach_delay: Duration::from_secs(2),
        detach_delay: Duration::from_secs(3),
    };
    const FIN: &str = "external-attacher/rwo-sim-podha-io";

    fn va(driver: &str) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some("csi-abc".into()),
                ..ObjectMeta::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: driver.into(),
                node_name: "node-1".into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some("pvc-1".into()),
                    ..VolumeAttachmentSource::default()
                },
            },
            status: None,
        }
    }

    fn prepared(mut va: VolumeAttachment) -> VolumeAttachment {
        va.metadata.finalizers = Some(vec![FIN.into()]);
        va.metadata.annotations =
            Some([(NODE_ID_ANNOTATION.to_owned(), "node-1".to_owned())].into());
        va
    }

    fn attached(mut va: VolumeAttachment) -> VolumeAttachment {
        va.status = Some(VolumeAttachmentStatus {
            attached: true,
            ..Default::default()
        });
        va
    }

    fn deleting(mut va: VolumeAttachment) -> VolumeAttachment {
        va.metadata.deletion_timestamp = Some(crate::csi::tests::epoch());
        va
    }

    fn pv(driver: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: driver.into(),
                    volume_handle: "h".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn pv_with_finalizer() -> PersistentVolume {
        let mut pv = pv(RWO_DRIVER);
        pv.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into(), FIN.into()]);
        pv
    }

    fn csinode(drivers: &[&str]) -> CSINode {
        CSINode {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                ..ObjectMeta::default()
            },
            spec: CSINodeSpec {
                drivers: drivers
                    .iter()
                    .map(|d| CSINodeDriver {
                        name: (*d).into(),
                        node_id: "node-1".into(),
                        ..Default::default()
                    })
                    .collect(),
            },
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn new_attachment_gets_finalizers_then_attached_after_the_delay() {
        let node = csinode(&[RWO_DRIVER, OTHER_DRIVER]);
        let plan = plan_va(
            &va(RWO_DRIVER),
            Some(&pv(RWO_DRIVER)),
            Some(&node),
            secs(0),
            &CFG,
        );
        assert_eq!(
            plan,
            VaPlan {
                steps: vec![
                    VaStep::AddPvFinalizer,
                    VaStep::PrepareVa {
                        node_id: "node-1".into()
                    }
                ],
                requeue_after: Some(secs(2)),
            }
        );
        let plan = plan_va(
            &prepared(va(RWO_DRIVER)),
            Some(&pv_with_finalizer()),
            Some(&node),
            secs(1),
            &CFG,
        );
        assert_eq!(
            plan,
            VaPlan {
                steps: vec![],
                requeue_after: Some(secs(1))
            }
        );
        let plan = plan_va(
            &prepared(va(RWO_DRIVER)),
            Some(&pv_with_finalizer()),
            Some(&node),
            secs(2),
            &CFG,
        );
        assert_eq!(
            plan,
            VaPlan {
                steps: vec![VaStep::MarkAttached],
                requeue_after: None
            }
        );
    }

    #[test]
    fn zero_delay_does_everything_at_once() {
        let cfg = ControllerConfig {
            attach_delay: Duration::ZERO,
            detach_delay: Duration::ZERO,
        };
        let node = csinode(&[RWO_DRIVER]);
        let plan = plan_va(
            &va(RWO_DRIVER),
            Some(&pv(RWO_DRIVER)),
            Some(&node),
            secs(0),
            &cfg,
        );
        assert_eq!(plan.steps.last(), Some(&VaStep::MarkAttached));
        assert_eq!(plan.steps.len(), 3);
        let plan = plan_va(
            &deleting(prepared(va(RWO_DRIVER))),
            None,
            None,
            secs(0),
            &cfg,
        );
        assert_eq!(plan.steps, vec![VaStep::MarkDetached]);
    }

    #[test]
    fn attached_and_foreign_attachments_need_nothing() {
        let node = csinode(&[RWO_DRIVER]);
        let done = attached(prepared(va(RWO_DRIVER)));
        assert_eq!(
            plan_va(
                &done,
                Some(&pv_with_finalizer()),
                Some(&node),
                secs(9),
                &CFG
            ),
            VaPlan::default()
        );
        assert_eq!(
            plan_va(&va("ebs.csi.aws.com"), None, None, secs(9), &CFG),
            VaPlan::default()
        );
    }

    #[test]
    fn attach_needs_the_driver_registered_on_the_node() {
        let plan = plan_va(&va(RWO_DRIVER), Some(&pv(RWO_DRIVER)), None, secs(9), &CFG);
        assert_eq!(
            plan.steps,
            vec![VaStep::SaveAttachError(
                "csinode.storage.k8s.io \"node-1\" not found".into()
            )]
        );
        let node = csinode(&[OTHER_DRIVER]);
        let plan = plan_va(
            &va(RWO_DRIVER),
            Some(&pv(RWO_DRIVER)),
            Some(&node),
            secs(9),
            &CFG,
        );
        let msg = "CSINode node-1 does not contain driver rwo.sim.podha.io".to_owned();
        assert_eq!(plan.steps, vec![VaStep::SaveAttachError(msg.clone())]);
        assert_eq!(plan.requeue_after, Some(ERROR_RETRY));

        // The same error is not written twice.
        let mut known = va(RWO_DRIVER);
        known.status = Some(VolumeAttachmentStatus {
            attach_error: Some(VolumeError {
                message: Some(msg),
                ..Default::default()
            }),
            ..Default::default()
        });
        let plan = plan_va(&known, Some(&pv(RWO_DRIVER)), Some(&node), secs(9), &CFG);
        assert_eq!(
            plan,
            VaPlan {
                steps: vec![],
                requeue_after: Some(ERROR_RETRY)
            }
        );
    }

    #[test]
    fn attach_refuses_deleting_or_foreign_volumes_and_waits_for_the_cache() {
        let node = csinode(&[RWO_DRIVER]);
        let mut gone = pv(RWO_DRIVER);
        gone.metadata.deletion_timestamp = Some(crate::csi::tests::epoch());
        let plan = plan_va(&va(RWO_DRIVER), Some(&gone), Some(&node), secs(9), &CFG);
        assert!(
            matches!(&plan.steps[..], [VaStep::SaveAttachError(m)] if m.contains("marked for deletion"))
        );
        let plan = plan_va(
            &va(RWO_DRIVER),
            Some(&pv(OTHER_DRIVER)),
            Some(&node),
            secs(9),
            &CFG,
        );
        assert!(matches!(&plan.steps[..], [VaStep::SaveAttachError(_)]));
        let plan = plan_va(&va(RWO_DRIVER), None, Some(&node), secs(9), &CFG);
        assert_eq!(
            plan,
            VaPlan {
                steps: vec![],
                requeue_after: Some(CACHE_RETRY)
            }
        );
    }

    #[test]
    fn deleted_attachment_is_detached_after_the_delay_even_without_its_node() {
        let va = deleting(attached(prepared(va(RWO_DRIVER))));
        assert_eq!(
            plan_va(&va, None, None, secs(1), &CFG),
            VaPlan {
                steps: vec![],
                requeue_after: Some(secs(2))
            }
        );
        assert_eq!(
            plan_va(&va, None, None, secs(3), &CFG),
            VaPlan {
                steps: vec![VaStep::MarkDetached],
                requeue_after: None
            }
        );
        // Already detached by us: nothing left to do.
        let mut done = deleting(va.clone());
        done.metadata.finalizers = None;
        done.status = None;
        assert_eq!(plan_va(&done, None, None, secs(9), &CFG), VaPlan::default());
    }

    #[test]
    fn pv_finalizer_stays_until_deleted_and_unused() {
        let mut pv = pv_with_finalizer();
        let user = va(RWO_DRIVER);
        assert_eq!(plan_pv_finalizers(&pv, [&user]), PvPlan::Nothing);
        pv.metadata.deletion_timestamp = Some(crate::csi::tests::epoch());
        assert_eq!(plan_pv_finalizers(&pv, [&user]), PvPlan::Blocked);
        let mut other = va(RWO_DRIVER);
        other.spec.source.persistent_volume_name = Some("pvc-2".into());
        assert_eq!(
            plan_pv_finalizers(&pv, [&other]),
            PvPlan::Remove(vec![FIN.into()])
        );
        let mut without = pv.clone();
        without.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
        assert_eq!(plan_pv_finalizers(&without, []), PvPlan::Nothing);
    }
}
