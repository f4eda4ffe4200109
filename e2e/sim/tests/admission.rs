//! The chart's admission policies on the sim's real API server: each write podha trusts (the
//! contract's Node annotations, the agent Leases, podha's leader Lease) is accepted from its
//! writer only, and no Secret is made to hold a token of podha's or the agent's account.
//! Agents authenticate as the chart's agent ServiceAccount with tokens a kubelet requested for
//! a pod on its node (the API server puts the pod and its node in the token's user info), podha
//! as its own ServiceAccount the same way, a fence controller as a user listed in
//! `rbac.fenceAcknowledgers`, a writer of the namespace's Secrets as a ServiceAccount a Role
//! lets do that, a kubelet and the admin as themselves.
//!
//! Needs `make k8s` and `make helm`; without them the test fails with that hint.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use libtest_mimic::Arguments;
use podha::contract::{
    AGENT_FENCED_WITHIN_ANNOTATION, AGENT_KEY_ANNOTATION, AGENT_LEASE_LABEL, AGENT_PORT_ANNOTATION,
    AGENT_WATCHDOG_ANNOTATION, FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION, agent_lease_name,
};
use podha_sim::chart_rbac::{self, RELEASE};
use podha_sim::testkit::*;
use serde_json::{Value, json};

const NAMESPACE: &str = "admission";
const AGENT_SA: &str = "podha-agent";
const FENCER_SA: &str = "fencer";
const SECRET_WRITER_SA: &str = "secret-writer";
/// A Secret of this type gets a never-expiring token of the ServiceAccount its annotation
/// [`TOKEN_ACCOUNT_ANNOTATION`] names from the tokens controller.
const TOKEN_SECRET_TYPE: &str = "kubernetes.io/service-account-token";
const TOKEN_ACCOUNT_ANNOTATION: &str = "kubernetes.io/service-account.name";
/// Made before the policies, as on a cluster that had them off.
const LEGACY_TOKEN_SECRET: &str = "podha-legacy-token";
/// The chart's default `leaderElection.leaseName`.
const LEADER_LEASE: &str = "podha-leader";

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
    /// The agents of node-1 and node-2, with the pods their tokens are bound to.
    agent_1: kube::Client,
    agent_1_pod: Pod,
    agent_2: kube::Client,
    agent_2_pod: Pod,
    /// The agent ServiceAccount with a token bound to no pod: it names no node.
    agent_nowhere: kube::Client,
    podha: kube::Client,
    /// podha's ServiceAccount with a token bound to no pod.
    podha_unbound: kube::Client,
    fencer: kube::Client,
    /// A ServiceAccount that may create and change the Secrets of the namespace, nothing else.
    secret_writer: kube::Client,
    /// node-1's kubelet (`system:node:node-1`, impersonated by the admin).
    kubelet_1: kube::Client,
    /// `system:masters`, in the chart's default `rbac.annotationCleaners`.
    admin: kube::Client,
}

fn each_write_from_its_writer(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, NAMESPACE, |ctx| async move {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/podha");
        let fencer = format!("system:serviceaccount:{NAMESPACE}:{FENCER_SA}");
        legacy_token_secret(&ctx.client).await?;
        chart_rbac::apply_agent_policies(
            ctx.cluster,
            &chart_rbac::helm_path()?,
            &chart,
            NAMESPACE,
            &[format!("rbac.fenceAcknowledgers={{{fencer}}}")],
        )?;
        policies_type_check(&ctx.client).await?;
        fence_controller(&ctx.client).await?;
        secret_writer_account(&ctx.client).await?;
        // Until the API server loaded the policies, the token goes out (and is thrown away).
        let sas: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), NAMESPACE);
        wait_for(
            "the policies to refuse an admin an agent's token",
            secs(30),
            || async {
                match token(&sas, AGENT_SA, None).await {
                    Ok(_) => Ok(None),
                    Err(e) => match e.downcast_ref::<kube::Error>() {
                        Some(kube::Error::Api(s)) if s.code == 403 => Ok(Some(())),
                        _ => Err(e),
                    },
                }
            },
        )
        .await?;
        let w = writers(&ctx).await?;
        node_annotations(&w).await?;
        agent_leases(&w).await?;
        leader_lease(&w).await?;
        heartbeat_key(&w).await?;
        token_secrets(&w).await?;

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

