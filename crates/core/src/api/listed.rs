//! A `PodHAPolicy` as the API server lists it: read, or kept aside with the reason it cannot
//! be. podha watches policies through this type so that one object its types cannot read (a
//! policy stored before the CRD's rules were tightened, or written by a newer podha) is
//! reported on that policy alone: a list of the typed `PodHAPolicy` fails as a whole, and a
//! newly started replica would never sync.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};

use super::{PodHAPolicy, PodHAPolicyStatus};

/// A listed policy.
#[derive(Clone, Debug)]
pub enum ListedPolicy {
    /// Read whole.
    Valid(Box<PodHAPolicy>),
    /// Its metadata, and why the rest cannot be read (both kinds boxed: they differ in size).
    Unreadable(Box<UnreadablePolicy>),
}

/// A policy podha cannot read: it acts on none of its nodes and says why on the policy.
#[derive(Clone, Debug, PartialEq)]
pub struct UnreadablePolicy {
    pub metadata: ObjectMeta,
    /// What reading it said, e.g. `spec.fencing.agentMargin: invalid duration …`.
    pub error: String,
    /// Its status as podha last wrote it, if that much can be read.
    pub status: Option<PodHAPolicyStatus>,
}

impl UnreadablePolicy {
    /// What podha says of it, on its status and in its event.
    pub fn note(&self) -> String {
        format!(
            "podha cannot read this policy and acts on none of its nodes: {}",
            self.error
        )
    }
}

impl From<PodHAPolicy> for ListedPolicy {
    fn from(policy: PodHAPolicy) -> Self {
        Self::Valid(Box::new(policy))
    }
}

impl<'de> Deserialize<'de> for ListedPolicy {
    /// Never fails on what a policy says, only on what is not an object with metadata at all.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        match serde_json::from_value::<PodHAPolicy>(value.clone()) {
            Ok(policy) => Ok(Self::Valid(Box::new(policy))),
            Err(error) => {
                let metadata = value
                    .get("metadata")
                    .cloned()
                    .map(serde_json::from_value::<ObjectMeta>)
                    .transpose()
                    .map_err(serde::de::Error::custom)?
                    .ok_or_else(|| serde::de::Error::missing_field("metadata"))?;
                let status = value
                    .get("status")
                    .and_then(|s| serde_json::from_value(s.clone()).ok());
                Ok(Self::Unreadable(Box::new(UnreadablePolicy {
                    metadata,
                    error: error.to_string(),
                    status,
                })))
            }
        }
    }
}

impl Resource for ListedPolicy {
    type DynamicType = ();
    type Scope = <PodHAPolicy as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        PodHAPolicy::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        PodHAPolicy::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        PodHAPolicy::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        PodHAPolicy::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Valid(p) => &p.metadata,
            Self::Unreadable(u) => &u.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Valid(p) => &mut p.metadata,
            Self::Unreadable(u) => &mut u.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use kube::core::ObjectList;
    use serde_json::json;

    fn policy(name: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "podha.io/v1alpha1",
            "kind": "PodHAPolicy",
            "metadata": {"name": name, "resourceVersion": "7"},
            "spec": spec,
        })
    }

    #[test]
    fn one_unreadable_policy_leaves_the_list_and_the_others_readable() {
        let list = json!({
            "apiVersion": "podha.io/v1alpha1",
            "kind": "PodHAPolicyList",
            "metadata": {"resourceVersion": "9"},
            "items": [
                policy("good", json!({})),
                // Past what a duration can hold: the API server's pattern lets it through.
                policy("huge", json!({"fencing": {"agentMargin": "99999999999999999999h"}})),
                policy("other", json!({"action": "DeletePods"})),
            ],
        });
        // The typed list fails whole: what a new replica's first list did.
        assert!(serde_json::from_value::<ObjectList<PodHAPolicy>>(list.clone()).is_err());
        let listed: ObjectList<ListedPolicy> = serde_json::from_value(list).expect("listed");
        let names: Vec<(String, bool)> = listed
            .items
            .iter()
            .map(|p| (p.name_any(), matches!(p, ListedPolicy::Valid(_))))
            .collect();
        assert_eq!(
            names,
            [
                ("good".to_string(), true),
                ("huge".to_string(), false),
                ("other".to_string(), true)
            ]
        );
        let ListedPolicy::Unreadable(huge) = &listed.items[1] else {
            unreachable!()
        };
        assert!(huge.error.contains("invalid duration"), "{}", huge.error);
        assert_eq!(huge.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn an_object_without_metadata_is_no_policy() {
        assert!(serde_json::from_value::<ListedPolicy>(json!({"spec": 1})).is_err());
    }

    #[test]
    fn it_is_addressed_as_the_policy_is() {
        assert_eq!(
            ListedPolicy::url_path(&(), None),
            PodHAPolicy::url_path(&(), None)
        );
        assert_eq!(ListedPolicy::kind(&()), "PodHAPolicy");
    }
}
