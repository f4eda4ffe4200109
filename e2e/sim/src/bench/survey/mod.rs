//! One agent's peer survey while podha's leader is down, against thousands of peers
//! (`podha-bench survey`). No cluster: the peers are real HTTP servers on 127.0.0.1 ports in
//! this process, each answering `/peer` with podha's own agent endpoints for a node podha last
//! heard a minute ago; `--silent-percent` of them, spread through the list, take the connection
//! and never answer. The survey is podha's own (`Peers::fixed` and `Peers::survey`, the
//! verdict by `isolation::decide`) for a node unheard for the default 30 s isolation timeout,
//! run `--trials` times against the same peers with the same client, one after another.
//!
//! Printed per trial: the verdict, the time to decide, the peers asked (`asked`: connections
//! the peers took, also those the survey dropped once it had decided), the answers, the silent
//! peers asked (`silent`), the most asks the peers held at once unanswered (`unanswered`: the
//! agent's asks under way, at most [`IN_FLIGHT`], and with many silent peers a few more: asks
//! the agent gave up whose close had not reached their silent peer yet), the most connections
//! open at the peers at once (`open`: also answered ones whose close a peer had not seen yet;
//! the agent keeps none once answered), and this process's
//! open files once the survey's connections closed (`files`: the peers' listeners and a few
//! more: the agent keeps no connection), and the sockets in TIME_WAIT in this network
//! namespace before and after (`time-wait`: the agent's connections close with a reset and
//! leave none). Then memory: the peer list's size, this process's RSS (which holds the peers too) and
//! the chart's memory request and limit for the agent. The bench prints figures; it asserts
//! nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use podha::agent::isolation::{Silence, Verdict, decide};
use podha::agent::peers::{IN_FLIGHT, Peer, Peers, SurveyTimes};
use podha::contract::Identity;
use tokio::time::Instant;

use super::scale::{machine, status_kib};

mod fake;

use fake::{Gauge, answering, open_files, raise_open_files, silent, time_wait};

/// The agent's default isolation timeout: the survey's node is unheard for this long.
const ISOLATION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long ago podha heard the peers: its leader stopped a minute ago.
const PEERS_HEARD_AGO: Duration = Duration::from_secs(60);

/// `podha-bench survey`: one agent's survey of thousands of fake peers in a leader outage.
#[derive(clap::Args, Debug)]
pub struct SurveyArgs {
    /// Fake peers, each a real HTTP server on a 127.0.0.1 port.
    #[arg(long, default_value_t = 5000)]
    pub peers: usize,
    /// Share of the peers that take the connection and never answer, spread through the list.
    #[arg(long, default_value_t = 1.0)]
    pub silent_percent: f64,
    /// The survey's deadline (the agent's `--survey-timeout`).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Surveys, one after another, against the same peers.
    #[arg(long, default_value_t = 3)]
    pub trials: usize,
    /// The chart's values, for the agent's memory request and limit.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/podha/values.yaml"))]
    pub values: PathBuf,
}

