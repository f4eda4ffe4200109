//! podha's own identity, so the API server counts its requests apart.

use std::path::PathBuf;

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use super::{FLOW_SCHEMA, PODHA_NS, PODHA_SA};
use crate::cluster::Cluster;
use crate::failover::metric_in;
use crate::testkit::create_namespace;

/// A ServiceAccount bound to cluster-admin, a FlowSchema matching it, and a kubeconfig with a
/// token of it (TokenRequest, 24 h).
pub(super) async fn podha_identity(cluster: &Cluster, client: &Client) -> anyhow::Result<PathBuf> {
    create_namespace(client, PODHA_NS).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), PODHA_NS);
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": PODHA_SA } }))?;
    create_ok(sas.create(&PostParams::default(), &sa).await)?;
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": FLOW_SCHEMA },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": PODHA_SA, "namespace": PODHA_NS }],
    }))?;
    create_ok(
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &crb)
            .await,
    )?;
    let fs: FlowSchema = serde_json::from_value(json!({
        "metadata": { "name": FLOW_SCHEMA },
        "spec": {
            "matchingPrecedence": 500,
            "priorityLevelConfiguration": { "name": "workload-high" },
            "distinguisherMethod": { "type": "ByUser" },
            "rules": [{
                "subjects": [{
                    "kind": "ServiceAccount",
                    "serviceAccount": { "name": PODHA_SA, "namespace": PODHA_NS },
                }],
                "resourceRules": [{
                    "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "clusterScope": true, "namespaces": ["*"],
                }],
                "nonResourceRules": [{ "verbs": ["*"], "nonResourceURLs": ["*"] }],
            }],
        },
    }))?;
    create_ok(
        Api::<FlowSchema>::all(client.clone())
            .create(&PostParams::default(), &fs)
            .await,
    )?;
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": { "audiences": [], "expirationSeconds": 86_400 },
    }))?;
    let token = sas
        .create_token_request(PODHA_SA, &PostParams::default(), &request)
        .await
        .context("TokenRequest for podha")?
        .status
        .ok_or_else(|| anyhow!("TokenRequest without status"))?
        .token;
    let path = cluster.dir().join("podha.kubeconfig");
    let ca = cluster.dir().join("pki").join("ca.crt");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n    \
         certificate-authority: {}\nusers:\n- name: podha\n  user:\n    token: {token}\n\
         contexts:\n- name: podha\n  context:\n    cluster: sim\n    user: podha\n\
         current-context: podha\n",
        cluster.apiserver_url(),
        ca.display()
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

pub(super) fn create_ok<T>(r: Result<T, kube::Error>) -> anyhow::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What the API server's Priority and Fairness filter counted for podha's FlowSchema so far.
/// Control-plane components of the sim authenticate as `system:masters` (the `exempt` level),
/// so podha's flow is the only one APF queues here.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PodhaFlow {
    /// Requests of podha dispatched (all verbs, watches counted when they start).
    pub(super) dispatched: f64,
    /// Requests that waited in an APF queue and then ran, and their total wait.
    pub(super) waited: f64,
    pub(super) wait_seconds: f64,
    /// Non-watch requests executed, and their total execution time.
    pub(super) executed: f64,
    pub(super) execution_seconds: f64,
    /// Writes of PodHAPolicy statuses (by anyone: only podha writes them).
    pub(super) status_writes: f64,
}

impl PodhaFlow {
    pub(super) async fn read(client: &Client) -> anyhow::Result<Self> {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        let text = client.request_text(req).await?;
        let flow = format!("flow_schema=\"{FLOW_SCHEMA}\"");
        let sum = |name: &str, extra: &str| metric_in(&text, name, &[&flow, extra]).unwrap_or(0.0);
        const WAIT: &str = "apiserver_flowcontrol_request_wait_duration_seconds";
        const EXEC: &str = "apiserver_flowcontrol_request_execution_seconds";
        Ok(Self {
            dispatched: sum("apiserver_flowcontrol_dispatched_requests_total", ""),
            waited: sum(&format!("{WAIT}_count"), "execute=\"true\""),
            wait_seconds: sum(&format!("{WAIT}_sum"), "execute=\"true\""),
            executed: sum(&format!("{EXEC}_count"), "type=\"regular\""),
            execution_seconds: sum(&format!("{EXEC}_sum"), "type=\"regular\""),
            status_writes: metric_in(
                &text,
                "apiserver_request_total",
                &["resource=\"podhapolicies\"", "subresource=\"status\""],
            )
            .unwrap_or(0.0),
        })
    }

    /// What was counted between `earlier` and `self`.
    pub(super) fn since(self, earlier: Self) -> Self {
        Self {
            dispatched: self.dispatched - earlier.dispatched,
            waited: self.waited - earlier.waited,
            wait_seconds: self.wait_seconds - earlier.wait_seconds,
            executed: self.executed - earlier.executed,
            execution_seconds: self.execution_seconds - earlier.execution_seconds,
            status_writes: self.status_writes - earlier.status_writes,
        }
    }

    pub(super) fn mean_wait(self) -> Option<f64> {
        (self.waited > 0.0).then(|| self.wait_seconds / self.waited)
    }

    pub(super) fn mean_execution(self) -> Option<f64> {
        (self.executed > 0.0).then(|| self.execution_seconds / self.executed)
    }
}
