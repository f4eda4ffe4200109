//! `podha agent`: one per node. It answers podha's heartbeat probes, fences its own node when
//! podha can no longer hear it (unless its peers show podha cannot prove it), and fences at once
//! when podha asks through the API, acknowledging on the Node. See docs/agent.md.
//!
//! - [`isolation`]: the rule for fencing oneself (pure).
//! - `main_loop`: the loop that applies it every check interval, and the hearing file read at
//!   start.
//! - [`server`]: the endpoints podha's leader and the peers call.
//! - [`port`]: how the agent serves them, within stated limits (any pod can reach the port).
//! - [`peers`]: who the peers are and what they answer.
//! - [`advert`]: what the agent tells podha about itself (on its Node, and its Lease).
//! - [`requests`]: fence requests podha writes on the Node, and the acknowledgement.
//! - [`fence`]: how the node is fenced, once per cause.
//!
//! Its own crate: it builds on the contract it shares with the operator (`podha-contract`) and
//! on what both use (`podha-support`), and on nothing of the operator's.
#![forbid(unsafe_code)]
// Functions that decide should read in one screen (clippy.toml sets the limit); tests are
// tables and scenarios, and may run longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

// The shared rooms under the names the agent's modules use.
use podha_contract as contract;
use podha_support::{backoff, kubeconfig, listen};

mod advert;
mod arming;
mod boot;
mod counters;
mod error;
mod fence;
mod fence_check;
mod fence_record;
mod hearing_file;
mod identity;
pub mod isolation;
pub mod leader_key;
mod main_loop;
mod peer_list;
pub mod peers;
pub mod port;
mod requests;
pub mod server;
pub mod shared_kernel;
pub mod supervisor;
#[cfg(test)]
mod test_fifo;
pub mod watchdog;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{error, info, warn};

use contract::{AGENT_PROBE_INTERVAL, DEFAULT_LEADER_LEASE};
pub use error::{
    AgentError, ArgsError, PeerListError, SupervisorError, WatchdogError, WatchdogRefusal,
};
pub use fence::{FenceCause, FenceConfirm, FenceMethod, Fenced, Fencer};
pub use fence_check::FenceCheck;
use hearing_file::HearingFile;
use leader_key::LeaderKey;
use main_loop::{check_loop, resume};
use peer_list::SavedList;
use peers::{Peers, SurveyTimes};
use server::SharedHearing;
use shared_kernel::{Kernel, SavedVerdict};
use watchdog::{Unwatched, Watchdog};

/// The shortest isolation timeout: a quarter of it (how recently a peer must have been heard
/// to count as heard, in a survey that starts when half the timeout has passed, as with the
/// longest watchdog) must cover two of podha's probe intervals (8 s with 1 s probes).
pub const MIN_ISOLATION_TIMEOUT: Duration = AGENT_PROBE_INTERVAL.saturating_mul(8);

