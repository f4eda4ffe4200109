//! The agent's errors, each with what was being done: they end in the log line that says why
//! the agent (or its supervisor) stopped or would not start.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

fn fmt(d: &Duration) -> humantime::FormattedDuration {
    humantime::format_duration(*d)
}

/// Options that cannot work together: found before anything runs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("--survey-timeout must be more than 0s")]
    NoSurveyTime,
    #[error(
        "--isolation-timeout {} must be at least {}: a peer podha hears was heard up to two of \
         its probes ({} apart) ago, and the agent counts a peer as heard within a quarter of the \
         isolation timeout at the earliest (half the silence of a survey that starts half the \
         timeout in, see docs/agent.md)",
        fmt(.timeout), fmt(.min), fmt(.probe_interval)
    )]
    IsolationTooShort {
        timeout: Duration,
        min: Duration,
        probe_interval: Duration,
    },
    #[error(
        "the watchdog timeout {} (--watchdog-timeout, or the one the device took) must be \
         longer than the check interval plus the longest peer survey ({}): a survey would let \
         the watchdog reset a healthy node",
        fmt(.watchdog), fmt(.shortest)
    )]
    WatchdogTooShort {
        watchdog: Duration,
        shortest: Duration,
    },
    #[error(
        "the watchdog timeout {} (--watchdog-timeout, or the one the device took) must be at \
         most half the isolation timeout {}",
        fmt(.watchdog), fmt(.isolation_timeout)
    )]
    WatchdogTooLong {
        watchdog: Duration,
        isolation_timeout: Duration,
    },
    #[error(
        "{0:?} is no fence method: use sysrq-reboot, write:<absolute path>=<text> or \
         command:<shell command>"
    )]
    NoFenceMethod(String),
    #[error(
        "{0:?} is no fence check: use read:<absolute path>=<text>, http://<host>[:port]/<path> \
         or command:<shell command>"
    )]
    NoFenceCheck(String),
}

/// Why the watchdog device could not be armed.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("there is no watchdog {} on this node (no such file)", .path.display())]
    Missing { path: PathBuf },
    #[error("cannot look at the watchdog {}: {source}", .path.display())]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the watchdog {} is neither a character device (a watchdog) nor a FIFO or regular \
         file standing in for one",
        .path.display()
    )]
    NotAWatchdogFile { path: PathBuf },
    #[error(
        "the watchdog {} is no character device: a FIFO or a regular file only stands in for \
         one where that is declared (--watchdog-stand-in, a test's BMC); with it a node is \
         never reset",
        .path.display()
    )]
    StandInNotDeclared { path: PathBuf },
    #[error("refusing the watchdog {}: {source}", .path.display())]
    Refused {
        path: PathBuf,
        source: WatchdogRefusal,
    },
    #[error(
        "refusing the watchdog {}, which was running before this agent opened it (a crashed \
         agent's countdown): closed armed, it resets the node unless the next agent can pet it: \
         {source}",
        .path.display()
    )]
    RefusedRunning {
        path: PathBuf,
        source: WatchdogRefusal,
    },
    #[error("opening the watchdog {} took over {after:?}", .path.display())]
    OpenTimedOut { path: PathBuf, after: Duration },
    #[error(
        "the watchdog {} was disarmed with a timeout of {was:?} and armed again with one of          {now:?}: disarmed again, as the agent advertised the first",
        .path.display()
    )]
    TimeoutChanged {
        path: PathBuf,
        was: Duration,
        now: Duration,
    },
    #[error("opening the watchdog {}: {source}", .path.display())]
    OpenTask {
        path: PathBuf,
        source: tokio::task::JoinError,
    },
    #[error("cannot open the watchdog {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the watchdog stand-in {} took no pet ({source}): nothing resets this node any more \
         (its BMC is gone); stopping, the advert taken back",
        .path.display()
    )]
    StandInFailed {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why the agent will not use a watchdog device (see `super::watchdog`): it would not reset
/// the node when podha counts it reset, or reset it when nothing should.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogRefusal {
    #[error(
        "cannot tell whether its driver has nowayout ({source}): the agent uses no watchdog it \
         might be unable to disarm. The kernel's watchdog core has this sysfs attribute when \
         built with CONFIG_WATCHDOG_SYSFS (Linux 4.3 and later); otherwise the file may be no \
         watchdog, its driver older than the core, or /sys not mounted in the agent's container"
    )]
    NowayoutUnknown {
        source: podha_watchdog_device::Error,
    },
    #[error(
        "its driver has nowayout: once armed it never disarms, so every stop of the agent (a \
         rollout, an uninstall) would reset the node. Load the driver with nowayout=0 \
         (`modprobe softdog nowayout=0`, or `softdog.nowayout=0` on the kernel command line \
         for a built-in driver; CONFIG_WATCHDOG_NOWAYOUT=y makes nowayout the default)"
    )]
    Nowayout,
    #[error(
        "it has no magic close ({identity:?}): any close disarms it, so a crashed or killed \
         agent would leave the node running while podha counts it reset. Use a watchdog \
         whose driver has magic close (softdog and most hardware watchdogs do)"
    )]
    NoMagicClose { identity: String },
    #[error(transparent)]
    Support(podha_watchdog_device::Error),
    #[error("it did not take a timeout of {asked}s (outside what its driver allows?): {source}")]
    SetTimeout {
        asked: u32,
        source: podha_watchdog_device::Error,
    },
    #[error("cannot read its timeout back: {source}")]
    ReadTimeout {
        source: podha_watchdog_device::Error,
    },
    #[error(
        "its timeout cannot be set and is {}, not {asked}s (--watchdog-timeout {}, rounded up \
         to whole seconds): set --watchdog-timeout to the device's, or the device's (its \
         driver's timeout parameter) to it",
        fmt(.device), fmt(.requested)
    )]
    FixedTimeout {
        device: Duration,
        requested: Duration,
        asked: u32,
    },
    #[error(
        "it resets the node {} after its last pet at the latest (--watchdog-timeout {} asked \
         for {}s), which the agent cannot keep: {source}",
        fmt(.actual), fmt(.requested), .asked
    )]
    DoesNotFit {
        actual: Duration,
        requested: Duration,
        asked: u32,
        source: ArgsError,
    },
}

