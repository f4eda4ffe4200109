//! The provisioner: what external-provisioner does for a driver with `Immediate` StorageClasses.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{
        CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
        PersistentVolumeSpec,
    },
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, PostParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};

use super::{Error, PROVISIONED_BY_ANNOTATION, is_already_exists, is_not_found, is_sim_driver};

/// Legacy annotation that still takes precedence over `spec.storageClassName`.
const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";
/// How long to wait before looking again for a StorageClass that does not exist yet.
const MISSING_CLASS_RETRY: Duration = Duration::from_secs(5);
/// Retry period after a failed write.
const ERROR_RETRY: Duration = Duration::from_secs(2);

/// What to do with a claim.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ClaimPlan {
    /// Not ours, already bound, or not provisionable; the reason is for logs.
    Ignore(&'static str),
    /// The claim names a StorageClass that does not exist (yet).
    WaitForClass(String),
    /// Create this PV (pre-bound to the claim).
    Provision(Box<PersistentVolume>),
}

/// The StorageClass a claim asks for, if any.
pub(super) fn claim_class(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.annotations()
        .get(BETA_STORAGE_CLASS_ANNOTATION)
        .map(String::as_str)
        .or_else(|| pvc.spec.as_ref()?.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
}

/// Name of the PV provisioned for a claim (as external-provisioner's default `pvc-<uid>`).
pub(super) fn pv_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// Decides whether `pvc` needs a PV; `class` is the StorageClass named by [`claim_class`], if it
/// exists.
pub(super) fn plan_claim(pvc: &PersistentVolumeClaim, class: Option<&StorageClass>) -> ClaimPlan {
    let Some(spec) = pvc.spec.as_ref() else {
        return ClaimPlan::Ignore("no spec");
    };
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return ClaimPlan::Ignore("already has a volume");
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return ClaimPlan::Ignore("being deleted");
    }
    let Some(class_name) = claim_class(pvc) else {
        return ClaimPlan::Ignore("no storage class");
    };
    let Some(sc) = class.filter(|sc| sc.name_any() == class_name) else {
        return ClaimPlan::WaitForClass(class_name.to_owned());
    };
    if !is_sim_driver(&sc.provisioner) {
        return ClaimPlan::Ignore("storage class of another provisioner");
    }
    // external-provisioner refuses claims with a selector ("claim Selector is not supported").
    if spec.selector.is_some() {
        return ClaimPlan::Ignore("selector is not supported");
    }
    let (Some(uid), Some(namespace)) = (pvc.uid(), pvc.namespace()) else {
        return ClaimPlan::Ignore("no uid or namespace");
    };
    let Some(storage) = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    else {
        return ClaimPlan::Ignore("no storage request");
    };
    let volume_mode = spec
        .volume_mode
        .clone()
        .unwrap_or_else(|| "Filesystem".to_owned());
    let fs_type = (volume_mode == "Filesystem").then(|| "ext4".to_owned());
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name(&uid)),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY_ANNOTATION.to_owned(),
                sc.provisioner.clone(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: Some(BTreeMap::from([("storage".to_owned(), storage.clone())])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some(namespace),
                name: Some(pvc.name_any()),
                uid: Some(uid.clone()),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: sc.provisioner.clone(),
                volume_handle: format!("sim-{uid}"),
                fs_type,
                ..CSIPersistentVolumeSource::default()
            }),
            mount_options: sc.mount_options.clone(),
            persistent_volume_reclaim_policy: Some(
                sc.reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".to_owned()),
            ),
            storage_class_name: Some(class_name.to_owned()),
            volume_mode: Some(volume_mode),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    };
    ClaimPlan::Provision(Box::new(pv))
}

/// Whether a PV is a released sim-csi volume whose reclaim policy says to delete it.
pub(super) fn should_delete(pv: &PersistentVolume) -> bool {
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let delete = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete");
    let ours = pv
        .annotations()
        .get(PROVISIONED_BY_ANNOTATION)
        .is_some_and(|p| is_sim_driver(p));
    released && delete && ours && pv.metadata.deletion_timestamp.is_none()
}

struct Ctx {
    client: Client,
    classes: Store<StorageClass>,
}

