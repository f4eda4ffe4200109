//! One failover, measured from outside through the API: after a fault hits the node of a pod
//! with volumes, every visible step until a replacement runs on another node with its volumes
//! attached there is timestamped from the fault. `podha chaos`, `podha-sim demo` and the
//! failover benchmark all measure with this module.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::api::{FENCE_TAINT_KEY, OUT_OF_SERVICE_TAINT_KEY};
use crate::contract::FENCE_REQUEST_ANNOTATION;
use crate::eligibility::claim_names;

/// How often the API is read while a failover runs.
const POLL: Duration = Duration::from_millis(100);

/// One step of a failover and when it was first seen, relative to the fault.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// `notready`, `taint`, `fenced`, `marked` (by podha), `kcm-marked`, `deleted`, `detached`,
    /// `scheduled`, `attached`, `running`.
    pub key: &'static str,
    pub what: String,
    pub at: Duration,
}

/// Everything seen of one failover.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// What happened at 0 s, e.g. `node node-2 killed (SIGKILL)`.
    pub fault: String,
    pub node: String,
    /// The node the replacement runs on, once it does.
    pub target: Option<String>,
    pub steps: Vec<Step>,
    /// Replacement Running on another node with its volumes attached there.
    pub recovered: Option<Duration>,
    /// How long the failover was followed.
    pub waited: Duration,
}

/// The phases of a failover, read from outside: detect = fault → podha's first visible action
/// (taint or fence, pod marked NotReady by podha, or pod deleted); act = that → old pod
/// deleted; detach = deleted → volumes detached from the failed node; recover = detached →
/// replacement Running with its volumes attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Detect,
    Act,
    Detach,
    Recover,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Detect, Phase::Act, Phase::Detach, Phase::Recover];

    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Detect => "detect",
            Phase::Act => "act",
            Phase::Detach => "detach",
            Phase::Recover => "recover",
        }
    }
}

/// One phase's extent, from the fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub phase: Phase,
    pub start: Duration,
    pub end: Duration,
}

impl Span {
    pub fn duration(&self) -> Duration {
        self.end - self.start
    }
}

/// The steps that show podha acted: its taint or fence, its NotReady mark, or the deletion.
const FIRST_ACTIONS: [&str; 4] = ["taint", "fenced", "marked", "deleted"];

/// Beyond its first actions, what shows podha acted on a node it should have held: its request
/// for the node's fence (the agent, or a fence controller, then resets the node: no taint
/// needed), or a replacement scheduled. A BMC power-off podha makes itself is not seen from the
/// API.
const HOLD_BREAKERS: [&str; 2] = ["fence-requested", "scheduled"];

impl Timeline {
    /// When the step `key` was first seen.
    pub fn at(&self, key: &str) -> Option<Duration> {
        self.steps.iter().find(|s| s.key == key).map(|s| s.at)
    }

    /// When podha's first action was seen.
    pub fn first_action(&self) -> Option<Duration> {
        FIRST_ACTIONS.iter().filter_map(|k| self.at(k)).min()
    }

    /// The first step that breaks a hold: podha's first action, its request for a fence, or a
    /// replacement scheduled. `None` while podha holds.
    pub fn hold_broken(&self) -> Option<&Step> {
        self.steps
            .iter()
            .filter(|s| FIRST_ACTIONS.contains(&s.key) || HOLD_BREAKERS.contains(&s.key))
            .min_by_key(|s| s.at)
    }

    /// The phases that completed, in order; a phase ends where the next begins. A step seen
    /// before the one it follows (volumes detached before the pod was deleted, as under the
    /// out-of-service taint) gives an empty phase, never a negative one.
    pub fn spans(&self) -> Vec<Span> {
        let ends = [
            self.first_action(),
            self.at("deleted"),
            self.at("detached"),
            self.recovered,
        ];
        let mut out = Vec::new();
        let mut start = Duration::ZERO;
        for (phase, end) in Phase::ALL.into_iter().zip(ends) {
            let Some(end) = end else { break };
            let end = end.max(start);
            out.push(Span { phase, start, end });
            start = end;
        }
        out
    }

