use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::*;

/// A policy built from a JSON spec the way the API server would see it after defaulting.
fn policy(spec: Value) -> PodHAPolicy {
    let spec: PodHAPolicySpec = serde_json::from_value(spec).expect("test spec deserializes");
    PodHAPolicy::new("test", spec)
}

/// The CEL messages a spec is rejected with (empty when accepted).
fn cel_errors(spec: Value) -> Vec<String> {
    match policy(spec).validate_cel() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn empty_spec_gets_the_documented_defaults() {
    let spec = policy(json!({})).spec;
    assert_eq!(
        spec.owners,
        vec![OwnerKind::STATEFUL_SET, OwnerKind::DEPLOYMENT]
    );
    assert_eq!(spec.volumes.drivers, Vec::<String>::new());
    assert_eq!(
        spec.volumes.access_modes,
        vec![AccessMode::ReadWriteOnce, AccessMode::ReadWriteOncePod]
    );
    assert_eq!(spec.detection.interval, HumanDuration::from_secs(2));
    assert_eq!(spec.detection.failure_threshold, 3);
    assert_eq!(
        spec.detection.signals,
        vec![Signal::Lease, Signal::AgentHeartbeat]
    );
    assert_eq!(
        spec.detection.lease_grace_period,
        HumanDuration::from_secs(15)
    );
    assert_eq!(spec.detection.tcp_timeout, HumanDuration::from_secs(1));
    assert_eq!(spec.action, Action::OutOfServiceTaint);
    assert_eq!(spec.safety.max_unhealthy, IntOrString::String("30%".into()));
    assert!(spec.safety.require_target);
    assert_eq!(spec.safety.unhealthy_window, HumanDuration::from_secs(600));
    assert_eq!(spec.detach_timeout, HumanDuration::from_secs(390));
    assert!(!spec.dry_run);
    assert_eq!(spec.fencing.proof, FencingProof::Agent);
    assert_eq!(spec.fencing.agent_margin, HumanDuration::from_secs(4));
}

#[test]
fn good_specs_pass_every_cel_rule() {
    for spec in [
        json!({}),
        json!({"detection": {"interval": "1s", "failureThreshold": 1, "tcpTimeout": "500ms",
                             "signals": ["Lease", "KubeletTCP"], "leaseGracePeriod": "12s"}}),
        json!({"detection": {"signals": ["NodeReady"], "interval": "30s"}}),
        json!({"detection": {"signals": ["KubeletTCP", "NodeReady", "Lease"]}}),
        // The detection before the fast defaults: wait for the controller manager's NotReady.
        json!({"detection": {"signals": ["Lease", "NodeReady", "AgentHeartbeat"]}}),
        // The defaults written out.
        json!({"detection": {"interval": "2s", "failureThreshold": 3, "leaseGracePeriod": "15s",
                             "signals": ["Lease", "AgentHeartbeat"], "tcpTimeout": "1s"},
               "action": "OutOfServiceTaint", "fencing": {"proof": "Agent", "agentMargin": "4s"}}),
        json!({"safety": {"maxUnhealthy": 1}}),
        json!({"safety": {"maxUnhealthy": "100%"}}),
        json!({"safety": {"maxUnhealthy": "5%"}}),
        json!({"safety": {"maxUnhealthy": "4"}}),
        json!({"safety": {"unhealthyWindow": "0s"}}),
        json!({"safety": {"unhealthyWindow": "24h"}}),
        json!({"action": "OutOfServiceTaint", "dryRun": true, "detachTimeout": "1m"}),
        json!({"volumes": {"drivers": ["rwo.sim.podha.io"], "accessModes": ["ReadWriteOnce"]}}),
        json!({"owners": []}),
        json!({"fencing": {"proof": "BMC", "bmc": {"secretName": "bmc-{node}"}}}),
        json!({"fencing": {"proof": "BMC", "bmc": {"secretName": "rack1.{node}.bmc",
                                                   "powerCycle": true}}}),
        json!({"fencing": {"proof": "BMC", "bmc": {"secretNameLabel": "example.com/bmc",
                                                   "matchSystemUUID": false}}}),
        // Signals without the kubelet's heartbeat, each behind a confirmed proof.
        json!({"detection": {"signals": ["AgentHeartbeat"]},
               "fencing": {"proof": "AgentAcknowledged"}}),
        json!({"detection": {"signals": ["AgentHeartbeat", "KubeletTCP"]},
               "fencing": {"proof": "BMC", "bmc": {"secretName": "bmc-{node}"}}}),
        json!({"detection": {"signals": ["KubeletTCP"]}, "action": "OutOfServiceTaint",
               "fencing": {"proof": "External"}}),
        json!({"detection": {"signals": ["KubeletTCP"]},
               "fencing": {"proof": "CloudShutdownTaint"}}),
        json!({"detection": {"signals": ["KubeletTCP", "Lease"]}, "action": "DeletePods"}),
        // Combined proofs; without the kubelet's heartbeat, anyOf of confirmed proofs only,
        // allOf with at least one.
        json!({"fencing": {"proof": "AnyOf", "anyOf": ["Agent", "BMC"],
                           "bmc": {"secretName": "bmc-{node}"}}}),
        json!({"fencing": {"proof": "AllOf", "allOf": ["Agent", "CloudShutdownTaint"]}}),
        json!({"detection": {"signals": ["AgentHeartbeat"]},
               "fencing": {"proof": "AnyOf", "anyOf": ["AgentAcknowledged", "BMC"],
                           "bmc": {"secretName": "bmc-{node}"}}}),
        json!({"detection": {"signals": ["AgentHeartbeat", "KubeletTCP"]},
               "fencing": {"proof": "AllOf", "allOf": ["Agent", "BMC"],
                           "bmc": {"secretName": "bmc-{node}"}}}),
    ] {
        assert_eq!(
            cel_errors(spec.clone()),
            Vec::<String>::new(),
            "spec {spec} should pass"
        );
    }
}

#[test]
fn each_bad_spec_is_rejected_with_its_own_message() {
    let cases = [
        (
            json!({"detection": {"failureThreshold": 0}}),
            "failureThreshold must be at least 1",
        ),
        (
            json!({"detection": {"failureThreshold": -3}}),
            "failureThreshold must be at least 1",
        ),
        (
            json!({"detection": {"interval": "500ms", "tcpTimeout": "100ms"}}),
            "interval must be at least 1s",
        ),
        (
            json!({"detection": {"signals": []}}),
            "must name at least one signal",
        ),
        // Without the kubelet's heartbeat, only behind a confirmed proof of the taint: not
        // the default proof (the agent's silence counts), no proof, or no taint at all.
        (
            json!({"detection": {"signals": ["KubeletTCP"]}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"signals": ["KubeletTCP", "AgentHeartbeat"]},
                   "fencing": {"proof": "Agent"}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"signals": ["AgentHeartbeat"]}, "fencing": {"proof": "None"}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"signals": ["AgentHeartbeat"]}, "action": "DeletePods",
                   "fencing": {"proof": "AgentAcknowledged"}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"signals": ["KubeletTCP"]},
                   "fencing": {"proof": "BMC", "bmc": {"secretName": "bmc-{node}",
                                                       "matchSystemUUID": false}}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"interval": "2s", "tcpTimeout": "2s"}}),
            "tcpTimeout must be shorter than detection.interval",
        ),
        (
            json!({"detection": {"interval": "5s", "tcpTimeout": "10s"}}),
            "tcpTimeout must be shorter than detection.interval",
        ),
        (
            json!({"detection": {"tcpTimeout": "5ms"}}),
            "tcpTimeout must be at least 10ms",
        ),
        (
            json!({"safety": {"unhealthyWindow": "25h"}}),
            "unhealthyWindow must be at most 24h",
        ),
        (
            json!({"detection": {"leaseGracePeriod": "500ms"}}),
            "leaseGracePeriod must be at least 1s",
        ),
        (
            json!({"safety": {"maxUnhealthy": 0}}),
            "maxUnhealthy must be a count of at least 1",
        ),
        (
            json!({"safety": {"maxUnhealthy": -1}}),
            "maxUnhealthy must be a count of at least 1",
        ),
        (
            json!({"safety": {"maxUnhealthy": "0%"}}),
            "maxUnhealthy must be a count of at least 1",
        ),
        (
            json!({"safety": {"maxUnhealthy": "101%"}}),
            "maxUnhealthy must be a count of at least 1",
        ),
        (
            json!({"safety": {"maxUnhealthy": "thirty"}}),
            "maxUnhealthy must be a count of at least 1",
        ),
        (
            json!({"volumes": {"accessModes": []}}),
            "must list at least one access mode",
        ),
        (
            json!({"detachTimeout": "500ms"}),
            "detachTimeout must be at least 1s",
        ),
        (
            json!({"fencing": {"proof": "BMC"}}),
            "fencing.proof BMC needs fencing.bmc",
        ),
        (
            json!({"fencing": {"proof": "BMC", "bmc": {}}}),
            "exactly one of secretName and secretNameLabel",
        ),
        (
            json!({"fencing": {"proof": "BMC", "bmc": {"secretName": "bmc-{node}",
                                                       "secretNameLabel": "example.com/bmc"}}}),
            "exactly one of secretName and secretNameLabel",
        ),
        (
            json!({"fencing": {"proof": "BMC", "bmc": {"secretName": "BMC_{node}"}}}),
            "fencing.bmc.secretName must be a Secret name",
        ),
        (
            json!({"fencing": {"proof": "BMC", "bmc": {"secretName": "bmc-{node}-"}}}),
            "fencing.bmc.secretName must be a Secret name",
        ),
        (
            json!({"fencing": {"proof": "BMC", "bmc": {"secretNameLabel": "a b"}}}),
            "fencing.bmc.secretNameLabel must be a label key",
        ),
        (
            json!({"fencing": {"proof": "AnyOf"}}),
            "fencing.proof AnyOf goes with fencing.anyOf",
        ),
        (
            json!({"fencing": {"proof": "Agent", "allOf": ["Agent", "CloudShutdownTaint"]}}),
            "fencing.proof AllOf goes with fencing.allOf",
        ),
        (
            json!({"fencing": {"proof": "AnyOf", "anyOf": ["Agent", "None"]}}),
            "fencing.anyOf lists proofs that prove something",
        ),
        (
            json!({"fencing": {"proof": "AllOf", "allOf": ["Agent", "AnyOf"]}}),
            "fencing.allOf lists proofs that prove something",
        ),
        (
            json!({"fencing": {"proof": "AnyOf", "anyOf": ["AgentAcknowledged", "External"]}}),
            "at most one of Agent, AgentAcknowledged and External",
        ),
        (
            json!({"fencing": {"proof": "AnyOf", "anyOf": ["AgentAcknowledged", "BMC"]}}),
            "fencing.proof BMC needs fencing.bmc",
        ),
        // Without the kubelet's heartbeat: an anyOf whose silence-proven member could prove
        // the fence alone, an allOf of nothing confirmed, a BMC that binds no machine.
        (
            json!({"detection": {"signals": ["AgentHeartbeat"]},
                   "fencing": {"proof": "AnyOf", "anyOf": ["Agent", "BMC"],
                               "bmc": {"secretName": "bmc-{node}"}}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"signals": ["KubeletTCP"]},
                   "fencing": {"proof": "AnyOf", "anyOf": ["AgentAcknowledged", "BMC"],
                               "bmc": {"secretName": "bmc-{node}", "matchSystemUUID": false}}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
        (
            json!({"detection": {"signals": ["KubeletTCP"]},
                   "fencing": {"proof": "AllOf", "allOf": ["Agent", "BMC"],
                               "bmc": {"secretName": "bmc-{node}", "matchSystemUUID": false}}}),
            "need action OutOfServiceTaint and a confirmed fencing proof",
        ),
    ];
    for (spec, expected) in cases {
        let errors = cel_errors(spec.clone());
        assert_eq!(
            errors.len(),
            1,
            "spec {spec}: expected exactly one error, got {errors:?}"
        );
        assert!(
            errors[0].contains(expected),
            "spec {spec}: {errors:?} should mention {expected:?}"
        );
    }
}