/// `podha agent`'s options. Every flag also reads a `PODHA_AGENT_*` variable.
#[derive(clap::Args, Clone, Debug)]
pub struct AgentArgs {
    /// This node's name (in the chart's DaemonSet: from the downward API).
    #[arg(long, env = "PODHA_AGENT_NODE")]
    pub node: String,
    /// How the node is fenced: `sysrq-reboot` (an immediate reboot through
    /// /proc/sysrq-trigger, no sync: what a fence is), `write:<file>=<text>` (the text written
    /// to the file: a kernel or BMC interface; `sysrq-reboot` is `write:/proc/sysrq-trigger=b`),
    /// or `command:<shell command>` (run with `sh -c`, in an image that has a shell: a site's
    /// own power-off). No default: a fence is never an accident.
    #[arg(long, env = "PODHA_AGENT_FENCE", value_parser = FenceMethod::parse)]
    pub fence: FenceMethod,
    /// A check that passes once the node is fenced, run every second after a fence podha
    /// asked for, for at most `--fence-confirm-within`: only then is the request acknowledged
    /// (podha moves the node's volumes on it). `read:<file>=<text>` (the file says the text:
    /// a BMC's power state, a cgroup's `populated 0`), `http://<host>[:port]/<path>` (a GET
    /// answered 2xx: a site's fence service) or `command:<shell command>` (exits 0, in an
    /// image with a shell). Without it a fence that leaves the agent running (`write:` or
    /// `command:`) is not acknowledged, and podha proves it by the agent's silence once the
    /// node is down.
    #[arg(long, env = "PODHA_AGENT_FENCE_CONFIRM", value_parser = FenceCheck::parse)]
    pub fence_confirm: Option<FenceCheck>,
    /// How long the `--fence-confirm` check may take to pass.
    #[arg(long, env = "PODHA_AGENT_FENCE_CONFIRM_WITHIN", value_parser = humantime::parse_duration, default_value = "60s")]
    pub fence_confirm_within: Duration,
    /// Where podha's probes and the peers' surveys arrive. Peers are asked on the same port.
    /// `[::]` listens on both families (on IPv4 alone where the host has no IPv6).
    #[arg(long, env = "PODHA_AGENT_LISTEN", default_value = "[::]:9441")]
    pub listen: SocketAddr,
    /// How long podha may not hear this node before it fences itself (unless its peers show
    /// half of its peers unheard: podha then cannot prove its silence). podha's `Agent` proof (by the agent's silence) waits this long plus
    /// `fencing.agentMargin`, for an agent that pets a watchdog.
    #[arg(long, env = "PODHA_AGENT_ISOLATION_TIMEOUT", value_parser = humantime::parse_duration, default_value = "14s")]
    pub isolation_timeout: Duration,
    /// How often the agent checks whether it is heard.
    #[arg(long, env = "PODHA_AGENT_CHECK_INTERVAL", value_parser = humantime::parse_duration, default_value = "1s")]
    pub check_interval: Duration,
    /// How long a peer survey may go on asking (peers answer within 1 s, or half this if
    /// shorter; the peer list is the one the agent keeps warm, read every 30 s). What the
    /// answers say by then decides, and too few answers fence: a short one suits a small
    /// cluster on a fast network and allows a short watchdog timeout (see docs/agent.md,
    /// "Timing").
    #[arg(long, env = "PODHA_AGENT_SURVEY_TIMEOUT", value_parser = humantime::parse_duration, default_value = "3s")]
    pub survey_timeout: Duration,
    /// Where the agent keeps the key it signs its words with (made at first start, mode 0600):
    /// somewhere that outlives reboots (the chart: /var/lib/podha-agent/<node>), so that its
    /// peers, which learn keys when they read the peer list, rarely hold an old one. Default:
    /// `<hearing file>.key`.
    #[arg(long, env = "PODHA_AGENT_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// podha's leader Lease (in `--namespace`), whose `podha.io/leader-key` annotation is the
    /// key podha's heartbeats must be signed with (podha's `--leader-lease`).
    #[arg(long, env = "PODHA_AGENT_LEADER_LEASE", default_value = DEFAULT_LEADER_LEASE)]
    pub leader_lease: String,
    /// Kubeconfig file; without it, in-cluster config or $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "PODHA_AGENT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Where this boot's ID is read (what the kubelet reports as `nodeInfo.bootID`). A fence
    /// request made in an earlier boot is answered without a fence: the reboot was one. The
    /// hearing file and the saved peer list name the boot they were written in, and count only
    /// in it.
    #[arg(
        long,
        env = "PODHA_AGENT_BOOT_ID_FILE",
        default_value = shared_kernel::KERNEL_BOOT_ID
    )]
    pub boot_id_file: PathBuf,
    /// Where the agent keeps this node's boot history: the boot IDs it ran in (the last 64),
    /// each with when its first agent started. Somewhere reboots keep, of this node alone (the
    /// chart: /var/lib/podha-agent/<node> on the node). A fence request naming another boot
    /// than this one is acknowledged without a fence only if it shows that boot as an earlier
    /// one of this node, asked before this boot began; one it does not is left unanswered.
    #[arg(
        long,
        env = "PODHA_AGENT_BOOT_HISTORY_FILE",
        default_value = "/var/lib/podha-agent/boots"
    )]
    pub boot_history_file: PathBuf,
    /// Where the agent keeps when podha last heard this node (and, beside it, its peer list as
    /// `<file>.peers` and podha's leader's key as `<file>.leader-key`), so that an agent restarted after a crash or in a new pod
    /// goes on from there (a node cut off from podha is still fenced in time) instead of
    /// counting its start as heard. Somewhere a pod replacement keeps, of this node alone (the
    /// chart: /run/podha-agent/<node> on the node). The record names its boot: no file, or one
    /// of another boot, means podha has not heard this node since it booted, and such a node
    /// does not fence itself on isolation. Required: without it a restarted agent could not
    /// tell that case from a node podha heard and lost.
    #[arg(long, env = "PODHA_AGENT_HEARING_FILE")]
    pub hearing_file: PathBuf,
    /// The node's watchdog device (e.g. /dev/watchdog): armed only while podha may count this
    /// node's silence (heard in this boot, not held), petted while podha hears this node (or
    /// cannot prove its silence), disarmed while podha holds the node and on SIGTERM. A device
    /// must have magic close and no nowayout. A FIFO or a regular file only with `--watchdog-stand-in`. Without one,
    /// or where there is none or it cannot be used (the agent then runs without and says why
    /// on the Node), a frozen node is not reset, and its agent's silence proves nothing: see
    /// docs/agent.md.
    #[arg(long, env = "PODHA_AGENT_WATCHDOG", requires = "watchdog_timeout")]
    pub watchdog: Option<PathBuf>,
    /// The watchdog's timeout: set on the device (rounded up to whole seconds) and read back,
    /// the device's own being what the agent goes by; a device whose timeout cannot be set must
    /// have this one; a FIFO or a file standing in for a device is taken to have it. More than
    /// the check interval plus the longest peer survey (7s with the default survey timeout), at
    /// most half the isolation timeout.
    #[arg(long, env = "PODHA_AGENT_WATCHDOG_TIMEOUT", value_parser = humantime::parse_duration, requires = "watchdog")]
    pub watchdog_timeout: Option<Duration>,
    /// `--watchdog` is a FIFO or a regular file that stands in for a device (a test's BMC,
    /// which resets its machine when not written to): taken to have `--watchdog-timeout`.
    #[arg(
        long,
        env = "PODHA_AGENT_WATCHDOG_STAND_IN",
        requires = "watchdog",
        hide = true
    )]
    pub watchdog_stand_in: bool,
    /// The namespace of the agent's Lease: podha's (default: the namespace of the client's
    /// configuration, in a Pod its own).
    #[arg(long, env = "PODHA_AGENT_NAMESPACE")]
    pub namespace: Option<String>,
    /// The agent's Pod (in the chart's DaemonSet: from the downward API), with
    /// `--pod-uid`: it owns the agent's Lease, which goes with it.
    #[arg(long, env = "PODHA_AGENT_POD_NAME", requires = "pod_uid")]
    pub pod_name: Option<String>,
    /// The UID of the agent's Pod (see `--pod-name`).
    #[arg(long, env = "PODHA_AGENT_POD_UID", requires = "pod_name")]
    pub pod_uid: Option<String>,
    /// Set by `podha agent` on the process it runs the agent in: the supervisor's pid (see
    /// `supervisor`). Not for people.
    #[arg(long, hide = true)]
    pub worker_of: Option<u32>,
}