    /// How long `phase` took, when it completed.
    pub fn phase(&self, phase: Phase) -> Option<Duration> {
        self.spans()
            .iter()
            .find(|s| s.phase == phase)
            .map(Span::duration)
    }
}

/// The pod a fault is aimed at, as it ran before: Running and Ready, every claim bound and
/// every volume attached on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub namespace: String,
    /// Label selector of the workload's pods (a replacement is one of them).
    pub selector: String,
    pub pod: String,
    pub uid: String,
    pub node: String,
    pub claims: Vec<String>,
    /// PersistentVolume names, one per claim.
    pub volumes: Vec<String>,
}

/// Waits until some pod matching `selector` in `namespace` is Running and Ready with all its
/// volumes attached on its node, and returns the first such pod (by name). `None` when none is
/// within `timeout`.
pub async fn wait_settled(
    client: &Client,
    namespace: &str,
    selector: &str,
    timeout: Duration,
) -> Result<Option<Subject>, kube::Error> {
    let started = Instant::now();
    loop {
        if let Some(subject) = settled(client, namespace, selector).await? {
            return Ok(Some(subject));
        }
        if started.elapsed() > timeout {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn settled(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<Option<Subject>, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let mut list = pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items;
    list.sort_by_key(|p| p.name_any());
    let vas = list_vas(client).await?;
    for pod in list {
        let Some(node) = node_of(&pod) else { continue };
        let claims = claim_names(&pod);
        if !running_ready(&pod) || pod.metadata.deletion_timestamp.is_some() || claims.is_empty() {
            continue;
        }
        let mut volumes = Vec::new();
        for claim in &claims {
            let bound = claims_api
                .get_opt(claim)
                .await?
                .and_then(|c| c.spec?.volume_name)
                .filter(|v| !v.is_empty());
            match bound {
                Some(pv) if attached_on(&vas, &pv, &node) => volumes.push(pv),
                _ => break,
            }
        }
        if volumes.len() == claims.len() {
            return Ok(Some(Subject {
                namespace: namespace.to_string(),
                selector: selector.to_string(),
                pod: pod.name_any(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                node,
                claims,
                volumes,
            }));
        }
    }
    Ok(None)
}

/// Follows the failover of `subject` from `fault_at` (when the fault described by `fault` hit
/// its node) until a replacement runs on another node with its volumes attached, or `timeout`
/// after the fault. `on_step` sees each step as it is first seen.
pub async fn follow(
    client: &Client,
    subject: &Subject,
    fault: &str,
    fault_at: Instant,
    timeout: Duration,
    on_step: &mut dyn FnMut(&Step),
) -> Result<Timeline, kube::Error> {
    let mut rec = Recorder {
        timeline: Timeline {
            fault: fault.to_string(),
            node: subject.node.clone(),
            target: None,
            steps: Vec::new(),
            recovered: None,
            waited: Duration::ZERO,
        },
        seen: BTreeSet::new(),
        fault_at,
        on_step,
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &subject.namespace);
    while fault_at.elapsed() < timeout {
        rec.node(&nodes.get(&subject.node).await?);
        let workload = pods
            .list(&ListParams::default().labels(&subject.selector))
            .await?
            .items;
        rec.old_pod(&workload, subject);
        if rec.volumes_and_replacement(&list_vas(client).await?, &workload, subject) {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let mut timeline = rec.timeline;
    // The last poll may end a little past the timeout: the trial was followed for the timeout.
    timeline.waited = fault_at.elapsed().min(timeout);
    Ok(timeline)
}

/// The timeline being followed: each step is recorded (and shown) once, when first seen.
struct Recorder<'a> {
    timeline: Timeline,
    seen: BTreeSet<&'static str>,
    fault_at: Instant,
    on_step: &'a mut dyn FnMut(&Step),
}

impl Recorder<'_> {
    fn step(&mut self, key: &'static str, what: String) {
        if self.seen.insert(key) {
            let step = Step {
                key,
                what,
                at: self.fault_at.elapsed(),
            };
            (self.on_step)(&step);
            self.timeline.steps.push(step);
        }
    }

    /// What the control plane and podha did to the faulted node.
    fn node(&mut self, n: &Node) {
        let node = self.timeline.node.clone();
        if !node_ready(n) {
            self.step(
                "notready",
                format!("kube-controller-manager marks {node} NotReady"),
            );
        }
        if has_taint(n, OUT_OF_SERVICE_TAINT_KEY) {
            self.step("taint", format!("{node} tainted out-of-service"));
        }
        if n.annotations().contains_key(FENCE_REQUEST_ANNOTATION) {
            self.step(
                "fence-requested",
                format!("podha asks for {node}'s fence ({FENCE_REQUEST_ANNOTATION})"),
            );
        }
        if has_taint(n, FENCE_TAINT_KEY) {
            self.step(
                "fenced",
                format!("{node} fenced (podha.io/fenced:NoSchedule)"),
            );
        }
    }

    /// What became of the subject pod itself.
    fn old_pod(&mut self, workload: &[Pod], subject: &Subject) {
        let pod_name = subject.pod.as_str();
        match workload
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(subject.uid.as_str()))
        {
            // Who marked it: podha's reason is NodeFailed; kube-controller-manager's is not.
            Some(old) if ready_false(old, Some("NodeFailed")) => {
                self.step("marked", format!("{pod_name} marked NotReady by podha"));
            }
            Some(old) if ready_false(old, None) => self.step(
                "kcm-marked",
                format!("{pod_name} marked NotReady by kube-controller-manager"),
            ),
            Some(_) => {}
            None => self.step("deleted", format!("old {pod_name} deleted")),
        }
    }

    /// The subject's volumes and its replacement; true once the replacement runs on another
    /// node with every volume attached there (the failover is over).
    fn volumes_and_replacement(
        &mut self,
        vas: &[VolumeAttachment],
        workload: &[Pod],
        subject: &Subject,
    ) -> bool {
        let node = subject.node.as_str();
        let volumes = subject.volumes.join(", ");
        let of_subject: Vec<&VolumeAttachment> = vas
            .iter()
            .filter(|v| {
                v.spec
                    .source
                    .persistent_volume_name
                    .as_ref()
                    .is_some_and(|pv| subject.volumes.contains(pv))
            })
            .collect();
        if !of_subject.iter().any(|v| v.spec.node_name == node) {
            self.step("detached", format!("{volumes} detached from {node}"));
        }
        let Some(replacement) = replacement(workload, subject) else {
            return false;
        };
        let Some(target) = node_of(replacement) else {
            return false;
        };
        self.step("scheduled", format!("replacement scheduled on {target}"));
        let attached = subject
            .volumes
            .iter()
            .all(|pv| of_subject.iter().any(|v| is_attached(v, pv, &target)));
        if attached {
            self.step("attached", format!("{volumes} attached on {target}"));
        }
        if attached && running_ready(replacement) {
            self.step("running", format!("replacement Running on {target}"));
            self.timeline.recovered = Some(self.fault_at.elapsed());
            self.timeline.target = Some(target);
            return true;
        }
        false
    }
}

/// The subject's replacement: a live pod of the workload, not the subject itself, that mounts
/// the subject's claims and is bound to another node.
fn replacement<'a>(workload: &'a [Pod], subject: &Subject) -> Option<&'a Pod> {
    workload.iter().find(|p| {
        p.metadata.uid.as_deref() != Some(subject.uid.as_str())
            && p.metadata.deletion_timestamp.is_none()
            && node_of(p).is_some_and(|n| n != subject.node)
            && claim_names(p) == subject.claims
    })
}

/// The timeline as lines for a terminal.
pub fn render(timeline: &Timeline) -> String {
    let mut out = format!("  {:>7}  {}\n", "0.0s", timeline.fault);
    for s in &timeline.steps {
        out.push_str(&format!("  {:>6.1}s  {}\n", s.at.as_secs_f64(), s.what));
    }
    match timeline.recovered {
        Some(d) => out.push_str(&format!("  failover complete in {:.1}s\n", d.as_secs_f64())),
        None => out.push_str(&format!(
            "  not recovered within {:.0}s\n",
            timeline.waited.as_secs_f64()
        )),
    }
    out
}

async fn list_vas(client: &Client) -> Result<Vec<VolumeAttachment>, kube::Error> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    Ok(api.list(&ListParams::default()).await?.items)
}

