//! Resource fit, as the scheduler's `NodeResourcesFit` sees it: the pod's CPU and memory
//! requests must fit in the node's allocatable minus what the pods already there request, and
//! the node must have room for one more pod. Anything podha cannot read (a malformed quantity)
//! makes the node not fit: the target check must never be more optimistic than the scheduler.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{milli_value, value};
use crate::view::View;

/// CPU in millicores and memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Requests {
    pub milli_cpu: u128,
    pub memory: u128,
}

impl Requests {
    fn add(self, other: Self) -> Self {
        Self {
            milli_cpu: self.milli_cpu.saturating_add(other.milli_cpu),
            memory: self.memory.saturating_add(other.memory),
        }
    }

    fn max(self, other: Self) -> Self {
        Self {
            milli_cpu: self.milli_cpu.max(other.milli_cpu),
            memory: self.memory.max(other.memory),
        }
    }
}

/// Reads `cpu` and `memory` from a resource list; absent means zero, malformed means `None`.
fn read(list: Option<&BTreeMap<String, Quantity>>) -> Option<Requests> {
    let get =
        |name: &str, parse: fn(&Quantity) -> Option<u128>| match list.and_then(|l| l.get(name)) {
            Some(q) => parse(q),
            None => Some(0),
        };
    Some(Requests {
        milli_cpu: get("cpu", milli_value)?,
        memory: get("memory", value)?,
    })
}

fn container_requests(container: &Container) -> Option<Requests> {
    read(
        container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()),
    )
}

/// What the scheduler charges a pod (`resourcehelper.PodRequests`): regular containers and
/// sidecars (init containers with `restartPolicy: Always`) run together; an ordinary init
/// container runs alone with the sidecars started before it; the pod needs the larger of the
/// two phases, plus its runtime-class overhead. Pod-level `resources.requests` replace the
/// container sums for the resources they name.
pub(crate) fn pod_requests(pod: &Pod) -> Option<Requests> {
    let Some(spec) = pod.spec.as_ref() else {
        return Some(Requests::default());
    };
    let mut running = Requests::default();
    for container in &spec.containers {
        running = running.add(container_requests(container)?);
    }
    let mut sidecars = Requests::default();
    let mut init_peak = Requests::default();
    for container in spec.init_containers.as_deref().unwrap_or_default() {
        let requests = container_requests(container)?;
        let during_init = if container.restart_policy.as_deref() == Some("Always") {
            running = running.add(requests);
            sidecars = sidecars.add(requests);
            sidecars
        } else {
            sidecars.add(requests)
        };
        init_peak = init_peak.max(during_init);
    }
    let mut total = running.max(init_peak);

    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    if let Some(list) = pod_level {
        let declared = read(Some(list))?;
        if list.contains_key("cpu") {
            total.milli_cpu = declared.milli_cpu;
        }
        if list.contains_key("memory") {
            total.memory = declared.memory;
        }
    }
    Some(total.add(read(spec.overhead.as_ref())?))
}

