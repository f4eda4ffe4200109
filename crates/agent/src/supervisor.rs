//! `podha agent` is a supervisor: it runs the agent itself as a child process (the worker: the
//! same binary, `podha agent … --worker-of <supervisor pid>`) and starts a new one the moment one
//! dies.
//!
//! Why: a killed agent leaves the node's watchdog armed, and must (a dead agent cannot say
//! whether podha hears its node). The kubelet restarts a container it never restarted at once,
//! but one it restarted before only after its CrashLoopBackOff (10 s and more), longer than
//! the watchdog lets a node run unpetted: a second crash of the agent reset a healthy node. The
//! supervisor starts a new worker within milliseconds whatever happened before; the watchdog
//! stays armed across (the worker that died never disarmed it) and the new worker goes on from
//! the hearing file, deciding as its predecessor would have.
//!
//! - A worker that dies (a signal, or an exit other than 0) is replaced: at once after a
//!   worker that ran a while ([`Restarts::settled`]), then after a delay doubling up to a
//!   second while workers keep dying quickly, so one that cannot start does not spin. After
//!   [`Restarts::quick_deaths`] quick deaths in a row the supervisor gives up and exits, so the
//!   pod shows the crash loop; a worker that cannot start pets no watchdog, and the node is
//!   reset either way, as it must be when its agent cannot run.
//! - SIGTERM to the supervisor is passed to the worker, which withdraws its advert, disarms
//!   the watchdog once the API server confirmed the withdrawal, and stops (see
//!   `advert::advertise_until_withdrawn`); the supervisor exits as the worker did. A worker that exits 0 on its own (stopped on
//!   purpose) ends the supervisor too.
//! - A worker dies with its supervisor (the parent-death signal, set by the worker itself: see
//!   [`die_with_supervisor`]), so a killed supervisor leaves no worker behind to be doubled by
//!   the next one.
//! - The supervisor collects orphans ([`Orphans::Reap`]): in its container it is PID 1, and a
//!   process orphaned there (a `command:` fence that leaves something running in the
//!   background) is handed to it; outside a container it asks to be their subreaper. Without
//!   that, each would stay a zombie for the container's life.

use std::future::Future;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::SupervisorError;

/// When the supervisor starts the next worker.
#[derive(Clone, Copy, Debug)]
pub struct Restarts {
    /// A worker that ran this long was not crash-looping: the next one starts at once.
    pub settled: Duration,
    /// The delay after the first quick death; it doubles with each quick death in a row.
    pub first_delay: Duration,
    /// The longest delay: well inside any watchdog timeout the agent accepts.
    pub max_delay: Duration,
    /// Quick deaths in a row after which the supervisor gives up.
    pub quick_deaths: usize,
}

impl Default for Restarts {
    fn default() -> Self {
        Self {
            settled: Duration::from_secs(10),
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            quick_deaths: 10,
        }
    }
}

impl Restarts {
    /// The delays before the restarts that follow quick deaths in a row; it ends where the
    /// supervisor gives up.
    fn after_quick_deaths(&self) -> impl Iterator<Item = Duration> + use<> {
        crate::backoff::quick_restarts(self.first_delay, self.max_delay, self.quick_deaths)
    }
}

/// What the supervisor does with exited processes that are not its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orphans {
    /// Become their subreaper and collect them (`podha agent`).
    Reap,
    /// Leave them to whoever else waits for them (a test process, whose other tests have
    /// children of their own).
    Leave,
}

/// Runs workers from `spawn` one after another until `stop` completes (then the worker gets
/// SIGTERM and its exit is returned) or a worker exits 0 on its own (returned). `Err` when a
/// worker cannot be started or waited for, or keeps dying.
pub async fn supervise(
    restarts: Restarts,
    orphans: Orphans,
    mut spawn: impl FnMut() -> std::io::Result<Child>,
    stop: impl Future<Output = ()>,
) -> Result<ExitStatus, SupervisorError> {
    tokio::pin!(stop);
    let mut exits = match orphans {
        Orphans::Reap => {
            become_subreaper()?;
            Some(signal(SignalKind::child()).map_err(SupervisorError::ChildSignal)?)
        }
        Orphans::Leave => None,
    };
    let mut delays = restarts.after_quick_deaths();
    loop {
        let mut worker = spawn().map_err(SupervisorError::Start)?;
        let pid = worker.id();
        let started = Instant::now();
        let status = loop {
            tokio::select! {
                // Cancel-safe: a wait cut short by another branch loses nothing.
                status = worker.wait() => break status.map_err(|source| SupervisorError::Wait { pid, source })?,
                () = &mut stop => return stop_worker(worker).await,
                Some(()) = child_exited(&mut exits) => reap_orphans(pid),
            }
        };
        if status.success() {
            info!(?pid, "the agent stopped");
            return Ok(status);
        }
        let delay = if started.elapsed() >= restarts.settled {
            delays = restarts.after_quick_deaths();
            Duration::ZERO
        } else {
            delays.next().ok_or(SupervisorError::GaveUp {
                deaths: restarts.quick_deaths + 1,
                within: restarts.settled,
                last: status,
            })?
        };
        warn!(?pid, %status, delay_ms = delay.as_millis(), "the agent died; starting another");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = &mut stop => return Err(SupervisorError::StoppedWhileDown(status)),
        }
    }
}