async fn node_annotations(w: &Writers) -> anyhow::Result<()> {
    log(
        NAMESPACE,
        "an agent writes its own node's annotations, nothing else",
    );
    for key in [
        AGENT_PORT_ANNOTATION,
        AGENT_FENCED_WITHIN_ANNOTATION,
        AGENT_WATCHDOG_ANNOTATION,
        AGENT_KEY_ANNOTATION,
        FENCE_ACK_ANNOTATION,
    ] {
        annotate(&w.agent_1, "node-1", key, Some("9000")).await?;
        annotate(&w.agent_1, "node-1", key, Some("9001")).await?;
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
    let elsewhere = "only the agent annotations of its own node";
    annotate(&w.admin, "node-1", "example.com/other", Some("x")).await?;
    for (what, patch) in [
        (
            "writing another annotation",
            json!({"metadata": {"annotations": {"example.com/other": "y"}}}),
        ),
        (
            "removing another annotation",
            json!({"metadata": {"annotations": {"example.com/other": null}}}),
        ),
        ("cordoning it", json!({"spec": {"unschedulable": true}})),
        ("labelling it", json!({"metadata": {"labels": {"x": "y"}}})),
        (
            "giving it a finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ] {
        refused(
            patch_node(&w.agent_1, "node-1", patch).await,
            &format!("agent of node-1 {what}"),
            elsewhere,
        )?;
    }
    refused(
        patch_node(
            &w.agent_1,
            "node-2",
            json!({"spec": {"unschedulable": true}}),
        )
        .await,
        "agent of node-1 cordoning node-2",
        elsewhere,
    )?;

    log(
        NAMESPACE,
        "podha requests fences; only agents and acknowledgers acknowledge",
    );
    annotate(&w.podha, "node-1", FENCE_REQUEST_ANNOTATION, Some("p/1/b")).await?;
    refused(
        annotate(
            &w.podha_unbound,
            "node-2",
            FENCE_REQUEST_ANNOTATION,
            Some("p/1/b"),
        )
        .await,
        "podha's ServiceAccount with a token of no pod requesting a fence",
        "may not change podha.io/fence-request",
    )?;
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
        refused(
            annotate(client, "node-1", AGENT_KEY_ANNOTATION, Some("k")).await,
            &format!("{who} putting its own key on node-1"),
            "may not change podha.io/agent-key",
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
    annotate(&w.podha, "node-1", FENCE_REQUEST_ANNOTATION, None).await?;

    log(
        NAMESPACE,
        "what an agent left behind, an admin may remove, not change",
    );
    annotate(&w.agent_2, "node-2", AGENT_PORT_ANNOTATION, Some("9441")).await?;
    refused(
        annotate(&w.admin, "node-2", AGENT_PORT_ANNOTATION, Some("1")).await,
        "an admin changing node-2's agent port",
        "may not change podha.io/agent-port",
    )?;
    annotate(&w.admin, "node-2", AGENT_PORT_ANNOTATION, None).await?;
    annotate(&w.admin, "node-1", FENCE_ACK_ANNOTATION, None).await?;
    annotate(&w.admin, "node-1", "example.com/other", None).await?;
    Ok(())
}

async fn agent_leases(w: &Writers) -> anyhow::Result<()> {
    log(
        NAMESPACE,
        "an agent keeps its own node's Lease and no other",
    );
    let (own, other) = (agent_lease_name("node-1"), agent_lease_name("node-2"));
    let owner = Some(&w.agent_1_pod);
    apply_lease(&w.agent_1, &own, "node-1", owner, 40).await?;
    apply_lease(&w.agent_1, &own, "node-1", owner, 40).await?;
    let only_own = "may write only the agent Lease of its own node";
    for (what, result) in [
        (
            "handing its Lease to node-2",
            apply_lease(&w.agent_1, &own, "node-2", owner, 40).await,
        ),
        (
            "advertising node-2's agent",
            apply_lease(&w.agent_1, &other, "node-2", owner, 40).await,
        ),
        (
            "taking node-2's absent Lease for itself",
            apply_lease(&w.agent_1, &other, "node-1", owner, 40).await,
        ),
        (
            "taking podha's absent leader Lease",
            apply_lease(&w.agent_1, LEADER_LEASE, "node-1", owner, 40).await,
        ),
        (
            "making its Lease last an hour",
            apply_lease(&w.agent_1, &own, "node-1", owner, 3600).await,
        ),
        (
            "keeping a Lease no pod owns",
            apply_lease(&w.agent_1, &own, "node-1", None, 40).await,
        ),
        (
            "keeping a Lease node-2's agent pod owns",
            apply_lease(&w.agent_1, &own, "node-1", Some(&w.agent_2_pod), 40).await,
        ),
    ] {
        refused(result, &format!("agent of node-1 {what}"), only_own)?;
    }
    refused(
        Api::<Lease>::namespaced(w.agent_1.clone(), NAMESPACE)
            .patch(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
            )
            .await,
        "agent of node-1 keeping its Lease past its deletion",
        only_own,
    )?;
    refused(
        apply_lease(&w.agent_nowhere, &other, "node-2", None, 40).await,
        "an agent token bound to no pod advertising node-2's agent",
        "its token names no node",
    )?;
    refused(
        apply_lease(&w.admin, &other, "node-2", None, 40).await,
        "an admin forging node-2's advert",
        "only the podha agent of its node does",
    )?;
    apply_lease(&w.agent_2, &other, "node-2", Some(&w.agent_2_pod), 40).await?;
    refused(
        apply_lease(&w.admin, &other, "node-2", None, 40).await,
        "an admin renewing node-2's advert",
        "only the podha agent of its node does",
    )?;
    refused(
        delete_lease(&w.agent_1, &other).await,
        "agent of node-1 withdrawing node-2's advert",
        only_own,
    )?;
    delete_lease(&w.agent_1, &own).await?;
    delete_lease(&w.admin, &other).await?;
    Ok(())
}

async fn leader_lease(w: &Writers) -> anyhow::Result<()> {
    log(NAMESPACE, "only podha writes its leader Lease");
    let leader = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEADER_LEASE},
        "spec": {"holderIdentity": "podha-a", "leaseDurationSeconds": 15}
    });
    let apply = |client: &kube::Client| {
        let leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
        let leader = leader.clone();
        async move {
            leases
                .patch(
                    LEADER_LEASE,
                    &PatchParams::apply("podha").force(),
                    &Patch::Apply(&leader),
                )
                .await
        }
    };
    let only_podha = "only podha does, with a token of its own pod";
    refused(
        apply(&w.admin).await,
        "an admin creating podha's leader Lease",
        only_podha,
    )?;
    apply(&w.podha)
        .await
        .context("podha creating its leader Lease")?;
    refused(
        apply(&w.admin).await,
        "an admin taking podha's leader Lease",
        only_podha,
    )?;
    refused(
        apply(&w.podha_unbound).await,
        "podha's ServiceAccount with a token of no pod taking the leader Lease",
        only_podha,
    )?;
    refused(
        delete_lease(&w.agent_1, LEADER_LEASE).await,
        "agent of node-1 deleting podha's leader Lease",
        "may write only the agent Lease of its own node",
    )?;
    delete_lease(&w.admin, LEADER_LEASE).await?;
    Ok(())
}

