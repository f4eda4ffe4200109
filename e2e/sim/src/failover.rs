//! One node death on the sim cluster, for `podha-sim demo` and the failover benchmark: a
//! StatefulSet pod with an RWO volume runs, its node is SIGKILLed, and the failover is measured
//! by the operator's own [`podha::chaos::timeline`] (the same code `podha chaos` measures with).
//! podha itself runs as a separate process ([`Operator`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::Cluster;
use podha::chaos::timeline::{Subject, Timeline, follow, wait_settled};

use crate::testkit::{create_namespace, statefulset};

/// The podha operator, run as a child process against a sim cluster.
pub struct Operator {
    child: Child,
    http: SocketAddr,
    pub log: PathBuf,
}

/// The namespace podha competes for leadership in when [`Operator::start`] runs it.
pub const PROCESS_NAMESPACE: &str = "default";

impl Operator {
    /// Starts `exe run` against the cluster as its admin; logs go to `DIR/logs/podha.log`.
    pub fn start(exe: &Path, cluster: &Cluster) -> anyhow::Result<Operator> {
        Self::start_as(
            exe,
            cluster,
            &cluster.kubeconfig_path(),
            PROCESS_NAMESPACE,
            "podha-demo",
            &[],
        )
    }

    /// Starts `exe run` with `kubeconfig`, competing for leadership in `leader_namespace` as
    /// `identity`, with `extra_args`; logs go to `DIR/logs/podha.log`.
    pub fn start_as(
        exe: &Path,
        cluster: &Cluster,
        kubeconfig: &Path,
        leader_namespace: &str,
        identity: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Operator> {
        let localhost = std::net::Ipv4Addr::LOCALHOST;
        let http =
            std::net::SocketAddr::from((localhost, crate::cluster::ports::free_port(localhost)?));
        let log = cluster.logs_dir().join("podha.log");
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(exe)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--http-addr")
            .arg(http.to_string())
            .arg("--leader-namespace")
            .arg(leader_namespace)
            .arg("--identity")
            .arg(identity)
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it with `cargo build -p podha`)",
                    exe.display()
                )
            })?;
        Ok(Operator { child, http, log })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// An error naming the log if the process has exited.
    pub fn alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("podha exited ({status}); see {}", self.log.display());
        }
        Ok(())
    }

    /// GET `path` on the operator's HTTP port.
    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        http_get(self.http, path)
    }

    /// Waits until the operator's caches are synced and it leads.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.alive()?;
            let leads = self
                .get("/metrics")
                .is_ok_and(|m| m.lines().any(|l| l == "podha_leader 1"));
            if self.get("/readyz").is_ok() && leads {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "podha not ready within {timeout:?}; see {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sum of a metric's samples whose line contains every `filters` part; `None` when the
    /// metrics cannot be read or no sample matches.
    pub fn metric(&self, name: &str, filters: &[&str]) -> Option<f64> {
        metric_in(&self.get("/metrics").ok()?, name, filters)
    }

    /// podha's own view of its failovers: the mean of each phase histogram of `policy` that has
    /// samples.
    pub fn phase_means(&self, policy: &str) -> anyhow::Result<Vec<(String, f64)>> {
        Ok(phase_means_in(&self.get("/metrics")?, policy))
    }

    /// The mean of `phase` in the phase histogram of `policy`.
    pub fn phase_mean(&self, policy: &str, phase: &str) -> Option<f64> {
        phase_mean_in(&self.get("/metrics").ok()?, policy, phase)
    }

    /// sum / count of the histogram `name` over the series whose labels contain every
    /// `filters` part, when it has samples.
    pub fn histogram_mean(&self, name: &str, filters: &[&str]) -> Option<f64> {
        histogram_mean_in(&self.get("/metrics").ok()?, name, filters)
    }
}

fn histogram_mean_in(text: &str, name: &str, filters: &[&str]) -> Option<f64> {
    let sum = metric_in(text, &format!("{name}_sum"), filters)?;
    let count = metric_in(text, &format!("{name}_count"), filters)?;
    (count > 0.0).then(|| sum / count)
}

/// Sum of the samples of `name` in the metrics `text` (Prometheus text format) whose line
/// contains every `filters` part; `None` without any such sample.
pub fn metric_in(text: &str, name: &str, filters: &[&str]) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The mean of each phase histogram of `policy` that has samples, in `/metrics` text.
pub fn phase_means_in(text: &str, policy: &str) -> Vec<(String, f64)> {
    ["detect", "act", "detach", "recover", "total"]
        .iter()
        .filter_map(|phase| Some((phase.to_string(), phase_mean_in(text, policy, phase)?)))
        .collect()
}