/// The next SIGCHLD, if the supervisor reaps orphans; never otherwise.
async fn child_exited(exits: &mut Option<SignalStream>) -> Option<()> {
    match exits {
        Some(exits) => exits.recv().await,
        None => std::future::pending().await,
    }
}

/// Collects every exited child but `worker` (which its own wait collects, with its status).
/// The supervisor starts no other process, so these are orphans handed to it.
fn reap_orphans(worker: Option<u32>) {
    for child in children() {
        if Some(child) == worker {
            continue;
        }
        let Ok(raw) = i32::try_from(child) else {
            continue;
        };
        match waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => {}
            Ok(status) => debug!(?status, "collected an orphan"),
        }
    }
}

/// This process's children, from every thread's `/proc/self/task/<tid>/children`.
fn children() -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Passes SIGTERM to `worker` and waits for it to exit.
async fn stop_worker(mut worker: Child) -> Result<ExitStatus, SupervisorError> {
    if let Some(pid) = worker.id() {
        info!(pid, "stopping the agent");
        let pid = Pid::from_raw(
            i32::try_from(pid).map_err(|source| SupervisorError::Pid { pid, source })?,
        );
        if let Err(e) = kill(pid, Signal::SIGTERM) {
            warn!(%pid, error = %e, "cannot pass SIGTERM to the agent");
        }
    }
    worker.wait().await.map_err(SupervisorError::WaitStop)
}

/// The worker's command: this executable with `args` (the supervisor's own, which name the
/// `agent` command) and `--worker-of <this process's pid>`.
pub fn worker_command(args: &[std::ffi::OsString]) -> std::io::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(args)
        .arg(format!("--worker-of={}", std::process::id()))
        .kill_on_drop(true);
    Ok(command)
}

/// Asks the kernel to make this process the parent of its descendants' orphans (Linux's
/// `PR_SET_CHILD_SUBREAPER`).
#[cfg(target_os = "linux")]
fn become_subreaper() -> Result<(), SupervisorError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(SupervisorError::Subreaper)
}

/// Asks the kernel for SIGKILL when the parent dies (Linux's `PR_SET_PDEATHSIG`).
#[cfg(target_os = "linux")]
fn die_with_parent() -> Result<(), SupervisorError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(SupervisorError::DeathSignal)
}