async fn heartbeat_key(w: &Writers) -> anyhow::Result<()> {
    log(
        NAMESPACE,
        "only podha makes its heartbeat key; nobody changes it",
    );
    let name = format!("{LEADER_LEASE}-heartbeat-key");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": {"pkcs8": "a2V5"},
    }))?;
    let secrets = |client: &kube::Client| Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    let only_podha = "only podha makes its heartbeat key";
    refused(
        secrets(&w.admin)
            .create(&PostParams::default(), &secret)
            .await,
        "an admin making podha's heartbeat key",
        only_podha,
    )?;
    refused(
        secrets(&w.podha_unbound)
            .create(&PostParams::default(), &secret)
            .await,
        "podha's ServiceAccount with a token of no pod making the key",
        only_podha,
    )?;
    secrets(&w.podha)
        .create(&PostParams::default(), &secret)
        .await
        .context("podha making its heartbeat key")?;
    let replaced = json!({"data": {"pkcs8": "b3RoZXI="}});
    refused(
        secrets(&w.admin)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&replaced))
            .await,
        "an admin replacing podha's heartbeat key",
        only_podha,
    )?;
    secrets(&w.admin)
        .delete(&name, &DeleteParams::default())
        .await
        .context("an admin deleting the key (to change it)")?;
    Ok(())
}

