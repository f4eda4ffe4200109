//! podha installed onto a sim cluster's real nodes as docs/install.md tells a user: its image
//! loaded into every real node's containerd (`make image`, as `kind load` would), then
//! `helm install charts/podha`, the replicas kept on the real nodes. Used by the real-node
//! tests, the demo and the benchmark.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Api;
use kube::api::ListParams;

use crate::cluster::Cluster;
use crate::testkit::{running_ready, terminating, wait_for};

pub(crate) mod machine_guard;
use machine_guard::{agent_on_this_machine_is_safe, sim_pods_cgroup, sim_stand_ins};

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

/// The agent the sim installs with the chart. Never the chart's default: its fence reboots
/// the machine through /proc/sysrq-trigger and its watchdog is the machine's own, and the
/// sim's nodes share this machine's kernel. So the chart is installed here only with the agent
/// off or with [`sim_agent_values`], which fence through each node's BMC stand-in.
pub enum SimAgent {
    Off,
    OnBmc(serde_json::Value),
}

impl SimAgent {
    /// The agent fencing its node's BestEffort pods instead of powering the node off: their
    /// cgroup killed (`cgroup.kill`), the fence confirmed once it is empty (`populated 0`),
    /// both read where the node shows its cgroup tree
    /// ([`crate::cluster::realnode::MACHINE_DIR`]`/cgroup`). The agent's own pod is Burstable
    /// (the chart's requests) and lives on to acknowledge the fence: `AgentAcknowledged` with
    /// the chart's image, which has no shell. The kubelet must be down already (the fault),
    /// or it would start the pods again.
    pub fn fencing_best_effort_pods(self) -> Self {
        match self {
            Self::Off => Self::Off,
            Self::OnBmc(mut values) => {
                let pods = format!("{}besteffort", sim_pods_cgroup());
                values["agent"]["fence"] = format!("write:{pods}/cgroup.kill=1").into();
                values["agent"]["fenceConfirm"] =
                    format!("read:{pods}/cgroup.events=populated 0").into();
                Self::OnBmc(values)
            }
        }
    }

    /// The chart values it sets.
    pub fn values(&self) -> serde_json::Value {
        match self {
            Self::Off => serde_json::json!({ "agent": { "enabled": false } }),
            Self::OnBmc(values) => values.clone(),
        }
    }
}

/// Loads podha's image into every real node and `helm install`s the chart into [`NAMESPACE`]
/// with the replicas on real nodes, the `agent` (as a `-f` values file) and `set` values
/// (`key=value`, as `--set` takes them).
pub fn install(
    cluster: &Cluster,
    helm: &Path,
    agent: &SimAgent,
    set: &[&str],
) -> anyhow::Result<()> {
    cluster.load_image(&image_tar()?)?;
    let mut cmd = Command::new(helm);
    cmd.arg("install")
        .arg(RELEASE)
        .arg(chart_dir())
        .args(["-n", NAMESPACE, "--create-namespace"])
        .args(["--set", "nodeSelector.type=real"]);
    helm_with_values(cluster, cmd, agent, set)
}

/// `helm upgrade`s the release [`install`] made, keeping its values but the `agent` (a `-f`
/// values file over them) and `set`: a user changing the agent's fence, say. The DaemonSet
/// rolls its pods.
pub fn upgrade(
    cluster: &Cluster,
    helm: &Path,
    agent: &SimAgent,
    set: &[&str],
) -> anyhow::Result<()> {
    let mut cmd = Command::new(helm);
    cmd.arg("upgrade")
        .arg(RELEASE)
        .arg(chart_dir())
        .args(["-n", NAMESPACE, "--reuse-values"]);
    helm_with_values(cluster, cmd, agent, set)
}

/// Runs helm's `cmd` against the cluster with the `agent` values, refused unless they keep the
/// agent off this machine's kernel.
fn helm_with_values(
    cluster: &Cluster,
    mut cmd: Command,
    agent: &SimAgent,
    set: &[&str],
) -> anyhow::Result<()> {
    let values = agent.values();
    let only_agent = values.as_object().is_some_and(|v| v.len() == 1);
    anyhow::ensure!(
        only_agent
            && agent_on_this_machine_is_safe(&values["agent"], &sim_stand_ins())
            && !set
                .iter()
                .any(|s| s.starts_with("agent.") || s.contains(',')),
        "the sim installs the agent only with its BMC stand-ins' fence and watchdog, or a fence \
         of the node's own pods (and no agent value set beside them, one value per --set): \
         {values}, {set:?}"
    );
    let file = cluster.dir().join("podha-values.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&values)?)
        .with_context(|| format!("write {}", file.display()))?;
    cmd.arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .arg("-f")
        .arg(file);
    for value in set {
        cmd.args(["--set", value]);
    }
    run(&mut cmd)?;
    Ok(())
}

/// A chart's values file, read.
pub fn read_values(path: &Path) -> anyhow::Result<serde_norway::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The agents' timings: `agent.isolationTimeout`, `agent.watchdog.timeout` and
/// `agent.surveyTimeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentTimings {
    pub isolation: Duration,
    pub watchdog: Duration,
    pub survey: Duration,
}

