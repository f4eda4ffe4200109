//! A real Prometheus (3.x, built from its Go module: `make prometheus`) scrapes both podha
//! replicas and the agents of the failover's two nodes through a failover; then every query of the Grafana dashboard and every alert
//! expression of the chart's PrometheusRule is evaluated against it. Each must be valid PromQL, every metric an
//! alert names must have been scraped, and the dashboard queries a failover feeds must have data.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};

use super::{
    Failed, Operators, SharedCluster, free_port, gone, log, metric, ops_leader, other,
    policy_and_db, scenario, scrape, secs_, wait_recovered,
};
use podha_sim::testkit::*;

/// Dashboard panels that may stay empty after one clean failover, and why.
const MAY_BE_EMPTY: [(&str, &str); 3] = [
    (
        "Pods skipped by reason",
        "the failover's only pod is eligible; nothing is skipped",
    ),
    (
        "Peers answering each agent's reach check",
        "an agent asks its peers only once podha has not heard it for a while: in a clean \
         failover podha hears every living agent, and whether an earlier scenario of the suite \
         made one ask depends on their order",
    ),
    (
        "Nodes fenced by their agent",
        "a node's agent exports its last fence only after the reboot that fence was",
    ),
];

/// Metrics an alert may name that are absent after one clean failover, and why.
const MAY_BE_ABSENT: [(&str, &str); 1] = [(
    "podha_agent_last_fence_timestamp_seconds",
    "exported by an agent only after its node came back from a fence it recorded",
)];

/// The Prometheus server, `$PODHA_PROMETHEUS`: Prometheus 3 built from its Go module by `make
/// prometheus`.
fn prometheus_path() -> anyhow::Result<PathBuf> {
    let how = "run `make prometheus` and set PODHA_PROMETHEUS to the prometheus it built (make \
               test does both)";
    let path = std::env::var_os("PODHA_PROMETHEUS")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .with_context(|| format!("PODHA_PROMETHEUS is not set: {how}"))?;
    if !path.is_file() {
        bail!("no Prometheus server at {}: {how}", path.display());
    }
    Ok(path)
}