impl AgentArgs {
    /// podha's namespace: `--namespace`, or the client's own (the agent Pod's).
    fn namespace_in(&self, client: &kube::Client) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string())
    }

    /// What can be wrong with the options before anything runs.
    pub fn check(&self) -> Result<(), ArgsError> {
        if self.survey_timeout.is_zero() {
            return Err(ArgsError::NoSurveyTime);
        }
        if self.isolation_timeout < MIN_ISOLATION_TIMEOUT {
            return Err(ArgsError::IsolationTooShort {
                timeout: self.isolation_timeout,
                min: MIN_ISOLATION_TIMEOUT,
                probe_interval: AGENT_PROBE_INTERVAL,
            });
        }
        if let Some(timeout) = self.watchdog_timeout {
            self.watchdog_bounds().check(timeout)?;
        }
        Ok(())
    }

    /// The timings a watchdog timeout must fit.
    pub fn watchdog_bounds(&self) -> watchdog::Bounds {
        watchdog::Bounds {
            isolation_timeout: self.isolation_timeout,
            check_interval: self.check_interval,
            survey_limit: self.survey_times().limit(),
        }
    }

    /// The watchdog the agent pets, opened (and so armed) with the timeout it goes by: the
    /// latest a device resets the node by what it reads back, which fits
    /// [`Self::watchdog_bounds`] (see [`watchdog`]). Or why it pets none: none configured, or
    /// none usable on this node ([`watchdog::run_without`]). An error stops the agent.
    async fn open_watchdog(
        &self,
        kernel: &Kernel,
    ) -> Result<Result<Watchdog, Unwatched>, WatchdogError> {
        let (Some(path), Some(timeout)) = (&self.watchdog, self.watchdog_timeout) else {
            return Ok(Err(Unwatched::NotConfigured));
        };
        let stand_in = self.watchdog_stand_in;
        // A device on a kernel that may not be the node's own may be the host's (see
        // `shared_kernel`); a declared stand-in that is no device is the node's (the sim's BMC).
        if let Err(doubt) = kernel
            && !(stand_in && watchdog::is_stand_in_file(path))
        {
            return Ok(Err(Unwatched::NotItsKernel(doubt.clone())));
        }
        match Watchdog::open(path, timeout, self.watchdog_bounds(), stand_in).await {
            Ok(watchdog) => Ok(Ok(watchdog)),
            Err(error) => watchdog::run_without(error, stand_in).map(Err),
        }
    }

    /// How long a peer survey and its parts may take.
    pub fn survey_times(&self) -> SurveyTimes {
        SurveyTimes::new(self.survey_timeout)
    }
}