/// sum / count of `phase` in podha's phase histogram of `policy`, when it has samples.
fn phase_mean_in(text: &str, policy: &str, phase: &str) -> Option<f64> {
    let name = "podha_failover_phase_duration_seconds";
    let filters = [format!("phase=\"{phase}\""), format!("policy=\"{policy}\"")];
    let filters: Vec<&str> = filters.iter().map(String::as_str).collect();
    histogram_mean_in(text, name, &filters)
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET of `path` on `addr` (podha's `/metrics`, `/readyz`): the body of a 200
/// answer, an error otherwise.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: podha\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// Creates the PodHAPolicy CRD from its manifest and waits until it is established.
pub async fn install_crd(client: &Client, manifest: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let crd: CustomResourceDefinition =
        serde_norway::from_str(&text).context("parsing the CRD manifest")?;
    create_crd(client, &crd).await
}

/// Creates a CRD (one that exists already is left as it is) and waits until it is established.
pub async fn create_crd(client: &Client, crd: &CustomResourceDefinition) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.create(&PostParams::default(), crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("creating the CRD"),
    }
    let name = crd.metadata.name.clone().unwrap_or_default();
    let cond = kube::runtime::wait::await_condition(
        api,
        &name,
        kube::runtime::conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(30), cond)
        .await
        .context("CRD not established")??;
    Ok(())
}

/// Creates (or replaces) a PodHAPolicy with this spec.
pub async fn apply_policy(
    client: &Client,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    let gvk = GroupVersionKind::gvk("podha.io", "v1alpha1", "PodHAPolicy");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "podha.io/v1alpha1",
        "kind": "PodHAPolicy",
        "metadata": { "name": name },
        "spec": spec,
    }))?;
    let params = kube::api::PatchParams::apply("podha-sim").force();
    api.patch(name, &params, &kube::api::Patch::Apply(&obj))
        .await
        .context("applying the PodHAPolicy")?;
    Ok(())
}

/// Returns once the node's Lease in `kube-node-lease` has been renewed (its `renewTime`
/// changed, or the Lease created: a kubelet may run pods before its Lease exists), seen by
/// polling every 50 ms.
async fn wait_lease_renewal(client: &Client, node: &str) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew_time = |lease: Option<Lease>| lease.and_then(|l| l.spec?.renew_time);
    let first = renew_time(leases.get_opt(node).await?);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if renew_time(leases.get_opt(node).await?) != first {
            return Ok(());
        }
    }
    bail!("the Lease of {node} was not renewed within 30s")
}

/// Runs a one-replica StatefulSet `app` in namespace `ns` on one of `nodes`, kills its node and
/// follows the failover for at most `timeout`. Returns when recovered or when the time is up.
/// With `after_renewal`, the kill comes that long after a renewal of the node's Lease was seen,
/// so that trials can sample the kubelet's renew cycle evenly (detection by Lease depends on
/// where in the cycle a node dies); without it, as soon as the pod runs.
pub async fn measure(
    cluster: &Cluster,
    client: &Client,
    ns: &str,
    statefulset: serde_json::Value,
    timeout: Duration,
    after_renewal: Option<Duration>,
    before_kill: &dyn Fn(&Subject) -> anyhow::Result<()>,
) -> anyhow::Result<Timeline> {
    let subject = start_subject(client, ns, statefulset).await?;
    if let Some(delay) = after_renewal {
        wait_lease_renewal(client, &subject.node).await?;
        tokio::time::sleep(delay).await;
    }
    before_kill(&subject)?;
    kill_and_follow(cluster, client, &subject, timeout).await
}

/// Creates namespace `ns` (if need be) and the one-replica `statefulset` in it; returns its pod
/// once it runs with its volume attached.
pub async fn start_subject(
    client: &Client,
    ns: &str,
    statefulset: serde_json::Value,
) -> anyhow::Result<Subject> {
    create_namespace(client, ns).await?;
    let app = statefulset["metadata"]["name"]
        .as_str()
        .context("the StatefulSet has no name")?
        .to_string();
    let sts: StatefulSet = serde_json::from_value(statefulset)?;
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sts)
        .await?;
    wait_settled(client, ns, &format!("app={app}"), Duration::from_secs(180))
        .await?
        .ok_or_else(|| anyhow!("{ns}/{app}-0 did not start within 180s"))
}

/// Kills `subject`'s node and follows the failover for at most `timeout`.
pub async fn kill_and_follow(
    cluster: &Cluster,
    client: &Client,
    subject: &Subject,
    timeout: Duration,
) -> anyhow::Result<Timeline> {
    cluster.kill_node(&subject.node)?;
    let killed = Instant::now();
    let fault = format!("node {} killed (SIGKILL)", subject.node);
    Ok(follow(client, subject, &fault, killed, timeout, &mut |_| {}).await?)
}

/// The StatefulSet `app` a failover is measured on, on `nodes`: on kwok nodes the testkit's
/// (no containers), on real nodes the writer workload (`podha-csi write` in a container).
pub fn subject_statefulset(
    app: &str,
    nodes: &[String],
    real: bool,
) -> anyhow::Result<serde_json::Value> {
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    if real {
        crate::csi::workload::writer_statefulset(app, &nodes, crate::csi::RWO_STORAGE_CLASS)
    } else {
        Ok(statefulset(app, &nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# TYPE podha_action_latency_seconds histogram
podha_action_latency_seconds_bucket{kind="delete_pod",le="+Inf"} 4
podha_action_latency_seconds_sum{kind="delete_pod"} 2
podha_action_latency_seconds_count{kind="delete_pod"} 4
podha_action_latency_seconds_sum{kind="taint_node"} 3
podha_action_latency_seconds_count{kind="taint_node"} 1
podha_failover_phase_duration_seconds_sum{phase="act",policy="p"} 1.5
podha_failover_phase_duration_seconds_count{phase="act",policy="p"} 3
"#;

    #[test]
    fn histogram_means_come_from_the_matching_series_only() {
        let name = "podha_action_latency_seconds";
        assert_eq!(
            histogram_mean_in(METRICS, name, &["kind=\"delete_pod\""]),
            Some(0.5)
        );
        assert_eq!(histogram_mean_in(METRICS, name, &[]), Some(1.0));
        assert_eq!(histogram_mean_in(METRICS, name, &["kind=\"other\""]), None);
        assert_eq!(phase_mean_in(METRICS, "p", "act"), Some(0.5));
        assert_eq!(phase_mean_in(METRICS, "p", "detect"), None);
    }
}
