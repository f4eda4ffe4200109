//! The chart against a release namespace's Pod Security Admission level: the agent's pods
//! (privileged, host network, host paths) are refused where the namespace enforces
//! `baseline` or `restricted`, so `helm install` there fails at once and says what to do,
//! instead of a DaemonSet whose pods never appear. Server-side dry runs against the sim's API
//! server (the chart's `lookup` reads the namespace; nothing is created).

use std::process::Command;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use super::{Failed, Operators, SharedCluster, log};
use podha_sim::testkit::*;

/// The release the dry runs install: not `podha`, whose cluster-wide objects (its
/// ClusterRole) the suite's podha replicas already have, as `helm template` renders them, and
/// a server-side dry run would find them taken.
const RELEASE: &str = "psa-check";

/// `helm install --dry-run=server` of the chart into `namespace`, with `set`: whether it
/// passed, and what helm said.
fn dry_install(ctx: &Ctx<'_>, namespace: &str, set: &[&str]) -> anyhow::Result<(bool, String)> {
    let helm = podha_sim::chart_rbac::helm_path()?;
    let mut cmd = Command::new(helm);
    cmd.args(["install", RELEASE])
        .arg(podha_sim::chart_install::chart_dir())
        .args(["-n", namespace, "--dry-run=server", "--kubeconfig"])
        .arg(ctx.cluster.kubeconfig_path());
    for value in set {
        cmd.args(["--set", value]);
    }
    let out = cmd.output().context("running helm")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    Ok((out.status.success(), said))
}

pub fn refused_where_the_agent_cannot_run(
    shared: &SharedCluster,
    _: &Operators,
) -> Result<(), Failed> {
    run_scenario(shared, "psa", |ctx| async move {
        for (namespace, level) in [
            ("psa-baseline", "baseline"),
            ("psa-privileged", "privileged"),
        ] {
            let enforce = [("pod-security.kubernetes.io/enforce", level)];
            create_labelled_namespace(&ctx.client, namespace, &enforce).await?;
        }
        let (passed, said) = dry_install(&ctx, "psa-baseline", &[])?;
        ensure!(
            !passed
                && said
                    .contains("namespace psa-baseline enforces the baseline Pod Security Standard")
                && said.contains("pod-security.kubernetes.io/enforce=privileged"),
            "a namespace enforcing baseline must refuse the chart with its agent, saying how \
             to fix it; helm said: {said}"
        );
        log(&ctx.ns, "baseline namespace: refused, naming the label");
        for (namespace, set) in [
            ("psa-baseline", &["agent.enabled=false"][..]),
            ("psa-privileged", &[][..]),
        ] {
            let (passed, said) = dry_install(&ctx, namespace, set)?;
            ensure!(
                passed,
                "the chart {set:?} in {namespace} must install; helm said: {said}"
            );
        }
        log(
            &ctx.ns,
            "privileged namespace, or no agent: the install goes through",
        );
        let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
        for namespace in ["psa-baseline", "psa-privileged"] {
            namespaces.delete(namespace, &Default::default()).await?;
        }
        Ok(())
    })
}