/// A Prometheus process started by this test; stopped (by its pid) when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (identity, address) every second, labelled like a
    /// Kubernetes scrape (`namespace`, `pod`), with its data and log under `dir`.
    fn start(dir: &Path, targets: &[(String, SocketAddr)]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let configs: Vec<Value> = targets
            .iter()
            .map(|(pod, addr)| {
                json!({ "targets": [addr.to_string()],
                        "labels": { "namespace": "podha-system", "pod": pod } })
            })
            .collect();
        // JSON is YAML: Prometheus reads this config as is.
        let config = json!({
            "global": { "scrape_interval": "1s", "evaluation_interval": "1s" },
            "scrape_configs": [{ "job_name": "podha", "static_configs": configs }],
        });
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
        let addr = free_port()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(prometheus_path()?)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let prometheus = Self { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(addr, "/-/ready").is_err() {
            if Instant::now() > deadline {
                bail!("prometheus not ready within 30s (see {})", dir.display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(prometheus)
    }

    /// The result vector of an instant query; an error for invalid PromQL.
    fn query(&self, promql: &str) -> anyhow::Result<Vec<Value>> {
        let body = get(
            self.addr,
            &format!("/api/v1/query?query={}", encode(promql)),
        )
        .with_context(|| format!("query {promql}"))?;
        let answer: Value = serde_json::from_str(&body)?;
        if answer["status"] != "success" {
            bail!("query {promql}: {body}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// GET over HTTP/1.0, so that the answer is never chunked.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed response"))?;
    if !head.contains(" 200 ") {
        bail!("{}: {body}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every (panel title, query) of the dashboard, with Grafana's variables filled in.
fn dashboard_queries(policy: &str) -> anyhow::Result<Vec<(String, String)>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/podha/dashboards/podha.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().context("no panels")? {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let expr = expr
                .replace("$namespace", "podha-system")
                .replace("$policy", policy)
                .replace("$__rate_interval", "1m")
                .replace("$__range", "10m");
            queries.push((title.to_string(), expr));
        }
    }
    if queries.is_empty() {
        bail!("{} has no queries", path.display());
    }
    Ok(queries)
}

/// Every (alert, expression) of the chart's PrometheusRule, rendered by helm.
fn alert_expressions() -> anyhow::Result<Vec<(String, String)>> {
    let helm = podha_sim::chart_rbac::helm_path()?;
    let chart = podha_sim::chart_install::chart_dir();
    let out = Command::new(helm)
        .args(["template", "podha"])
        .arg(&chart)
        .args([
            "--kube-version",
            "1.34.0",
            "--set",
            "prometheusRule.enabled=true",
        ])
        .args(["--show-only", "templates/prometheusrule.yaml"])
        .output()?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    let rule: Value = serde_norway::from_slice(&out.stdout)?;
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().context("no groups")? {
        for r in group["rules"].as_array().into_iter().flatten() {
            alerts.push((
                r["alert"].as_str().unwrap_or_default().to_string(),
                r["expr"].as_str().context("rule without expr")?.to_string(),
            ));
        }
    }
    Ok(alerts)
}

/// The podha metric names an expression refers to.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names: Vec<String> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("podha_"))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

pub fn prometheus_scrapes_a_failover(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let pair = ["node-17", "node-18"];
    scenario(shared, ops, "prometheus", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        let mut targets: Vec<(String, SocketAddr)> = replicas
            .iter()
            .map(|r| (r.identity.clone(), r.http))
            .collect();
        for name in pair {
            let node = ctx.nodes().get(name).await?;
            let addr = podha::contract::agent_addr(&node)
                .with_context(|| format!("{name} advertises no agent"))?;
            targets.push((format!("podha-agent-{name}"), addr));
        }
        let prometheus = Prometheus::start(&ctx.cluster.logs_dir().join("prometheus"), &targets)?;
        let (_, node, uid, pv) =
            policy_and_db(&ctx, &pair, json!({"action": "OutOfServiceTaint"})).await?;
        let target = other(&pair, &node);
        // Before the death, the leader counts db-0 among the policy's protected pods.
        let leader = ops_leader(replicas).await?;
        wait_for(
            "db-0 counted protected in podha_pods",
            secs_(60),
            || async {
                let text = scrape(leader)?;
                let protected = [("policy", ns.as_str()), ("protected", "true")];
                Ok((metric(&text, "podha_pods", &protected) == Some(1.0)).then_some(()))
            },
        )
        .await?;
        ctx.cluster.kill_node(&node)?;
        wait_for("db-0 force-deleted", secs_(90), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        // A few more scrapes, so that rates and increases see the failover's samples.
        tokio::time::sleep(secs_(5)).await;

        let mut problems = Vec::new();
        for (title, expr) in dashboard_queries(&ns)? {
            match prometheus.query(&expr) {
                Err(e) => problems.push(format!("dashboard {title:?}: {e:#}")),
                Ok(result) if result.is_empty() => {
                    if !MAY_BE_EMPTY.iter().any(|(t, _)| *t == title) {
                        problems.push(format!("dashboard {title:?} has no data: {expr}"));
                    }
                }
                Ok(_) => {}
            }
        }
        for (alert, expr) in alert_expressions()? {
            if let Err(e) = prometheus.query(&expr) {
                problems.push(format!("alert {alert}: {e:#}"));
            }
            for name in metric_names(&expr) {
                if MAY_BE_ABSENT.iter().any(|(absent, _)| *absent == name) {
                    continue;
                }
                let scraped = prometheus.query(&format!("count({{__name__=\"{name}\"}})"))?;
                if scraped.is_empty() {
                    problems.push(format!(
                        "alert {alert} uses {name}, which podha does not export"
                    ));
                }
            }
            // A healthy pair of replicas: these stay quiet.
            if ["PodhaNoLeader", "PodhaTwoLeaders", "PodhaCachesNotSynced"]
                .contains(&alert.as_str())
                && !prometheus.query(&expr)?.is_empty()
            {
                problems.push(format!(
                    "alert {alert} would fire on a healthy pair: {expr}"
                ));
            }
        }
        log(
            &ns,
            format!(
                "prometheus evaluated the dashboard and the alerts: {} problem(s)",
                problems.len()
            ),
        );
        if !problems.is_empty() {
            bail!("{}", problems.join("\n"));
        }
        Ok(())
    })
}
