//! Pods that tolerate the taint podha fences their node with: left alone, and refusing the
//! out-of-service taint unless it leaves them alone for good.

use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::*;

/// `cluster(2)` with `pod` (its own claim `data-<name>` on a volume of `DRIVER`) on node-1.
fn with(pod: Pod) -> View {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let app = name.trim_end_matches("-0").to_string();
    cluster(2)
        .with(
            pod.on("node-1")
                .owned_by_sts(&app)
                .claim(&format!("data-{name}")),
        )
        .with(mk_pvc("ns", &format!("data-{name}")).bound_to(&format!("pv-{app}")))
        .with(mk_csi_pv(&format!("pv-{app}"), DRIVER))
}

fn plan_of(view: View) -> Plan {
    World::new(view)
        .policy("p", mk_spec())
        .fail("node-1")
        .plan()
}

fn tainted_out_of_service(plan: &Plan) -> bool {
    intent_names(plan)
        .iter()
        .any(|i| i.contains("taint node-1 node.kubernetes.io/out-of-service"))
}

#[test]
fn a_pod_tolerating_the_fence_is_left_alone_and_does_not_refuse_the_taint() {
    let every = Toleration {
        operator: Some("Exists".into()),
        ..Toleration::default()
    };
    let plan = plan_of(with(mk_pod("ns", "any-0").toleration(every)));
    assert_eq!(
        skip_reasons(&plan),
        vec![("ns/any-0".to_string(), "ToleratesFence")]
    );
    // It is not evicted by the out-of-service taint, nor detached: the taint may go on.
    assert_eq!(
        intent_names(&plan),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn a_pod_no_node_could_take_still_refuses_the_taint_whatever_it_tolerates() {
    // Only node-1 fits; it tolerates NoSchedule taints, not the out-of-service one (NoExecute),
    // which would evict it with no node to go to.
    let no_schedule = Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    };
    let pinned = mk_pod("ns", "pinned-0")
        .node_selector("kubernetes.io/hostname", "node-1")
        .toleration(no_schedule);
    let plan = plan_of(with(pinned));
    assert_eq!(
        skip_reasons(&plan),
        vec![("ns/pinned-0".to_string(), "NoTargetNode")]
    );
    assert!(!tainted_out_of_service(&plan), "{:?}", plan.intents);
}

#[test]
fn a_pod_tolerating_the_taint_for_a_while_refuses_it() {
    let for_a_minute = Toleration {
        key: Some(NodeTaint::OutOfService.key().into()),
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        toleration_seconds: Some(60),
        ..Toleration::default()
    };
    let plan = plan_of(with(mk_pod("ns", "slow-0").toleration(for_a_minute)));
    assert_eq!(
        skip_reasons(&plan),
        vec![("ns/slow-0".to_string(), "ToleratesFence")]
    );
    assert!(!tainted_out_of_service(&plan), "{:?}", plan.intents);
}
