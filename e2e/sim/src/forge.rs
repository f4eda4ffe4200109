//! `podha-sim forge-heartbeats`: a process on a node that tries to keep the node "heard" by
//! sending its own podha agent the words only podha's leader and the node's peers may send.
//! Round after round it asks, over plain HTTP/1.1 (one connection per request,
//! `Connection: close`):
//! - `GET /heartbeat?heardMs=0`, unsigned;
//! - `GET /heartbeat?heardMs=0&nonce=…&challenge=…&signature=…`, each value random bytes in
//!   base64url without padding (the signature 64 bytes, an Ed25519 signature's length), so
//!   signed by no key and answering no challenge the agent issued;
//! - `GET /peer?from=<--peer-name>&nonce=…&signature=…`, random the same way.
//!
//! At most `--rate` requests a second, one at a time, for `--for` or until SIGTERM or SIGINT;
//! then one JSON line on stdout counts the requests sent, the answers by HTTP status and the
//! requests that got no answer (refused, reset, timed out, or not HTTP):
//! `{"sent":N,"status":{"401":M},"errors":K}`. An agent that checks its callers answers every
//! one of them 401.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::time::{Instant, MissedTickBehavior};

/// The longest status line read; an answer whose first line is longer is no HTTP answer.
const STATUS_LINE_LIMIT: u64 = 1024;
/// The most of an answer's headers and body read (and dropped) after its status line, so the
/// agent's side of the connection closes cleanly rather than by a reset.
const DRAIN_LIMIT: u64 = 64 * 1024;

/// `podha-sim forge-heartbeats`: forged heartbeats and peer surveys to one agent.
#[derive(clap::Args, Debug)]
pub struct ForgeArgs {
    /// The agent: its node's InternalIP and the port in its `podha.io/agent-port` annotation.
    #[arg(long)]
    pub to: SocketAddr,
    /// The node the forged peer surveys claim to come from.
    #[arg(long)]
    pub peer_name: String,
    /// Stop after this long (without it: at SIGTERM or SIGINT).
    #[arg(long = "for", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// The most requests a second.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rate: u32,
    /// How long one request may take, connect to status line.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// What the forged requests got: printed as one JSON line when the forger stops.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests sent and answered or failed (a refused connect counts; one cut short by a stop
    /// signal does not): the answers plus the errors.
    pub sent: u64,
    /// Answers by HTTP status.
    pub status: BTreeMap<u16, u64>,
    /// Requests that got no HTTP answer: refused, reset, timed out, or not HTTP.
    pub errors: u64,
}

impl Summary {
    /// Requests the agent answered, with any status.
    pub fn answered(&self) -> u64 {
        self.status.values().sum()
    }

    /// Answers with a status other than 401 Unauthorized.
    pub fn not_unauthorized(&self) -> u64 {
        self.status
            .iter()
            .filter(|(status, _)| **status != 401)
            .map(|(_, count)| count)
            .sum()
    }
}

/// The three forgeries, asked in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forgery {
    UnsignedHeartbeat,
    RandomlySignedHeartbeat,
    RandomlySignedSurvey,
}

impl Forgery {
    const ROUND: [Forgery; 3] = [
        Forgery::UnsignedHeartbeat,
        Forgery::RandomlySignedHeartbeat,
        Forgery::RandomlySignedSurvey,
    ];

    /// The request's path and query, with fresh random values.
    fn path_and_query(self, peer_name: &str) -> anyhow::Result<String> {
        Ok(match self {
            Forgery::UnsignedHeartbeat => "/heartbeat?heardMs=0".to_string(),
            Forgery::RandomlySignedHeartbeat => format!(
                "/heartbeat?heardMs=0&nonce={}&challenge={}&signature={}",
                random_base64url(16)?,
                random_base64url(32)?,
                random_base64url(64)?
            ),
            Forgery::RandomlySignedSurvey => format!(
                "/peer?from={}&nonce={}&signature={}",
                query_value(peer_name),
                random_base64url(16)?,
                random_base64url(64)?
            ),
        })
    }
}

