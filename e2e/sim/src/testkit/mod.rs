//! What the integration tests on the sim cluster share (this crate's and the operator's): one shared cluster per test binary, polling
//! waits, object builders, queries and a dump of everything relevant for failure messages.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, ClusterOptions, Profile};
use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Taint,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

mod dump;
mod explain;
mod objects;
pub use dump::dump;
pub use explain::{explained_rule, podha_explain};
pub use objects::{deployment, deployment_of, pvc, statefulset, statefulset_of};

/// One cluster shared by every test of a binary, started on first use and taken down by
/// [`SharedCluster::teardown`].
pub struct SharedCluster {
    dir: PathBuf,
    nodes: usize,
    real_nodes: usize,
    sim_exe: Option<PathBuf>,
    agents: Option<crate::cluster::Agents>,
    real_node_watchdog: Option<Duration>,
    redfish_bmcs: bool,
    cell: OnceLock<Result<Cluster, String>>,
}

impl SharedCluster {
    /// A cluster of `nodes` nodes in `<tmp_dir>/<name>-<pid>`, run with the `podha-sim`
    /// executable `sim_exe` (tests pass `env!("CARGO_BIN_EXE_podha-sim")` where cargo defines
    /// it; `None` looks next to the test binary, see [`ClusterOptions::sim_exe`]).
    pub fn new(
        tmp_dir: impl Into<PathBuf>,
        name: &str,
        nodes: usize,
        sim_exe: Option<PathBuf>,
    ) -> Self {
        let dir = tmp_dir
            .into()
            .join(format!("{name}-{}", std::process::id()));
        SharedCluster {
            dir,
            nodes,
            real_nodes: 0,
            sim_exe,
            agents: None,
            real_node_watchdog: None,
            redfish_bmcs: false,
            cell: OnceLock::new(),
        }
    }

    /// Adds `n` real nodes (kubelet + containerd) after the kwok ones.
    pub fn with_real_nodes(mut self, n: usize) -> Self {
        self.real_nodes = n;
        self
    }

    /// Runs a podha agent beside every kwok node, petting the watchdog of the node's BMC (an
    /// agent without one proves no fence by its silence): `exe` is the podha executable, cut
    /// off agents fence after `isolation_timeout`, their watchdogs fire `watchdog_timeout`
    /// after their last pet, and their peer surveys take at most `survey_timeout`.
    pub fn with_agents(
        mut self,
        exe: impl Into<PathBuf>,
        isolation_timeout: Duration,
        watchdog_timeout: Duration,
        survey_timeout: Duration,
    ) -> Self {
        self.agents = Some(crate::cluster::Agents {
            exe: exe.into(),
            isolation_timeout,
            survey_timeout: Some(survey_timeout),
            watchdog_timeout: Some(watchdog_timeout),
        });
        self
    }

    /// Gives every real node's BMC a watchdog of `timeout` (which a podha agent installed by the
    /// chart pets, see `crate::chart_install::sim_agent_values`).
    pub fn with_real_node_watchdog(mut self, timeout: Duration) -> Self {
        self.real_node_watchdog = Some(timeout);
        self
    }

    /// Powers every node through Redfish: the cluster's sushy-tools emulator has a system per
    /// node, which the node's BMC follows (`crate::cluster::bmc`).
    pub fn with_redfish_bmcs(mut self) -> Self {
        self.redfish_bmcs = true;
        self
    }

