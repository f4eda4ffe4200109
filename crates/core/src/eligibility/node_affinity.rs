//! Matching a `NodeSelector` (a pod's required node affinity, a PV's topology) against a node,
//! with the scheduler's semantics (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`):
//! terms are ORed, the requirements inside a term are ANDed, an empty term or an empty term
//! list matches no node. A requirement podha cannot interpret (unknown operator, `Gt` with a
//! non-integer, a field other than `metadata.name`) makes its term match nothing, so podha
//! never believes a pod fits where the scheduler would refuse it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use kube::ResourceExt;

/// Some term of `selector` matches `node`.
pub(crate) fn matches(selector: &NodeSelector, node: &Node) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.labels();
    let node_fields = BTreeMap::from([("metadata.name".to_string(), node.name_any())]);
    expressions.iter().all(|r| requirement_matches(r, labels))
        && fields
            .iter()
            .all(|r| field_requirement_matches(r, &node_fields))
}

/// The scheduler accepts only `In`/`NotIn` on `metadata.name` in `matchFields`.
fn field_requirement_matches(
    requirement: &NodeSelectorRequirement,
    fields: &BTreeMap<String, String>,
) -> bool {
    requirement.key == "metadata.name"
        && matches!(requirement.operator.as_str(), "In" | "NotIn")
        && requirement.values.as_ref().is_some_and(|v| v.len() == 1)
        && requirement_matches(requirement, fields)
}

fn requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let label = labels.get(&requirement.key);
    match requirement.operator.as_str() {
        // `In`/`NotIn` without values is invalid; the scheduler drops such a term.
        "In" => !values.is_empty() && label.is_some_and(|l| values.contains(l)),
        "NotIn" => !values.is_empty() && label.is_none_or(|l| !values.contains(l)),
        "Exists" => values.is_empty() && label.is_some(),
        "DoesNotExist" => values.is_empty() && label.is_none(),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else { return false };
            let (Ok(bound), Some(Ok(label))) =
                (bound.parse::<i64>(), label.map(|l| l.parse::<i64>()))
            else {
                return false;
            };
            if op == "Gt" {
                label > bound
            } else {
                label < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;

    #[test]
    fn operators() {
        let node = mk_node("n1").label("zone", "a").label("gen", "5");
        let cases: Vec<(&str, NodeSelectorTerm, bool)> = vec![
            (
                "In matches",
                mk_term().expr("zone", "In", &["a", "b"]),
                true,
            ),
            ("In misses", mk_term().expr("zone", "In", &["b"]), false),
            (
                "In on absent label",
                mk_term().expr("rack", "In", &["r1"]),
                false,
            ),
            (
                "NotIn matches",
                mk_term().expr("zone", "NotIn", &["b"]),
                true,
            ),
            (
                "NotIn misses",
                mk_term().expr("zone", "NotIn", &["a"]),
                false,
            ),
            (
                "NotIn on absent label",
                mk_term().expr("rack", "NotIn", &["r1"]),
                true,
            ),
            ("Exists", mk_term().expr("zone", "Exists", &[]), true),
            (
                "Exists absent",
                mk_term().expr("rack", "Exists", &[]),
                false,
            ),
            (
                "DoesNotExist",
                mk_term().expr("rack", "DoesNotExist", &[]),
                true,
            ),
            (
                "DoesNotExist present",
                mk_term().expr("zone", "DoesNotExist", &[]),
                false,
            ),
            ("Gt true", mk_term().expr("gen", "Gt", &["4"]), true),
            (
                "Gt equal is false",
                mk_term().expr("gen", "Gt", &["5"]),
                false,
            ),
            ("Lt true", mk_term().expr("gen", "Lt", &["6"]), true),
            ("Lt false", mk_term().expr("gen", "Lt", &["5"]), false),
            (
                "Gt on non-integer label",
                mk_term().expr("zone", "Gt", &["1"]),
                false,
            ),
            (
                "Gt with non-integer value",
                mk_term().expr("gen", "Gt", &["x"]),
                false,
            ),
            (
                "Gt with two values",
                mk_term().expr("gen", "Gt", &["1", "2"]),
                false,
            ),
            (
                "Lt on absent label",
                mk_term().expr("rack", "Lt", &["9"]),
                false,
            ),
            (
                "NotIn without values is invalid",
                mk_term().expr("zone", "NotIn", &[]),
                false,
            ),
            (
                "unknown operator",
                mk_term().expr("zone", "Like", &["a"]),
                false,
            ),
            (
                "expressions are ANDed",
                mk_term()
                    .expr("zone", "In", &["a"])
                    .expr("gen", "Lt", &["3"]),
                false,
            ),
            (
                "matchFields In",
                mk_term().field("metadata.name", "In", &["n1"]),
                true,
            ),
            (
                "matchFields In other",
                mk_term().field("metadata.name", "In", &["n2"]),
                false,
            ),
            (
                "matchFields NotIn",
                mk_term().field("metadata.name", "NotIn", &["n2"]),
                true,
            ),
            (
                "matchFields NotIn self",
                mk_term().field("metadata.name", "NotIn", &["n1"]),
                false,
            ),
            (
                "matchFields on another field",
                mk_term().field("metadata.uid", "NotIn", &["x"]),
                false,
            ),
            (
                "matchFields Exists unsupported",
                mk_term().field("metadata.name", "Exists", &[]),
                false,
            ),
            (
                "fields and expressions are ANDed",
                mk_term()
                    .expr("zone", "In", &["a"])
                    .field("metadata.name", "In", &["n2"]),
                false,
            ),
            ("empty term matches nothing", mk_term(), false),
        ];
        for (name, term, want) in cases {
            let selector = NodeSelector {
                node_selector_terms: vec![term],
            };
            assert_eq!(matches(&selector, &node), want, "{name}");
        }
    }

    #[test]
    fn terms_are_ored_and_no_terms_match_nothing() {
        let node = mk_node("n1").label("zone", "a");
        let miss = mk_term().expr("zone", "In", &["b"]);
        let hit = mk_term().expr("zone", "In", &["a"]);
        let ored = NodeSelector {
            node_selector_terms: vec![miss.clone(), hit],
        };
        assert!(matches(&ored, &node));
        assert!(!matches(
            &NodeSelector {
                node_selector_terms: vec![miss]
            },
            &node
        ));
        assert!(!matches(
            &NodeSelector {
                node_selector_terms: vec![]
            },
            &node
        ));
    }
}