async fn token_secrets(w: &Writers) -> anyhow::Result<()> {
    log(
        NAMESPACE,
        "no Secret is made to hold a token of podha's or the agent's account",
    );
    for (who, client) in [
        ("a writer of the namespace's Secrets", &w.secret_writer),
        ("an admin", &w.admin),
    ] {
        for sa in [RELEASE, AGENT_SA] {
            refused(
                create_secret(client, token_secret("minted", sa)?).await,
                &format!("{who} making a Secret hold a token of {sa}"),
                &format!("may not make Secret minted hold a token of {sa}"),
            )?;
        }
    }

    log(
        NAMESPACE,
        "other Secrets, and token Secrets of other accounts, are made as before",
    );
    // Named like podha's account and annotated with it, but of a type that holds no token.
    let plain: Secret = serde_json::from_value(json!({
        "metadata": {"name": RELEASE, "annotations": {TOKEN_ACCOUNT_ANNOTATION: RELEASE}},
        "data": {"password": "c2VjcmV0"},
    }))?;
    create_secret(&w.secret_writer, plain)
        .await
        .context("a writer of Secrets making an ordinary Secret")?;
    create_secret(&w.secret_writer, token_secret("fencer-token", FENCER_SA)?)
        .await
        .context("a writer of Secrets making a token Secret of the fence controller")?;
    let secrets = Api::<Secret>::namespaced(w.secret_writer.clone(), NAMESPACE);
    refused(
        secrets
            .patch(
                "fencer-token",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    TOKEN_ACCOUNT_ANNOTATION: RELEASE,
                    "kubernetes.io/service-account.uid": null,
                }}})),
            )
            .await,
        "a writer of Secrets handing the fence controller's token Secret to podha",
        &format!("may not make Secret fencer-token hold a token of {RELEASE}"),
    )?;

    log(
        NAMESPACE,
        "a token Secret of podha's from before the policies may be retired, not handed on",
    );
    secrets
        .patch(
            LEGACY_TOKEN_SECRET,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "kubernetes.io/legacy-token-invalid-since": "2026-01-01"
            }}})),
        )
        .await
        .context("marking podha's legacy token Secret invalid, as the legacy token cleaner does")?;
    refused(
        secrets
            .patch(
                LEGACY_TOKEN_SECRET,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    TOKEN_ACCOUNT_ANNOTATION: AGENT_SA,
                    "kubernetes.io/service-account.uid": null,
                }}})),
            )
            .await,
        "a writer of Secrets handing podha's legacy token Secret to the agent",
        &format!("may not make Secret {LEGACY_TOKEN_SECRET} hold a token of {AGENT_SA}"),
    )?;
    for name in [RELEASE, "fencer-token", LEGACY_TOKEN_SECRET] {
        secrets
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("a writer of Secrets deleting Secret {name}"))?;
    }
    Ok(())
}

/// A Secret that asks the tokens controller for a token of ServiceAccount `sa`.
fn token_secret(name: &str, sa: &str) -> anyhow::Result<Secret> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {TOKEN_ACCOUNT_ANNOTATION: sa}},
        "type": TOKEN_SECRET_TYPE,
    }))?)
}

async fn create_secret(client: &kube::Client, secret: Secret) -> kube::Result<Secret> {
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
}

/// podha's ServiceAccount (the chart's, applied over it later) with a token Secret, made while
/// no policy guards them.
async fn legacy_token_secret(admin: &kube::Client) -> anyhow::Result<()> {
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": RELEASE}}))?,
        )
        .await
        .context("create podha's ServiceAccount ahead of the chart")?;
    create_secret(admin, token_secret(LEGACY_TOKEN_SECRET, RELEASE)?)
        .await
        .context("create a token Secret of podha's before the policies")?;
    Ok(())
}

/// A ServiceAccount with a Role over the Secrets of the namespace: what the policies, not
/// RBAC, keep from minting podha's tokens.
async fn secret_writer_account(admin: &kube::Client) -> anyhow::Result<()> {
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": SECRET_WRITER_SA}}))?,
        )
        .await
        .context("create the Secret writer's ServiceAccount")?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": SECRET_WRITER_SA},
        "rules": [{"apiGroups": [""], "resources": ["secrets"],
                   "verbs": ["get", "create", "update", "patch", "delete"]}]
    }))?;
    Api::<Role>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &role)
        .await
        .context("create the Secret writer's Role")?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": SECRET_WRITER_SA},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SECRET_WRITER_SA},
        "subjects": [{"kind": "ServiceAccount", "name": SECRET_WRITER_SA, "namespace": NAMESPACE}]
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &binding)
        .await
        .context("bind the Secret writer's Role")?;
    Ok(())
}