#[test]
fn several_mistakes_are_all_reported() {
    let errors = cel_errors(json!({
        "detection": {"failureThreshold": 0, "signals": ["KubeletTCP"]},
        "safety": {"maxUnhealthy": "0%"},
    }));
    assert_eq!(errors.len(), 3, "{errors:?}");
}

/// Rules the schema enforces outside CEL: the API server rejects these through `enum` and
/// `pattern`, so the generated schema must carry them.
#[test]
fn schema_carries_enums_patterns_and_list_types() {
    let crd = serde_json::to_value(PodHAPolicy::crd()).expect("CRD serializes");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let props = &spec["properties"];
    let detection = &props["detection"]["properties"];
    assert_eq!(
        detection["signals"]["items"]["enum"],
        json!(["Lease", "NodeReady", "KubeletTCP", "AgentHeartbeat"])
    );
    assert_eq!(detection["signals"]["x-kubernetes-list-type"], "set");
    assert_eq!(detection["interval"]["pattern"], DURATION_PATTERN);
    assert_eq!(props["owners"]["items"]["type"], "string");
    assert_eq!(props["owners"]["maxItems"], 32);
    assert_eq!(props["owners"]["x-kubernetes-list-type"], "set");
    assert_eq!(
        props["action"]["enum"],
        json!(["DeletePods", "OutOfServiceTaint"])
    );
    assert_eq!(
        props["safety"]["properties"]["maxUnhealthy"]["x-kubernetes-int-or-string"],
        true
    );
    assert_eq!(props["detection"]["default"]["interval"], "2s");
}

