//! The chart's admission policies on the sim's real API server: each write podha trusts (the
//! contract's Node annotations, the agent Leases) is accepted from its writer only. Agents
//! authenticate as the chart's agent ServiceAccount with tokens bound to a pod on their node
//! (the API server puts the node in the token's user info), podha as its own ServiceAccount, a
//! fence controller as a user listed in `rbac.fenceAcknowledgers`, a kubelet by impersonation.
//!
//! Needs `make k8s` and `make helm`; without them the test fails with that hint.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use libtest_mimic::Arguments;
use podha::contract::{
    AGENT_FENCED_WITHIN_ANNOTATION, AGENT_LEASE_LABEL, AGENT_PORT_ANNOTATION, FENCE_ACK_ANNOTATION,
    FENCE_REQUEST_ANNOTATION, agent_lease_name,
};
use podha_sim::chart_rbac::{self, RELEASE};
use podha_sim::testkit::*;
use serde_json::{Value, json};

const NAMESPACE: &str = "admission";
const AGENT_SA: &str = "podha-agent";
const FENCER_SA: &str = "fencer";

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let shared = Arc::new(SharedCluster::new(
        env!("CARGO_TARGET_TMPDIR"),
        "podha-sim-admission",
        2,
        Some(env!("CARGO_BIN_EXE_podha-sim").into()),
    ));
    let scenarios: [Scenario; 1] = [(
        "each_trusted_write_is_accepted_from_its_writer_only",
        each_write_from_its_writer,
    )];
    run_trials(&args, &shared, scenarios.into())
}

/// Who writes, as a client of the API server.
struct Writers {
    /// The agent of node-1 and of node-2: the agent ServiceAccount, tokens bound to a pod on
    /// their node.
    agent_1: kube::Client,
    agent_2: kube::Client,
    /// The agent ServiceAccount with a token bound to no pod: it names no node.
    agent_nowhere: kube::Client,
    podha: kube::Client,
    fencer: kube::Client,
    /// node-1's kubelet (`system:node:node-1`, impersonated by the admin).
    kubelet_1: kube::Client,
    admin: kube::Client,
}

