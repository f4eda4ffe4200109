//! The failover: a whole group killed, podha's log and a pod watch timed against it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};

use super::identity::PodhaFlow;
use super::rest::status_kib;
use super::{BENCH_LABEL, FailoverSample, KIND_LABEL, POLICY, STATEFUL, ScaleArgs, say};
use crate::cluster::{Cluster, FleetGroup};
use crate::failover::Operator;

struct Victim {
    node: String,
    stateful: bool,
}

pub(super) async fn failover(
    cluster: &Cluster,
    client: &Client,
    podha: &mut Operator,
    group: &FleetGroup,
    args: &ScaleArgs,
) -> anyhow::Result<FailoverSample> {
    let pods: Api<Pod> = Api::all(client.clone());
    let victims = victims_of(&pods, group).await?;
    let eligible = victims.values().filter(|v| v.stateful).count();
    let others = victims.len() - eligible;
    say(format!(
        "failover: group {} ({} nodes) holds {eligible} StatefulSet pods and {others} others",
        group.label,
        group.nodes.len()
    ));

    let mut events = synced_pod_watch(&pods).await?;

    let flow_before = PodhaFlow::read(client).await?;
    let killed = SystemTime::now();
    cluster.kill_fleet_group(group)?;
    say(format!(
        "failover: {} SIGKILLed; waiting up to {} for podha",
        group.process_name(),
        humantime::format_duration(args.failover_timeout)
    ));
    let gone = watch_deletions(&mut events, &victims, args.failover_timeout, podha, killed).await?;
    drop(events);
    let apf = PodhaFlow::read(client).await?.since(flow_before);

    let log = podha_log(&podha.log)?;
    let (failed_at, held) = judged_dead(&log, group, killed);
    let mut last_gone_by_node: BTreeMap<&str, SystemTime> = BTreeMap::new();
    for (uid, at) in &gone {
        if let Some(v) = victims.get(uid)
            && v.stateful
        {
            let e = last_gone_by_node.entry(v.node.as_str()).or_insert(*at);
            *e = (*e).max(*at);
        }
    }
    let mut per_node: Vec<f64> = last_gone_by_node
        .iter()
        .filter_map(|(node, at)| Some(since(*failed_at.get(*node)?, *at)))
        .collect();
    per_node.sort_by(f64::total_cmp);
    let first_failed = failed_at.values().min().copied();
    let last_failed = failed_at.values().max().copied();
    let last_gone = last_gone_by_node.values().max().copied();
    let deleted = gone
        .keys()
        .filter(|u| victims.get(*u).is_some_and(|v| v.stateful))
        .count();
    Ok(FailoverSample {
        group: group.label.clone(),
        nodes: group.nodes.len(),
        eligible,
        others,
        deleted,
        others_deleted: gone.len() - deleted,
        failed_seen: failed_at.len(),
        held,
        kill_to_first_failed: first_failed.map(|t| since(killed, t)),
        kill_to_last_failed: last_failed.map(|t| since(killed, t)),
        per_node,
        last_failed_to_last_deleted: last_failed.zip(last_gone).map(|(a, b)| since(a, b)),
        first_failed_to_last_deleted: first_failed.zip(last_gone).map(|(a, b)| since(a, b)),
        podha_act_mean: podha.phase_mean(POLICY, "act"),
        action_timings: action_timings(podha),
        apf,
        rss_after_kib: status_kib(podha.pid(), "VmRSS").unwrap_or(0),
    })
}

/// When each victim's deletion was seen, until every StatefulSet pod is gone or `timeout`,
/// then a few seconds more.
async fn watch_deletions(
    events: &mut futures::stream::BoxStream<'static, watcher::Result<watcher::Event<Pod>>>,
    victims: &HashMap<String, Victim>,
    timeout: Duration,
    podha: &mut Operator,
    killed: SystemTime,
) -> anyhow::Result<HashMap<String, SystemTime>> {
    let deadline = Instant::now() + timeout;
    let eligible = victims.values().filter(|v| v.stateful).count();
    let mut gone: HashMap<String, SystemTime> = HashMap::new();
    let mut last_say = Instant::now();
    while victims
        .iter()
        .any(|(uid, v)| v.stateful && !gone.contains_key(uid))
    {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        match next {
            Err(_) => break,
            Ok(None) => bail!("pod watch ended"),
            Ok(Some(Err(e))) => say(format!("pod watch error (kube-rs retries): {e}")),
            Ok(Some(Ok(watcher::Event::Delete(p)))) => {
                if let Some(uid) = p.metadata.uid
                    && victims.contains_key(&uid)
                {
                    gone.entry(uid).or_insert_with(SystemTime::now);
                }
            }
            Ok(Some(Ok(_))) => {}
        }
        if last_say.elapsed() > Duration::from_secs(15) {
            last_say = Instant::now();
            podha.alive()?;
            let deleted = gone
                .keys()
                .filter(|uid| victims.get(*uid).is_some_and(|v| v.stateful))
                .count();
            say(format!(
                "  {:.0}s after the kill: {deleted}/{eligible} StatefulSet pods deleted",
                since(killed, SystemTime::now()),
            ));
        }
    }
    // A few seconds more, so a wrongly deleted Deployment pod would be seen.
    let grace = Instant::now() + Duration::from_secs(5);
    while let Ok(Some(ev)) = tokio::time::timeout_at(grace.into(), events.next()).await {
        if let Ok(watcher::Event::Delete(p)) = ev
            && let Some(uid) = p.metadata.uid
            && victims.contains_key(&uid)
        {
            gone.entry(uid).or_insert_with(SystemTime::now);
        }
    }
    Ok(gone)
}

