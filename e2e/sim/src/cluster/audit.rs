//! The API server's audit log: what was asked of it, by whom, and what it answered. Tests read
//! it to count podha's own requests (a pod deleted exactly once, whichever replica sent it),
//! where Events can be lost with a replica that stops right after its request.
//!
//! Only writes that move workloads are recorded: pod deletions and changes to Node objects
//! (taints, annotations; not `nodes/status`, which every kubelet writes all the time).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Error, Result};

const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [delete, deletecollection]
    resources: [{group: \"\", resources: [pods]}]
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources: [{group: \"\", resources: [nodes]}]
  - level: None
";

/// Writes the audit policy into the cluster directory `dir`; returns its path.
pub(super) fn write_policy(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("audit-policy.yaml");
    std::fs::write(&path, POLICY).map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    Ok(path)
}

/// Where the API server of the cluster in `dir` writes its audit log.
pub(super) fn log_path(dir: &Path) -> PathBuf {
    dir.join("logs").join("audit.log")
}

/// One request as the audit log records it once answered.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub verb: String,
    pub user: User,
    pub object_ref: Option<ObjectRef>,
    pub response_status: Option<ResponseStatus>,
    pub stage: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct User {
    pub username: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ObjectRef {
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ResponseStatus {
    pub code: Option<u16>,
}

impl Request {
    /// Whether this is `verb` on `resource` `namespace/name` (namespace `None` for
    /// cluster-scoped objects).
    pub fn is(&self, verb: &str, resource: &str, namespace: Option<&str>, name: &str) -> bool {
        self.verb == verb
            && self.object_ref.as_ref().is_some_and(|o| {
                o.resource.as_deref() == Some(resource)
                    && o.namespace.as_deref() == namespace
                    && o.name.as_deref() == Some(name)
            })
    }

    /// The HTTP status the API server answered with.
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref().and_then(|s| s.code)
    }
}

/// Every answered request in the audit log at `path` (a line that does not parse, e.g. one
/// being written, is skipped).
pub fn answered(path: &Path) -> Result<Vec<Request>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("read the audit log {}", path.display()), e))?;
    Ok(parse(&text))
}

fn parse(text: &str) -> Vec<Request> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Request>(line).ok())
        .filter(|r| r.stage == "ResponseComplete")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answered_requests_are_read_and_matched() {
        let log = concat!(
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"delete","user":{"username":"system:serviceaccount:default:podha"},"objectRef":{"resource":"pods","namespace":"ns","name":"db-0"},"responseStatus":{"code":200}}"#,
            "\n",
            r#"{"kind":"Event","stage":"ResponseStarted","verb":"delete","user":{"username":"u"},"objectRef":{"resource":"pods","namespace":"ns","name":"db-0"}}"#,
            "\n",
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"patch","user":{"username":"u"},"objectRef":{"resource":"nodes","name":"node-1"},"responseStatus":{"code":409}}"#,
            "\n",
            r#"{"kind":"Event","stage":"ResponseComp"#,
        );
        let requests = parse(log);
        assert_eq!(requests.len(), 2, "{requests:?}");
        assert!(requests[0].is("delete", "pods", Some("ns"), "db-0"));
        assert!(!requests[0].is("delete", "pods", Some("other"), "db-0"));
        assert_eq!(requests[0].code(), Some(200));
        assert!(requests[1].is("patch", "nodes", None, "node-1"));
        assert_eq!(requests[1].code(), Some(409));
    }
}