fn each_write_from_its_writer(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, NAMESPACE, |ctx| async move {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/podha");
        let fencer = format!("system:serviceaccount:{NAMESPACE}:{FENCER_SA}");
        chart_rbac::apply_agent_policies(
            ctx.cluster,
            &chart_rbac::helm_path()?,
            &chart,
            NAMESPACE,
            &[format!("rbac.fenceAcknowledgers={{{fencer}}}")],
        )?;
        policies_type_check(&ctx.client).await?;
        let w = writers(&ctx).await?;
        // Until the API server loaded the policies, the forged advert goes through (and is
        // taken back at once).
        let forged = agent_lease_name("node-2");
        wait_for(
            "the policies to refuse a forged advert",
            secs(30),
            || async {
                match apply_lease(&w.admin, &forged, "node-2").await {
                    Ok(_) => {
                        delete_lease(&w.admin, &forged).await?;
                        Ok(None)
                    }
                    Err(kube::Error::Api(s)) if s.code == 403 => Ok(Some(())),
                    Err(e) => Err(e.into()),
                }
            },
        )
        .await?;

        log(
            NAMESPACE,
            "an agent writes its own node's annotations, nothing else",
        );
        for key in [
            AGENT_PORT_ANNOTATION,
            AGENT_FENCED_WITHIN_ANNOTATION,
            FENCE_ACK_ANNOTATION,
        ] {
            annotate(&w.agent_1, "node-1", key, Some("9000")).await?;
            annotate(&w.agent_1, "node-1", key, None).await?;
            refused(
                annotate(&w.agent_1, "node-2", key, Some("9000")).await,
                &format!("agent of node-1 writing {key} of node-2"),
                &format!("may not change {key} of node node-2"),
            )?;
            refused(
                annotate(&w.agent_nowhere, "node-1", key, Some("9000")).await,
                &format!("an agent token bound to no pod writing {key}"),
                &format!("may not change {key} of node node-1"),
            )?;
        }
        refused(
            annotate(
                &w.agent_1,
                "node-1",
                FENCE_REQUEST_ANNOTATION,
                Some("p/1/b"),
            )
            .await,
            "agent of node-1 requesting its own fence",
            "may not change podha.io/fence-request",
        )?;
        refused(
            annotate(&w.agent_1, "node-1", "example.com/other", Some("x")).await,
            "agent of node-1 writing another annotation",
            "only the agent annotations of its own node",
        )?;
        refused(
            patch_node(
                &w.agent_1,
                "node-1",
                json!({"spec": {"unschedulable": true}}),
            )
            .await,
            "agent of node-1 cordoning it",
            "only the agent annotations of its own node",
        )?;
        refused(
            patch_node(
                &w.agent_1,
                "node-1",
                json!({"metadata": {"labels": {"x": "y"}}}),
            )
            .await,
            "agent of node-1 labelling it",
            "only the agent annotations of its own node",
        )?;

        log(
            NAMESPACE,
            "podha requests fences; only agents and acknowledgers acknowledge",
        );
        annotate(&w.podha, "node-1", FENCE_REQUEST_ANNOTATION, Some("p/1/b")).await?;
        for (who, client) in [
            ("podha", &w.podha),
            ("an admin", &w.admin),
            ("node-1's kubelet", &w.kubelet_1),
        ] {
            refused(
                annotate(client, "node-1", FENCE_ACK_ANNOTATION, Some("p/1/b")).await,
                &format!("{who} forging node-1's acknowledgement"),
                "may not change podha.io/fence-ack",
            )?;
            refused(
                annotate(client, "node-1", AGENT_PORT_ANNOTATION, Some("1")).await,
                &format!("{who} pointing node-1's agent port elsewhere"),
                "may not change podha.io/agent-port",
            )?;
        }
        refused(
            annotate(&w.admin, "node-1", FENCE_REQUEST_ANNOTATION, None).await,
            "an admin withdrawing podha's fence request",
            "may not change podha.io/fence-request",
        )?;
        annotate(&w.fencer, "node-1", FENCE_ACK_ANNOTATION, Some("p/1/b")).await?;
        refused(
            annotate(
                &w.fencer,
                "node-1",
                AGENT_FENCED_WITHIN_ANNOTATION,
                Some("0s"),
            )
            .await,
            "the fence controller advertising an agent",
            "may not change podha.io/agent-fenced-within",
        )?;
        annotate(&w.agent_1, "node-1", FENCE_ACK_ANNOTATION, None).await?;
        annotate(&w.podha, "node-1", FENCE_REQUEST_ANNOTATION, None).await?;

        log(
            NAMESPACE,
            "an agent keeps its own node's Lease and no other",
        );
        let own = agent_lease_name("node-1");
        apply_lease(&w.agent_1, &own, "node-1").await?;
        apply_lease(&w.agent_1, &own, "node-1").await?;
        refused(
            apply_lease(&w.agent_1, &own, "node-2").await,
            "agent of node-1 handing its Lease to node-2",
            "may write only the agent Lease of its own node",
        )?;
        refused(
            apply_lease(&w.agent_1, &agent_lease_name("node-2"), "node-2").await,
            "agent of node-1 advertising node-2's agent",
            "may write only the agent Lease of its own node",
        )?;
        refused(
            apply_lease(&w.admin, &agent_lease_name("node-2"), "node-2").await,
            "an admin forging node-2's advert",
            "only the podha agent of its node does",
        )?;
        refused(
            apply_lease(&w.agent_nowhere, &agent_lease_name("node-2"), "node-2").await,
            "an agent token bound to no pod advertising node-2's agent",
            "its token names no node",
        )?;
        apply_lease(&w.agent_2, &agent_lease_name("node-2"), "node-2").await?;
        refused(
            apply_lease(&w.admin, &agent_lease_name("node-2"), "node-2").await,
            "an admin renewing node-2's advert",
            "only the podha agent of its node does",
        )?;
        let leases: Api<Lease> = Api::namespaced(w.admin.clone(), NAMESPACE);
        leases
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": RELEASE},
                    "spec": {"holderIdentity": "podha-a", "leaseDurationSeconds": 15}
                }))?,
            )
            .await
            .context("create the leader Lease as admin")?;
        refused(
            apply_lease(&w.agent_1, RELEASE, "node-1").await,
            "agent of node-1 taking podha's leader Lease",
            "may write only the agent Lease of its own node",
        )?;
        refused(
            delete_lease(&w.agent_1, RELEASE).await,
            "agent of node-1 deleting podha's leader Lease",
            "may write only the agent Lease of its own node",
        )?;
        refused(
            delete_lease(&w.agent_1, &agent_lease_name("node-2")).await,
            "agent of node-1 withdrawing node-2's advert",
            "may write only the agent Lease of its own node",
        )?;
        delete_lease(&w.agent_1, &own).await?;
        delete_lease(&w.admin, &agent_lease_name("node-2")).await?;
        delete_lease(&w.admin, RELEASE).await?;

        log(NAMESPACE, "a kubelet's status updates go on");
        let status = json!({"status": {"conditions": [{
            "type": "PodhaAdmissionTest", "status": "True", "reason": "Test", "message": "",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]}});
        Api::<Node>::all(w.kubelet_1.clone())
            .patch_status(
                "node-1",
                &PatchParams::default(),
                &Patch::Strategic(&status),
            )
            .await
            .context("node-1's kubelet updating its status")?;
        Ok(())
    })
}