#[test]
fn crd_has_validations_printer_columns_and_status() {
    let crd = PodHAPolicy::crd();
    assert_eq!(crd.spec.group, "podha.io");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.short_names, Some(vec!["pha".to_string()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    let columns: Vec<_> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Action",
            "Paused",
            "Dry-Run",
            "Watched",
            "Failed",
            "Protected",
            "Unprotected",
            "Ready",
            "Degraded",
            "Last-Failover",
            "Age"
        ]
    );
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let yaml = crd_yaml().expect("CRD renders");
    assert!(yaml.contains("x-kubernetes-validations"));
    // `kubectl explain podhapolicy` shows the root description.
    let root = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.description.as_deref())
        .unwrap_or_default();
    assert!(
        root.starts_with("A PodHAPolicy tells podha which nodes to watch"),
        "root description: {root}"
    );
}

/// The committed manifest is generated, never edited: regenerate with `make crd`.
#[test]
fn committed_crd_matches_the_generated_one() {
    let committed = include_str!("../../../../crds/podha.io_podhapolicies.yaml");
    let generated = crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "crds/podha.io_podhapolicies.yaml is stale: run `make crd` and commit the result"
    );
}

#[test]
fn max_unhealthy_counts_and_percentages() {
    let with = |v: Value| policy(json!({"safety": {"maxUnhealthy": v}})).spec;
    assert_eq!(with(json!(2)).max_unhealthy_nodes(100), 2);
    assert_eq!(with(json!("30%")).max_unhealthy_nodes(100), 30);
    assert_eq!(with(json!("30%")).max_unhealthy_nodes(10), 3);
    // Rounds down, but a policy always tolerates one failed node.
    assert_eq!(with(json!("30%")).max_unhealthy_nodes(5), 1);
    assert_eq!(with(json!("30%")).max_unhealthy_nodes(3), 1);
    assert_eq!(with(json!("100%")).max_unhealthy_nodes(7), 7);
    assert_eq!(with(json!("4")).max_unhealthy_nodes(100), 4);
}