pub async fn run(args: SurveyArgs) -> anyhow::Result<()> {
    let silent_count = ((args.peers as f64) * args.silent_percent / 100.0).round() as usize;
    let silent_count = silent_count.min(args.peers);
    // Every peer's listener, the agent's asks and each peer's side of them, and some slack.
    let needed = (args.peers + 2 * IN_FLIGHT + 256) as u64;
    let limit = raise_open_files(needed)?;
    let rss_start = rss_kib();
    let gauge = Arc::new(Gauge::default());
    // The surveying agent: its peers answer its questions alone.
    let me = "surveyor";
    let identity = Arc::new(Identity::generate().context("the agent's key")?);
    let times = SurveyTimes::new(args.deadline);
    let myself = Peer {
        node: me.into(),
        addr: SocketAddr::from(([127, 0, 0, 1], 9)),
        key: Some(identity.public()),
    };
    let trusted = Arc::new(Peers::fixed("peers", identity.clone(), vec![myself], times));
    let mut peers: Vec<Peer> = Vec::with_capacity(args.peers);
    for i in 0..args.peers {
        // Peer i is silent where the running count of silent peers steps up: evenly spread.
        let is_silent = (i + 1) * silent_count / args.peers > i * silent_count / args.peers;
        let addr = if is_silent {
            silent(gauge.clone()).await
        } else {
            answering(PEERS_HEARD_AGO, trusted.clone(), gauge.clone()).await
        };
        peers.push(addr.with_context(|| format!("peer {i} of {}", args.peers))?);
    }
    let rss_peers = rss_kib();
    let list_bytes: usize = peers
        .iter()
        .map(|p| std::mem::size_of::<Peer>() + p.node.len())
        .sum();
    let agent = Peers::fixed(me, identity, peers, times);
    println!(
        "podha-bench survey: {} peers on 127.0.0.1 ({silent_count} silent), a leader outage \
         (every peer last heard {}s ago, this node {}s ago); deadline {:?}, asks {:?} each, {} at \
         once at most; {}; open-file limit {limit}",
        args.peers,
        PEERS_HEARD_AGO.as_secs(),
        ISOLATION_TIMEOUT.as_secs(),
        times.deadline,
        times.ask,
        IN_FLIGHT,
        machine(),
    );
    println!(
        "{:<6} {:<7} {:>11} {:>6} {:>8} {:>7} {:>11} {:>6} {:>6} {:>10}",
        "trial",
        "verdict",
        "decided in",
        "asked",
        "answers",
        "silent",
        "unanswered",
        "open",
        "files",
        "time-wait"
    );
    let mut rss_before = Vec::new();
    let mut rss_after = Vec::new();
    for trial in 1..=args.trials {
        settle(&gauge).await;
        gauge.reset();
        rss_before.push(rss_kib());
        let tw_before = time_wait();
        let start = Instant::now();
        let survey = agent.survey(ISOLATION_TIMEOUT).await;
        let took = start.elapsed();
        let seen = gauge.reset();
        let verdict = decide(
            Silence::For(ISOLATION_TIMEOUT),
            ISOLATION_TIMEOUT,
            Some(&survey),
            None,
        );
        settle(&gauge).await;
        rss_after.push(rss_kib());
        let word = match &verdict {
            Verdict::Heard => "heard",
            Verdict::Stay(_) => "stay",
            Verdict::Fence(_) => "fence",
        };
        println!(
            "{trial:<6} {word:<7} {:>9.3} s {:>6} {:>8} {:>7} {:>11} {:>6} {:>6} {:>10}",
            took.as_secs_f64(),
            seen.asked,
            survey.answers.len(),
            seen.silent_asked,
            seen.most_unanswered,
            seen.most_open,
            open_files(),
            format!("{tw_before} -> {}", time_wait()),
        );
        if let Verdict::Fence(why) = &verdict {
            println!("       why: {why}");
        }
    }
    let (request, limit) = chart_memory(&args.values);
    println!(
        "peer list: {} peers (node name, address, key: {} B each and the name's bytes) = {} KiB \
         (kept once; each survey asks from one copy of it)",
        args.peers,
        std::mem::size_of::<Peer>(),
        list_bytes / 1024,
    );
    println!(
        "RSS of this process (the peers too): {} at start, {} with the peers listening; per \
         trial before -> after: {}; peak {}",
        mib(rss_start),
        mib(rss_peers),
        rss_before
            .iter()
            .zip(&rss_after)
            .map(|(b, a)| format!("{} -> {}", mib(*b), mib(*a)))
            .collect::<Vec<_>>()
            .join(", "),
        mib(status_kib(std::process::id() as i32, "VmHWM").unwrap_or(0)),
    );
    println!("the chart's agent (agent.resources): memory request {request}, limit {limit}");
    Ok(())
}

/// Waits (up to 2 s) for the connections of the last survey to close at the peers.
async fn settle(gauge: &Gauge) {
    let until = Instant::now() + Duration::from_secs(2);
    while gauge.open() > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rss_kib() -> u64 {
    status_kib(std::process::id() as i32, "VmRSS").unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// `agent.resources.requests.memory` and `.limits.memory` from the chart's values.
fn chart_memory(values: &Path) -> (String, String) {
    let Ok(values) = crate::chart_install::read_values(values) else {
        return ("unknown".into(), "unknown".into());
    };
    let memory = |kind: &str| {
        values["agent"]["resources"][kind]["memory"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    };
    (memory("requests"), memory("limits"))
}
