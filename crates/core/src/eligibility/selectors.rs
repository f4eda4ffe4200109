//! The policy's label selectors: which nodes it watches and which pods it may move.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::api::PodHAPolicySpec;
use crate::view::View;

/// The policy's nodeSelector selects this node.
pub fn node_selected(spec: &PodHAPolicySpec, node: &Node) -> bool {
    selects(&spec.node_selector, node.labels())
}

/// The policy's namespaceSelector and podSelector both select this pod. A namespace the view
/// does not know has no labels: an empty namespaceSelector still selects it, any other does not.
pub fn pod_selected(spec: &PodHAPolicySpec, pod: &Pod, view: &View) -> bool {
    let no_labels = BTreeMap::new();
    let namespace = pod.namespace().unwrap_or_default();
    let namespace_labels = view.namespace_labels.get(&namespace).unwrap_or(&no_labels);
    selects(&spec.namespace_selector, namespace_labels) && selects(&spec.pod_selector, pod.labels())
}

/// Why one of the policy's selectors cannot be parsed (each as `field: error`), if one cannot.
/// Such a selector selects nothing; the policy reports it as an invalid spec.
pub fn invalid_selectors(spec: &PodHAPolicySpec) -> Option<String> {
    let problems: Vec<String> = [
        ("nodeSelector", &spec.node_selector),
        ("namespaceSelector", &spec.namespace_selector),
        ("podSelector", &spec.pod_selector),
    ]
    .into_iter()
    .filter_map(|(field, selector)| {
        Selector::try_from(selector.clone())
            .err()
            .map(|e| format!("{field}: {e}"))
    })
    .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// An empty selector selects everything. A selector that cannot be parsed (an unknown operator,
/// `In` without values) selects nothing: a broken policy must not widen what podha deletes.
/// The CRD schema leaves `LabelSelector` unvalidated, so such selectors can reach us.
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    match Selector::try_from(selector.clone()) {
        Ok(selector) => selector.matches(labels),
        Err(error) => {
            tracing::debug!(%error, "invalid label selector selects nothing");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn match_labels(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
            ..LabelSelector::default()
        }
    }

    fn expression(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.to_string(),
                operator: operator.to_string(),
                values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
            }]),
            ..LabelSelector::default()
        }
    }

    #[test]
    fn node_selector() {
        let worker = mk_node("n1").label("role", "worker");
        let cases = [
            ("empty selects all", LabelSelector::default(), true),
            ("matching label", match_labels("role", "worker"), true),
            ("other value", match_labels("role", "infra"), false),
            (
                "In",
                expression("role", "In", Some(&["db", "worker"])),
                true,
            ),
            (
                "NotIn",
                expression("role", "NotIn", Some(&["worker"])),
                false,
            ),
            ("Exists", expression("role", "Exists", None), true),
            (
                "DoesNotExist",
                expression("role", "DoesNotExist", None),
                false,
            ),
            (
                "unknown operator selects nothing",
                expression("role", "Like", None),
                false,
            ),
            (
                "In without values selects nothing",
                expression("role", "In", None),
                false,
            ),
        ];
        for (name, selector, want) in cases {
            let spec = mk_spec().node_selector(selector);
            assert_eq!(node_selected(&spec, &worker), want, "{name}");
        }
    }

    #[test]
    fn pod_selector_and_namespace_selector_must_both_select() {
        let pod = mk_pod("prod", "db-0").label("app", "db");
        let view = view_with([mk_namespace("prod").label("env", "prod").into()]);
        let cases = [
            (
                "both empty",
                LabelSelector::default(),
                LabelSelector::default(),
                true,
            ),
            (
                "namespace matches",
                match_labels("env", "prod"),
                LabelSelector::default(),
                true,
            ),
            (
                "namespace differs",
                match_labels("env", "dev"),
                LabelSelector::default(),
                false,
            ),
            (
                "pod matches",
                LabelSelector::default(),
                match_labels("app", "db"),
                true,
            ),
            (
                "pod differs",
                LabelSelector::default(),
                match_labels("app", "web"),
                false,
            ),
            (
                "both match",
                match_labels("env", "prod"),
                match_labels("app", "db"),
                true,
            ),
            (
                "namespace ok, pod not",
                match_labels("env", "prod"),
                match_labels("app", "x"),
                false,
            ),
            (
                "invalid pod selector",
                LabelSelector::default(),
                expression("a", "Bad", None),
                false,
            ),
        ];
        for (name, namespace_selector, pod_selector, want) in cases {
            let spec = mk_spec()
                .namespace_selector(namespace_selector)
                .pod_selector(pod_selector);
            assert_eq!(pod_selected(&spec, &pod, &view), want, "{name}");
        }
    }

    #[test]
    fn unknown_namespace_has_no_labels() {
        let pod = mk_pod("elsewhere", "p");
        let view = View::default();
        assert!(pod_selected(&mk_spec(), &pod, &view));
        let spec = mk_spec().namespace_selector(match_labels("env", "prod"));
        assert!(!pod_selected(&spec, &pod, &view));
        let spec = mk_spec().namespace_selector(expression("env", "DoesNotExist", None));
        assert!(pod_selected(&spec, &pod, &view));
    }
}