fn attached_on(vas: &[VolumeAttachment], pv: &str, node: &str) -> bool {
    vas.iter().any(|v| is_attached(v, pv, node))
}

fn is_attached(va: &VolumeAttachment, pv: &str, node: &str) -> bool {
    va.spec.node_name == node
        && va.spec.source.persistent_volume_name.as_deref() == Some(pv)
        && va.status.as_ref().is_some_and(|s| s.attached)
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// Phase Running and condition Ready True.
pub fn running_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Ready condition False, with `reason` if given.
fn ready_false(pod: &Pod, reason: Option<&str>) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "False"
                    && (reason.is_none() || c.reason.as_deref() == reason)
            })
        })
}

/// The node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(steps: &[(&'static str, u64)], recovered: Option<u64>) -> Timeline {
        Timeline {
            fault: "node n1 killed".into(),
            node: "n1".into(),
            target: recovered.map(|_| "n2".into()),
            steps: steps
                .iter()
                .map(|&(key, s)| Step {
                    key,
                    what: key.to_string(),
                    at: Duration::from_secs(s),
                })
                .collect(),
            recovered: recovered.map(Duration::from_secs),
            waited: Duration::from_secs(recovered.unwrap_or(600)),
        }
    }

    #[test]
    fn phases_follow_the_steps() {
        let t = timeline(
            &[
                ("notready", 20),
                ("taint", 14),
                ("marked", 15),
                ("deleted", 16),
                ("detached", 18),
                ("running", 25),
            ],
            Some(25),
        );
        let secs = |p| t.phase(p).map(|d: Duration| d.as_secs());
        assert_eq!(t.first_action(), Some(Duration::from_secs(14)));
        assert_eq!(secs(Phase::Detect), Some(14));
        assert_eq!(secs(Phase::Act), Some(2));
        assert_eq!(secs(Phase::Detach), Some(2));
        assert_eq!(secs(Phase::Recover), Some(7));
    }

    #[test]
    fn a_detach_before_the_delete_is_an_empty_phase_and_missing_steps_end_the_spans() {
        let t = timeline(&[("taint", 10), ("detached", 11), ("deleted", 12)], None);
        let spans = t.spans();
        assert_eq!(spans.len(), 3, "{spans:?}");
        assert_eq!(spans[2].phase, Phase::Detach);
        assert_eq!(spans[2].duration(), Duration::ZERO);
        assert_eq!(t.phase(Phase::Recover), None);
        assert!(timeline(&[("notready", 30)], None).spans().is_empty());
    }

    #[test]
    fn render_lists_the_fault_every_step_and_the_outcome() {
        let done = render(&timeline(&[("taint", 14)], Some(25)));
        assert!(done.starts_with("     0.0s  node n1 killed\n"), "{done}");
        assert!(done.contains("   14.0s  taint\n"), "{done}");
        assert!(done.ends_with("failover complete in 25.0s\n"), "{done}");
        let not = render(&timeline(&[], None));
        assert!(not.ends_with("not recovered within 600s\n"), "{not}");
    }
}
