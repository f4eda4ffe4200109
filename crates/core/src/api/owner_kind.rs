//! `owners`: the controller kinds whose pods podha may delete, any API group.
//!
//! Written `StatefulSet`, `Deployment` or `ReplicaSet` (the `apps` kinds, the shorthand) or
//! `Kind.group` for any other controller: `Cluster.postgresql.cnpg.io` (CloudNativePG),
//! `StrimziPodSet.core.strimzi.io` (Strimzi), `Rollout.argoproj.io` (Argo Rollouts, through its
//! ReplicaSets). `StatefulSet.apps` is `StatefulSet`. A kind of the core group (no group to
//! write) is selected pod by pod, with the opt-in annotation.

use std::borrow::Cow;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A controller kind whose pods podha may delete: an API group and a kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerKind {
    group: Cow<'static, str>,
    kind: Cow<'static, str>,
}

/// The API group of the kinds the shorthand names.
const APPS: &str = "apps";

/// The CEL rule on `owners` (the grammar [`OwnerKind`]'s `FromStr` reads): each entry one of
/// the shorthands, or a kind (letters and digits, from an upper-case letter) and its group's
/// dot-separated DNS labels.
pub const OWNERS_RULE: &str = "self.all(o, o.matches('^(StatefulSet|Deployment|ReplicaSet|[A-Z][A-Za-z0-9]{0,62}[.][a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$'))";

/// What the API server says of an entry [`OWNERS_RULE`] refuses.
pub const OWNERS_RULE_MESSAGE: &str = "owners: write StatefulSet, Deployment, ReplicaSet, or another controller's kind with its API group, Kind.group (e.g. Cluster.postgresql.cnpg.io)";

/// At most this many entries in `owners` (the API server bounds the rule's cost by it).
pub const OWNERS_MAX_ITEMS: usize = 32;

/// The longest entry: a 63-character kind, the dot and a 253-character group.
pub const OWNER_MAX_LENGTH: usize = 63 + 1 + 253;

impl OwnerKind {
    pub const STATEFUL_SET: Self = Self::apps("StatefulSet");
    pub const DEPLOYMENT: Self = Self::apps("Deployment");
    pub const REPLICA_SET: Self = Self::apps("ReplicaSet");

    const fn apps(kind: &'static str) -> Self {
        Self {
            group: Cow::Borrowed(APPS),
            kind: Cow::Borrowed(kind),
        }
    }

    /// The kind an owner reference names: its `apiVersion`'s group (`apps/v1` → `apps`, `v1` →
    /// the core group, `""`) and its kind.
    pub fn of_reference(api_version: &str, kind: &str) -> Self {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        Self {
            group: Cow::Owned(group.to_string()),
            kind: Cow::Owned(kind.to_string()),
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// One of the `apps` kinds the shorthand names.
    fn is_shorthand(&self) -> bool {
        [Self::STATEFUL_SET, Self::DEPLOYMENT, Self::REPLICA_SET].contains(self)
    }
}

/// As written in `owners`: the shorthand for the `apps` kinds, `Kind.group` for the others
/// (`Kind` alone for a core-group kind, which `owners` cannot name).
impl fmt::Display for OwnerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_shorthand() || self.group.is_empty() {
            f.write_str(&self.kind)
        } else {
            write!(f, "{}.{}", self.kind, self.group)
        }
    }
}

/// An `owners` entry podha cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseOwnerKindError(String);

impl fmt::Display for ParseOwnerKindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{OWNERS_RULE_MESSAGE}; read {:?}", self.0)
    }
}

impl std::error::Error for ParseOwnerKindError {}

impl std::str::FromStr for OwnerKind {
    type Err = ParseOwnerKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let refuse = || ParseOwnerKindError(s.to_string());
        let Some((kind, group)) = s.split_once('.') else {
            return [Self::STATEFUL_SET, Self::DEPLOYMENT, Self::REPLICA_SET]
                .into_iter()
                .find(|k| k.kind == s)
                .ok_or_else(refuse);
        };
        let kind_ok = kind.len() <= 63
            && kind.starts_with(|c: char| c.is_ascii_uppercase())
            && kind.chars().all(|c| c.is_ascii_alphanumeric());
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !kind_ok || s.len() > OWNER_MAX_LENGTH || !group.split('.').all(label_ok) {
            return Err(refuse());
        }
        Ok(Self {
            group: Cow::Owned(group.to_string()),
            kind: Cow::Owned(kind.to_string()),
        })
    }
}

impl Serialize for OwnerKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OwnerKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Cow::<str>::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for OwnerKind {
    fn schema_name() -> Cow<'static, str> {
        "OwnerKind".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "maxLength": OWNER_MAX_LENGTH,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shorthand_and_any_group() {
        for (written, group, kind, shown) in [
            ("StatefulSet", "apps", "StatefulSet", "StatefulSet"),
            ("Deployment", "apps", "Deployment", "Deployment"),
            ("ReplicaSet", "apps", "ReplicaSet", "ReplicaSet"),
            ("StatefulSet.apps", "apps", "StatefulSet", "StatefulSet"),
            (
                "Cluster.postgresql.cnpg.io",
                "postgresql.cnpg.io",
                "Cluster",
                "Cluster.postgresql.cnpg.io",
            ),
            (
                "StrimziPodSet.core.strimzi.io",
                "core.strimzi.io",
                "StrimziPodSet",
                "StrimziPodSet.core.strimzi.io",
            ),
            ("DaemonSet.apps", "apps", "DaemonSet", "DaemonSet.apps"),
            ("Job.batch", "batch", "Job", "Job.batch"),
        ] {
            let read: OwnerKind = written.parse().unwrap();
            assert_eq!((read.group(), read.kind()), (group, kind), "{written}");
            assert_eq!(read.to_string(), shown, "{written}");
            assert_eq!(shown.parse::<OwnerKind>(), Ok(read), "{shown}");
        }
    }

    #[test]
    fn refuses_what_names_no_controller_kind() {
        for written in [
            "",
            "Pod",
            "DaemonSet",
            "statefulset",
            "Cluster.",
            ".postgresql.cnpg.io",
            "cluster.postgresql.cnpg.io",
            "Cluster.PostgreSQL.cnpg.io",
            "Cluster.postgresql..io",
            "Cluster.-pg.io",
            "Clus-ter.pg.io",
            "Cluster/postgresql.cnpg.io",
            "postgresql.cnpg.io/v1/Cluster",
        ] {
            let refused = written.parse::<OwnerKind>();
            assert!(refused.is_err(), "{written:?} read as {refused:?}");
        }
        let said = "DaemonSet".parse::<OwnerKind>().unwrap_err().to_string();
        assert!(said.contains("Kind.group"), "{said}");
    }

    #[test]
    fn an_owner_reference_names_its_group() {
        assert_eq!(
            OwnerKind::of_reference("apps/v1", "StatefulSet"),
            OwnerKind::STATEFUL_SET
        );
        let pg = OwnerKind::of_reference("postgresql.cnpg.io/v1", "Cluster");
        assert_eq!(pg.to_string(), "Cluster.postgresql.cnpg.io");
        let rc = OwnerKind::of_reference("v1", "ReplicationController");
        assert_eq!(
            (rc.group(), rc.to_string().as_str()),
            ("", "ReplicationController")
        );
    }
}