// The agent runs on Linux nodes only; elsewhere (the `podha` CLI built for macOS) `podha agent`
// refuses to start, and these are never reached.
#[cfg(not(target_os = "linux"))]
fn become_subreaper() -> Result<(), SupervisorError> {
    Err(SupervisorError::Subreaper(nix::Error::ENOTSUP))
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent() -> Result<(), SupervisorError> {
    Err(SupervisorError::DeathSignal(nix::Error::ENOTSUP))
}

/// In the worker: asks the kernel for SIGKILL when the supervisor dies, then makes sure it has
/// not died already (the worker would have been orphaned before asking). `Err` says why the
/// worker must not run.
pub fn die_with_supervisor(supervisor: u32) -> Result<(), SupervisorError> {
    die_with_parent()?;
    let parent = std::os::unix::process::parent_id();
    if parent != supervisor {
        return Err(SupervisorError::SupervisorGone { supervisor, parent });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A worker that records its start in `runs` and then runs `script` (sh).
    fn worker(runs: &Path, script: &str) -> impl FnMut() -> std::io::Result<Child> {
        let script = format!("echo started >> {}; {script}", runs.display());
        move || Command::new("sh").arg("-c").arg(&script).spawn()
    }

    fn starts(runs: &Path) -> usize {
        std::fs::read_to_string(runs)
            .unwrap_or_default()
            .lines()
            .count()
    }

    #[tokio::test]
    async fn a_worker_that_dies_is_replaced_until_one_stops_on_purpose() {
        let dir = tempfile_dir("replaced");
        let runs = dir.join("runs");
        // Killed by a signal twice, exits 3 once, then stops on purpose.
        let script = format!(
            "n=$(wc -l < {runs}); \
             if [ $n -le 2 ]; then kill -9 $$; fi; \
             if [ $n -eq 3 ]; then exit 3; fi; \
             exit 0",
            runs = runs.display()
        );
        let begun = Instant::now();
        let status = supervise(
            Restarts::default(),
            Orphans::Leave,
            worker(&runs, &script),
            std::future::pending(),
        )
        .await
        .expect("supervised");
        assert!(status.success(), "{status}");
        assert_eq!(starts(&runs), 4);
        // Three quick deaths: 0.1 + 0.2 + 0.4 s of delays, no more.
        let took = begun.elapsed();
        assert!(
            took >= Duration::from_millis(700),
            "restarted without delay: {took:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn quick_restarts_wait_longer_and_longer_up_to_a_second_then_stop() {
        let delays: Vec<u128> = Restarts::default()
            .after_quick_deaths()
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000]
        );
    }

    #[tokio::test]
    async fn a_worker_that_keeps_dying_quickly_is_given_up_but_one_that_ran_a_while_is_not() {
        let dir = tempfile_dir("given-up");
        let runs = dir.join("runs");
        let restarts = Restarts {
            settled: Duration::from_millis(300),
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            quick_deaths: 3,
        };
        // Every worker dies; the 2nd and 4th after running past `settled`, which restarts the
        // count: quick deaths in a row are the 5th-8th, and the 8th is given up on.
        let script = format!(
            "n=$(wc -l < {runs}); \
             if [ $n -eq 2 ] || [ $n -eq 4 ]; then sleep 0.4; fi; \
             exit 7",
            runs = runs.display()
        );
        let err = supervise(
            restarts,
            Orphans::Leave,
            worker(&runs, &script),
            std::future::pending(),
        )
        .await
        .expect_err("given up")
        .to_string();
        assert!(err.contains("died 4 times in a row"), "{err}");
        assert!(err.contains("exit status: 7"), "{err}");
        assert_eq!(starts(&runs), 8);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_stop_is_passed_to_the_worker_and_its_exit_returned() {
        let dir = tempfile_dir("stop");
        let runs = dir.join("runs");
        let stopped = dir.join("stopped");
        let script = format!(
            "trap 'echo term > {stopped}; exit 0' TERM; while true; do sleep 0.05; done",
            stopped = stopped.display()
        );
        let stop = async {
            while starts(&runs) == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The trap is set right after the start is recorded.
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let status = supervise(
            Restarts::default(),
            Orphans::Leave,
            worker(&runs, &script),
            stop,
        )
        .await
        .expect("supervised");
        assert!(status.success(), "{status}");
        assert_eq!(
            std::fs::read_to_string(&stopped).expect("stopped"),
            "term\n"
        );
        assert_eq!(starts(&runs), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_worker_that_cannot_be_started_is_an_error() {
        let err = supervise(
            Restarts::default(),
            Orphans::Leave,
            || Command::new("/nonexistent/podha").spawn(),
            std::future::pending(),
        )
        .await
        .expect_err("no worker")
        .to_string();
        assert!(err.contains("cannot start the agent"), "{err}");
    }

    /// Runs in a process of its own, this test binary started again for this test alone: the
    /// supervisor becomes the subreaper of its whole process and would collect the children of
    /// the tests running beside it.
    #[tokio::test]
    async fn an_orphan_of_the_worker_is_collected() {
        const INSIDE: &str = "PODHA_TEST_SUPERVISOR_REAPS";
        const NAME: &str = "supervisor::tests::an_orphan_of_the_worker_is_collected";
        if std::env::var_os(INSIDE).is_none() {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", NAME, "--nocapture"])
                .env(INSIDE, "1")
                .output()
                .expect("the test binary runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "{stdout}\n{stderr}"
            );
            return;
        }
        let dir = tempfile_dir("orphan");
        let runs = dir.join("runs");
        let orphan = dir.join("orphan");
        // A subshell starts a sleep in the background and exits: the sleep is orphaned while
        // the worker runs on, and exits before it.
        let script = format!(
            "(sleep 0.2 & echo $! > {orphan}); sleep 1; exit 0",
            orphan = orphan.display()
        );
        let status = supervise(
            Restarts::default(),
            Orphans::Reap,
            worker(&runs, &script),
            std::future::pending(),
        )
        .await
        .expect("supervised");
        assert!(status.success(), "{status}");
        let pid = std::fs::read_to_string(&orphan).expect("the orphan's pid");
        let pid = pid.trim();
        // Collected: gone from /proc (a zombie stays there, in state Z, until collected).
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        assert!(stat.is_err(), "orphan {pid} not collected: {stat:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_worker_whose_supervisor_is_gone_does_not_run() {
        // This test's parent is not pid 1's child here: whatever it is, pid 1 is not it.
        let err = die_with_supervisor(1)
            .expect_err("pid 1 is not the parent")
            .to_string();
        assert!(err.contains("the supervisor (pid 1) is gone"), "{err}");
        die_with_supervisor(std::os::unix::process::parent_id()).expect("the real parent");
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("podha-supervisor-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }
}