/// `podha agent`: the supervisor, which runs the agent in a worker process of its own and
/// replaces it when it dies (see [`supervisor`]).
pub async fn supervisor_cli(args: AgentArgs) -> std::process::ExitCode {
    if let Err(e) = args.check() {
        error!(error = %e, "podha agent cannot start");
        return std::process::ExitCode::FAILURE;
    }
    let own_args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(e) => {
                error!(error = %e, "podha agent cannot handle SIGTERM");
                return std::process::ExitCode::FAILURE;
            }
        };
    let stop = async {
        terminate.recv().await;
        info!("SIGTERM: stopping the agent");
    };
    let spawn = || supervisor::worker_command(&own_args)?.spawn();
    match supervisor::supervise(
        supervisor::Restarts::default(),
        supervisor::Orphans::Reap,
        spawn,
        stop,
    )
    .await
    {
        Ok(status) if status.success() => std::process::ExitCode::SUCCESS,
        Ok(status) => {
            error!(%status, "podha agent stopped");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            error!(error = %e, "podha agent stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `podha agent --worker-of <pid>`: the agent itself, in the supervisor's worker process.
pub async fn cli(args: AgentArgs) -> std::process::ExitCode {
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "podha agent stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What the agent's endpoints answer with and whom they believe: its key (see
/// [`identity`]), the peers it keeps warm with their keys, and podha's leader's key.
fn endpoints(
    args: &AgentArgs,
    client: &kube::Client,
    boot: Option<&str>,
    hearing: SharedHearing,
) -> Result<server::Endpoints, AgentError> {
    let key_file = args
        .key_file
        .clone()
        .unwrap_or_else(|| args.hearing_file.with_extension("key"));
    let identity = identity::load_or_create(&key_file)
        .map(Arc::new)
        .map_err(AgentError::Key)?;
    let peers = Arc::new(
        Peers::discovered(
            client.clone(),
            &args.node,
            identity.clone(),
            args.survey_times(),
            SavedList::new(args.hearing_file.with_extension("peers"), boot),
        )
        .keeping_reach(peers::SavedReach::new(
            args.hearing_file.with_extension("reach"),
            boot,
        )),
    );
    let leader_key = Arc::new(LeaderKey::kept_at(
        args.hearing_file.with_extension("leader-key"),
        boot,
    ));
    Ok(server::Endpoints {
        node: args.node.as_str().into(),
        identity,
        hearing,
        leader_key,
        peers,
    })
}

/// Logs why the agent on `node` pets no watchdog, if it pets none: its node is then not
/// agent-protected. A watchdog configured but unusable is a warning (the operator meant one).
fn say_unwatched(node: &str, watchdog: &Result<Watchdog, Unwatched>) {
    match watchdog {
        Ok(_) => {}
        Err(Unwatched::NotConfigured) => info!(
            node,
            "no watchdog (--watchdog): this node is not agent-protected: a silence of its agent \
             proves no fence, podha's Agent proof needs an acknowledged fence request for it"
        ),
        Err(Unwatched::NotItsKernel(doubt)) => warn!(
            node,
            %doubt,
            "no watchdog device on a kernel that may not be this node's own: this node is not \
             agent-protected: a silence of its agent proves no fence, podha's Agent proof needs \
             an acknowledged fence request for it"
        ),
        Err(Unwatched::Unusable(error)) => warn!(
            node,
            error = %error,
            "running without a watchdog: this node is not agent-protected: a silence of its agent \
             proves no fence, podha's Agent proof needs an acknowledged fence request for it"
        ),
    }
}

/// The agent's fencer: `--fence`, unless it reboots a kernel that may not be the node's own
/// (then every fence is refused and says why), with `--fence-confirm`.
fn fencer(args: &AgentArgs, kernel: &Kernel, record: fence_record::FenceRecord) -> Fencer {
    let confirm = args.fence_confirm.clone().map(|check| FenceConfirm {
        check,
        within: args.fence_confirm_within,
    });
    let fence = match kernel {
        Err(doubt) if args.fence.reboots_kernel() => FenceMethod::Refused(doubt.to_string()),
        _ => args.fence.clone(),
    };
    Fencer::new(fence, confirm, &args.node).recording(record)
}

/// Where the agent records its fences: beside the boot history, which reboots keep, its name
/// followed by `.fences`.
fn fence_record(args: &AgentArgs, boot: Option<&str>) -> fence_record::FenceRecord {
    let mut name = args.boot_history_file.as_os_str().to_os_string();
    name.push(".fences");
    fence_record::FenceRecord::new(&PathBuf::from(name), boot)
}

/// The agent's Lease, owned by its Pod when it runs in one, saying whether podha heard it in
/// `boot` and whether it reaches its peers, renewed often while a leader that never heard it
/// leads (`watchdog`: the watchdog's timeout, for the window).
fn advert_lease(
    args: &AgentArgs,
    client: &kube::Client,
    endpoints: &server::Endpoints,
    boot: Option<String>,
    watchdog: Option<Duration>,
) -> advert::AdvertLease {
    let owner = args
        .pod_name
        .clone()
        .zip(args.pod_uid.clone())
        .map(|(name, uid)| advert::OwnerPod { name, uid });
    let namespace = args.namespace_in(client);
    let window = isolation::renewal_window(args.isolation_timeout, watchdog);
    let hearing = endpoints.hearing.clone();
    advert::AdvertLease::new(client.clone(), &namespace, &args.node, owner, boot, hearing)
        .following(endpoints.leader_key.clone(), window)
        .reporting(endpoints.peers.reach())
}

async fn run(args: AgentArgs) -> Result<(), AgentError> {
    args.check()?;
    crate::listen::raise_open_file_limit();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(AgentError::Terminate)?;
    let client = crate::kubeconfig::client(args.kubeconfig.as_deref())
        .await
        .map_err(AgentError::Client)?;
    let (listener, listening) =
        crate::listen::bind(args.listen).map_err(|source| AgentError::Listen {
            addr: args.listen,
            source,
        })?;
    let boot = boot::boot_id(&args.boot_id_file);
    let mut hearing_file = HearingFile::new(&args.hearing_file, boot.as_deref());
    let hearing = resume(&hearing_file, &args.node, args.isolation_timeout);
    let hearing: SharedHearing = Arc::new(Mutex::new(hearing));
    let endpoints = endpoints(&args, &client, boot.as_deref(), hearing.clone())?;
    let (identity, peers, leader_key) = (
        endpoints.identity.clone(),
        endpoints.peers.clone(),
        endpoints.leader_key.clone(),
    );
    let namespace = args.namespace_in(&client);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let verdict = SavedVerdict::new(args.hearing_file.with_extension("kernel"), boot.as_deref());
    let kernel = shared_kernel::at_start(&nodes, &args.node, &verdict).await;
    let record = fence_record(&args, boot.as_deref());
    counters::last_fence(record.last());
    let fencer = Arc::new(fencer(&args, &kernel, record));
    let router = server::router(endpoints.clone());
    // A task of its own: a flood keeps its accept loop busy, not the loop that pets the
    // watchdog.
    let serve = async {
        tokio::spawn(port::serve(listener, router, port::LIMITS))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    // A device's own timeout from here on (it may have rounded what it was asked).
    let mut watchdog = args.open_watchdog(&kernel).await?;
    say_unwatched(&args.node, &watchdog);
    arming::follow(watchdog.as_mut().ok(), &hearing, &mut hearing_file).await?;
    let watchdog_timeout = watchdog.as_ref().ok().map(Watchdog::timeout);
    let fenced_within = isolation::fenced_within(args.isolation_timeout, watchdog_timeout);
    info!(node = %args.node, listen = %listening.addr, timeout = ?args.isolation_timeout, ?watchdog_timeout, ?fenced_within, "podha agent started");
    let advert = advert::Advert {
        port: listening.addr.port(),
        fenced_within,
        watchdog: watchdog::advertised(&watchdog),
        key: identity.public(),
    };
    let lease = advert_lease(&args, &client, &endpoints, boot.clone(), watchdog_timeout);
    let advertise = async {
        tokio::select! {
            r = requests::follow(client.clone(), &args.node, advert, listening, boot, &args.boot_history_file, fencer.clone()) => r,
            () = lease.keep() => Ok(()),
        }
    };
    let stop = futures::FutureExt::map(terminate.recv(), drop);
    // Stopped for good (uninstalled, moved away, or replaced: a new agent advertises again):
    // nothing will fence this node, so the advert goes first, while the watchdog still does.
    let advertising = advert::advertise_until_withdrawn(advertise, stop, || {
        advert::withdraw(&nodes, &args.node, &lease)
    });
    let (result, withdrawn) = tokio::select! {
        r = serve => (r.map_err(AgentError::Serve), false),
        ended = advertising => ended.outcome(),
        failed = check_loop(&args, hearing, &leader_key, &peers, &fencer, watchdog.as_mut().ok(), &mut hearing_file) => (Err(AgentError::Watchdog(failed)), false),
        () = peers.keep_warm() => (Ok(()), false),
        () = peers.keep_reach_checked() => (Ok(()), false),
        () = leader_key.keep_watching(kube::Api::namespaced(client.clone(), &namespace), &args.leader_lease) => (Ok(()), false),
        changed = shared_kernel::until_changed(&nodes, &args.node, &kernel, &verdict) => (Err(AgentError::KernelVerdictChanged(changed.err())), false),
    };
    leave(
        &result,
        withdrawn,
        watchdog,
        advert::withdraw(&nodes, &args.node, &lease),
    )
    .await;
    result
}

/// What a worker that ends with `result` leaves on its node: the watchdog disarmed, or the
/// advert withdrawn (by `withdraw`, run only then), as the way it ended asks.
async fn leave(
    result: &Result<(), AgentError>,
    withdrawn: bool,
    watchdog: Result<Watchdog, Unwatched>,
    withdraw: impl std::future::Future<Output = bool>,
) {
    // Stopped on purpose and withdrawn: the watchdog would otherwise reset the node. A part
    // that failed leaves it as it is (armed, as a killed agent does, or disarmed on a node
    // podha holds): the supervisor starts a worker at once, which goes on by the rules (the
    // node's advert, and podha's proof, stand meanwhile). The kernel's verdict became known:
    // the next agent starts by it, and this one, which had no device (at most a stand-in),
    // leaves nothing armed.
    let kernel_changed = matches!(result, Err(AgentError::KernelVerdictChanged(_)));
    if (withdrawn || kernel_changed)
        && let Ok(mut watchdog) = watchdog
    {
        watchdog.disarm();
    }
    // Its watchdog's stand-in gone: nothing fences this node any more, so podha must not count
    // its silence as a fence. Another part that failed leaves the advert: the supervisor starts
    // the agent again at once.
    if matches!(
        result,
        Err(AgentError::Watchdog(WatchdogError::StandInFailed { .. }))
    ) {
        withdraw.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_args(flags: &[&str]) -> AgentArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            agent: AgentArgs,
        }
        let argv = [
            "agent",
            "--node=n1",
            "--fence=sysrq-reboot",
            "--hearing-file=/run/podha-agent/heard",
        ];
        let argv = argv.iter().chain(flags);
        <Cli as clap::Parser>::try_parse_from(argv)
            .expect("flags")
            .agent
    }

    #[tokio::test]
    async fn a_kernel_other_nodes_share_gets_no_watchdog_device_but_a_stand_in_is_kept() {
        let shared: Kernel = Err(shared_kernel::KernelDoubt::Shared {
            me: "n1".into(),
            with: "n2".into(),
            boot_id: "b".into(),
        });
        // Not even looked at: the path does not exist, and the answer is the shared kernel.
        let missing =
            std::env::temp_dir().join(format!("podha-no-watchdog-{}", std::process::id()));
        let device = format!("--watchdog={}", missing.display());
        let args = agent_args(&[&device, "--watchdog-timeout=10s"]);
        let opened = args.open_watchdog(&shared).await;
        assert!(
            matches!(&opened, Ok(Err(Unwatched::NotItsKernel(d))) if Err(d.clone()) == shared),
            "expected no watchdog on a shared kernel"
        );
        // Declared a stand-in, a path that is no FIFO or file is still not trusted.
        let args = agent_args(&[&device, "--watchdog-timeout=10s", "--watchdog-stand-in"]);
        let opened = args.open_watchdog(&shared).await;
        assert!(matches!(&opened, Ok(Err(Unwatched::NotItsKernel(_)))));
        // A declared stand-in that is a FIFO or a file (the sim's BMC) is the node's own:
        // opened as configured (a file: armed as a stand-in).
        let file = std::env::temp_dir().join(format!("podha-stand-in-{}", std::process::id()));
        std::fs::write(&file, b"").expect("file");
        let stand_in = format!("--watchdog={}", file.display());
        let args = agent_args(&[&stand_in, "--watchdog-timeout=10s", "--watchdog-stand-in"]);
        let opened = args.open_watchdog(&shared).await;
        assert!(matches!(&opened, Ok(Ok(_))));
        if let Ok(Ok(mut watchdog)) = opened {
            watchdog.disarm();
        }
        let _ = std::fs::remove_file(&file);
    }

    #[tokio::test]
    async fn a_stand_in_whose_bmc_is_gone_stops_the_agent_at_its_next_pet() {
        let fifo = std::env::temp_dir().join(format!("podha-stand-in-fifo-{}", std::process::id()));
        // The BMC: the FIFO's reader.
        let bmc = crate::test_fifo::fifo_with_reader(&fifo);
        let stand_in = format!("--watchdog={}", fifo.display());
        let args = agent_args(&[&stand_in, "--watchdog-timeout=10s", "--watchdog-stand-in"]);
        let own: Kernel = Ok(());
        let Ok(Ok(mut watchdog)) = args.open_watchdog(&own).await else {
            panic!("a declared FIFO stand-in with its reader opens");
        };
        watchdog.pet().expect("petted while the BMC reads");
        drop(bmc);
        let err = watchdog
            .pet()
            .expect_err("no reader: the pet reaches nothing");
        assert!(matches!(err, WatchdogError::StandInFailed { .. }), "{err}");
        let _ = std::fs::remove_file(&fifo);
    }

    #[test]
    fn the_hearing_file_is_required() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            _agent: AgentArgs,
        }
        let argv = ["agent", "--node=n1", "--fence=sysrq-reboot"];
        let err = <Cli as clap::Parser>::try_parse_from(argv).expect_err("no hearing file");
        assert!(err.to_string().contains("--hearing-file"), "{err}");
    }

    #[test]
    fn a_short_survey_timeout_allows_a_short_watchdog_and_isolation_timeout() {
        let check = |flags: &[&str]| agent_args(flags).check().map_err(|e| e.to_string());
        assert_eq!(check(&[]), Ok(()), "the defaults");
        // The default survey takes up to 4 s: a 4 s watchdog could reset a node mid-survey.
        let short = [
            "--isolation-timeout=8s",
            "--watchdog=/dev/watchdog",
            "--watchdog-timeout=4s",
        ];
        let err = check(&short).unwrap_err();
        assert!(
            err.contains("longer than the check interval plus the longest peer survey (5s)"),
            "{err}"
        );
        // Nor a 5 s one: the defaults' 6 s is the shortest.
        let five = ["--watchdog=/dev/watchdog", "--watchdog-timeout=5s"];
        assert!(check(&five).is_err());
        let six = ["--watchdog=/dev/watchdog", "--watchdog-timeout=6s"];
        assert_eq!(check(&six), Ok(()));
        // A 1 s survey takes up to 1.5 s: check (1 s) + 1.5 s < 4 s.
        assert_eq!(
            check(&[&short[..], &["--survey-timeout=1s"]].concat()),
            Ok(())
        );
        let err = check(&["--isolation-timeout=6s", "--survey-timeout=1s"]).unwrap_err();
        assert!(
            err.contains("--isolation-timeout 6s must be at least 8s"),
            "{err}"
        );
        let err = check(&["--survey-timeout=0s"]).unwrap_err();
        assert!(
            err.contains("--survey-timeout must be more than 0s"),
            "{err}"
        );
    }
}
