//! How the agent fences its node (`--fence`), how it checks that a fence it was asked for took
//! (`--fence-confirm`), and the one place that carries both out.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{error, info, warn};

use super::ArgsError;
use super::fence_check::{FenceCheck, shell};
use super::fence_record::FenceRecord;

/// How the agent fences its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceMethod {
    /// `text` written to the file at `path`.
    Write { path: PathBuf, text: String },
    /// A shell command.
    Command(String),
    /// No fence: the configured one would reboot a kernel other nodes share (the reason, see
    /// `super::shared_kernel`); every fence fails and says why.
    Refused(String),
}

impl FenceMethod {
    pub fn parse(s: &str) -> Result<Self, ArgsError> {
        let method = match s.split_once(':') {
            _ if s == "sysrq-reboot" => Some(Self::Write {
                path: SYSRQ_TRIGGER.into(),
                text: "b".into(),
            }),
            Some(("write", what)) => what.split_once('=').and_then(|(path, text)| {
                (path.starts_with('/') && !text.is_empty()).then(|| Self::Write {
                    path: path.into(),
                    text: text.into(),
                })
            }),
            Some(("command", cmd)) if !cmd.trim().is_empty() => Some(Self::Command(cmd.into())),
            _ => None,
        };
        method.ok_or_else(|| ArgsError::NoFenceMethod(s.to_string()))
    }

    /// Whether the fence reboots the kernel the agent runs on (`sysrq-reboot`, or a `write:`
    /// to a `sysrq-trigger`, wherever its `/proc` is). A `command:` fence is the site's own
    /// and not looked into.
    pub fn reboots_kernel(&self) -> bool {
        matches!(self, Self::Write { path, .. } if path.file_name() == Some("sysrq-trigger".as_ref()))
    }
}

/// The kernel's magic SysRq trigger: `b` reboots at once.
const SYSRQ_TRIGGER: &str = "/proc/sysrq-trigger";

/// What a fence answers: podha's silence (an isolation episode, until podha hears the node
/// again) or one of podha's fence requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceCause {
    Isolation,
    Request(String),
}

/// How the agent checks that a fence took before it acknowledges a request: a check
/// ([`FenceCheck`]: a file's text, an HTTP answer, a shell command) that passes once the node
/// is fenced, run every second until it does, for at most `within`. A fence that returned is
/// not yet one that took: a power-off may be asynchronous, and an acknowledgement lets podha
/// move the node's volumes at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceConfirm {
    pub check: FenceCheck,
    pub within: Duration,
}

/// How far a fence went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// The fence itself failed.
    Failed,
    /// Carried out, not confirmed: no check, or the check never passed (or an isolation
    /// fence, which nobody acknowledges).
    Unconfirmed,
    /// Carried out, and the confirmation check passed: what an acknowledgement may say.
    Confirmed,
}

/// How often the confirmation check runs.
const CONFIRM_EVERY: Duration = Duration::from_secs(1);

/// Fences the node, once per cause: an isolation episode is fenced once until podha has heard
/// the node since (a fence that did not take the node down is reported, not repeated in a
/// loop), and each fence request once. A request is never answered by an earlier fence: if
/// that one had taken the node down, this agent would not be running to read the request.
pub struct Fencer {
    method: FenceMethod,
    confirm: Option<FenceConfirm>,
    node: String,
    fenced: tokio::sync::Mutex<Vec<(FenceCause, Fenced)>>,
    /// Where each fence is recorded before it is carried out, for the agent of the next boot.
    record: Option<FenceRecord>,
    /// The record is of a watchdog let run out ([`Fencer::letting_watchdog_run`]), which
    /// petting it again takes back; no fence carried out has recorded over it since.
    watchdog_recorded: std::sync::atomic::AtomicBool,
}

