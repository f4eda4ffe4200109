//! One trial against a live cluster: wait for the workload, judge it with podha's rules, note
//! the pods that must stay, inject the fault, follow the failover, check the bystanders,
//! restore the node and watch podha's taint go.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::core::{Selector, SelectorExt};
use kube::{Api, Client, ResourceExt};

use super::faults::{self, Fault, Vars};
use super::invariants::{Expect, Restore, TrialRecord};
use super::own_check;
use super::preflight::{Bystander, bystanders, hold_note, window_note};
use super::timeline::{Subject, follow, node_ready, wait_settled};
use super::{ChaosArgs, Error};
use crate::api::{FENCE_TAINT_KEY, OUT_OF_SERVICE_TAINT_KEY, TAINT_MARKER_ANNOTATION};
use crate::explain::{Snapshot, explain_pod};

/// The workload under test.
pub struct Workload {
    /// `statefulset` or `deployment`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub selector: Selector,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// What runs after a trial's failover: the expanded restore, data check and workload check
/// commands, if any.
pub struct After {
    pub restore: Option<String>,
    pub data_check: Option<String>,
    pub check: Option<String>,
}

/// Runs trial `k` up to the end of the failover, reporting progress one line at a time; returns
/// the record (without the restore and the data check) and what is to run after.
pub async fn run_trial(
    client: &Client,
    args: &ChaosArgs,
    fault: &Fault,
    workload: &Workload,
    k: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<(TrialRecord, After), Error> {
    let n = args.trials;
    progress(&format!(
        "trial {k}/{n}: waiting for {workload} to run with its volumes attached"
    ));
    let judged = judge_subject(client, args, workload, k, progress).await?;
    let Judged {
        subject,
        pod_key,
        policy,
        bystanders,
        ..
    } = &judged;
    let (inject, after) = commands(args, fault, &judged)?;
    let checks = check_before(client, args, subject, &after, k, progress).await?;
    progress(&format!(
        "trial {k}/{n}: {pod_key} on {} (policy {policy}), {} pod(s) there must stay; fault: {inject}",
        subject.node,
        bystanders.len()
    ));
    let fault_at = faults::run(&inject).await?;
    let mut show = |step: &super::timeline::Step| {
        progress(&format!(
            "  [{k}] {:>6.1}s  {}",
            step.at.as_secs_f64(),
            step.what
        ))
    };
    // A trial that should hold is followed through the hold; a replacement would end it early.
    let follow_for = match args.expect {
        Expect::Moved => args.timeout,
        Expect::Held => args.hold,
    };
    let timeline = follow(
        client,
        subject,
        &format!("fault: {inject}"),
        fault_at,
        follow_for,
        &mut show,
    )
    .await
    .map_err(|e| Error::kube("following the failover", e))?;
    let waited = timeline.waited.as_secs_f64();
    progress(&format!(
        "trial {k}/{n}: {}",
        match (args.expect, timeline.recovered, timeline.hold_broken()) {
            (_, Some(d), _) => format!("recovered in {:.1}s", d.as_secs_f64()),
            (Expect::Moved, None, _) => format!("not recovered within {waited:.0}s"),
            (Expect::Held, None, None) => format!("podha held for {waited:.0}s"),
            (Expect::Held, None, Some(s)) =>
                format!("podha acted {:.1}s after the fault", s.at.as_secs_f64()),
        }
    ));
    let lost = lost_bystanders(client, bystanders).await?;
    let Judged {
        pod_key,
        policy,
        bystanders,
        ..
    } = judged;
    let record = TrialRecord {
        trial: k,
        expect: args.expect,
        pod: pod_key,
        policy,
        fault_command: inject,
        timeline,
        bystanders,
        lost,
        restore: None,
        data: None,
        checks,
    };
    Ok((record, after))
}

/// The workload's own check before trial `k`'s fault, if there is one: a failure ends the
/// run before the fault, and so does a pod deleted or replaced while it ran (the fault is aimed
/// at the node judged before it).
async fn check_before(
    client: &Client,
    args: &ChaosArgs,
    subject: &Subject,
    after: &After,
    k: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<own_check::CheckRun>, Error> {
    let Some(command) = after.check.as_deref() else {
        return Ok(Vec::new());
    };
    let n = args.trials;
    let checked = own_check::run(
        own_check::When::Before,
        command.to_string(),
        args.check_timeout,
    )
    .await;
    progress(&format!("trial {k}/{n}: {}", checked.summary()));
    if !checked.passed() {
        return Err(Error::CheckFailedBefore {
            trial: k,
            summary: checked.summary(),
        });
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &subject.namespace);
    let now = pods
        .get_opt(&subject.pod)
        .await
        .map_err(|e| Error::kube(format!("reading pod {}", subject.pod), e))?;
    let still = now.as_ref().is_some_and(|p| {
        p.metadata.uid.as_deref() == Some(subject.uid.as_str())
            && p.metadata.deletion_timestamp.is_none()
            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(subject.node.as_str())
    });
    if !still {
        return Err(Error::Usage(format!(
            "{}/{} on {} was deleted or replaced while the check ran: trial {k} faulted nothing",
            subject.namespace, subject.pod, subject.node
        )));
    }
    Ok(vec![checked])
}

/// The workload's pod as podha's rules see it before the fault.
struct Judged {
    subject: Subject,
    /// `namespace/name`.
    pod_key: String,
    /// The policy that would move it.
    policy: String,
    /// The pods on its node that must keep their objects.
    bystanders: Vec<Bystander>,
    /// Its first claim's CSI volume handle, for `{volume}`.
    volume: Option<String>,
}

/// Waits for the workload's pod to run with its volumes attached and judges it with the
/// operator's own rules; a pod podha would not move ends the run before any fault.
async fn judge_subject(
    client: &Client,
    args: &ChaosArgs,
    workload: &Workload,
    k: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Judged, Error> {
    let selector = workload.selector.to_string();
    let subject = wait_settled(client, &workload.namespace, &selector, args.settle_timeout)
        .await
        .map_err(|e| Error::kube(format!("reading the pods of {workload}"), e))?
        .ok_or_else(|| Error::NotSettled {
            workload: workload.to_string(),
            waited: args.settle_timeout,
        })?;
    let pod_key = format!("{}/{}", subject.namespace, subject.pod);

    let snapshot =
        Snapshot::read(client, args.podha_namespace.as_deref(), &args.leader_lease).await?;
    let policies = snapshot.policy_refs();
    let pod = snapshot
        .view
        .pods_on(&subject.node)
        .iter()
        .find(|p| p.metadata.uid.as_deref() == Some(subject.uid.as_str()))
        .ok_or_else(|| Error::NotSettled {
            workload: workload.to_string(),
            waited: args.settle_timeout,
        })?;
    let explained = explain_pod(&snapshot.cluster(), pod);
    if let Some(refusal) = explained.first_failure() {
        return Err(Error::NotMovable {
            pod: pod_key,
            reason: refusal.detail.clone(),
        });
    }
    let policy = explained.policy.unwrap_or_default();
    if k == 1
        && let Some(note) = window_note(&policies, &snapshot.view, &subject.node, args.trials)
    {
        progress(&note);
    }
    if k == 1
        && args.expect == Expect::Held
        && let Some(note) = hold_note(&policies, &snapshot.view, &subject.node, args.hold)
    {
        progress(&note);
    }
    let of_workload = |p: &Pod| {
        p.namespace().as_deref() == Some(workload.namespace.as_str())
            && workload.selector.matches(p.labels())
    };
    let bystanders = bystanders(&policies, &snapshot.view, &subject.node, &of_workload);
    let volume = volume_handle(client, pod).await?;
    Ok(Judged {
        subject,
        pod_key,
        policy,
        bystanders,
        volume,
    })
}

/// The fault's inject command, and the restore and data check to run after, expanded for the
/// judged pod.
fn commands(args: &ChaosArgs, fault: &Fault, judged: &Judged) -> Result<(String, After), Error> {
    let subject = &judged.subject;
    let vars = Vars {
        node: subject.node.clone(),
        namespace: subject.namespace.clone(),
        pod: subject.pod.clone(),
        sim_dir: args.sim_dir.clone(),
        podha_sim: args.podha_sim.clone(),
        volume: judged.volume.clone(),
        podha_csi: args.podha_csi.clone(),
    };
    let data_check = args
        .data_check
        .as_deref()
        .map(|c| faults::expand(super::data::template(c), &vars))
        .transpose()?;
    let check = args
        .check
        .as_deref()
        .map(|c| faults::expand(c, &vars))
        .transpose()?;
    let inject = faults::expand(&fault.inject, &vars)?;
    let restore = fault
        .restore
        .as_deref()
        .map(|r| faults::expand(r, &vars))
        .transpose()?;
    Ok((
        inject,
        After {
            restore,
            data_check,
            check,
        },
    ))
}

/// The volume handle (`spec.csi.volumeHandle`) of the pod's first claim, if it is bound to a
/// CSI volume.
async fn volume_handle(client: &Client, pod: &Pod) -> Result<Option<String>, Error> {
    let Some(claim) = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find_map(|v| v.persistent_volume_claim.as_ref())
    else {
        return Ok(None);
    };
    let ns = pod.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let read = |what: String| move |e| Error::kube(what, e);
    let Some(volume) = claims
        .get_opt(&claim.claim_name)
        .await
        .map_err(read(format!("reading claim {ns}/{}", claim.claim_name)))?
        .and_then(|c| c.spec?.volume_name)
    else {
        return Ok(None);
    };
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    Ok(volumes
        .get_opt(&volume)
        .await
        .map_err(read(format!("reading volume {volume}")))?
        .and_then(|v| Some(v.spec?.csi?.volume_handle)))
}

/// Runs the restore command of trial `k` and watches the node come back without podha's taint.
pub async fn restore_node(
    client: &Client,
    args: &ChaosArgs,
    record: &TrialRecord,
    command: String,
    progress: &mut dyn FnMut(&str),
) -> Result<Restore, Error> {
    let (k, n, node) = (record.trial, args.trials, record.timeline.node.as_str());
    progress(&format!("trial {k}/{n}: restore: {command}"));
    let restored_at = faults::run(&command).await?;
    let seen = watch_untaint(client, node, restored_at, args.settle_timeout).await?;
    progress(&format!(
        "trial {k}/{n}: {}",
        match (seen.taint_gone, &seen.remaining_taint) {
            (Some(d), _) => format!(
                "{node} Ready without podha's taint {:.1}s after the restore",
                d.as_secs_f64()
            ),
            (None, Some(t)) => format!("{node} still carries podha's taint {t}"),
            (None, None) => format!("{node} did not come back Ready"),
        }
    ));
    Ok(Restore { command, ..seen })
}

/// The bystanders whose object is gone, or was replaced by another of the same name.
async fn lost_bystanders(
    client: &Client,
    bystanders: &[Bystander],
) -> Result<Vec<Bystander>, Error> {
    let mut lost = Vec::new();
    for b in bystanders {
        let api: Api<Pod> = Api::namespaced(client.clone(), &b.namespace);
        let now = api
            .get_opt(&b.name)
            .await
            .map_err(|e| Error::kube(format!("reading pod {}/{}", b.namespace, b.name), e))?;
        if now.and_then(|p| p.metadata.uid).as_deref() != Some(b.uid.as_str()) {
            lost.push(b.clone());
        }
    }
    Ok(lost)
}

/// podha's taint on `node`, if any: its fence, or an out-of-service taint it marked as its own.
fn podha_taint(node: &Node) -> Option<&'static str> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref())?;
    let has = |key: &str| taints.iter().any(|t| t.key == key);
    if has(FENCE_TAINT_KEY) {
        Some(FENCE_TAINT_KEY)
    } else if has(OUT_OF_SERVICE_TAINT_KEY)
        && node.annotations().contains_key(TAINT_MARKER_ANNOTATION)
    {
        Some(OUT_OF_SERVICE_TAINT_KEY)
    } else {
        None
    }
}

/// Polls `node` every second from `since` until it is Ready without podha's taint, or
/// `timeout` has passed.
async fn watch_untaint(
    client: &Client,
    node: &str,
    since: Instant,
    timeout: Duration,
) -> Result<Restore, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut seen = Restore {
        command: String::new(),
        node_ready: None,
        taint_gone: None,
        waited: Duration::ZERO,
        remaining_taint: None,
    };
    loop {
        let n = nodes
            .get(node)
            .await
            .map_err(|e| Error::kube(format!("reading node {node}"), e))?;
        let ready = node_ready(&n);
        if ready && seen.node_ready.is_none() {
            seen.node_ready = Some(since.elapsed());
        }
        seen.remaining_taint = podha_taint(&n).map(str::to_string);
        if ready && seen.remaining_taint.is_none() {
            seen.taint_gone = Some(since.elapsed());
        }
        seen.waited = since.elapsed();
        if seen.taint_gone.is_some() || seen.waited >= timeout {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
