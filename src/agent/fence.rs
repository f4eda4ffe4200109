//! How the agent fences its node (`--fence`), and the one place that carries it out.

use std::path::PathBuf;

use tracing::{error, info, warn};

use super::ArgsError;

/// How the agent fences its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceMethod {
    /// `text` written to the file at `path`.
    Write { path: PathBuf, text: String },
    /// A shell command.
    Command(String),
}

impl FenceMethod {
    pub fn parse(s: &str) -> Result<Self, ArgsError> {
        let method = match s.split_once(':') {
            _ if s == "sysrq-reboot" => Some(Self::Write {
                path: "/proc/sysrq-trigger".into(),
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
}

/// What a fence answers: podha's silence (an isolation episode, until podha hears the node
/// again) or one of podha's fence requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceCause {
    Isolation,
    Request(String),
}

/// Fences the node, once per cause: an isolation episode is fenced once until podha has heard
/// the node since (a fence that did not take the node down is reported, not repeated in a
/// loop), and each fence request once. A request is never answered by an earlier fence: if
/// that one had taken the node down, this agent would not be running to read the request.
pub struct Fencer {
    method: FenceMethod,
    node: String,
    fenced: tokio::sync::Mutex<Vec<FenceCause>>,
}

impl Fencer {
    pub fn new(method: FenceMethod, node: &str) -> Self {
        Self {
            method,
            node: node.to_string(),
            fenced: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    /// Fences for `cause` unless that was done already; returns whether the node is fenced
    /// for it.
    pub async fn fence(&self, cause: FenceCause, why: &str) -> bool {
        let mut fenced = self.fenced.lock().await;
        if fenced.contains(&cause) {
            return true;
        }
        warn!(node = %self.node, why, "fencing this node");
        match self.run(why).await {
            Ok(()) => {
                info!(node = %self.node, "node fenced");
                fenced.push(cause);
                true
            }
            Err(e) => {
                error!(node = %self.node, error = %e, "the fence failed");
                false
            }
        }
    }

    async fn run(&self, why: &str) -> Result<(), String> {
        match &self.method {
            FenceMethod::Write { path, text } => tokio::fs::write(path, text.as_bytes())
                .await
                .map_err(|e| format!("writing {text:?} to {}: {e}", path.display())),
            FenceMethod::Command(cmd) => tokio::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .env("PODHA_FENCE_NODE", &self.node)
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
        }
    }

    /// podha heard the node again: a later isolation is a new episode.
    pub async fn heard(&self) {
        self.fenced
            .lock()
            .await
            .retain(|c| *c != FenceCause::Isolation);
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
            "node-1",
        );
        assert!(!missing.fence(FenceCause::Isolation, "cut off").await);
        let fencer = Fencer::new(
            FenceMethod::Write {
                path: power.clone(),
                text: "off".into(),
            },
            "node-1",
        );
        assert!(fencer.fence(FenceCause::Isolation, "cut off").await);
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
        let fencer = Fencer::new(FenceMethod::Command(cmd), "node-1");
        let isolation = || FenceCause::Isolation;
        let request = |r: &str| FenceCause::Request(r.to_string());
        std::fs::write(&flag, "").expect("flag");
        assert!(
            !fencer.fence(isolation(), "cut off").await,
            "the command failed"
        );
        std::fs::remove_file(&flag).expect("flag");
        assert!(fencer.fence(isolation(), "cut off").await);
        assert!(fencer.fence(isolation(), "cut off").await, "already fenced");
        // A request is answered by a fence of its own, once, never by the isolation's.
        assert!(fencer.fence(request("p/1/b"), "asked 1").await);
        assert!(fencer.fence(request("p/1/b"), "asked 1").await);
        assert!(fencer.fence(request("p/2/b"), "asked 2").await);
        fencer.heard().await;
        assert!(fencer.fence(isolation(), "again").await);
        assert!(fencer.fence(request("p/2/b"), "asked 2").await, "done");
        let text = std::fs::read_to_string(&log).expect("log");
        assert_eq!(
            text,
            "node-1 cut off\nnode-1 asked 1\nnode-1 asked 2\nnode-1 again\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