impl AgentTimings {
    /// The chart's own, read from its `values.yaml`: what a user who keeps the defaults runs.
    pub fn chart_defaults() -> anyhow::Result<Self> {
        let path = chart_dir().join("values.yaml");
        let values = read_values(&path)?;
        let agent = &values["agent"];
        let duration = |v: &serde_norway::Value, what: &str| {
            let text = v
                .as_str()
                .with_context(|| format!("{what} is no duration in {}", path.display()))?;
            humantime::parse_duration(text).with_context(|| format!("{what}: {text}"))
        };
        Ok(Self {
            isolation: duration(&agent["isolationTimeout"], "agent.isolationTimeout")?,
            watchdog: duration(&agent["watchdog"]["timeout"], "agent.watchdog.timeout")?,
            survey: duration(&agent["surveyTimeout"], "agent.surveyTimeout")?,
        })
    }

    /// [`sim_agent_values`] with these timings and a watchdog.
    pub fn sim_values(self) -> SimAgent {
        sim_agent_values(self.isolation, Some(self.watchdog), Some(self.survey))
    }
}

/// The chart's values for `podha agent` on the sim's real nodes, as a user would write them for
/// machines with a BMC: the DaemonSet on the real nodes only, fencing by writing `off` to the
/// BMC's power control, petting the BMC's watchdog when the cluster gives its BMCs one
/// (`watchdog_timeout`), both found where the nodes show them
/// ([`crate::cluster::realnode::MACHINE_DIR`]), with the node's boot ID from there too.
/// `survey_timeout`: the agents' `agent.surveyTimeout`, or the chart's default.
pub fn sim_agent_values(
    isolation_timeout: Duration,
    watchdog_timeout: Option<Duration>,
    survey_timeout: Option<Duration>,
) -> SimAgent {
    let machine = crate::cluster::realnode::MACHINE_DIR;
    let watchdog = match watchdog_timeout {
        Some(timeout) => serde_json::json!({
            "device": format!("{machine}/bmc/watchdog"),
            "timeout": humantime::format_duration(timeout).to_string(),
            // A FIFO, not a character device, mounted from the machine's directory.
            "mountFromHost": true,
            "hostPathType": "",
        }),
        None => serde_json::json!({ "device": "" }),
    };
    let mut extra_args = vec![format!("--boot-id-file={machine}/boot_id")];
    if watchdog_timeout.is_some() {
        // The BMC's watchdog is a FIFO standing in for a device (no test opens a real one).
        extra_args.push("--watchdog-stand-in".to_string());
    }
    let mut values = serde_json::json!({ "agent": {
        "enabled": true,
        "fence": format!("write:{machine}/bmc/power=off"),
        // Explicit: a `helm upgrade --reuse-values` back from another fence drops its check.
        "fenceConfirm": "",
        "isolationTimeout": humantime::format_duration(isolation_timeout).to_string(),
        "watchdog": watchdog,
        "nodeSelector": { "type": "real" },
        "extraArgs": extra_args,
        "extraVolumes": [{
            "name": "machine",
            "hostPath": { "path": machine, "type": "Directory" },
        }],
        "extraVolumeMounts": [{ "name": "machine", "mountPath": machine }],
    }});
    if let Some(timeout) = survey_timeout {
        values["agent"]["surveyTimeout"] = humantime::format_duration(timeout).to_string().into();
    }
    SimAgent::OnBmc(values)
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

/// The chart's live agent pods (its DaemonSet's).
pub async fn agent_pods(client: &kube::Client) -> anyhow::Result<Vec<Pod>> {
    let lp = ListParams::default().labels("app.kubernetes.io/name=podha-agent");
    Ok(Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| !terminating(p))
        .collect())
}

/// The arguments of the agent container in the agent DaemonSet's current template.
pub async fn agent_args(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let daemon_set = daemon_sets.get(&format!("{RELEASE}-agent")).await?;
    let containers = daemon_set
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers);
    Ok(agent_container_args(containers.as_deref()))
}

