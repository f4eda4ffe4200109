//! podha installed onto a sim cluster's real nodes as docs/install.md tells a user: its image
//! loaded into every real node's containerd (`make image`, as `kind load` would), then
//! `helm install charts/podha`, the replicas kept on the real nodes. Used by the real-node
//! tests, the demo and the benchmark.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use crate::cluster::Cluster;
use crate::testkit::{running_ready, terminating, wait_for};

/// The namespace and release name docs/install.md uses.
pub const NAMESPACE: &str = "podha-system";
pub const RELEASE: &str = "podha";
/// The chart's default `leaderElection.leaseName`.
pub const LEASE: &str = "podha-leader";

/// `$PODHA_IMAGE_TAR` (the Makefile sets it), else `target/podha-image.tar` found from the
/// running executable, as `make image` writes it; an error saying how to build it when missing.
pub fn image_tar() -> anyhow::Result<PathBuf> {
    let tar = std::env::var_os("PODHA_IMAGE_TAR")
        .filter(|t| !t.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            let target = exe
                .ancestors()
                .find(|a| a.file_name().is_some_and(|n| n == "target"))?
                .to_path_buf();
            Some(target.join("podha-image.tar"))
        })
        .context("cannot tell where podha's image is: set PODHA_IMAGE_TAR")?;
    ensure!(
        tar.is_file(),
        "podha's image {} is missing: run `make image`",
        tar.display()
    );
    Ok(tar)
}

/// The repository's chart, found from this crate's sources.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/podha")
}

/// Runs `cmd`; its stdout, or an error with both outputs.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Loads podha's image into every real node and `helm install`s the chart into [`NAMESPACE`]
/// with `set` values (`key=value`, as `--set` takes them) and the replicas on real nodes.
pub fn install(cluster: &Cluster, helm: &Path, set: &[&str]) -> anyhow::Result<()> {
    cluster.load_image(&image_tar()?)?;
    let mut cmd = Command::new(helm);
    cmd.arg("install")
        .arg(RELEASE)
        .arg(chart_dir())
        .args(["-n", NAMESPACE, "--create-namespace"])
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["--set", "nodeSelector.type=real"]);
    for value in set {
        cmd.args(["--set", value]);
    }
    run(&mut cmd)?;
    Ok(())
}

/// The chart's live pods.
pub async fn podha_pods(client: &kube::Client) -> anyhow::Result<Vec<Pod>> {
    let lp = ListParams::default().labels("app.kubernetes.io/name=podha");
    Ok(Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| !terminating(p))
        .collect())
}

/// Waits until `replicas` pods of the chart are Running and Ready; returns them.
pub async fn wait_replicas(
    client: &kube::Client,
    replicas: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<Pod>> {
    wait_for(
        &format!("{replicas} podha replicas Running and Ready"),
        timeout,
        || async {
            let pods = podha_pods(client).await?;
            Ok((pods.len() == replicas && pods.iter().all(running_ready)).then_some(pods))
        },
    )
    .await
}

/// Who holds podha's leader Lease.
pub async fn lease_holder(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    Ok(leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until one of `pods` holds the Lease; returns its name.
pub async fn wait_leader(
    client: &kube::Client,
    pods: &[Pod],
    timeout: Duration,
) -> anyhow::Result<String> {
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    wait_for("a podha replica to hold the Lease", timeout, || async {
        Ok(lease_holder(client).await?.filter(|h| names.contains(h)))
    })
    .await
}

/// `/metrics` of a podha pod, fetched from inside its node's network namespace (the only place
/// its address is routed to; no port-forward in the sim).
pub fn pod_metrics(cluster: &Cluster, pod: &Pod) -> anyhow::Result<String> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .context("pod not bound")?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("pod has no IP")?;
    let netns = cluster.node_netns(node)?;
    run(Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["curl", "-sS", "--max-time", "5"])
        .arg(format!("http://{ip}:8080/metrics")))
}