    /// The cluster, started on the first call (other callers wait for it).
    pub fn get(&self) -> Result<&Cluster, String> {
        self.cell
            .get_or_init(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let mut opts = ClusterOptions::new(&self.dir);
                opts.nodes = self.nodes;
                opts.real_nodes = self.real_nodes;
                opts.profile = Profile::Fast;
                opts.sim_exe = self.sim_exe.clone();
                opts.agents = self.agents.clone();
                opts.real_node_watchdog = self.real_node_watchdog;
                opts.redfish_bmcs = self.redfish_bmcs;
                eprintln!(
                    "starting a sim cluster with {} kwok and {} real nodes in {} (if this run is \
                     interrupted: podha-sim down --dir {})",
                    self.nodes,
                    self.real_nodes,
                    self.dir.display(),
                    self.dir.display()
                );
                let started = Instant::now();
                let res = rt.block_on(Cluster::up(opts)).map_err(|e| format!("{e}"));
                eprintln!("sim cluster up in {:.1?}", started.elapsed());
                res
            })
            .as_ref()
            .map_err(|e| format!("could not start the sim cluster: {e}"))
    }

    /// Takes the cluster down; removes its directory when every test passed, keeps it (logs)
    /// otherwise.
    pub fn teardown(&self, failed: bool) {
        let Some(res) = self.cell.get() else { return };
        if let Ok(cluster) = res
            && let Err(e) = cluster.down()
        {
            eprintln!("sim cluster down failed: {e}");
        }
        if failed || res.is_err() {
            if self.dir.exists() {
                eprintln!("sim cluster logs kept in {}/logs", self.dir.display());
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs one scenario on its own tokio runtime with a fresh client and namespace; on failure the
/// error carries a dump of the namespace and the nodes.
pub fn run_scenario<'a, F, Fut>(
    shared: &'a SharedCluster,
    namespace: &str,
    scenario: F,
) -> Result<(), libtest_mimic::Failed>
where
    F: FnOnce(Ctx<'a>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let cluster = shared.get()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = cluster.client().await.map_err(|e| e.to_string())?;
        create_namespace(&client, namespace)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let ctx = Ctx {
            cluster,
            client: client.clone(),
            ns: namespace.to_string(),
        };
        match scenario(ctx).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut dump = dump(&client, namespace).await;
                // Every fence of the cluster's life, with when: a node reset that a scenario
                // did not expect shows first as that node NotReady.
                match cluster.fences() {
                    Ok(fences) => {
                        dump.push_str("fences:\n");
                        for f in fences {
                            dump.push_str(&format!(
                                "  {} at {} ms: {}\n",
                                f.node, f.at_ms, f.reason
                            ));
                        }
                    }
                    Err(e) => dump.push_str(&format!("fences: cannot read them: {e}\n")),
                }
                Err(format!("{e:#}\n\n==== state at failure ====\n{dump}").into())
            }
        }
    })
}

/// A scenario of a test binary: its name and what it runs against the shared cluster.
pub type Scenario = (
    &'static str,
    fn(&SharedCluster) -> Result<(), libtest_mimic::Failed>,
);

/// Runs `scenarios` as the binary's tests on `shared`, then takes the cluster down (kept for
/// a look when a test failed, see [`SharedCluster::teardown`]).
pub fn run_trials(
    args: &libtest_mimic::Arguments,
    shared: &Arc<SharedCluster>,
    scenarios: Vec<Scenario>,
) -> ExitCode {
    let trials = scenarios
        .into_iter()
        .map(|(name, f)| {
            let shared = shared.clone();
            libtest_mimic::Trial::test(name, move || f(&shared))
        })
        .collect();
    let conclusion = libtest_mimic::run(args, trials);
    shared.teardown(conclusion.has_failed());
    conclusion.exit_code()
}

/// A scenario's progress line, prefixed with its namespace.
pub fn log(ns: &str, msg: impl AsRef<str>) {
    eprintln!("[{ns}] {}", msg.as_ref());
}

/// What a scenario works with.
#[derive(Clone)]
pub struct Ctx<'a> {
    pub cluster: &'a Cluster,
    pub client: kube::Client,
    pub ns: String,
}