/// The arguments of the container named `agent` among `containers` (none: empty).
fn agent_container_args(containers: Option<&[Container]>) -> Vec<String> {
    containers
        .unwrap_or_default()
        .iter()
        .find(|c| c.name == "agent")
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}

/// Waits until an agent pod of the DaemonSet's current template (after a `helm upgrade`, once
/// it rolled) is Running and Ready on each of `nodes`; returns them.
pub async fn wait_agents(
    client: &kube::Client,
    nodes: &[&str],
    timeout: Duration,
) -> anyhow::Result<Vec<Pod>> {
    wait_for(
        &format!(
            "a podha agent of the DaemonSet's template Running and Ready on each of {nodes:?}"
        ),
        timeout,
        || async {
            let wanted = agent_args(client).await?;
            let pods = agent_pods(client).await?;
            let on = |node: &&str| {
                pods.iter().any(|p| {
                    running_ready(p)
                        && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(*node)
                        && agent_container_args(p.spec.as_ref().map(|s| s.containers.as_slice()))
                            == wanted
                })
            };
            Ok(nodes.iter().all(on).then_some(pods))
        },
    )
    .await
}

/// How often the kubelet has restarted the agent container on each of `nodes` (a node reboot
/// counts), by node; a node without an agent pod is left out.
pub async fn agent_restarts(
    client: &kube::Client,
    nodes: &[&str],
) -> anyhow::Result<BTreeMap<String, i32>> {
    let pods = agent_pods(client).await?;
    Ok(nodes
        .iter()
        .filter_map(|node| {
            let pod = pods
                .iter()
                .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(*node))?;
            let restarts = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .map(|c| c.restart_count)
                .sum();
            Some((node.to_string(), restarts))
        })
        .collect())
}

/// Everything the agent containers on real node `node` logged (every pod, every restart), from
/// the kubelet's pod log directory.
pub fn agent_log(cluster: &Cluster, node: &str) -> anyhow::Result<String> {
    pod_log(
        cluster,
        node,
        &format!("{NAMESPACE}_{RELEASE}-agent-"),
        "agent",
    )
}

/// What container `container` of every pod on real node `node` whose log directory starts
/// with `prefix` (`<namespace>_<pod name>`, then `_<uid>`) wrote, oldest first, as its kubelet
/// kept it (the sim's API server does not reach the kubelets for logs).
pub fn pod_log(
    cluster: &Cluster,
    node: &str,
    prefix: &str,
    container: &str,
) -> anyhow::Result<String> {
    let dir = cluster.dir().join("nodes").join(node).join("pod-logs");
    let mut text = String::new();
    for pod in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let pod = pod?.path();
        let ours = pod
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix));
        if !ours {
            continue;
        }
        let Ok(logs) = std::fs::read_dir(pod.join(container)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = logs.filter_map(|f| Some(f.ok()?.path())).collect();
        files.sort();
        for file in files {
            text.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
        }
    }
    Ok(text)
}

/// podha as the chart installs it by default on a sim cluster: its two replicas Running, an
/// agent on each of `nodes` (within `agents_within`), a leader.
pub struct Installed {
    pub replicas: Vec<Pod>,
    /// The leading replica's name.
    pub leader: String,
    /// The node it runs on.
    pub leader_node: String,
}

/// Waits until the chart's default install is up on `nodes` (see [`Installed`]).
pub async fn wait_installed(
    client: &kube::Client,
    nodes: &[&str],
    agents_within: Duration,
) -> anyhow::Result<Installed> {
    let replicas = wait_replicas(client, 2, Duration::from_secs(180)).await?;
    wait_agents(client, nodes, agents_within).await?;
    let leader = wait_leader(client, &replicas, Duration::from_secs(60)).await?;
    let leader_node = replicas
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(leader.as_str()))
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .context("the leader's node")?;
    Ok(Installed {
        replicas,
        leader,
        leader_node,
    })
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

/// Crashes podha replica `pod`: SIGKILL to its process (found among its node's processes by
/// the `--identity` the chart gives it); the kubelet restarts the container. Returns the
/// process ID.
pub fn crash_replica(cluster: &Cluster, pod: &Pod) -> anyhow::Result<i32> {
    let name = pod.metadata.name.as_deref().context("pod name")?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .context("pod not bound")?;
    let identity = format!("--identity={name}");
    let pid = podha_process(cluster, node, |arg| arg == identity.as_bytes())?
        .with_context(|| format!("no process of {node} runs podha with {identity}"))?;
    sigkill(pid, &format!("podha replica {name} on {node}"))?;
    Ok(pid)
}

