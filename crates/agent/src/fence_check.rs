//! How the agent checks that a fence podha asked for took, before it acknowledges the request
//! (`--fence-confirm`). Three checks, two of which need no shell (the chart's image has none):
//!
//! - `read:<file>=<text>`: the file says `text`, as its whole content or as one of its lines
//!   (blanks around either ignored): a BMC's or a power controller's state where the pod
//!   mounts it, a cgroup's `cgroup.events` line `populated 0` once the workloads are gone;
//! - `http://<host>[:port]/<path>`: a GET answered 2xx, within a second: a site's fence
//!   service that answers once the node is fenced (plain HTTP: on the node or its network);
//! - `command:<shell command>`: exits 0, run by `sh -c` (an image with a shell).

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::ArgsError;

/// How long one HTTP check may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);

/// A fence confirmation check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceCheck {
    /// The file's content, or one of its lines, blanks around it trimmed, is `text`.
    Read { path: PathBuf, text: String },
    /// A GET of the URL answered 2xx.
    Http { url: http::Uri },
    /// A shell command exits 0.
    Command(String),
}

impl FenceCheck {
    pub fn parse(s: &str) -> Result<Self, ArgsError> {
        let refuse = || ArgsError::NoFenceCheck(s.to_string());
        if s.starts_with("http://") {
            let url: http::Uri = s.parse().map_err(|_| refuse())?;
            return url
                .authority()
                .is_some()
                .then_some(Self::Http { url })
                .ok_or_else(refuse);
        }
        match s.split_once(':') {
            Some(("read", what)) => {
                let (path, text) = what.split_once('=').ok_or_else(refuse)?;
                (path.starts_with('/') && !text.trim().is_empty())
                    .then(|| Self::Read {
                        path: path.into(),
                        text: text.trim().to_string(),
                    })
                    .ok_or_else(refuse)
            }
            Some(("command", cmd)) if !cmd.trim().is_empty() => Ok(Self::Command(cmd.into())),
            _ => Err(refuse()),
        }
    }

    /// Runs the check once for `node`: `Ok` when it passes, otherwise what it found.
    pub async fn run(&self, node: &str) -> Result<(), String> {
        match self {
            Self::Read { path, text } => match tokio::fs::read_to_string(path).await {
                Ok(found) if found.trim() == text || found.lines().any(|l| l.trim() == text) => {
                    Ok(())
                }
                Ok(found) => Err(format!(
                    "{} says {:?}, not {text:?}",
                    path.display(),
                    found.trim()
                )),
                Err(e) => Err(format!("reading {}: {e}", path.display())),
            },
            Self::Http { url } => {
                let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
                let get = client.get(url.clone());
                match tokio::time::timeout(HTTP_TIMEOUT, get).await {
                    Ok(Ok(answer)) if answer.status().is_success() => Ok(()),
                    Ok(Ok(answer)) => Err(format!("GET {url} answered {}", answer.status())),
                    Ok(Err(e)) => Err(format!("GET {url}: {e}")),
                    Err(_) => Err(format!("GET {url}: no answer within {HTTP_TIMEOUT:?}")),
                }
            }
            Self::Command(cmd) => {
                let run = shell(cmd, node).kill_on_drop(true).status().await;
                match run {
                    Ok(status) if status.success() => Ok(()),
                    Ok(status) => Err(format!("{cmd:?} answered {status}")),
                    Err(e) => Err(format!("running {cmd:?}: {e}")),
                }
            }
        }
    }
}

/// `command` run by `sh -c`, told the node in `$PODHA_FENCE_NODE`: a `command:` fence, or
/// its confirmation check.
pub(crate) fn shell(command: &str, node: &str) -> tokio::process::Command {
    let mut sh = tokio::process::Command::new("sh");
    sh.arg("-c").arg(command).env("PODHA_FENCE_NODE", node);
    sh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_is_named_with_its_kind() {
        assert_eq!(
            FenceCheck::parse("read:/run/bmc/state=off"),
            Ok(FenceCheck::Read {
                path: "/run/bmc/state".into(),
                text: "off".into()
            })
        );
        assert_eq!(
            FenceCheck::parse("read:/sys/fs/cgroup/kubepods/cgroup.events=populated 0"),
            Ok(FenceCheck::Read {
                path: "/sys/fs/cgroup/kubepods/cgroup.events".into(),
                text: "populated 0".into()
            })
        );
        assert!(matches!(
            FenceCheck::parse("http://10.0.0.9:8000/fenced?node=n1"),
            Ok(FenceCheck::Http { .. })
        ));
        assert_eq!(
            FenceCheck::parse("command:test -e /run/off"),
            Ok(FenceCheck::Command("test -e /run/off".into()))
        );
        for bad in [
            "",
            "test -e /run/off",
            "read:",
            "read:/run/bmc/state",
            "read:/run/bmc/state=  ",
            "read:state=off",
            "http://",
            "https://bmc.example/redfish",
            "command:",
            "command:  ",
        ] {
            assert!(FenceCheck::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_read_check_passes_only_on_the_text() {
        let dir = std::env::temp_dir().join(format!("podha-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("state");
        let check = FenceCheck::Read {
            path: state.clone(),
            text: "off".into(),
        };
        assert!(check.run("n1").await.unwrap_err().contains("reading"));
        std::fs::write(&state, "on\n").unwrap();
        assert!(check.run("n1").await.unwrap_err().contains("\"on\""));
        std::fs::write(&state, "off\n").unwrap();
        assert_eq!(check.run("n1").await, Ok(()));
        std::fs::write(&state, "offline\n").unwrap();
        assert!(
            check.run("n1").await.is_err(),
            "the whole text, not a prefix"
        );
        let events = FenceCheck::parse(&format!("read:{}=populated 0", state.display())).unwrap();
        std::fs::write(&state, "populated 1\nfrozen 0\n").unwrap();
        assert!(events.run("n1").await.is_err());
        std::fs::write(&state, "populated 0\nfrozen 0\n").unwrap();
        assert_eq!(events.run("n1").await, Ok(()), "one of its lines");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A GET answered 2xx passes; another status, or nobody listening, does not.
    #[tokio::test]
    async fn an_http_check_passes_only_on_a_success() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                let status = if request.starts_with("GET /fenced ") {
                    "200 OK"
                } else {
                    "409 Conflict"
                };
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        let check = |path: &str| FenceCheck::parse(&format!("http://127.0.0.1:{port}{path}"));
        assert_eq!(check("/fenced").unwrap().run("n1").await, Ok(()));
        let refused = check("/not-yet").unwrap().run("n1").await.unwrap_err();
        assert!(refused.contains("409"), "{refused}");
        let nobody = FenceCheck::parse("http://127.0.0.1:1/fenced").unwrap();
        assert!(nobody.run("n1").await.is_err());
    }
}
