//! The table and the JSON.

use serde_json::json;

use super::{FailoverSample, MAX_UNHEALTHY, POLICY, Report, ScaleArgs};
use crate::csi::RWO_STORAGE_CLASS;

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(i).copied()
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.2}s"))
}

pub(super) fn render(r: &Report) -> String {
    let mut out = format!(
        "\npodha at scale (sim cluster, stock profile; {})\n\n",
        r.machine
    );
    out.push_str(
        "step   fleet nodes   pods    podha sees  podha RSS  podha CPU    podha req/s  \
         apiserver CPU  all sim CPU\n",
    );
    for s in &r.rest {
        let api = s
            .cluster_cpu_percent
            .get("kube-apiserver")
            .copied()
            .unwrap_or(0.0);
        let all: f64 = s.cluster_cpu_percent.values().sum();
        out.push_str(&format!(
            "{:<6} {:>11}  {:>6}  {:>10}  {:>6.1} MiB  {:>6.2} %  {:>12.2}  {:>11.0} %  {:>9.0} %\n",
            s.step,
            s.fleet_nodes,
            s.pods,
            s.podha_nodes.map_or("-".into(), |n| format!("{n:.0} nodes")),
            s.rss_kib as f64 / 1024.0,
            s.cpu_percent,
            s.requests_per_s,
            api,
            all,
        ));
    }
    if let Some(w) = r.rest.first() {
        out.push_str(&format!(
            "(at rest: {:.0} s window after settling; CPU in % of one core; requests counted by \
             the API server for podha's ServiceAccount)\n",
            w.window.as_secs_f64()
        ));
    }
    out.push_str(&render_coverage(r));
    if let Some(f) = &r.failover {
        out.push_str(&render_failover(f));
    }
    out
}

/// What podha counts at rest, and what working it out costs.
fn render_coverage(r: &Report) -> String {
    let mut out = String::from(
        "\nstep   protected  unprotected  worked out in window  mean time to work out  status writes\n",
    );
    let count = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    for s in &r.rest {
        let c = &s.coverage;
        out.push_str(&format!(
            "{:<6} {:>9}  {:>11}  {:>20.0}  {:>21}  {:>13.0}\n",
            s.step,
            count(c.protected),
            count(c.unprotected),
            c.worked_out,
            c.mean_seconds
                .map_or("-".to_string(), |m| format!("{:.1} ms", m * 1000.0)),
            c.status_writes,
        ));
    }
    out.push_str(
        "(podha_pods{protected} at the end of the window: pods with a volume; \
         podha_coverage_duration_seconds over it; PodHAPolicy status writes the API server \
         counted over it)\n",
    );
    out
}

/// The failover's figures, one per line.
fn render_failover(f: &FailoverSample) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\nfailover: group {} ({} nodes, one kwok) SIGKILLed; {} eligible StatefulSet pods \
         (one {RWO_STORAGE_CLASS} volume each), {} Deployment pods without volumes\n",
        f.group, f.nodes, f.eligible, f.others
    ));
    let mut rows = vec![
        (
            "nodes judged dead by podha".to_string(),
            format!("{}/{}", f.failed_seen, f.nodes),
        ),
        (
            "kill -> first node Failed".to_string(),
            secs(f.kill_to_first_failed),
        ),
        (
            "kill -> last node Failed".to_string(),
            secs(f.kill_to_last_failed),
        ),
        (
            "threshold -> node's eligible pods deleted, median".to_string(),
            secs(quantile(&f.per_node, 0.5)),
        ),
        (
            "threshold -> node's eligible pods deleted, p90".to_string(),
            secs(quantile(&f.per_node, 0.9)),
        ),
        (
            "threshold -> node's eligible pods deleted, max".to_string(),
            secs(f.per_node.last().copied()),
        ),
        (
            "last Failed -> last eligible pod deleted".to_string(),
            secs(f.last_failed_to_last_deleted),
        ),
        (
            "first Failed -> last eligible pod deleted".to_string(),
            secs(f.first_failed_to_last_deleted),
        ),
        (
            "podha's own act phase (mean)".to_string(),
            secs(f.podha_act_mean),
        ),
    ];
    for t in &f.action_timings {
        rows.push((
            format!("{}: API requests / sent->handled (mean)", t.kind),
            format!("{} / {}", secs(t.requests_mean), secs(t.latency_mean)),
        ));
    }
    rows.extend(request_and_outcome_rows(f));
    for (k, v) in rows {
        out.push_str(&format!("  {k:<50} {v:>10}\n"));
    }
    out
}

