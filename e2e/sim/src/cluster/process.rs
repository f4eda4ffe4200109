//! Detached processes: each runs in its own process group (so it outlives `podha-sim up` and a
//! whole group can be killed at once), logs to a file, and is identified by pid plus start time
//! (so a recycled pid is never killed by mistake).

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::{Error, Result};

/// A process the sim cluster started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    /// Process id, also its process group id.
    pub pid: i32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

impl ProcRecord {
    /// The record of the running process `pid`, if there is one.
    pub fn of(pid: i32) -> Option<Self> {
        start_time(pid).map(|start_time| Self { pid, start_time })
    }
}

/// Starts `cmd` in a new process group, stdin from /dev/null, stdout and stderr appended to
/// `log`. A thread reaps it when it exits, so a killed child never lingers as a zombie of a
/// long-lived parent (the test binary).
pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<ProcRecord> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::io(format!("open log {}", log.display()), e))?;
    let err = out.try_clone().map_err(|e| Error::io("dup log file", e))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("start {name} ({:?})", cmd.get_program()), e))?;
    let pid = child.id() as i32;
    let start_time = start_time(pid).unwrap_or(0);
    std::thread::Builder::new()
        .name(format!("reap-{name}"))
        .spawn(move || {
            let _ = child.wait();
        })
        .map_err(|e| Error::io("spawn reaper thread", e))?;
    Ok(ProcRecord { pid, start_time })
}

/// Start time and state of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// True when the recorded process still runs. A zombie counts as gone only once it is its
/// last thread: when a multi-threaded process (kwok, a Go program) is killed, its leader thread
/// can turn zombie while other threads are still exiting and still hold its open files, so a
/// killed node's kubelet port would go on accepting connections for a moment.
pub fn is_alive(rec: &ProcRecord) -> bool {
    match stat(rec.pid) {
        Some((_, start)) if start != rec.start_time => false,
        Some(('Z' | 'X', _)) => threads(rec.pid) > 1,
        Some(_) => true,
        None => false,
    }
}

/// Threads of `pid` still listed by the kernel (a thread leaves the list after it has closed
/// its share of the process's files).
fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |dir| dir.count())
}

/// SIGKILLs the process group of `rec` if its leader is still the recorded process, and waits
/// (up to 10 s) for the leader to be gone.
pub fn kill(name: &str, rec: &ProcRecord) -> Result<()> {
    if !is_alive(rec) {
        return Ok(());
    }
    match killpg(Pid::from_raw(rec.pid), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            return Err(Error::io(
                format!("kill {name} (process group {})", rec.pid),
                std::io::Error::from(e),
            ));
        }
    }
    wait_gone(name, rec)
}

/// Waits (up to 10 s) for the recorded process, just sent SIGKILL or SIGTERM, to be gone.
fn wait_gone(name: &str, rec: &ProcRecord) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_alive(rec) {
        if Instant::now() > deadline {
            return Err(Error::Other(format!(
                "{name} (pid {}) still alive 10 s after it was signalled to stop",
                rec.pid
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// SIGTERMs only the recorded process (not its group), as a kubelet stops a container, and
/// waits (up to 10 s) for it to be gone.
pub fn terminate(name: &str, rec: &ProcRecord) -> Result<()> {
    signal_leader(name, rec, Signal::SIGTERM)
}

/// SIGKILLs only the recorded process (not its group) and waits (up to 10 s) for it to be gone.
pub fn kill_leader(name: &str, rec: &ProcRecord) -> Result<()> {
    signal_leader(name, rec, Signal::SIGKILL)
}

/// Sends `signal` to the recorded process alone, if it still runs, and waits (up to 10 s) for
/// it to be gone.
fn signal_leader(name: &str, rec: &ProcRecord, signal: Signal) -> Result<()> {
    if !is_alive(rec) {
        return Ok(());
    }
    match nix::sys::signal::kill(Pid::from_raw(rec.pid), signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            return Err(Error::io(
                format!("{signal} {name} (pid {})", rec.pid),
                std::io::Error::from(e),
            ));
        }
    }
    wait_gone(name, rec)
}

/// Stops (`SIGSTOP`, `paused`) or continues (`SIGCONT`) the process group of `rec`: a process
/// that hangs, its sockets still open.
pub fn pause(name: &str, rec: &ProcRecord, paused: bool) -> Result<()> {
    if !is_alive(rec) {
        return Err(Error::Other(format!(
            "{name} (pid {}) is not running",
            rec.pid
        )));
    }
    let signal = if paused {
        Signal::SIGSTOP
    } else {
        Signal::SIGCONT
    };
    killpg(Pid::from_raw(rec.pid), signal).map_err(|e| {
        Error::io(
            format!("{signal} {name} (process group {})", rec.pid),
            std::io::Error::from(e),
        )
    })
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawned_group_is_killed() {
        let dir = std::env::temp_dir().join(format!("podha-sim-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 600 & echo started; wait"]);
        let rec = spawn("sleep", cmd, &log).unwrap();
        assert!(is_alive(&rec));
        std::thread::sleep(Duration::from_millis(200));
        kill("sleep", &rec).unwrap();
        assert!(!is_alive(&rec));
        // The grandchild (sleep) was in the same group and is gone too (once init reaped it).
        let group_empty = || {
            let out = Command::new("pgrep")
                .args(["-g", &rec.pid.to_string()])
                .output()
                .unwrap();
            out.stdout.is_empty()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !group_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(group_empty(), "process group {} still has members", rec.pid);
        assert!(log_tail(&log, 5).contains("started"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn recycled_pid_is_not_alive() {
        let me = std::process::id() as i32;
        let rec = ProcRecord {
            pid: me,
            start_time: start_time(me).unwrap() + 1,
        };
        assert!(!is_alive(&rec));
    }
}