/// The group's bench pods, by UID.
async fn victims_of(
    pods: &Api<Pod>,
    group: &FleetGroup,
) -> anyhow::Result<HashMap<String, Victim>> {
    let mut victims: HashMap<String, Victim> = HashMap::new();
    for node in &group.nodes {
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        for p in pods.list(&lp).await?.items {
            let (Some(uid), labels) = (p.metadata.uid.clone(), p.metadata.labels.as_ref()) else {
                continue;
            };
            let Some(kind) = labels.and_then(|l| l.get(KIND_LABEL)) else {
                continue;
            };
            victims.insert(
                uid,
                Victim {
                    node: node.clone(),
                    stateful: kind == STATEFUL,
                },
            );
        }
    }
    Ok(victims)
}

/// A watch of every bench pod (so that a deleted Deployment pod would show too), past its
/// initial list.
async fn synced_pod_watch(
    pods: &Api<Pod>,
) -> anyhow::Result<futures::stream::BoxStream<'static, watcher::Result<watcher::Event<Pod>>>> {
    let cfg = watcher::Config::default().labels(BENCH_LABEL);
    let mut events = watcher(pods.clone(), cfg).boxed();
    let synced_by = Instant::now() + Duration::from_secs(120);
    loop {
        match tokio::time::timeout_at(synced_by.into(), events.next()).await {
            Ok(Some(Ok(watcher::Event::InitDone))) => break,
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => bail!("pod watch: {e}"),
            Ok(None) | Err(_) => bail!("pod watch did not sync within 120s"),
        }
    }

    Ok(events)
}

/// When podha judged each of the group's nodes dead, from its log, and whether it held an
/// action after the kill.
fn judged_dead(
    log: &[LogLine],
    group: &FleetGroup,
    killed: SystemTime,
) -> (BTreeMap<String, SystemTime>, bool) {
    let mut failed_at: BTreeMap<String, SystemTime> = BTreeMap::new();
    let mut held = false;
    for line in log {
        let msg = line.message.as_str();
        if msg == "node judged dead"
            && let Some(node) = line.field("node")
            && group.nodes.iter().any(|n| n == node)
        {
            failed_at.entry(node.to_string()).or_insert(line.at);
        }
        if msg == "action held" && line.at > killed {
            held = true;
        }
    }
    (failed_at, held)
}

/// podha's timing of one kind of action over the run.
#[derive(Debug, Clone)]
pub(super) struct ActionTiming {
    pub(super) kind: &'static str,
    pub(super) requests_mean: Option<f64>,
    pub(super) latency_mean: Option<f64>,
}

pub(super) fn action_timings(podha: &Operator) -> Vec<ActionTiming> {
    ["taint_node", "mark_pod_not_ready", "delete_pod"]
        .into_iter()
        .map(|kind| {
            let filter = format!("kind=\"{kind}\"");
            let mean = |name| podha.histogram_mean(name, &[filter.as_str()]);
            ActionTiming {
                kind,
                requests_mean: mean("podha_action_request_duration_seconds"),
                latency_mean: mean("podha_action_latency_seconds"),
            }
        })
        .collect()
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
fn since(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// One line of podha's JSON log.
struct LogLine {
    at: SystemTime,
    message: String,
    fields: serde_json::Value,
}

impl LogLine {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name)?.as_str()
    }
}

fn podha_log(path: &Path) -> anyhow::Result<Vec<LogLine>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let ts: k8s_openapi::jiff::Timestamp = v.get("timestamp")?.as_str()?.parse().ok()?;
            let fields = v.get("fields")?.clone();
            Some(LogLine {
                at: SystemTime::from(ts),
                message: fields.get("message")?.as_str()?.to_string(),
                fields,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_log_lines_parse() {
        let dir = std::env::temp_dir().join(format!("podha-scale-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("podha.log");
        std::fs::write(
            &p,
            "{\"timestamp\":\"2025-01-02T03:04:05.123456Z\",\"level\":\"WARN\",\"fields\":\
             {\"message\":\"node judged dead\",\"policy\":\"scale\",\"node\":\"fleet-0-1\"}}\n\
             not json\n",
        )
        .unwrap();
        let lines = podha_log(&p).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].field("node"), Some("fleet-0-1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn since_is_signed() {
        let a = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let b = SystemTime::UNIX_EPOCH + Duration::from_secs(12);
        assert_eq!(since(a, b), 2.0);
        assert_eq!(since(b, a), -2.0);
    }
}
