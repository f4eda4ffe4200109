//! `podha run`: watches, the decision loop, the writer, leader election and the HTTP server,
//! supervised together. Any of them ending ends the process (a replica that has lost its
//! watches or its lease task must not keep acting on stale knowledge).

mod actor;
mod actuator;
pub mod agent_coverage;
mod events;
mod node_lease;
mod pod_coverage;
pub mod power;
mod prober;
mod rewatch;
mod state;
mod status;
mod trim;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::{conditions, wait::await_condition, watcher};
use kube::{Api, Client, CustomResourceExt};
use std::future::Future;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use actor::TICK;
pub use actuator::{Actuator, Outcome};
pub use state::{Change, ClusterState, Watch};

use crate::api::{ListedPolicy, PodHAPolicy};
use crate::contract::{AGENT_LEASE_LABEL, Identity};
use crate::health::ProbeKind;
use crate::leader::{self, LeaderConfig};
use crate::metrics::Metrics;

/// Settings of one operator process.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where `/metrics`, `/healthz` and `/readyz` listen.
    pub http_addr: SocketAddr,
    pub leader: LeaderConfig,
    /// Name of this controller in Events (`reportingController`).
    pub controller_name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the API server: {0}")]
    Client(#[source] kube::Error),
    #[error("waiting for the PodHAPolicy CRD: {0}")]
    Crd(#[source] kube::runtime::wait::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    #[error("leader election: {0}")]
    Leader(#[from] leader::LeaderError),
    #[error("no key to sign heartbeats with: {0}")]
    Key(#[from] leader::key::SharedKeyError),
    #[error("no key to sign heartbeats with: the API server did not answer within {0:?}")]
    KeyTimedOut(Duration),
    #[error("decision loop: {0}")]
    Actor(#[from] actor::ActorError),
    #[error("the {0} task ended unexpectedly")]
    TaskEnded(&'static str),
}

/// How long getting the replicas' heartbeat key may take at start.
const KEY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the kubelets keep their Leases (the node heartbeats podha watches).
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Runs the operator until `shutdown` resolves or a task fails.
pub async fn run(
    client: Client,
    opts: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    wait_for_crd(&client).await?;
    let metrics = Arc::new(Metrics::new()?);
    let (claim_tx, leadership) = leader::channel();
    let (ready_tx, ready_rx) = watch::channel(false);
    let (writes_tx, writes_rx) = writer::lanes();
    let (results_tx, results_rx) = writer::results();
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let election_progress = leader::Progress::new(&opts.leader);
    crate::listen::raise_open_file_limit();
    let (listener, listening) = crate::listen::bind(opts.http_addr)?;
    info!(addr = %listening.addr, "serving /metrics, /healthz, /readyz");
    let mut http = tokio::spawn(crate::http::serve(
        listener,
        metrics.clone(),
        ready_rx,
        election_progress.clone(),
        stopped(),
    ));
    // What the replicas sign their heartbeats with (published on the leader Lease by the
    // leader): had before this replica competes, so that a leader always has it.
    let secrets = Api::namespaced(client.clone(), &opts.leader.namespace);
    let heartbeat_key =
        tokio::time::timeout(KEY_TIMEOUT, leader::key::shared(&secrets, &opts.leader))
            .await
            .map_err(|_| Error::KeyTimedOut(KEY_TIMEOUT))??;
    let heartbeat_key = Arc::new(heartbeat_key);
    let mut election = tokio::spawn(leader::run(
        client.clone(),
        opts.leader.clone(),
        claim_tx,
        election_progress,
        stopped(),
    ));
    let reporter = Reporter {
        controller: opts.controller_name.clone(),
        instance: Some(opts.leader.identity.clone()),
    };
    let writer = writer::Writer::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
        opts.leader.step_down_margin(),
        &opts.leader.namespace,
    );
    let mut writer = tokio::spawn(writer.run(writes_rx, results_tx));
    let key_publisher = tokio::spawn(leader::key::publish(
        Api::namespaced(client.clone(), &opts.leader.namespace),
        opts.leader.clone(),
        heartbeat_key.clone(),
        leadership.clone(),
    ));
    let (mut prober, plans, rounds_rx) = spawn_probers(heartbeat_key, leadership.clone());
    let outputs = actor::Outputs {
        ready: ready_tx,
        writes: writes_tx,
        probe_plans: plans,
    };
    let actor = actor::Actor::new(leadership, outputs, metrics.clone());
    let changes = watches(&client, &opts.leader.namespace);

    let result = tokio::select! {
        r = &mut http => flatten(r, "HTTP server", Error::Http),
        r = &mut election => flatten(r, "leader election", Error::Leader),
        _ = &mut writer => Err(Error::TaskEnded("writer")),
        _ = &mut prober => Err(Error::TaskEnded("probers")),
        r = actor.run(changes, results_rx, rounds_rx) => r.map_err(Error::from),
        () = shutdown => Ok(()),
    };
    let _ = stop_tx.send(true);
    drain(&mut election, &mut http).await;
    writer.abort();
    prober.abort();
    key_publisher.abort();
    result
}

/// The kubelet-port and agent probers in one task, the senders of their plans and the
/// receiver of their rounds.
fn spawn_probers(
    heartbeat_key: Arc<Identity>,
    leadership: leader::Leadership,
) -> (
    JoinHandle<()>,
    prober::PlanSenders,
    mpsc::Receiver<prober::Round>,
) {
    let (kubelet, kubelet_plan) = watch::channel(prober::ProbePlan::default());
    let (agent, agent_plan) = watch::channel(prober::ProbePlan::default());
    let (rounds_tx, rounds_rx) = mpsc::channel(16);
    let kubelet_prober = prober::run(
        ProbeKind::KubeletTcp,
        kubelet_plan,
        rounds_tx.clone(),
        heartbeat_key.clone(),
        leadership.clone(),
    );
    let agent_prober = prober::run(
        ProbeKind::Agent,
        agent_plan,
        rounds_tx,
        heartbeat_key,
        leadership,
    );
    let task = tokio::spawn(async move {
        tokio::join!(kubelet_prober, agent_prober);
    });
    (task, prober::PlanSenders { kubelet, agent }, rounds_rx)
}

/// Once stopped: the lease is released (so a standby takes over at once) and the server
/// drained before returning, within [`SHUTDOWN_GRACE`]; in-flight writes are abandoned (every
/// write is idempotent and re-planned by whoever leads next).
async fn drain<E, H>(election: &mut JoinHandle<E>, http: &mut JoinHandle<H>) {
    let drain = async {
        if !election.is_finished() {
            let _ = election.await;
        }
        if !http.is_finished() {
            let _ = http.await;
        }
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        warn!("shutdown took longer than {SHUTDOWN_GRACE:?}; leaving");
    }
}

/// How long shutdown waits for the lease release and the HTTP drain.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A supervised task that returned: an error is the task's error, a normal return is still an
/// unexpected end (these tasks run until shutdown).
fn flatten<E>(
    joined: Result<Result<(), E>, tokio::task::JoinError>,
    task: &'static str,
    wrap: impl FnOnce(E) -> Error,
) -> Result<(), Error> {
    match joined {
        Ok(Ok(())) | Err(_) => Err(Error::TaskEnded(task)),
        Ok(Err(e)) => Err(wrap(e)),
    }
}

async fn wait_for_crd(client: &Client) -> Result<(), Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = PodHAPolicy::crd_name();
    info!(crd = name, "waiting for the CRD to be established");
    loop {
        let wait = await_condition(crds.clone(), name, conditions::is_crd_established());
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => return Err(Error::Crd(e)),
            Err(_) => warn!(
                crd = name,
                "CRD not established yet; install crds/podha.io_podhapolicies.yaml"
            ),
        }
    }
}

/// Every watch podha needs, merged into one stream of changes. No polling: watches only.
/// Pods are watched only once bound to a node; ReplicaSets and Namespaces as metadata only.
/// A watch that fails lists everything again ([`rewatch`]), so that the end of a gap in podha's
/// view is known; so does the Lease watch when it stalls ([`rewatch::LEASE_STALL_BOUND`]).
/// The agents' Leases are in podha's own namespace, `namespace`.
pub fn watches(client: &Client, namespace: &str) -> BoxStream<'static, Change> {
    let any = || watcher::Config::default().any_semantic();
    let c = client;
    stream::select_all([
        watch(
            Api::<ListedPolicy>::all(c.clone()),
            watcher::Config::default(),
            Watch::Policy,
            Change::Policy,
        ),
        watch(
            Api::<Node>::all(c.clone()),
            any(),
            Watch::Node,
            Change::Node,
        ),
        watch(
            Api::<Lease>::namespaced(c.clone(), NODE_LEASE_NAMESPACE),
            any(),
            Watch::Lease,
            Change::Lease,
        ),
        watch(
            Api::<Pod>::all(c.clone()),
            any().fields("spec.nodeName!="),
            Watch::Pod,
            Change::Pod,
        ),
        watch(
            Api::<PersistentVolumeClaim>::all(c.clone()),
            any(),
            Watch::Pvc,
            Change::Pvc,
        ),
        watch(
            Api::<PersistentVolume>::all(c.clone()),
            any(),
            Watch::Pv,
            Change::Pv,
        ),
        watch(
            Api::<VolumeAttachment>::all(c.clone()),
            any(),
            Watch::Va,
            Change::Va,
        ),
        watch(
            Api::<PartialObjectMeta<ReplicaSet>>::all(c.clone()),
            any(),
            Watch::ReplicaSet,
            Change::ReplicaSet,
        ),
        watch(
            Api::<PartialObjectMeta<Namespace>>::all(c.clone()),
            any(),
            Watch::Namespace,
            Change::Namespace,
        ),
        watch(
            Api::<Lease>::namespaced(c.clone(), namespace),
            any().labels(&format!("{AGENT_LEASE_LABEL}=true")),
            Watch::AgentLease,
            Change::AgentLease,
        ),
    ])
    .boxed()
}

/// One relisting watch, its events wrapped as changes. The Lease watch alone has a stall bound:
/// renewals arrive every few seconds, so a silent Lease watch is a gap, not a quiet cluster.
fn watch<K, F>(
    api: Api<K>,
    cfg: watcher::Config,
    watch: Watch,
    wrap: F,
) -> BoxStream<'static, Change>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(watcher::Event<K>) -> Change + Send + 'static,
{
    let stall_bound = (watch == Watch::Lease).then_some(rewatch::LEASE_STALL_BOUND);
    rewatch::relisting_watcher(api, cfg, stall_bound)
        .map(move |r| match r {
            Ok(event) => wrap(event),
            Err(error) => {
                warn!(watch = watch.as_str(), %error, "watch failed or stalled; listing again");
                Change::WatchError { watch }
            }
        })
        .boxed()
}