/// The API server type-checked every expression of the chart's policies without a warning.
async fn policies_type_check(admin: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
    let api: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    for name in ["node-annotations", "leases", "tokens", "heartbeat-key"] {
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

/// A fence controller's ServiceAccount, allowed by RBAC to patch Nodes.
async fn fence_controller(admin: &kube::Client) -> anyhow::Result<()> {
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create(
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
    Ok(())
}

async fn writers(ctx: &Ctx<'_>) -> anyhow::Result<Writers> {
    let admin = ctx.client.clone();
    let config = ctx.cluster.config().await?;
    let kubelet = |node: &str| -> anyhow::Result<kube::Client> {
        let mut c = config.clone();
        c.auth_info.impersonate = Some(format!("system:node:{node}"));
        c.auth_info.impersonate_groups = Some(vec!["system:nodes".into()]);
        Ok(kube::Client::try_from(c)?)
    };
    let with_token = |token: String| -> anyhow::Result<kube::Client> {
        let mut c = config.clone();
        c.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        Ok(kube::Client::try_from(c)?)
    };
    // Tokens of podha's and the agents' accounts, as the kubelets of their pods request them.
    let tokens_of = |node: &str| -> anyhow::Result<Api<ServiceAccount>> {
        Ok(Api::namespaced(kubelet(node)?, NAMESPACE))
    };
    let agent_1_pod = pod(ctx, "agent-node-1", "node-1", AGENT_SA).await?;
    let agent_2_pod = pod(ctx, "agent-node-2", "node-2", AGENT_SA).await?;
    let podha_pod = pod(ctx, "podha-a", "node-1", RELEASE).await?;
    let (on_1, on_2) = (tokens_of("node-1")?, tokens_of("node-2")?);
    Ok(Writers {
        agent_1: with_token(token(&on_1, AGENT_SA, Some(&agent_1_pod)).await?)?,
        agent_2: with_token(token(&on_2, AGENT_SA, Some(&agent_2_pod)).await?)?,
        agent_nowhere: with_token(token(&on_1, AGENT_SA, None).await?)?,
        podha: with_token(token(&on_1, RELEASE, Some(&podha_pod)).await?)?,
        podha_unbound: with_token(token(&on_1, RELEASE, None).await?)?,
        fencer: with_token(
            token(&Api::namespaced(admin.clone(), NAMESPACE), FENCER_SA, None).await?,
        )?,
        secret_writer: with_token(
            token(
                &Api::namespaced(admin.clone(), NAMESPACE),
                SECRET_WRITER_SA,
                None,
            )
            .await?,
        )?,
        kubelet_1: kubelet("node-1")?,
        agent_1_pod,
        agent_2_pod,
        admin,
    })
}

/// A pod of ServiceAccount `sa` on `node`: what its tokens are bound to.
async fn pod(ctx: &Ctx<'_>, name: &str, node: &str, sa: &str) -> anyhow::Result<Pod> {
    ctx.create::<Pod>(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa,
            "containers": [{"name": "main", "image": "podha:sim"}]
        }
    }))
    .await
}

/// A token of ServiceAccount `sa`, bound to `pod` when given (the API server then names the
/// pod and its node in the token's user info), requested through `sas`.
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
        .await?;
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

/// Creates or renews agent Lease `name` held by `holder` for `seconds`, owned by `owner`, as
/// the agent does.
async fn apply_lease(
    client: &kube::Client,
    name: &str,
    holder: &str,
    owner: Option<&Pod>,
    seconds: i32,
) -> kube::Result<Lease> {
    let owners: Vec<Value> = owner
        .map(|p| json!({"apiVersion": "v1", "kind": "Pod", "name": p.metadata.name, "uid": p.metadata.uid}))
        .into_iter()
        .collect();
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": {AGENT_LEASE_LABEL: "true"}, "ownerReferences": owners},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds}
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