/// What podha asked of the API server, and what the failover left.
fn request_and_outcome_rows(f: &FailoverSample) -> [(String, String); 6] {
    [
        (
            "podha's requests at the API server (non-watch)".to_string(),
            format!("{:.0}", f.apf.executed),
        ),
        (
            "  APF queue wait / execution (mean)".to_string(),
            format!(
                "{} / {}",
                secs(f.apf.mean_wait()),
                secs(f.apf.mean_execution())
            ),
        ),
        (
            "eligible pods deleted".to_string(),
            format!("{}/{}", f.deleted, f.eligible),
        ),
        (
            "other pods deleted".to_string(),
            f.others_deleted.to_string(),
        ),
        (
            "actions held".to_string(),
            if f.held { "yes" } else { "no" }.to_string(),
        ),
        (
            "podha RSS after the failover".to_string(),
            format!("{:.1} MiB", f.rss_after_kib as f64 / 1024.0),
        ),
    ]
}

impl Report {
    pub(super) fn to_json(&self, args: &ScaleArgs) -> serde_json::Value {
        let rest: Vec<serde_json::Value> = self
            .rest
            .iter()
            .map(|s| {
                json!({
                    "step": s.step,
                    "fleet_nodes": s.fleet_nodes,
                    "pods": s.pods,
                    "podha_nodes": s.podha_nodes,
                    "podha_rss_mib": s.rss_kib as f64 / 1024.0,
                    "podha_peak_rss_mib": s.hwm_kib as f64 / 1024.0,
                    "podha_cpu_percent_of_core": s.cpu_percent,
                    "podha_requests": s.requests,
                    "podha_requests_per_second": s.requests_per_s,
                    "window_seconds": s.window.as_secs_f64(),
                    "sim_cpu_percent_of_core": s.cluster_cpu_percent,
                    "build_seconds": s.built_in.as_secs_f64(),
                    "protected_pods": s.coverage.protected,
                    "unprotected_pods": s.coverage.unprotected,
                    "coverage_worked_out_in_window": s.coverage.worked_out,
                    "coverage_mean_seconds": s.coverage.mean_seconds,
                    "status_writes": s.coverage.status_writes,
                })
            })
            .collect();
        let failover = self.failover.as_ref().map(|f| {
            json!({
                "group": f.group,
                "nodes": f.nodes,
                "eligible_pods": f.eligible,
                "other_pods": f.others,
                "eligible_deleted": f.deleted,
                "others_deleted": f.others_deleted,
                "nodes_failed_seen": f.failed_seen,
                "held": f.held,
                "kill_to_first_failed_seconds": f.kill_to_first_failed,
                "kill_to_last_failed_seconds": f.kill_to_last_failed,
                "threshold_to_deleted_per_node_seconds": f.per_node,
                "threshold_to_deleted_median_seconds": quantile(&f.per_node, 0.5),
                "threshold_to_deleted_p90_seconds": quantile(&f.per_node, 0.9),
                "threshold_to_deleted_max_seconds": f.per_node.last(),
                "last_failed_to_last_deleted_seconds": f.last_failed_to_last_deleted,
                "first_failed_to_last_deleted_seconds": f.first_failed_to_last_deleted,
                "podha_act_phase_mean_seconds": f.podha_act_mean,
                "podha_action_timings": f.action_timings.iter().map(|t| json!({
                    "kind": t.kind,
                    "api_requests_mean_seconds": t.requests_mean,
                    "sent_to_handled_mean_seconds": t.latency_mean,
                })).collect::<Vec<_>>(),
                "podha_apf": {
                    "dispatched": f.apf.dispatched,
                    "waited": f.apf.waited,
                    "wait_mean_seconds": f.apf.mean_wait(),
                    "executed_non_watch": f.apf.executed,
                    "execution_mean_seconds": f.apf.mean_execution(),
                },
                "podha_rss_after_mib": f.rss_after_kib as f64 / 1024.0,
            })
        });
        json!({
            "machine": self.machine,
            "profile": "stock",
            "args": {
                "nodes": args.nodes,
                "pods": args.pods,
                "group_size": args.group_size,
                "stateful_percent": args.stateful_percent,
                "sts_replicas": args.sts_replicas,
                "deploy_replicas": args.deploy_replicas,
                "namespaces": args.namespaces,
                "client_qps": args.client_qps,
                "settle_seconds": args.settle.as_secs_f64(),
                "window_seconds": args.window.as_secs_f64(),
            },
            "policy": { "name": POLICY, "safety.maxUnhealthy": MAX_UNHEALTHY, "detection": "defaults" },
            "rest": rest,
            "failover": failover,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_ranks() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.5), Some(3.0));
        assert_eq!(quantile(&v, 1.0), Some(5.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