/// Phase Succeeded or Failed: the pod holds no resources any more.
fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// `pod` (or its replacement, which has the same requests) fits on `node` next to the
/// non-terminal pods the view already has there. A resource missing from the node's
/// allocatable counts as zero, as in the scheduler.
pub(crate) fn fits(pod: &Pod, node: &Node, view: &View) -> bool {
    let Some(wanted) = pod_requests(pod) else {
        return false;
    };
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let Some(capacity) = read(allocatable) else {
        return false;
    };
    let max_pods = match allocatable.and_then(|a| a.get("pods")) {
        Some(q) => match value(q) {
            Some(n) => n,
            None => return false,
        },
        None => 0,
    };

    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let mut used = Requests::default();
    let mut count: u128 = 0;
    for other in view.pods_on(node_name).iter().filter(|p| !is_terminal(p)) {
        let Some(requests) = pod_requests(other) else {
            return false;
        };
        used = used.add(requests);
        count += 1;
    }

    let room = |wanted: u128, capacity: u128, used: u128| {
        wanted == 0 || wanted <= capacity.saturating_sub(used)
    };
    count < max_pods
        && room(wanted.milli_cpu, capacity.milli_cpu, used.milli_cpu)
        && room(wanted.memory, capacity.memory, used.memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;

    const GI: u128 = 1 << 30;

    #[test]
    fn pod_requests_follow_the_scheduler() {
        let cases: Vec<(&str, Pod, Option<Requests>)> = vec![
            ("no requests", mk_pod("ns", "p"), Some(Requests::default())),
            (
                "containers add up",
                mk_pod("ns", "p")
                    .requests("500m", "1Gi")
                    .requests("250m", "1Gi"),
                Some(Requests {
                    milli_cpu: 750,
                    memory: 2 * GI,
                }),
            ),
            (
                "a big init container sets the peak",
                mk_pod("ns", "p")
                    .requests("500m", "1Gi")
                    .init_requests("2", "512Mi"),
                Some(Requests {
                    milli_cpu: 2000,
                    memory: GI,
                }),
            ),
            (
                "sidecars run with the containers and with later init containers",
                mk_pod("ns", "p")
                    .requests("500m", "1Gi")
                    .sidecar_requests("100m", "128Mi")
                    .init_requests("1", "0"),
                Some(Requests {
                    milli_cpu: 1100,
                    memory: GI + (128 << 20),
                }),
            ),
            (
                "pod-level requests replace the container sums",
                mk_pod("ns", "p")
                    .requests("500m", "1Gi")
                    .pod_level_requests(&[("cpu", "2")]),
                Some(Requests {
                    milli_cpu: 2000,
                    memory: GI,
                }),
            ),
            (
                "overhead is added",
                mk_pod("ns", "p")
                    .requests("500m", "1Gi")
                    .overhead("100m", "100Mi"),
                Some(Requests {
                    milli_cpu: 600,
                    memory: GI + (100 << 20),
                }),
            ),
            (
                "malformed request",
                mk_pod("ns", "p").requests("lots", "1Gi"),
                None,
            ),
        ];
        for (name, pod, want) in cases {
            assert_eq!(pod_requests(&pod), want, "{name}");
        }
    }

    #[test]
    fn fit() {
        // Every node offers 4 CPU, 16Gi and 110 pods unless the case says otherwise.
        let big = || mk_pod("ns", "new").requests("3", "8Gi");
        let neighbour = |name: &str| mk_pod("ns", name).on("n2").requests("2", "4Gi");
        let cases: Vec<(&str, Node, Vec<Pod>, Pod, bool)> = vec![
            ("empty node", mk_node("n2"), vec![], big(), true),
            (
                "exactly full",
                mk_node("n2"),
                vec![],
                mk_pod("ns", "p").requests("4", "16Gi"),
                true,
            ),
            (
                "cpu short",
                mk_node("n2"),
                vec![neighbour("a")],
                big(),
                false,
            ),
            (
                "memory short",
                mk_node("n2"),
                vec![mk_pod("ns", "a").on("n2").requests("0", "9Gi")],
                big(),
                false,
            ),
            (
                "terminal pods free their requests",
                mk_node("n2"),
                vec![
                    neighbour("a").phase("Succeeded"),
                    neighbour("b").phase("Failed"),
                ],
                big(),
                true,
            ),
            (
                "terminating pods still hold theirs",
                mk_node("n2"),
                vec![neighbour("a").terminating()],
                big(),
                false,
            ),
            (
                "pod count full",
                mk_node("n2").max_pods(1),
                vec![mk_pod("ns", "a").on("n2")],
                mk_pod("ns", "p"),
                false,
            ),
            (
                "pod count with room",
                mk_node("n2").max_pods(2),
                vec![mk_pod("ns", "a").on("n2")],
                mk_pod("ns", "p"),
                true,
            ),
            (
                "no allocatable: a pod without requests still needs a pod slot",
                mk_node("n2").no_allocatable(),
                vec![],
                mk_pod("ns", "p"),
                false,
            ),
            (
                "zero requests fit a node whose cpu is used up",
                mk_node("n2").allocatable("1", "1Gi"),
                vec![mk_pod("ns", "a").on("n2").requests("1", "1Gi")],
                mk_pod("ns", "p"),
                true,
            ),
            (
                "malformed allocatable",
                mk_node("n2").allocatable("four", "16Gi"),
                vec![],
                mk_pod("ns", "p"),
                false,
            ),
            (
                "malformed request of a neighbour",
                mk_node("n2"),
                vec![mk_pod("ns", "a").on("n2").requests("x", "1Gi")],
                mk_pod("ns", "p"),
                false,
            ),
        ];
        for (name, node, neighbours, pod, want) in cases {
            let mut objects: Vec<Obj> = vec![node.clone().into()];
            objects.extend(neighbours.into_iter().map(Obj::from));
            let view = view_with(objects);
            assert_eq!(fits(&pod, &node, &view), want, "{name}");
        }
    }
}
