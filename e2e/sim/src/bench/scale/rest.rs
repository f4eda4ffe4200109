//! At rest: podha's memory, CPU and request rate over a window, from `/proc` and the API
//! server's metrics.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use kube::Client;

use super::identity::PodhaFlow;
use super::{CoverageSample, RestSample, ScaleArgs, say};
use crate::cluster::Cluster;
use crate::failover::Operator;

/// Where the run stands when it measures at rest.
pub(super) struct Size {
    pub(super) step: &'static str,
    pub(super) fleet_nodes: usize,
    pub(super) pods: usize,
    pub(super) built_in: Duration,
}

pub(super) async fn measure_rest(
    cluster: &Cluster,
    client: &Client,
    podha: &Operator,
    size: Size,
    args: &ScaleArgs,
) -> anyhow::Result<RestSample> {
    let Size {
        step,
        fleet_nodes,
        pods,
        built_in,
    } = size;
    say(format!(
        "{step}: settling {}, then measuring over {}",
        humantime::format_duration(args.settle),
        humantime::format_duration(args.window)
    ));
    tokio::time::sleep(args.settle).await;
    let pid = podha.pid();
    let hz = clock_ticks();
    let work0 = coverage_work(podha);
    let (cpu0, flow0, cl0, t0) = (
        cpu_ticks(pid).ok_or_else(|| anyhow!("podha is gone"))?,
        PodhaFlow::read(client).await?,
        cluster_ticks(cluster),
        Instant::now(),
    );
    tokio::time::sleep(args.window).await;
    let work1 = coverage_work(podha);
    let (cpu1, flow1, cl1, window) = (
        cpu_ticks(pid).ok_or_else(|| anyhow!("podha is gone"))?,
        PodhaFlow::read(client).await?,
        cluster_ticks(cluster),
        t0.elapsed(),
    );
    let secs = window.as_secs_f64();
    let flow = flow1.since(flow0);
    let cluster_cpu_percent = cl1
        .iter()
        .map(|(k, v)| {
            let before = cl0.get(k).copied().unwrap_or(0);
            (
                k.clone(),
                v.saturating_sub(before) as f64 / hz / secs * 100.0,
            )
        })
        .collect();
    Ok(RestSample {
        step,
        fleet_nodes,
        pods,
        podha_nodes: podha.metric("podha_nodes", &[]),
        rss_kib: status_kib(pid, "VmRSS").unwrap_or(0),
        hwm_kib: status_kib(pid, "VmHWM").unwrap_or(0),
        cpu_percent: (cpu1 - cpu0) as f64 / hz / secs * 100.0,
        requests: flow.dispatched,
        requests_per_s: flow.dispatched / secs,
        window,
        cluster_cpu_percent,
        built_in,
        coverage: CoverageSample {
            protected: podha.metric("podha_pods", &["protected=\"true\""]),
            unprotected: podha.metric("podha_pods", &["protected=\"false\""]),
            worked_out: work1.1 - work0.1,
            status_writes: flow.status_writes,
            mean_seconds: (work1.1 > work0.1).then(|| (work1.0 - work0.0) / (work1.1 - work0.1)),
        },
    })
}

/// podha's time spent working out its coverage, and how many times, so far.
fn coverage_work(podha: &Operator) -> (f64, f64) {
    let name = "podha_coverage_duration_seconds";
    (
        podha.metric(&format!("{name}_sum"), &[]).unwrap_or(0.0),
        podha.metric(&format!("{name}_count"), &[]).unwrap_or(0.0),
    )
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
pub(crate) fn status_kib(pid: i32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// CPU ticks of the sim cluster's processes, by kind (`kwok` sums every kwok).
fn cluster_ticks(cluster: &Cluster) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for p in cluster.processes().into_iter().filter(|p| p.alive) {
        let kind = if p.name.starts_with("kwok") {
            "kwok".to_string()
        } else if p.name.starts_with("csi-node") {
            "csi-node".to_string()
        } else {
            p.name.clone()
        };
        *out.entry(kind).or_default() += cpu_ticks(p.pid).unwrap_or(0);
    }
    out
}

pub(crate) fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!("{cpus} CPUs, {:.1} GiB RAM", mem as f64 / 1024.0 / 1024.0)
}