/// `len` random bytes from the operating system, in base64url without padding.
fn random_base64url(len: usize) -> anyhow::Result<String> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("random bytes: {e}"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// `value` percent-encoded for a query string (RFC 3986's unreserved characters kept).
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Sends the forged requests until `args.duration` has passed or SIGTERM or SIGINT arrives,
/// and returns what they got.
pub async fn run(args: &ForgeArgs) -> anyhow::Result<Summary> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listen for SIGTERM")?;
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut summary = Summary::default();
    // A stop signal drops the request under way: `summary` counts only finished ones.
    tokio::select! {
        forged = forge(args, deadline, &mut summary) => forged?,
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(summary)
}

/// The forged requests, in turn, at most `args.rate` a second, none begun at or after
/// `deadline` (without one: until the caller stops it). `summary` counts each once it is
/// answered or has failed.
async fn forge(
    args: &ForgeArgs,
    deadline: Option<Instant>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let mut pace = tokio::time::interval(Duration::from_secs(1) / args.rate);
    pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut first_error_shown = false;
    for forgery in Forgery::ROUND.iter().cycle() {
        pace.tick().await;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let path = forgery.path_and_query(&args.peer_name)?;
        let answer = get_status(args.to, &path, args.timeout).await;
        summary.sent += 1;
        match answer {
            Ok(status) => *summary.status.entry(status).or_default() += 1,
            Err(e) => {
                summary.errors += 1;
                if !first_error_shown {
                    first_error_shown = true;
                    tracing::warn!(to = %args.to, ?forgery, "no answer (later ones not shown): {e}");
                }
            }
        }
    }
    Ok(())
}

/// `GET path` at `addr` on a connection of its own: the answer's HTTP status, read within
/// `timeout`. The rest of the answer is read and dropped (briefly), then the connection closed.
async fn get_status(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<u16> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = BufReader::new(stream);
        let mut line = String::new();
        (&mut answer)
            .take(STATUS_LINE_LIMIT)
            .read_line(&mut line)
            .await?;
        let status = parse_status_line(&line).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP status line: {line:?}"),
            )
        })?;
        io::Result::Ok((status, answer))
    };
    let (status, answer) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, format!("no answer in {timeout:?}"))
        })??;
    let drain = async {
        let _ = tokio::io::copy(&mut answer.take(DRAIN_LIMIT), &mut tokio::io::sink()).await;
    };
    let _ = tokio::time::timeout(timeout, drain).await;
    Ok(status)
}