/// The API server type-checked every expression of the chart's policies without a warning.
async fn policies_type_check(admin: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
    let api: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    for name in ["node-annotations", "agent-leases"] {
        let name = format!("{RELEASE}-{name}");
        let checked = wait_for(&format!("{name} to be type-checked"), secs(30), || async {
            let policy = api.get(&name).await?;
            Ok(policy
                .status
                .filter(|s| s.observed_generation == policy.metadata.generation)
                .and_then(|s| s.type_checking))
        })
        .await?;
        let warnings = checked.expression_warnings.unwrap_or_default();
        ensure!(
            warnings.is_empty(),
            "policy {name} type-checks with warnings: {warnings:?}"
        );
    }
    Ok(())
}

async fn writers(ctx: &Ctx<'_>) -> anyhow::Result<Writers> {
    let admin = ctx.client.clone();
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": FENCER_SA}}))?,
    )
    .await
    .context("create the fence controller's ServiceAccount")?;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "admission-fencer"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    }))?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .context("create the fence controller's ClusterRole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "admission-fencer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admission-fencer"},
        "subjects": [{"kind": "ServiceAccount", "name": FENCER_SA, "namespace": NAMESPACE}]
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("bind the fence controller's ClusterRole")?;
    let agent_1 = agent_pod(ctx, "node-1").await?;
    let agent_2 = agent_pod(ctx, "node-2").await?;
    let config = ctx.cluster.config().await?;
    let with_token = |token: String| -> anyhow::Result<kube::Client> {
        let mut c = config.clone();
        c.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        Ok(kube::Client::try_from(c)?)
    };
    let mut kubelet = config.clone();
    kubelet.auth_info.impersonate = Some("system:node:node-1".into());
    kubelet.auth_info.impersonate_groups = Some(vec!["system:nodes".into()]);
    Ok(Writers {
        agent_1: with_token(token(&sas, AGENT_SA, Some(&agent_1)).await?)?,
        agent_2: with_token(token(&sas, AGENT_SA, Some(&agent_2)).await?)?,
        agent_nowhere: with_token(token(&sas, AGENT_SA, None).await?)?,
        podha: with_token(token(&sas, RELEASE, None).await?)?,
        fencer: with_token(token(&sas, FENCER_SA, None).await?)?,
        kubelet_1: kube::Client::try_from(kubelet)?,
        admin,
    })
}

/// An agent pod on `node` (the chart's agent ServiceAccount): what its tokens are bound to.
async fn agent_pod(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<Pod> {
    ctx.create::<Pod>(json!({
        "metadata": {"name": format!("agent-{node}")},
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SA,
            "containers": [{"name": "agent", "image": "podha:sim"}]
        }
    }))
    .await
}

/// A token of ServiceAccount `sa`, bound to `pod` when given (the API server then names the
/// pod's node in the token's user info).
async fn token(sas: &Api<ServiceAccount>, sa: &str, pod: Option<&Pod>) -> anyhow::Result<String> {
    let bound = pod.map(|p| {
        json!({
            "kind": "Pod", "apiVersion": "v1",
            "name": p.metadata.name, "uid": p.metadata.uid
        })
    });
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 3600, "boundObjectRef": bound}
    }))?;
    let answer = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .with_context(|| format!("request a token of {sa}"))?;
    answer
        .status
        .map(|s| s.token)
        .with_context(|| format!("the token request of {sa} returned no token"))
}

async fn patch_node(client: &kube::Client, node: &str, patch: Value) -> kube::Result<Node> {
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// Sets (or with `None` removes) annotation `key` of `node`, as the agents and podha do.
async fn annotate(
    client: &kube::Client,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> kube::Result<Node> {
    patch_node(
        client,
        node,
        json!({"metadata": {"annotations": {key: value}}}),
    )
    .await
}

/// Creates or renews agent Lease `name` held by `holder`, as the agent does.
async fn apply_lease(client: &kube::Client, name: &str, holder: &str) -> kube::Result<Lease> {
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": {AGENT_LEASE_LABEL: "true"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 40}
    });
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .patch(
            name,
            &PatchParams::apply("podha-agent").force(),
            &Patch::Apply(&body),
        )
        .await
}

async fn delete_lease(client: &kube::Client, name: &str) -> kube::Result<()> {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .delete(name, &DeleteParams::default())
        .await
        .map(|_| ())
}

/// `result` is the API server's refusal (403) whose message contains `because`.
fn refused<T>(result: kube::Result<T>, what: &str, because: &str) -> anyhow::Result<()> {
    match result {
        Ok(_) => bail!("{what}: accepted, must be refused"),
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains(because) => {
            Ok(())
        }
        Err(e) => bail!("{what}: refused, but not because {because:?}: {e}"),
    }
}
