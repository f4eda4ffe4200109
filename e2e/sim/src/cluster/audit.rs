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
    /// The client's User-Agent: tells the controller manager from podha where both use the
    /// cluster's admin credentials (podha run as a process on this machine).
    #[serde(default)]
    pub user_agent: Option<String>,
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

/// How many pods named `namespace/name` the controller manager (its taint eviction, or pod GC)
/// deleted after another client, podha, had deleted one of that name: podha force-deletes the
/// pod of the dead node by its UID, so any pod of that name deleted after it is a replacement.
/// Answers other than 200 delete nothing and are not counted.
pub fn replacements_deleted(requests: &[Request], namespace: &str, name: &str) -> usize {
    let mut deleted_by_another = false;
    let mut replacements = 0;
    let deletes = requests
        .iter()
        .filter(|r| r.is("delete", "pods", Some(namespace), name) && r.code() == Some(200));
    for delete in deletes {
        if delete.by_controller_manager() {
            replacements += usize::from(deleted_by_another);
        } else {
            deleted_by_another = true;
        }
    }
    replacements
}

impl Request {
    fn by_controller_manager(&self) -> bool {
        self.user_agent
            .as_deref()
            .is_some_and(|agent| agent.starts_with("kube-controller-manager/"))
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

    fn delete(agent: &str, code: u16) -> String {
        format!(
            r#"{{"kind":"Event","stage":"ResponseComplete","verb":"delete","user":{{"username":"admin"}},"userAgent":"{agent}","objectRef":{{"resource":"pods","namespace":"ns","name":"db-0"}},"responseStatus":{{"code":{code}}}}}"#
        )
    }

    #[test]
    fn a_controller_managers_delete_after_podhas_is_a_replacements() {
        let kcm = "kube-controller-manager/v1.34.4 (linux/amd64) kubernetes/abc/tainteviction";
        let podha = "kube-rs/5.0";
        let count =
            |lines: &[String]| replacements_deleted(&parse(&lines.join("\n")), "ns", "db-0");
        // The taint eviction's delete, then podha's by UID: the replacement is untouched.
        assert_eq!(count(&[delete(kcm, 200), delete(podha, 200)]), 0);
        // podha first; the eviction's retry by name finds the replacement.
        assert_eq!(count(&[delete(podha, 200), delete(kcm, 200)]), 1);
        // A retry that finds nothing deletes nothing.
        assert_eq!(count(&[delete(podha, 200), delete(kcm, 404)]), 0);
        // Without podha (Kubernetes alone): the controller manager's deletes are of the old pod.
        assert_eq!(count(&[delete(kcm, 200), delete(kcm, 200)]), 0);
    }

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