/// Why the supervisor stopped, or a worker must not run.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot become the subreaper of orphans: {0}")]
    Subreaper(nix::Error),
    #[error("cannot handle SIGCHLD: {0}")]
    ChildSignal(std::io::Error),
    #[error("cannot start the agent: {0}")]
    Start(std::io::Error),
    #[error("waiting for the agent (pid {pid:?}): {source}")]
    Wait {
        pid: Option<u32>,
        source: std::io::Error,
    },
    #[error(
        "the agent died {deaths} times in a row within {within:?} of its start, the last time \
         {last}: giving up"
    )]
    GaveUp {
        deaths: usize,
        within: Duration,
        last: ExitStatus,
    },
    #[error("stopped while the agent was down ({0})")]
    StoppedWhileDown(ExitStatus),
    #[error("the agent's pid {pid} is out of range: {source}")]
    Pid {
        pid: u32,
        source: std::num::TryFromIntError,
    },
    #[error("waiting for the agent to stop: {0}")]
    WaitStop(std::io::Error),
    #[error("cannot ask to die with the supervisor: {0}")]
    DeathSignal(nix::Error),
    #[error("the supervisor (pid {supervisor}) is gone: the parent is pid {parent}")]
    SupervisorGone { supervisor: u32, parent: u32 },
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The agent learned whether its node's kernel is its own (see `super::shared_kernel`): the
    /// next agent starts by it (`None`: the kernel is the node's own).
    #[error("the kernel's verdict is known ({}): starting again by it", .0.as_ref().map_or_else(|| "the node's own".to_string(), ToString::to_string))]
    KernelVerdictChanged(Option<super::shared_kernel::KernelDoubt>),
    #[error("cannot handle SIGTERM: {0}")]
    Terminate(std::io::Error),
    /// The client's own message says which configuration and what was wrong.
    #[error(transparent)]
    Client(#[from] crate::kubeconfig::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Watchdog(#[from] WatchdogError),
    #[error("the agent's server stopped: {0}")]
    Serve(std::io::Error),
    #[error("no key to sign the agent's words with: {0}")]
    Key(crate::contract::KeyError),
    #[error("the watch of this node ended")]
    WatchEnded,
}

/// Why the peer list could not be read from the API server (the last good one is kept).
#[derive(Debug, thiserror::Error)]
pub enum PeerListError {
    #[error("listing the Nodes: {0}")]
    Api(#[from] kube::Error),
    #[error("listing the Nodes took over {}", fmt(.0))]
    TimedOut(Duration),
}