#[test]
fn combined_proofs_name_their_members_and_are_confirmed_as_their_combination_is() {
    let fencing = |spec: Value| policy(json!({"fencing": spec})).spec.fencing;
    let bmc = json!({"secretName": "bmc-{node}"});
    let unbound = json!({"secretName": "bmc-{node}", "matchSystemUUID": false});
    let cases = [
        (json!({}), "Agent", false),
        (json!({"proof": "None"}), "None", false),
        (json!({"proof": "External"}), "External", true),
        (json!({"proof": "BMC", "bmc": bmc}), "BMC", true),
        (json!({"proof": "BMC", "bmc": unbound}), "BMC", false),
        // Listed in the order podha names them, whatever the order written.
        (
            json!({"proof": "AnyOf", "anyOf": ["BMC", "AgentAcknowledged"], "bmc": bmc}),
            "AnyOf [AgentAcknowledged, BMC]",
            true,
        ),
        (
            json!({"proof": "AnyOf", "anyOf": ["Agent", "BMC"], "bmc": bmc}),
            "AnyOf [Agent, BMC]",
            false,
        ),
        (
            json!({"proof": "AnyOf", "anyOf": ["External", "BMC"], "bmc": unbound}),
            "AnyOf [External, BMC]",
            false,
        ),
        (
            json!({"proof": "AllOf", "allOf": ["Agent", "BMC"], "bmc": bmc}),
            "AllOf [Agent, BMC]",
            true,
        ),
        (
            json!({"proof": "AllOf", "allOf": ["Agent", "BMC"], "bmc": unbound}),
            "AllOf [Agent, BMC]",
            false,
        ),
        // Without its list: nothing listed, never confirmed (and never proven).
        (json!({"proof": "AllOf"}), "AllOf []", false),
        (json!({"proof": "AnyOf"}), "AnyOf []", false),
    ];
    for (spec, named, confirmed) in cases {
        let f = fencing(spec.clone());
        assert_eq!(f.proofs().describe(), named, "{spec}");
        assert_eq!(f.is_confirmed(), confirmed, "{spec}");
    }
    let any = fencing(json!({"proof": "AnyOf", "anyOf": ["Agent", "BMC"], "bmc": bmc}));
    let all = fencing(json!({"proof": "AllOf", "allOf": ["Agent", "BMC"], "bmc": bmc}));
    assert!(any.proofs().asks(FencingProof::Agent) && !any.proofs().requires(FencingProof::Agent));
    assert!(all.proofs().requires(FencingProof::Agent) && all.proofs().requires(FencingProof::Bmc));
    assert!(fencing(json!({})).proofs().requires(FencingProof::Agent));
    assert!(fencing(json!({"proof": "None"})).proofs().is_none());
    assert!(!fencing(json!({"proof": "AllOf"})).proofs().is_none());
}