impl Ctx<'_> {
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
    pub fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }
    pub fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    pub async fn create<K>(&self, obj: serde_json::Value) -> anyhow::Result<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let obj: K = serde_json::from_value(obj).context("build object")?;
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.ns);
        api.create(&PostParams::default(), &obj)
            .await
            .context("create object")
    }

    /// Pods of the namespace carrying `app=<app>`.
    pub async fn app_pods(&self, app: &str) -> anyhow::Result<Vec<Pod>> {
        Ok(self
            .pods()
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await?
            .items)
    }

    /// The PV bound to claim `pvc`, once bound.
    pub async fn wait_bound_pv(&self, pvc: &str) -> anyhow::Result<PersistentVolume> {
        let name = wait_for(&format!("PVC {pvc} to be bound"), secs(60), || async {
            let claim = self.pvcs().get_opt(pvc).await?;
            Ok(claim
                .and_then(|c| c.spec)
                .and_then(|s| s.volume_name)
                .filter(|v| !v.is_empty()))
        })
        .await?;
        Ok(self.pvs().get(&name).await?)
    }

    /// VolumeAttachments of `pv`.
    pub async fn vas_of(&self, pv: &str) -> anyhow::Result<Vec<VolumeAttachment>> {
        Ok(self
            .vas()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
            .collect())
    }

    /// Waits until `pv` has a VolumeAttachment on `node` with `status.attached=true`.
    pub async fn wait_attached(
        &self,
        pv: &str,
        node: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        wait_for(&format!("{pv} attached to {node}"), timeout, || async {
            let vas = self.vas_of(pv).await?;
            Ok(vas
                .iter()
                .any(|va| va.spec.node_name == node && va_attached(va))
                .then_some(()))
        })
        .await
    }

    /// Waits until the node's Ready condition is no longer True; returns its status then.
    pub async fn wait_not_ready(&self, node: &str, timeout: Duration) -> anyhow::Result<String> {
        wait_for(&format!("{node} to leave Ready"), timeout, || async {
            let n = self.nodes().get(node).await?;
            Ok(ready_status(&n).filter(|s| s != "True"))
        })
        .await
    }

    pub async fn wait_ready(&self, node: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(&format!("{node} to be Ready"), timeout, || async {
            let n = self.nodes().get(node).await?;
            Ok((ready_status(&n).as_deref() == Some("True")).then_some(()))
        })
        .await
    }

    /// Waits for the single live (not terminating) pod of `app` to be Running and Ready.
    pub async fn wait_app_running(&self, app: &str, timeout: Duration) -> anyhow::Result<Pod> {
        wait_for(&format!("a Running pod of {app}"), timeout, || async {
            let pods = self.app_pods(app).await?;
            Ok(pods
                .into_iter()
                .find(|p| !terminating(p) && running_ready(p)))
        })
        .await
    }

    /// Marks `node` unschedulable (`cordoned`) or schedulable again.
    pub async fn cordon(&self, node: &str, cordoned: bool) -> anyhow::Result<()> {
        let patch = json!({ "spec": { "unschedulable": cordoned } });
        self.nodes()
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("cordon {node}: {cordoned}"))?;
        Ok(())
    }

    /// Node `node`'s fence request and its acknowledgement, as its annotations say them.
    pub async fn fence_annotations(
        &self,
        node: &str,
    ) -> anyhow::Result<(Option<String>, Option<String>)> {
        let n = self.nodes().get(node).await?;
        let a = n.metadata.annotations.unwrap_or_default();
        Ok((
            a.get(podha::contract::FENCE_REQUEST_ANNOTATION).cloned(),
            a.get(podha::contract::FENCE_ACK_ANNOTATION).cloned(),
        ))
    }

    /// Waits (60 s) until writer `pod` (`crate::csi::workload`) has `n` acknowledged writes.
    pub async fn wait_writes(&self, pod: &Pod, n: usize) -> anyhow::Result<()> {
        let uid = pod.metadata.uid.clone().context("pod uid")?;
        let dir = self.cluster.dir().to_path_buf();
        let what = format!("{} to have {n} acknowledged writes", name_of(pod));
        wait_for(&what, secs(60), || {
            let done = crate::csi::workload::acknowledged(&dir, &uid).map(|k| k >= n);
            async move { Ok(done?.then_some(())) }
        })
        .await
    }

    /// Adds a taint to a node (read-modify-write with the resourceVersion, retried on conflict).
    pub async fn add_taint(&self, node: &str, taint: Taint) -> anyhow::Result<()> {
        self.edit_taints(node, |taints| {
            taints.retain(|t| !(t.key == taint.key && t.effect == taint.effect));
            taints.push(taint.clone());
        })
        .await
    }

    pub async fn remove_taint(&self, node: &str, key: &str) -> anyhow::Result<()> {
        self.edit_taints(node, |taints| taints.retain(|t| t.key != key))
            .await
    }

    async fn edit_taints(&self, node: &str, edit: impl Fn(&mut Vec<Taint>)) -> anyhow::Result<()> {
        for _ in 0..10 {
            let n = self.nodes().get(node).await?;
            let mut taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            edit(&mut taints);
            let patch = json!({
                "metadata": { "resourceVersion": n.metadata.resource_version },
                "spec": { "taints": taints },
            });
            match self
                .nodes()
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        bail!("could not update the taints of {node}: conflicts")
    }

    /// Deletes a pod with grace period 0 and a UID precondition (what `kubectl delete --force`
    /// does, and what podha does).
    pub async fn force_delete(&self, pod: &Pod) -> anyhow::Result<()> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.pods()
            .delete(&name, &dp)
            .await
            .with_context(|| format!("force-delete {name}"))?;
        Ok(())
    }

    /// Deletes the namespace's workloads (StatefulSets, Deployments, then every pod, forced:
    /// some are on nodes a scenario left dead) and waits until no pod of it remains, so that
    /// a later scenario on the same nodes does not find them there (a leftover pod with a
    /// volume is one podha must leave alone, and that changes what it may do to the node).
    pub async fn remove_workloads(&self, timeout: Duration) -> anyhow::Result<()> {
        let (dp, lp) = (DeleteParams::default(), ListParams::default());
        let sts: Api<StatefulSet> = Api::namespaced(self.client.clone(), &self.ns);
        let deploys: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns);
        sts.delete_collection(&dp, &lp)
            .await
            .context("delete StatefulSets")?;
        deploys
            .delete_collection(&dp, &lp)
            .await
            .context("delete Deployments")?;
        let forced = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let what = format!("the pods of namespace {} to be gone", self.ns);
        wait_for(&what, timeout, || async {
            // Again on every round: a ReplicaSet not yet collected may have made another.
            let left = self.pods().delete_collection(&forced, &lp).await?;
            Ok(left
                .left()
                .is_some_and(|l| l.items.is_empty())
                .then_some(()))
        })
        .await
    }
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Polls `check` every 500 ms until it yields `Some`; errors from `check` abort the wait.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            // API hiccups under load are retried; the last one is reported on timeout.
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            let detail = last_err
                .map(|e| format!(" (last error: {e:#})"))
                .unwrap_or_default();
            bail!("timed out after {timeout:?} waiting for {what}{detail}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Checks every second for `duration` that `check` holds (`Ok(Ok(()))`); fails at the first
/// violation (`Ok(Err(reason))`).
pub async fn holds_for<F, Fut>(what: &str, duration: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Result<(), String>>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => {
                bail!("{what}: violated after {:.1?}: {reason}", start.elapsed())
            }
            Err(e) => eprintln!("{what}: check failed ({e:#}), retrying"),
        }
        if start.elapsed() >= duration {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub fn terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

pub fn name_of(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or("")
}

pub fn running_ready(p: &Pod) -> bool {
    phase(p) == "Running"
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn ready_status(n: &Node) -> Option<String> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
}

pub fn va_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

pub fn volumes_in_use(n: &Node) -> Vec<String> {
    n.status
        .as_ref()
        .and_then(|s| s.volumes_in_use.clone())
        .unwrap_or_default()
}

/// `node.status.volumesInUse` name of a CSI PV.
pub fn unique_name(pv: &PersistentVolume) -> anyhow::Result<String> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .ok_or_else(|| anyhow!("PV {:?} is not a CSI volume", pv.metadata.name))?;
    Ok(crate::csi::unique_volume_name(
        &csi.driver,
        &csi.volume_handle,
    ))
}

pub fn pv_name(pv: &PersistentVolume) -> String {
    pv.metadata.name.clone().unwrap_or_default()
}

pub async fn create_namespace(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    create_labelled_namespace(client, ns, &[]).await
}

/// Namespace `ns` with `labels` (kept as it is if it exists).
pub async fn create_labelled_namespace(
    client: &kube::Client,
    ns: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let obj: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": ns, "labels": labels } }))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).context(format!("create namespace {ns}")),
    }
}

pub async fn events_for(ctx: &Ctx<'_>, pod: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .collect())
}

/// podha's Events (`events.k8s.io/v1`, reporting controller `podha`) in namespace `ns` with
/// reason `reason` about the object named `regarding`.
pub async fn podha_events(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    regarding: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.reporting_controller.as_deref() == Some("podha")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
        })
        .collect())
}

/// How many times podha said [`podha_events`] of `reason` about `regarding`, counting the
/// repeats of each event's series.
pub async fn podha_event_count(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    regarding: &str,
) -> anyhow::Result<i32> {
    let events = podha_events(client, ns, reason, regarding).await?;
    Ok(events
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum())
}

/// Summary of the scenario's pods (for progress output).
pub fn summary(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .map(|p| {
            (
                name_of(p).to_string(),
                format!(
                    "{}@{}{}",
                    phase(p),
                    node_of(p).unwrap_or("-"),
                    if terminating(p) { " (terminating)" } else { "" }
                ),
            )
        })
        .collect()
}
