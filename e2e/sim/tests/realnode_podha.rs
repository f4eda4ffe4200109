//! podha installed by its own chart onto real nodes, as docs/install.md tells a user, with the
//! image loaded into the nodes' containerd instead of pulled (`make image`, like `kind load`):
//!
//! - both replicas run on the real nodes, Ready, as the chart's ServiceAccount, reaching the API
//!   server through the `kubernetes` Service (in-cluster config; kube-proxy on each node);
//! - one of them holds the leader Lease, says so on `/metrics` (read from inside its node's
//!   network namespace), and the other says it does not lead;
//! - a PodHAPolicy is reported `Ready=True` in its status (the leader writes it);
//! - the node running the leader dies: the other replica takes the Lease.
//!
//! Needs root, `make k8s csi-sidecars node-deps node-pause helm image` (`make real-node-test`
//! does it); without them the test fails and says which target to run.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use libtest_mimic::Arguments;
use podha_sim::testkit::*;
use serde_json::json;

const KWOK_NODES: usize = 2;
const REAL_NODES: usize = 2;
const NAMESPACE: &str = "podha-system";
const RELEASE: &str = "podha";
/// The chart's default `leaderElection.leaseName`.
const LEASE: &str = "podha-leader";
const POLICY: &str = "real-nodes";

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let shared = Arc::new(
        SharedCluster::new(
            env!("CARGO_TARGET_TMPDIR"),
            "podha-sim-realnode-podha",
            KWOK_NODES,
            Some(env!("CARGO_BIN_EXE_podha-sim").into()),
        )
        .with_real_nodes(REAL_NODES),
    );
    let scenarios: [Scenario; 1] = [(
        "podha_installed_by_its_chart_leads_on_real_nodes_and_fails_over",
        installed_by_chart,
    )];
    run_trials(&args, &shared, scenarios.into())
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `$PODHA_IMAGE_TAR`, else `target/podha-image.tar`, as `make image` writes it.
fn image_tar() -> anyhow::Result<PathBuf> {
    let tar = std::env::var_os("PODHA_IMAGE_TAR")
        .filter(|t| !t.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("../podha-image.tar"));
    ensure!(
        tar.is_file(),
        "podha's image {} is missing: run `make image`",
        tar.display()
    );
    Ok(tar)
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The chart's pods, by name, with their nodes.
async fn podha_pods(ctx: &Ctx<'_>) -> anyhow::Result<Vec<Pod>> {
    let lp = ListParams::default().labels("app.kubernetes.io/name=podha");
    Ok(ctx
        .pods()
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| !terminating(p))
        .collect())
}

async fn lease_holder(ctx: &Ctx<'_>) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), NAMESPACE);
    Ok(leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// `/metrics` of a pod, fetched from inside its node's network namespace (the only place its
/// address is routed to; no port-forward in the sim).
fn metrics(ctx: &Ctx<'_>, pod: &Pod) -> anyhow::Result<String> {
    let node = node_of(pod).context("pod not bound")?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("pod has no IP")?;
    let netns = ctx.cluster.node_netns(node)?;
    run(Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["curl", "-sS", "--max-time", "5"])
        .arg(format!("http://{ip}:8080/metrics")))
}

fn leader_gauge(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("podha_leader "))
        .map(str::trim)
}

/// Waits (10 s) until the pod's `/metrics` shows `podha_leader <value>`: the gauge follows the
/// Lease a moment later.
async fn wait_leader_gauge(ctx: &Ctx<'_>, pod: &Pod, value: &str) -> anyhow::Result<()> {
    let mut last = None;
    let what = format!("{}'s /metrics to say podha_leader {value}", name_of(pod));
    let res = wait_for(&what, secs(10), || {
        let text = metrics(ctx, pod);
        let seen = text
            .as_deref()
            .ok()
            .and_then(leader_gauge)
            .map(str::to_string);
        let done = seen.as_deref() == Some(value);
        last = Some(text.map(|_| seen));
        async move { Ok(done.then_some(())) }
    })
    .await;
    res.with_context(|| format!("last seen: {last:?}"))
}