/// The status of an HTTP/1.x status line (`HTTP/1.1 401 Unauthorized`).
fn parse_status_line(line: &str) -> Option<u16> {
    let mut words = line.split_ascii_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/1."))?;
    words
        .next()
        .filter(|s| s.len() == 3)?
        .parse()
        .ok()
        .filter(|s| (100..600).contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// [`forge`] until `args.duration` has passed (no signal handlers: they would outlive the
    /// test, and SIGINT no longer stop the test binary).
    async fn forged_until_deadline(args: &ForgeArgs) -> Summary {
        let deadline = Instant::now() + args.duration.unwrap();
        let mut summary = Summary::default();
        forge(args, Some(deadline), &mut summary).await.unwrap();
        summary
    }

    #[test]
    fn status_lines() {
        assert_eq!(
            parse_status_line("HTTP/1.1 401 Unauthorized\r\n"),
            Some(401)
        );
        assert_eq!(parse_status_line("HTTP/1.0 200 OK\r\n"), Some(200));
        assert_eq!(parse_status_line("HTTP/1.1 204\r\n"), Some(204));
        assert_eq!(parse_status_line("SSH-2.0-OpenSSH_9.6\r\n"), None);
        assert_eq!(parse_status_line("HTTP/1.1 4011 Nope\r\n"), None);
        assert_eq!(parse_status_line(""), None);
    }

    #[test]
    fn forged_requests_carry_random_base64url_values() {
        let path = Forgery::RandomlySignedHeartbeat
            .path_and_query("node-2")
            .unwrap();
        let query: BTreeMap<&str, &str> = path
            .strip_prefix("/heartbeat?")
            .unwrap()
            .split('&')
            .map(|kv| kv.split_once('=').unwrap())
            .collect();
        assert_eq!(query["heardMs"], "0");
        let signature = URL_SAFE_NO_PAD.decode(query["signature"]).unwrap();
        assert_eq!(signature.len(), 64);
        assert_eq!(
            URL_SAFE_NO_PAD.decode(query["challenge"]).unwrap().len(),
            32
        );
        assert_ne!(signature, vec![0u8; 64]);
        let again = Forgery::RandomlySignedHeartbeat
            .path_and_query("node-2")
            .unwrap();
        assert_ne!(path, again, "fresh random values each time");

        let survey = Forgery::RandomlySignedSurvey
            .path_and_query("node 2/x")
            .unwrap();
        assert!(
            survey.starts_with("/peer?from=node%202%2Fx&nonce="),
            "{survey}"
        );
        assert_eq!(
            Forgery::UnsignedHeartbeat.path_and_query("node-2").unwrap(),
            "/heartbeat?heardMs=0"
        );
    }

    /// A listener that answers the unsigned heartbeat 200 and everything else 401: the summary
    /// counts each status and the paths arrive in turn.
    #[tokio::test]
    async fn counts_answers_by_status() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap();
        let (paths_tx, mut paths) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let mut stream = BufReader::new(stream);
                let mut request_line = String::new();
                stream.read_line(&mut request_line).await.unwrap();
                let path = request_line
                    .split(' ')
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                let status = if path == "/heartbeat?heardMs=0" {
                    "200 OK"
                } else {
                    "401 Unauthorized"
                };
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                stream.get_mut().write_all(answer.as_bytes()).await.unwrap();
                paths_tx.send(path).unwrap();
            }
        });
        let args = ForgeArgs {
            to,
            peer_name: "node-2".into(),
            duration: Some(Duration::from_millis(400)),
            rate: 100,
            timeout: Duration::from_secs(2),
        };
        let summary = forged_until_deadline(&args).await;
        assert!(summary.sent >= 6, "{summary:?}");
        assert_eq!(summary.errors, 0, "{summary:?}");
        assert_eq!(summary.answered(), summary.sent, "{summary:?}");
        assert_eq!(summary.not_unauthorized(), summary.status[&200]);
        assert!(summary.status[&401] >= 4, "{summary:?}");
        let mut seen = Vec::new();
        while let Ok(path) = paths.try_recv() {
            seen.push(path);
        }
        assert_eq!(seen[0], "/heartbeat?heardMs=0");
        assert!(seen[1].starts_with("/heartbeat?heardMs=0&nonce="));
        assert!(seen[2].starts_with("/peer?from=node-2&nonce="));
    }

    #[tokio::test]
    async fn refused_connections_are_errors() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap();
        drop(listener);
        let args = ForgeArgs {
            to,
            peer_name: "node-2".into(),
            duration: Some(Duration::from_millis(100)),
            rate: 50,
            timeout: Duration::from_secs(1),
        };
        let summary = forged_until_deadline(&args).await;
        assert!(summary.sent >= 1);
        assert_eq!(summary.errors, summary.sent);
        assert_eq!(summary.answered(), 0);
    }

    #[test]
    fn the_summary_is_one_json_line() {
        let summary = Summary {
            sent: 3,
            status: BTreeMap::from([(401, 2)]),
            errors: 1,
        };
        let line = serde_json::to_string(&summary).unwrap();
        assert_eq!(line, r#"{"sent":3,"status":{"401":2},"errors":1}"#);
        assert_eq!(serde_json::from_str::<Summary>(&line).unwrap(), summary);
    }
}