impl Fencer {
    pub fn new(method: FenceMethod, confirm: Option<FenceConfirm>, node: &str) -> Self {
        Self {
            method,
            confirm,
            node: node.to_string(),
            fenced: tokio::sync::Mutex::new(Vec::new()),
            record: None,
            watchdog_recorded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The fencer recording each fence in `record` before it carries it out.
    pub fn recording(mut self, record: FenceRecord) -> Self {
        self.record = Some(record);
        self
    }

    /// Fences for `cause` unless that was done already, and for a request checks that the
    /// fence took; returns how far it went (what it went to before, for a cause fenced
    /// already).
    pub async fn fence(&self, cause: FenceCause, why: &str) -> Fenced {
        {
            let mut fenced = self.fenced.lock().await;
            if let Some((_, done)) = fenced.iter().find(|(c, _)| *c == cause) {
                return *done;
            }
            warn!(node = %self.node, why, "fencing this node");
            let record = self.record.as_ref().filter(|_| !self.refused());
            if let Some(record) = record {
                self.watchdog_recorded.store(false, Ordering::SeqCst);
                record.write_soon(&cause).await;
            }
            if let Err(e) = self.run(why).await {
                error!(node = %self.node, error = %e, "the fence failed");
                if let Some(record) = record {
                    record.remove_soon().await;
                }
                // A refused fence is refused again: said once per cause, not every second.
                if matches!(self.method, FenceMethod::Refused(_)) {
                    fenced.push((cause, Fenced::Failed));
                }
                return Fenced::Failed;
            }
            info!(node = %self.node, "node fenced");
            fenced.push((cause.clone(), Fenced::Unconfirmed));
        }
        // The check may take a while: the lock is free meanwhile (the check loop asks it
        // whether podha heard the node, and pets the watchdog, every second).
        if !matches!(cause, FenceCause::Request(_)) || self.confirmed().await != Fenced::Confirmed {
            return Fenced::Unconfirmed;
        }
        let mut fenced = self.fenced.lock().await;
        for (_, done) in fenced.iter_mut().filter(|(c, _)| *c == cause) {
            *done = Fenced::Confirmed;
        }
        Fenced::Confirmed
    }

    /// The agent stopped petting its watchdog on isolation: a precise watchdog resets the node
    /// before the agent's own fence would, so it is recorded as an isolation fence now (see
    /// `super::fence_record`).
    pub async fn letting_watchdog_run(&self) {
        if let Some(record) = &self.record {
            self.watchdog_recorded.store(true, Ordering::SeqCst);
            record.write_soon(&FenceCause::Isolation).await;
        }
    }

    /// The agent pets its watchdog again before it fired: the record of it let run is taken
    /// back (not one of a fence carried out since).
    pub async fn petting_again(&self) {
        if let Some(record) = &self.record
            && self.watchdog_recorded.swap(false, Ordering::SeqCst)
        {
            record.remove_soon().await;
        }
    }

    /// Whether every fence is refused (see [`FenceMethod::Refused`]): nothing to record.
    fn refused(&self) -> bool {
        matches!(self.method, FenceMethod::Refused(_))
    }

    /// Whether the fence just carried out took, by the confirmation check.
    async fn confirmed(&self) -> Fenced {
        let Some(check) = &self.confirm else {
            warn!(
                node = %self.node,
                "fence carried out, not acknowledged: without --fence-confirm nothing shows it \
                 took, and an acknowledgement before it took would let podha move volumes the \
                 node still writes (podha proves the fence by this agent's silence instead)"
            );
            return Fenced::Unconfirmed;
        };
        let deadline = tokio::time::Instant::now() + check.within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let last = match tokio::time::timeout(left, check.check.run(&self.node)).await {
                Ok(Ok(())) => {
                    info!(node = %self.node, "fence confirmed");
                    return Fenced::Confirmed;
                }
                Ok(Err(found)) => found,
                Err(_) => format!("{:?} did not finish", check.check),
            };
            if tokio::time::Instant::now() + CONFIRM_EVERY >= deadline {
                error!(
                    node = %self.node,
                    last = %last,
                    "the fence was not confirmed within {}: not acknowledged",
                    humantime::format_duration(check.within)
                );
                return Fenced::Unconfirmed;
            }
            tokio::time::sleep(CONFIRM_EVERY).await;
        }
    }

    async fn run(&self, why: &str) -> Result<(), String> {
        match &self.method {
            FenceMethod::Write { path, text } => tokio::fs::write(path, text.as_bytes())
                .await
                .map_err(|e| format!("writing {text:?} to {}: {e}", path.display())),
            FenceMethod::Command(cmd) => shell(cmd, &self.node)
                .env("PODHA_FENCE_REASON", why)
                .status()
                .await
                .map_err(|e| format!("running {cmd:?}: {e}"))
                .and_then(|status| {
                    status
                        .success()
                        .then_some(())
                        .ok_or_else(|| format!("{cmd:?} failed: {status}"))
                }),
            FenceMethod::Refused(reason) => Err(format!("no fence carried out: {reason}")),
        }
    }

    /// podha heard the node again: a later isolation is a new episode.
    pub async fn heard(&self) {
        self.fenced
            .lock()
            .await
            .retain(|(c, _)| *c != FenceCause::Isolation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_method_is_named_never_assumed() {
        assert_eq!(
            FenceMethod::parse("sysrq-reboot"),
            Ok(FenceMethod::Write {
                path: "/proc/sysrq-trigger".into(),
                text: "b".into()
            })
        );
        assert_eq!(
            FenceMethod::parse("write:/run/bmc/power=off"),
            Ok(FenceMethod::Write {
                path: "/run/bmc/power".into(),
                text: "off".into()
            })
        );
        assert_eq!(
            FenceMethod::parse("command:kill -9 1"),
            Ok(FenceMethod::Command("kill -9 1".into()))
        );
        for bad in [
            "",
            "reboot",
            "command:",
            "command:  ",
            "sysrq",
            "write:",
            "write:/run/bmc/power",
            "write:/run/bmc/power=",
            "write:power=off",
        ] {
            let err = FenceMethod::parse(bad).expect_err(bad).to_string();
            assert!(
                err.contains("sysrq-reboot, write:<absolute path>=<text> or command:"),
                "{err}"
            );
        }
    }

    #[test]
    fn only_sysrq_reboots_the_kernel() {
        let reboots = |s: &str| FenceMethod::parse(s).expect(s).reboots_kernel();
        assert!(reboots("sysrq-reboot"));
        assert!(reboots("write:/proc/sysrq-trigger=b"));
        assert!(reboots("write:/host/proc/sysrq-trigger=b"));
        assert!(!reboots("write:/run/bmc/power=off"));
        assert!(!reboots("command:ipmitool power off"));
    }

    #[tokio::test]
    async fn a_refused_fence_fails_and_says_why() {
        let fencer = Fencer::new(
            FenceMethod::Refused("node a shares its kernel with node b".into()),
            None,
            "a",
        );
        for _ in 0..2 {
            assert_eq!(
                fencer.fence(FenceCause::Isolation, "test").await,
                Fenced::Failed
            );
        }
        assert_eq!(
            fencer.fenced.lock().await.len(),
            1,
            "refused once per cause"
        );
        let err = fencer.run("test").await.expect_err("refused");
        assert!(err.contains("shares its kernel with node b"), "{err}");
    }

    #[tokio::test]
    async fn a_write_fence_writes_its_text_and_a_missing_file_is_no_fence() {
        let dir = std::env::temp_dir().join(format!("podha-write-fence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let power = dir.join("power");
        let missing = Fencer::new(
            FenceMethod::Write {
                path: dir.join("no-such-dir/power"),
                text: "off".into(),
            },
            None,
            "node-1",
        );
        assert_eq!(
            missing.fence(FenceCause::Isolation, "cut off").await,
            Fenced::Failed
        );
        let fencer = Fencer::new(
            FenceMethod::Write {
                path: power.clone(),
                text: "off".into(),
            },
            None,
            "node-1",
        );
        assert_eq!(
            fencer.fence(FenceCause::Isolation, "cut off").await,
            Fenced::Unconfirmed
        );
        assert_eq!(std::fs::read_to_string(&power).expect("power"), "off");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_fence_runs_once_per_cause_and_a_failed_one_is_tried_again() {
        let dir = std::env::temp_dir().join(format!("podha-fence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("log");
        let flag = dir.join("fail");
        let cmd = format!(
            "test ! -e {flag} && echo \"$PODHA_FENCE_NODE $PODHA_FENCE_REASON\" >> {log}",
            flag = flag.display(),
            log = log.display()
        );
        let fencer = Fencer::new(FenceMethod::Command(cmd), None, "node-1");
        let isolation = || FenceCause::Isolation;
        let request = |r: &str| FenceCause::Request(r.to_string());
        let fence = |cause, why| {
            let fencer = &fencer;
            async move { fencer.fence(cause, why).await != Fenced::Failed }
        };
        std::fs::write(&flag, "").expect("flag");
        assert!(!fence(isolation(), "cut off").await, "the command failed");
        std::fs::remove_file(&flag).expect("flag");
        assert!(fence(isolation(), "cut off").await);
        assert!(fence(isolation(), "cut off").await, "already fenced");
        // A request is answered by a fence of its own, once, never by the isolation's.
        assert!(fence(request("p/1/b"), "asked 1").await);
        assert!(fence(request("p/1/b"), "asked 1").await);
        assert!(fence(request("p/2/b"), "asked 2").await);
        fencer.heard().await;
        assert!(fence(isolation(), "again").await);
        assert!(fence(request("p/2/b"), "asked 2").await, "done");
        let text = std::fs::read_to_string(&log).expect("log");
        assert_eq!(
            text,
            "node-1 cut off\nnode-1 asked 1\nnode-1 asked 2\nnode-1 again\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A request's fence is acknowledged only once its check passed: without a check, or with
    /// one that never passes within its time, it stays unconfirmed; a check that passes after
    /// a while (an asynchronous power-off) confirms it. The outcome is kept for the request.
    #[tokio::test]
    async fn a_requested_fence_is_confirmed_only_by_its_check() {
        let dir = std::env::temp_dir().join(format!("podha-confirm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let off = dir.join("off");
        let request = |r: &str| FenceCause::Request(r.to_string());
        // The fence powers off two seconds later; the check sees it then.
        let power_off = format!("(sleep 2; touch {}) >/dev/null 2>&1 &", off.display());
        let check = |within: Duration| FenceConfirm {
            check: FenceCheck::Command(format!(
                "test -e {} && test \"$PODHA_FENCE_NODE\" = node-1",
                off.display()
            )),
            within,
        };
        let unchecked = Fencer::new(FenceMethod::Command("true".into()), None, "node-1");
        assert_eq!(
            unchecked.fence(request("p/1/b"), "asked").await,
            Fenced::Unconfirmed
        );
        assert_eq!(
            unchecked.fence(FenceCause::Isolation, "cut off").await,
            Fenced::Unconfirmed
        );

        let impatient = Fencer::new(
            FenceMethod::Command(power_off.clone()),
            Some(check(Duration::from_millis(500))),
            "node-1",
        );
        assert_eq!(
            impatient.fence(request("p/1/b"), "asked").await,
            Fenced::Unconfirmed
        );
        let _ = std::fs::remove_file(&off);
        let patient = Fencer::new(
            FenceMethod::Command(power_off),
            Some(check(Duration::from_secs(10))),
            "node-1",
        );
        assert_eq!(
            patient.fence(request("p/2/b"), "asked").await,
            Fenced::Confirmed
        );
        assert_eq!(
            patient.fence(request("p/2/b"), "asked").await,
            Fenced::Confirmed,
            "kept for the request"
        );
        // An isolation fence is acknowledged to nobody: no check runs.
        assert_eq!(
            patient.fence(FenceCause::Isolation, "cut off").await,
            Fenced::Unconfirmed
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fresh directory for a test's fence record, and the record's path in it.
    fn record_dir(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("podha-fence-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("boots.fences");
        (dir, path)
    }

    /// Each fence is recorded (synced) before it is carried out: the fence itself finds the
    /// record, for the agent of the next boot. A refused fence records nothing.
    #[tokio::test]
    async fn a_fence_is_recorded_before_it_is_carried_out() {
        use super::super::fence_record::FenceRecord;
        let (dir, path) = record_dir("record");
        let cmd = format!("grep -q ' request$' {}", path.display());
        let fencer = Fencer::new(FenceMethod::Command(cmd), None, "node-1")
            .recording(FenceRecord::new(&path, Some("boot-1")));
        let done = fencer
            .fence(FenceCause::Request("r1".into()), "asked")
            .await;
        assert_eq!(done, Fenced::Unconfirmed, "the fence found its record");
        let last = FenceRecord::new(&path, Some("boot-2"))
            .last()
            .expect("recorded");
        assert_eq!(last.cause, "request");
        let text = std::fs::read_to_string(&path).expect("record");
        assert!(text.starts_with("boot=boot-1\n"), "{text}");
        std::fs::remove_file(&path).expect("record");
        let refused = Fencer::new(FenceMethod::Refused("shared kernel".into()), None, "node-1")
            .recording(FenceRecord::new(&path, Some("boot-1")));
        assert_eq!(
            refused.fence(FenceCause::Isolation, "cut off").await,
            Fenced::Failed
        );
        assert!(!path.exists(), "nothing recorded for a refused fence");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A watchdog let run out is recorded as an isolation fence, and taken back when it is
    /// petted again; a fence carried out since is not taken back.
    #[tokio::test]
    async fn a_watchdog_let_run_out_is_recorded_until_it_is_petted_again() {
        use super::super::fence_record::FenceRecord;
        let (dir, path) = record_dir("let-run");
        let fencer = Fencer::new(FenceMethod::Command("true".into()), None, "node-1")
            .recording(FenceRecord::new(&path, Some("boot-1")));
        let next_boot = || FenceRecord::new(&path, Some("boot-2")).last();
        fencer.petting_again().await;
        assert!(!path.exists(), "nothing let run");
        fencer.letting_watchdog_run().await;
        assert_eq!(next_boot().map(|l| l.cause), Some("isolation"));
        fencer.petting_again().await;
        assert!(!path.exists(), "petted in time: taken back");
        fencer.letting_watchdog_run().await;
        let done = fencer
            .fence(FenceCause::Request("r1".into()), "asked")
            .await;
        assert_eq!(done, Fenced::Unconfirmed);
        fencer.petting_again().await;
        assert_eq!(
            next_boot().map(|l| l.cause),
            Some("request"),
            "a fence carried out stays recorded"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