fn installed_by_chart(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    let (helm, tar) = (podha_sim::chart_rbac::helm_path()?, image_tar()?);
    run_scenario(shared, NAMESPACE, |ctx| async move {
        let real: Vec<String> = (KWOK_NODES + 1..=KWOK_NODES + REAL_NODES)
            .map(|i| format!("node-{i}"))
            .collect();
        let loaded = ctx.cluster.load_image(&tar)?;
        ensure!(loaded == real, "image loaded into {loaded:?}, not {real:?}");

        // docs/install.md §2, with the image the nodes already have (chart default podha:<appVersion>,
        // pullPolicy IfNotPresent) and the replicas kept on the real nodes.
        let chart = repo_root().join("charts/podha");
        run(Command::new(&helm)
            .arg("install")
            .arg(RELEASE)
            .arg(&chart)
            .args(["-n", NAMESPACE, "--create-namespace"])
            .arg("--kubeconfig")
            .arg(ctx.cluster.kubeconfig_path())
            .args(["--set", "nodeSelector.type=real"]))?;
        log(NAMESPACE, "helm install done");

        let pods = wait_for(
            "both podha replicas Running and Ready on the real nodes",
            secs(120),
            || async {
                let pods = podha_pods(&ctx).await?;
                Ok((pods.len() == 2 && pods.iter().all(running_ready)).then_some(pods))
            },
        )
        .await?;
        let mut nodes: Vec<&str> = pods.iter().filter_map(node_of).collect();
        nodes.sort();
        ensure!(
            nodes == real,
            "the replicas run on {nodes:?}, not one on each real node {real:?} (the chart's \
             anti-affinity)"
        );
        for p in &pods {
            let sa = p
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref());
            ensure!(sa == Some(RELEASE), "{} runs as {sa:?}", name_of(p));
        }
        log(NAMESPACE, format!("replicas Ready on {nodes:?}"));

        let names: Vec<String> = pods.iter().map(|p| name_of(p).to_string()).collect();
        let leader = wait_for("a replica to hold the Lease", secs(60), || async {
            Ok(lease_holder(&ctx).await?.filter(|h| names.contains(h)))
        })
        .await?;
        let leader_pod = pods
            .iter()
            .find(|p| name_of(p) == leader)
            .context("leader pod")?;
        let follower_pod = pods
            .iter()
            .find(|p| name_of(p) != leader)
            .context("follower")?;
        wait_leader_gauge(&ctx, leader_pod, "1").await?;
        wait_leader_gauge(&ctx, follower_pod, "0").await?;
        log(
            NAMESPACE,
            format!("{leader} leads (Lease and /metrics), the other follows"),
        );

        let gvk = GroupVersionKind::gvk("podha.io", "v1alpha1", "PodHAPolicy");
        let policies: Api<DynamicObject> =
            Api::all_with(ctx.client.clone(), &ApiResource::from_gvk(&gvk));
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "podha.io/v1alpha1",
            "kind": "PodHAPolicy",
            "metadata": { "name": POLICY },
            "spec": {
                "nodeSelector": { "matchLabels": { "type": "real" } },
                "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": NAMESPACE } },
                "dryRun": true,
            },
        }))?;
        policies
            .patch(
                POLICY,
                &PatchParams::apply("realnode-podha").force(),
                &Patch::Apply(&policy),
            )
            .await
            .context("apply the PodHAPolicy")?;
        let policies = &policies;
        wait_for(
            "the PodHAPolicy's status Ready=True",
            secs(60),
            || async move {
                let p = policies.get(POLICY).await?;
                let conditions = p.data["status"]["conditions"].as_array().cloned();
                Ok(conditions
                    .unwrap_or_default()
                    .iter()
                    .find_map(|c| (c["type"] == "Ready" && c["status"] == "True").then_some(())))
            },
        )
        .await?;
        log(NAMESPACE, "policy Ready=True");

        let leader_node = node_of(leader_pod).context("leader node")?.to_string();
        let follower = name_of(follower_pod).to_string();
        ctx.cluster.kill_node(&leader_node)?;
        log(
            NAMESPACE,
            format!("{leader_node}, running leader {leader}, killed"),
        );
        let started = std::time::Instant::now();
        wait_for(
            &format!("{follower} to take the Lease from {leader}"),
            secs(60),
            || async {
                Ok((lease_holder(&ctx).await?.as_deref() == Some(&follower)).then_some(()))
            },
        )
        .await?;
        wait_leader_gauge(&ctx, follower_pod, "1").await?;
        log(
            NAMESPACE,
            format!(
                "{follower} took over {:.1?} after the kill",
                started.elapsed()
            ),
        );
        Ok(())
    })
}