async fn reconcile_claim(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let class = claim_class(&pvc).and_then(|name| ctx.classes.get(&ObjectRef::new(name)));
    let plan = plan_claim(&pvc, class.as_deref());
    match plan {
        ClaimPlan::Ignore(_) => Ok(Action::await_change()),
        ClaimPlan::WaitForClass(class) => {
            tracing::debug!(pvc = %pvc.name_any(), %class, "storage class not found");
            Ok(Action::requeue(MISSING_CLASS_RETRY))
        }
        ClaimPlan::Provision(pv) => {
            let name = pv.name_any();
            match Api::<PersistentVolume>::all(ctx.client.clone())
                .create(&PostParams::default(), &pv)
                .await
            {
                Ok(_) => {
                    tracing::info!(pv = %name, pvc = %pvc.name_any(), ns = %pvc.namespace().unwrap_or_default(), "provisioned");
                }
                Err(e) if is_already_exists(&e) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
    }
}

async fn reconcile_volume(pv: Arc<PersistentVolume>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if should_delete(&pv) {
        let name = pv.name_any();
        match Api::<PersistentVolume>::all(ctx.client.clone())
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => tracing::info!(pv = %name, "deleted released volume"),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

fn retry<K>(_: Arc<K>, err: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(error = %err, "provisioner: retrying");
    Action::requeue(ERROR_RETRY)
}

/// Runs the claim and volume loops; returns when one of them ends.
pub(super) async fn run(client: Client) -> anyhow::Result<()> {
    let (classes, writer) = reflector::store();
    let class_watch = watcher(
        Api::<StorageClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .for_each(|ev| {
        if let Err(e) = ev {
            tracing::warn!(error = %e, "storage class watch");
        }
        futures::future::ready(())
    });
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        classes: classes.clone(),
    });
    let claims = {
        let ctx = ctx.clone();
        let client = client.clone();
        async move {
            // Without the classes every claim would look unprovisionable for a while.
            classes.wait_until_ready().await?;
            Controller::new(
                Api::<PersistentVolumeClaim>::all(client),
                watcher::Config::default(),
            )
            .run(reconcile_claim, retry, ctx)
            .for_each(|res| {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "claim loop");
                }
                futures::future::ready(())
            })
            .await;
            anyhow::Ok(())
        }
    };
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default(),
    )
    .run(reconcile_volume, retry, ctx)
    .for_each(|res| {
        if let Err(e) = res {
            tracing::debug!(error = %e, "volume loop");
        }
        futures::future::ready(())
    });
    tokio::select! {
        () = class_watch => anyhow::bail!("storage class watch ended"),
        res = claims => res.and(Err(anyhow::anyhow!("claim loop ended"))),
        () = volumes => anyhow::bail!("volume loop ended"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{
            PersistentVolumeClaimSpec, PersistentVolumeStatus, VolumeResourceRequirements,
        },
        apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector},
    };

    use super::*;
    use crate::csi::{OTHER_DRIVER, RWO_DRIVER};

    fn class(name: &str, provisioner: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            provisioner: provisioner.into(),
            reclaim_policy: Some("Delete".into()),
            volume_binding_mode: Some("Immediate".into()),
            ..StorageClass::default()
        }
    }

    fn classes() -> Vec<StorageClass> {
        vec![
            class("sim-rwo", RWO_DRIVER),
            class("sim-other", OTHER_DRIVER),
            class("gp", "ebs"),
        ]
    }

    fn claim(class: &str, modes: &[&str]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data-db-0".into()),
                namespace: Some("ns1".into()),
                uid: Some("u-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| (*m).to_owned()).collect()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                    ..VolumeResourceRequirements::default()
                }),
                storage_class_name: Some(class.into()),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        }
    }

    fn plan(pvc: &PersistentVolumeClaim) -> ClaimPlan {
        let classes = classes();
        let class = claim_class(pvc).and_then(|n| classes.iter().find(|c| c.name_any() == n));
        plan_claim(pvc, class)
    }

    fn provisioned(pvc: &PersistentVolumeClaim) -> PersistentVolume {
        match plan(pvc) {
            ClaimPlan::Provision(pv) => *pv,
            other => panic!("expected a PV, got {other:?}"),
        }
    }

    #[test]
    fn provisions_a_prebound_csi_volume() {
        let pv = provisioned(&claim("sim-rwo", &["ReadWriteOnce"]));
        assert_eq!(pv.name_any(), "pvc-u-1");
        assert_eq!(pv.annotations()[PROVISIONED_BY_ANNOTATION], RWO_DRIVER);
        let spec = pv.spec.unwrap();
        let csi = spec.csi.unwrap();
        assert_eq!(csi.driver, RWO_DRIVER);
        assert_eq!(csi.volume_handle, "sim-u-1");
        assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
        assert_eq!(spec.capacity.unwrap()["storage"], Quantity("1Gi".into()));
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(
            (
                claim_ref.namespace.as_deref(),
                claim_ref.name.as_deref(),
                claim_ref.uid.as_deref()
            ),
            (Some("ns1"), Some("data-db-0"), Some("u-1"))
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("sim-rwo"));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    }

    #[test]
    fn honours_every_access_mode_and_the_other_driver() {
        for modes in [
            &["ReadWriteOncePod"][..],
            &["ReadWriteMany"],
            &["ReadWriteOnce", "ReadOnlyMany"],
        ] {
            let pv = provisioned(&claim("sim-other", modes));
            let spec = pv.spec.unwrap();
            assert_eq!(spec.access_modes.unwrap(), modes.to_vec());
            assert_eq!(spec.csi.unwrap().driver, OTHER_DRIVER);
        }
    }

    #[test]
    fn block_claims_get_block_volumes_without_fs_type() {
        let mut pvc = claim("sim-rwo", &["ReadWriteOnce"]);
        pvc.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let spec = provisioned(&pvc).spec.unwrap();
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(spec.csi.unwrap().fs_type, None);
    }

    #[test]
    fn beta_annotation_wins_over_spec_class() {
        let mut pvc = claim("gp", &["ReadWriteOnce"]);
        pvc.metadata.annotations = Some(BTreeMap::from([(
            BETA_STORAGE_CLASS_ANNOTATION.into(),
            "sim-rwo".into(),
        )]));
        assert_eq!(
            provisioned(&pvc)
                .spec
                .unwrap()
                .storage_class_name
                .as_deref(),
            Some("sim-rwo")
        );
    }

    #[test]
    fn leaves_other_claims_alone() {
        let bound = {
            let mut c = claim("sim-rwo", &["ReadWriteOnce"]);
            c.spec.as_mut().unwrap().volume_name = Some("pv-x".into());
            c
        };
        let deleting = {
            let mut c = claim("sim-rwo", &["ReadWriteOnce"]);
            c.metadata.deletion_timestamp = Some(crate::csi::tests::epoch());
            c
        };
        let with_selector = {
            let mut c = claim("sim-rwo", &["ReadWriteOnce"]);
            c.spec.as_mut().unwrap().selector = Some(LabelSelector::default());
            c
        };
        let no_class = {
            let mut c = claim("sim-rwo", &["ReadWriteOnce"]);
            c.spec.as_mut().unwrap().storage_class_name = None;
            c
        };
        for pvc in [
            bound,
            deleting,
            with_selector,
            no_class,
            claim("gp", &["ReadWriteOnce"]),
        ] {
            assert!(matches!(plan(&pvc), ClaimPlan::Ignore(_)), "{pvc:?}");
        }
        assert_eq!(
            plan(&claim("later", &["ReadWriteOnce"])),
            ClaimPlan::WaitForClass("later".into())
        );
    }

    fn volume(phase: &str, policy: &str, by: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-u-1".into()),
                annotations: by
                    .map(|b| BTreeMap::from([(PROVISIONED_BY_ANNOTATION.into(), b.into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some(policy.into()),
                ..PersistentVolumeSpec::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn deletes_only_released_delete_volumes_of_ours() {
        assert!(should_delete(&volume(
            "Released",
            "Delete",
            Some(RWO_DRIVER)
        )));
        assert!(should_delete(&volume(
            "Released",
            "Delete",
            Some(OTHER_DRIVER)
        )));
        assert!(!should_delete(&volume("Bound", "Delete", Some(RWO_DRIVER))));
        assert!(!should_delete(&volume(
            "Released",
            "Retain",
            Some(RWO_DRIVER)
        )));
        assert!(!should_delete(&volume(
            "Released",
            "Delete",
            Some("ebs.csi.aws.com")
        )));
        assert!(!should_delete(&volume("Released", "Delete", None)));
        let mut deleting = volume("Released", "Delete", Some(RWO_DRIVER));
        deleting.metadata.deletion_timestamp = Some(crate::csi::tests::epoch());
        assert!(!should_delete(&deleting));
    }
}