/// What the CRD's CEL rules say of a policy as written, before podha reads it.
fn cel_errors_as_written(spec: Value) -> Vec<String> {
    let crd = PodHAPolicy::crd();
    let schema = serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("the CRD has a schema"),
    )
    .unwrap();
    let object = json!({
        "apiVersion": "podha.io/v1alpha1",
        "kind": "PodHAPolicy",
        "metadata": {"name": "test"},
        "spec": spec,
    });
    match kube::core::cel::Validator::new().validate(&schema, &object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

/// The API server's rule on `owners` and podha's reading agree on every entry: nothing the
/// API server accepts is unreadable to podha, and what it refuses says how to write it.
#[test]
fn owners_rule_and_reading_agree() {
    for written in [
        "StatefulSet",
        "Deployment",
        "ReplicaSet",
        "ReplicaSet.apps",
        "Cluster.postgresql.cnpg.io",
        "StrimziPodSet.core.strimzi.io",
        "VirtualMachineInstance.kubevirt.io",
        "Job.batch",
        "A.b",
        "DaemonSet",
        "Pod",
        "",
        "Cluster.",
        "cluster.pg.io",
        "Cluster.pg..io",
        "Cluster.-pg.io",
        "Cluster.pg-.io",
        "Cluster.PG.io",
        "Clus-ter.pg.io",
        "Cluster/pg.io",
    ] {
        let refused = cel_errors_as_written(json!({"owners": [written]}));
        let read = written.parse::<OwnerKind>();
        assert_eq!(
            refused.is_empty(),
            read.is_ok(),
            "{written:?}: the API server says {refused:?}, podha reads {read:?}"
        );
        if !refused.is_empty() {
            assert!(
                refused.iter().any(|e| e.contains("Kind.group")),
                "{written:?}: {refused:?}"
            );
        }
    }
    assert!(cel_errors_as_written(json!({"owners": ["StatefulSet", "Cluster.pg.io"]})).is_empty());
}
