//! The workload's own check (`--check`): a command the user points at their application, a
//! database's consistency check say (`e2e/postgres/check.sh` is one for PostgreSQL), with the
//! trial's placeholders. It runs before each trial's fault, where a failure ends the run with
//! nothing faulted (the workload was not whole to begin with), and after the trial, once the
//! node is restored and any data check has run, where a failure fails the trial (invariant
//! `check-passes`). Its last line of output is shown and kept in the results.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::faults;

/// When a check ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum When {
    /// Before the trial's fault.
    Before,
    /// After the trial: the failover, the restore and the data check.
    After,
}

impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            When::Before => "before the fault",
            When::After => "after the trial",
        })
    }
}

/// One run of the check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRun {
    pub when: When,
    /// The command as run.
    pub command: String,
    /// The last line it printed when it passed; why it failed (its exit status and standard
    /// error) when it did not.
    pub result: Result<String, String>,
    pub took: Duration,
}

impl CheckRun {
    pub fn passed(&self) -> bool {
        self.result.is_ok()
    }

    /// One line for the progress: passed or failed, how long it took, what it said.
    pub fn summary(&self) -> String {
        let took = self.took.as_secs_f64();
        match &self.result {
            Ok(last) if last.is_empty() => format!("check {} passed ({took:.1}s)", self.when),
            Ok(last) => format!("check {} passed ({took:.1}s): {last}", self.when),
            Err(why) => format!("check {} FAILED ({took:.1}s): {why}", self.when),
        }
    }
}

/// Runs `command` for at most `timeout`; a failure is recorded, not raised.
pub async fn run(when: When, command: String, timeout: Duration) -> CheckRun {
    let started = Instant::now();
    let result = output_within(&command, timeout)
        .await
        .map(|stdout| stdout.lines().last().unwrap_or_default().trim().to_string());
    CheckRun {
        when,
        command,
        result,
        took: started.elapsed(),
    }
}

/// `sh -c command`'s standard output when it exits 0 within `timeout`; else why not. It runs in
/// a process group of its own, all of which is killed when the time is up (a check's `kubectl
/// exec` or query must not run on into the next trial).
async fn output_within(command: &str, timeout: Duration) -> Result<String, String> {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("could not start sh: {e}"))?;
    let group = child.id();
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(output) => output.map_err(|e| format!("waiting for it: {e}"))?,
        Err(_) => {
            if let Some(pid) = group.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(format!(
                "it did not finish within {}",
                humantime::format_duration(timeout)
            ));
        }
    };
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(faults::failed(command, &output).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_check_passes_on_exit_0_with_its_last_line_and_fails_otherwise_with_the_reason() {
        let minute = Duration::from_secs(60);
        let passed = run(
            When::After,
            "echo checking; echo 'verdict lost=0'".into(),
            minute,
        )
        .await;
        assert!(passed.passed());
        assert_eq!(passed.result.as_deref(), Ok("verdict lost=0"));
        assert!(
            passed
                .summary()
                .starts_with("check after the trial passed (")
        );
        let failed = run(When::Before, "echo 2 rows lost >&2; exit 1".into(), minute).await;
        let why = failed.result.clone().unwrap_err();
        assert!(
            why.contains("exit code 1") && why.contains("2 rows lost"),
            "{why}"
        );
        assert!(
            failed
                .summary()
                .starts_with("check before the fault FAILED ("),
            "{}",
            failed.summary()
        );
        // Its children go with it: the marker is never written.
        let dir = std::env::temp_dir().join(format!("podha-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("written");
        let command = format!("bash -c 'sleep 1; touch {}'; true", marker.display());
        let slow = run(When::After, command, Duration::from_millis(200)).await;
        assert_eq!(slow.result.unwrap_err(), "it did not finish within 200ms");
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !marker.exists(),
            "the check's child ran on after its timeout"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