/// The process of real node `node`'s podha agent that runs the agent itself: the worker its
/// supervisor (the container's main process, `podha agent`) started, `podha agent
/// --worker-of=<pid>`. `None` while there is none.
pub fn agent_worker(cluster: &Cluster, node: &str) -> anyhow::Result<Option<i32>> {
    podha_process(cluster, node, |arg| arg.starts_with(b"--worker-of="))
}

/// Crashes the podha agent of real node `node`: SIGKILL to its worker process, which its
/// supervisor replaces (the container stays). Returns the process ID.
pub fn crash_agent(cluster: &Cluster, node: &str) -> anyhow::Result<i32> {
    let pid = agent_worker(cluster, node)?
        .with_context(|| format!("no podha agent worker runs on {node}"))?;
    sigkill(pid, &format!("podha agent on {node}"))?;
    Ok(pid)
}

/// Freezes the podha agent of real node `node` (SIGSTOP to its worker process: it answers
/// nothing and pets nothing, and its supervisor, which sees no death, starts no other), or
/// thaws it (SIGCONT). Returns the process ID.
pub fn freeze_agent(cluster: &Cluster, node: &str, frozen: bool) -> anyhow::Result<i32> {
    let pid = agent_worker(cluster, node)?
        .with_context(|| format!("no podha agent worker runs on {node}"))?;
    let sig = if frozen {
        nix::sys::signal::Signal::SIGSTOP
    } else {
        nix::sys::signal::Signal::SIGCONT
    };
    signal(pid, sig, &format!("podha agent on {node}"))?;
    Ok(pid)
}

/// Stops the podha agent of real node `node` as the kubelet does: SIGTERM to the container's
/// main process, its worker's parent (the supervisor), which passes it on. The kubelet's
/// SIGKILL after the grace period does not follow. Returns the process ID, as this host sees
/// it (the worker's `--worker-of` names it in the container's PID namespace).
pub fn stop_agent(cluster: &Cluster, node: &str) -> anyhow::Result<i32> {
    let worker = agent_worker(cluster, node)?
        .with_context(|| format!("no podha agent worker runs on {node}"))?;
    let status = std::fs::read_to_string(format!("/proc/{worker}/status"))
        .with_context(|| format!("read the status of {node}'s agent (pid {worker})"))?;
    let supervisor = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|pid| pid.trim().parse::<i32>().ok())
        .with_context(|| format!("{node}'s agent (pid {worker}) has no parent"))?;
    // Only podha's own process on that node: never one outside it.
    ensure!(
        cluster.node_pids(node)?.contains(&supervisor)
            && std::fs::read(format!("/proc/{supervisor}/cmdline")).is_ok_and(|c| c
                .split(|b| *b == 0)
                .next()
                .is_some_and(|e| e.ends_with(b"/podha"))),
        "{node}'s agent's parent (pid {supervisor}) is not a podha process of the node"
    );
    signal(
        supervisor,
        nix::sys::signal::Signal::SIGTERM,
        &format!("podha agent's supervisor on {node}"),
    )?;
    Ok(supervisor)
}

/// The podha process among real node `node`'s processes with an argument `arg` accepts.
fn podha_process(
    cluster: &Cluster,
    node: &str,
    arg: impl Fn(&[u8]) -> bool,
) -> anyhow::Result<Option<i32>> {
    Ok(cluster.node_pids(node)?.into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let mut args = cmdline.split(|b| *b == 0);
            args.next().is_some_and(|exe| exe.ends_with(b"/podha")) && args.any(&arg)
        })
    }))
}

fn sigkill(pid: i32, what: &str) -> anyhow::Result<()> {
    signal(pid, nix::sys::signal::Signal::SIGKILL, what)
}

fn signal(pid: i32, signal: nix::sys::signal::Signal, what: &str) -> anyhow::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
        .with_context(|| format!("{signal} {what} (pid {pid})"))
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
    curl_in_node(cluster, node, [format!("http://{ip}:8080/metrics")])
}

/// `curl -sS --max-time 5 <args>` from inside real node `node`'s network namespace (where its
/// host network and its pods' addresses are routed): what it printed, or an error with it.
pub fn curl_in_node<I, S>(cluster: &Cluster, node: &str, args: I) -> anyhow::Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let netns = cluster.node_netns(node)?;
    run(Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["curl", "-sS", "--max-time", "5"])
        .args(args))
}
