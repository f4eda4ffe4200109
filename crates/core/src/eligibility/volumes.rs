//! Which volumes make a pod worth moving: at least one claim, and every claim bound to a CSI
//! volume of a listed driver and access mode. A pod that mounts a volume podha does not manage
//! (a hostPath-backed PV, another driver) is left alone: deleting it would not bring that volume
//! along, and the replacement might start without its data.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::ResourceExt;

use super::SkipReason;
use crate::api::PodHAPolicySpec;
use crate::view::View;

/// Names of the PersistentVolumeClaims the pod mounts, in volume order, without duplicates.
/// A generic ephemeral volume (`ephemeral.volumeClaimTemplate`) is a claim named
/// `<pod>-<volume>` that the ephemeral volume controller creates for the pod: it behaves like
/// any other claim when the node dies.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let pod_name = pod.name_any();
    let mut names: Vec<String> = Vec::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    for volume in volumes {
        let name = if let Some(claim) = &volume.persistent_volume_claim {
            claim.claim_name.clone()
        } else if volume.ephemeral.is_some() {
            format!("{pod_name}-{}", volume.name)
        } else {
            continue;
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The PersistentVolumes behind the pod's claims, or why one of them disqualifies the pod.
/// Checks each claim in volume order: bound (`ClaimNotBound`), CSI (`VolumeNotCsi`), driver
/// (`DriverNotSelected`), access mode (`AccessModeNotSelected`); the first refusal wins.
pub(crate) fn check_volumes<'v>(
    spec: &PodHAPolicySpec,
    pod: &Pod,
    view: &'v View,
) -> Result<Vec<&'v PersistentVolume>, SkipReason> {
    let claims = claim_names(pod);
    if claims.is_empty() {
        return Err(SkipReason::NoPersistentVolumeClaim);
    }
    let namespace = pod.namespace().unwrap_or_default();
    claims
        .iter()
        .map(|claim| {
            let pv = bound_volume(view, &namespace, claim).ok_or(SkipReason::ClaimNotBound)?;
            check_volume(spec, pv)?;
            Ok(pv)
        })
        .collect()
}

/// The PV a claim is bound to. `None` when the claim is missing, not `Bound`, names no volume,
/// the volume is missing, or the volume says it belongs to another claim (a stale cache:
/// better to wait than to act on it).
pub(crate) fn bound_volume<'v>(
    view: &'v View,
    namespace: &str,
    claim: &str,
) -> Option<&'v PersistentVolume> {
    let pvc = view.pvc(namespace, claim)?;
    if pvc.status.as_ref()?.phase.as_deref() != Some("Bound") {
        return None;
    }
    let volume_name = pvc
        .spec
        .as_ref()?
        .volume_name
        .as_deref()
        .filter(|n| !n.is_empty())?;
    let pv = view.pv(volume_name)?;
    if let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        let same_claim = claim_ref.namespace.as_deref() == Some(namespace)
            && claim_ref.name.as_deref() == Some(claim);
        if !same_claim {
            return None;
        }
    }
    Some(pv)
}

fn check_volume(spec: &PodHAPolicySpec, pv: &PersistentVolume) -> Result<(), SkipReason> {
    let pv_spec = pv.spec.as_ref();
    let csi = pv_spec
        .and_then(|s| s.csi.as_ref())
        .ok_or(SkipReason::VolumeNotCsi)?;
    let drivers = &spec.volumes.drivers;
    if !drivers.is_empty() && !drivers.contains(&csi.driver) {
        return Err(SkipReason::DriverNotSelected);
    }
    // One listed mode among the PV's modes is enough. This is the A/D controller's own test
    // for "may not attach to two nodes" (any ReadWriteOnce/ReadWriteOncePod mode blocks a
    // second attachment), so a PV offering [ReadWriteOnce, ReadWriteMany] is exactly the
    // volume that strands a pod with the default list. A PV without access modes matches none.
    let pv_modes = pv_spec
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    let listed = spec
        .volumes
        .access_modes
        .iter()
        .any(|mode| pv_modes.iter().any(|m| m == mode.as_str()));
    if !listed {
        return Err(SkipReason::AccessModeNotSelected);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AccessMode::{ReadOnlyMany, ReadWriteMany, ReadWriteOnce, ReadWriteOncePod};
    use crate::test_builders::*;

    const RWO: &str = "rwo.sim.podha.io";
    const OTHER: &str = "other.sim.podha.io";

    #[test]
    fn claim_names_include_ephemeral_volumes_once() {
        let pod = mk_pod("ns", "db-0")
            .claim("data")
            .ephemeral("scratch")
            .claim("data")
            .empty_dir("tmp");
        assert_eq!(claim_names(&pod), ["data", "db-0-scratch"]);
        assert!(claim_names(&mk_pod("ns", "p").empty_dir("tmp")).is_empty());
    }

    #[test]
    fn volume_rules() {
        let pod = || mk_pod("ns", "db-0").owned_by_sts("db");
        let bound = |pv: &str| mk_pvc("ns", "data").bound_to(pv);
        type Case = (
            &'static str,
            Pod,
            Vec<Obj>,
            Result<Vec<&'static str>, SkipReason>,
        );
        let cases: Vec<Case> = vec![
            (
                "no volumes",
                pod(),
                vec![],
                Err(SkipReason::NoPersistentVolumeClaim),
            ),
            (
                "only an emptyDir",
                pod().empty_dir("tmp"),
                vec![],
                Err(SkipReason::NoPersistentVolumeClaim),
            ),
            (
                "bound rwo csi claim",
                pod().claim("data"),
                vec![bound("pv1").into(), mk_csi_pv("pv1", RWO).into()],
                Ok(vec!["pv1"]),
            ),
            (
                "claim missing",
                pod().claim("data"),
                vec![],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "claim pending",
                pod().claim("data"),
                vec![mk_pvc("ns", "data").into(), mk_csi_pv("pv1", RWO).into()],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "claim lost",
                pod().claim("data"),
                vec![
                    bound("pv1").phase("Lost").into(),
                    mk_csi_pv("pv1", RWO).into(),
                ],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "claim in another namespace",
                pod().claim("data"),
                vec![
                    mk_pvc("other", "data").bound_to("pv1").into(),
                    mk_csi_pv("pv1", RWO).into(),
                ],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "bound but volume missing from the view",
                pod().claim("data"),
                vec![bound("pv1").into()],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "volume claimed by another claim",
                pod().claim("data"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO).claimed_by("ns", "other").into(),
                ],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "volume claimed by this claim",
                pod().claim("data"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO).claimed_by("ns", "data").into(),
                ],
                Ok(vec!["pv1"]),
            ),
            (
                "not csi",
                pod().claim("data"),
                vec![bound("pv1").into(), mk_host_path_pv("pv1").into()],
                Err(SkipReason::VolumeNotCsi),
            ),
            (
                "rwx volume",
                pod().claim("data"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO).access_modes(&[ReadWriteMany]).into(),
                ],
                Err(SkipReason::AccessModeNotSelected),
            ),
            (
                "rwop volume",
                pod().claim("data"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO)
                        .access_modes(&[ReadWriteOncePod])
                        .into(),
                ],
                Ok(vec!["pv1"]),
            ),
            (
                "one listed mode among several is enough",
                pod().claim("data"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO)
                        .access_modes(&[ReadWriteMany, ReadWriteOnce])
                        .into(),
                ],
                Ok(vec!["pv1"]),
            ),
            (
                "no access modes at all",
                pod().claim("data"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO).access_modes(&[]).into(),
                ],
                Err(SkipReason::AccessModeNotSelected),
            ),
            (
                "ephemeral volume bound",
                pod().ephemeral("scratch"),
                vec![
                    mk_pvc("ns", "db-0-scratch").bound_to("pv9").into(),
                    mk_csi_pv("pv9", RWO).into(),
                ],
                Ok(vec!["pv9"]),
            ),
            (
                "ephemeral volume not created yet",
                pod().ephemeral("scratch"),
                vec![],
                Err(SkipReason::ClaimNotBound),
            ),
            (
                "every claim must qualify, not just one",
                pod().claim("data").claim("logs"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO).into(),
                    mk_pvc("ns", "logs").bound_to("pv2").into(),
                    mk_host_path_pv("pv2").into(),
                ],
                Err(SkipReason::VolumeNotCsi),
            ),
            (
                "two good claims",
                pod().claim("data").claim("logs"),
                vec![
                    bound("pv1").into(),
                    mk_csi_pv("pv1", RWO).into(),
                    mk_pvc("ns", "logs").bound_to("pv2").into(),
                    mk_csi_pv("pv2", OTHER).into(),
                ],
                Ok(vec!["pv1", "pv2"]),
            ),
        ];
        for (name, pod, objects, want) in cases {
            let view = view_with(objects);
            let got = check_volumes(&mk_spec(), &pod, &view)
                .map(|pvs| pvs.iter().map(|pv| pv.name_any()).collect::<Vec<_>>());
            let want = want.map(|names| names.iter().map(|n| n.to_string()).collect());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn drivers_and_modes_come_from_the_policy() {
        let pod = mk_pod("ns", "p").claim("data");
        let view = view_with([
            mk_pvc("ns", "data").bound_to("pv1").into(),
            mk_csi_pv("pv1", OTHER).access_modes(&[ReadOnlyMany]).into(),
        ]);
        let cases = [
            (
                "default rules refuse ROX",
                mk_spec(),
                Err(SkipReason::AccessModeNotSelected),
            ),
            (
                "driver not listed",
                mk_spec().drivers(&[RWO]).access_modes(&[ReadOnlyMany]),
                Err(SkipReason::DriverNotSelected),
            ),
            (
                "driver checked before mode",
                mk_spec().drivers(&[RWO]),
                Err(SkipReason::DriverNotSelected),
            ),
            (
                "driver listed",
                mk_spec()
                    .drivers(&[RWO, OTHER])
                    .access_modes(&[ReadOnlyMany]),
                Ok(()),
            ),
            (
                "empty drivers accept any",
                mk_spec().access_modes(&[ReadOnlyMany]),
                Ok(()),
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(
                check_volumes(&spec, &pod, &view).map(|_| ()),
                want,
                "{name}"
            );
        }
    }
}
