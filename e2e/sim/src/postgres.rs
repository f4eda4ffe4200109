//! PostgreSQL as a workload a failover must keep whole, checked by PostgreSQL itself
//! (`e2e/postgres`):
//!
//! - [`statefulset`]: one server on a podha-csi volume at `/data` (`server.sh`: `initdb
//!   --data-checksums` on first start, a log file per server start on the volume), beside
//!   podha-csi's writer on the same volume, so that the storage's write log says which nodes
//!   wrote to it and when; [`service`] in front of it;
//! - [`client`]: numbered transactions through the Service from another node (`client.sh`),
//!   each acknowledged COMMIT printed;
//! - [`check`]: `check.sh`, the database's verdict: every acknowledged transaction present
//!   once, no torn one, checksums and `pg_amcheck --heapallindexed` clean, no two servers at
//!   once on the data directory, and the crash recoveries counted. `podha chaos --check` runs
//!   the same command ([`check_command`]).
//!
//! The image is Debian's postgresql-15 (`e2e/images/postgres.sh`, `make node-images`); a test
//! loads it into the real nodes with [`load_image`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;

use crate::cluster::Cluster;
use crate::cluster::realnode::images;

/// The image `make node-images` builds (the Makefile's POSTGRES_IMAGE).
pub const IMAGE: &str = "podha.io/sim/postgres:15";
/// The server's container in [`statefulset`]'s pod.
pub const CONTAINER: &str = "postgres";
const SERVER: &str = include_str!("../../postgres/server.sh");
const CLIENT: &str = include_str!("../../postgres/client.sh");

/// `e2e/postgres/check.sh` in this repository.
pub fn check_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../postgres/check.sh")
}

/// Loads [`IMAGE`] (`postgres.tar` among the node images: `$PODHA_NODE_IMAGES_DIR`, else
/// `target/images`) into every real node of `cluster`.
pub fn load_image(cluster: &Cluster) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("the test's executable")?;
    let tar = images::default_dir(&exe).join("postgres.tar");
    images::check_holds(&tar, IMAGE, "node-images")?;
    cluster.load_image(&tar)?;
    Ok(())
}

/// A one-replica StatefulSet `name` (label `app=<name>`): PostgreSQL and podha-csi's writer on
/// one volume of StorageClass `class`, on one of `nodes`.
pub fn statefulset(name: &str, nodes: &[&str], class: &str) -> anyhow::Result<serde_json::Value> {
    let mut spec = crate::csi::workload::writer_pod_spec(nodes)?;
    let server = json!({
        "name": CONTAINER,
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["bash", "-c", SERVER],
        "env": [
            { "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
        ],
        "ports": [{ "name": "postgres", "containerPort": 5432 }],
        "readinessProbe": {
            "exec": { "command": ["pg_isready", "-q", "-h", "127.0.0.1"] },
            "periodSeconds": 1,
            "timeoutSeconds": 2,
        },
        "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
    });
    spec["containers"]
        .as_array_mut()
        .context("the writer's containers")?
        .insert(0, server);
    Ok(crate::testkit::statefulset_of(name, spec, class))
}

/// A ClusterIP Service `name` in front of [`statefulset`] `name`'s server.
pub fn service(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "spec": {
            "selector": { "app": name },
            "ports": [{ "name": "postgres", "port": 5432, "targetPort": 5432 }],
        },
    })
}

/// A one-replica Deployment `name` (label `app=<name>`) of the client on `node`, through the
/// Service at `service_ip`.
pub fn client(name: &str, node: &str, service_ip: &str) -> serde_json::Value {
    crate::testkit::deployment_of(
        name,
        json!({
            "nodeSelector": { "kubernetes.io/hostname": node },
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["bash", "-c", CLIENT],
                "env": [{ "name": "PGHOST", "value": service_ip }],
            }],
        }),
    )
}

/// In namespace `namespace` (made if need be): [`service`] `db` and [`client`] Deployment
/// `client` on `client_node`, through it; returns the Service's address. The database itself,
/// [`statefulset`] `db`, is the caller's to start.
pub async fn serve(
    kube: &kube::Client,
    namespace: &str,
    db: &str,
    client_name: &str,
    client_node: &str,
) -> anyhow::Result<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::PostParams;
    crate::testkit::create_namespace(kube, namespace).await?;
    let created = Api::<Service>::namespaced(kube.clone(), namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(service(db))?,
        )
        .await
        .with_context(|| format!("create Service {namespace}/{db}"))?;
    let ip = created
        .spec
        .and_then(|s| s.cluster_ip)
        .with_context(|| format!("Service {namespace}/{db} has no address"))?;
    let deployment = client(client_name, client_node, &ip);
    Api::<Deployment>::namespaced(kube.clone(), namespace)
        .create(&PostParams::default(), &serde_json::from_value(deployment)?)
        .await
        .with_context(|| format!("create Deployment {namespace}/{client_name}"))?;
    Ok(ip)
}

/// Waits (`timeout`) until [`client`] Deployment `name` in `namespace` has seen `n`
/// transactions acknowledged (its pod's log); returns how many it has.
pub async fn wait_acknowledged(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    n: usize,
    timeout: std::time::Duration,
) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let what = format!("{n} transactions acknowledged to {namespace}/{name}");
    crate::testkit::wait_for(&what, timeout, || async {
        let listed = pods
            .list(&kube::api::ListParams::default().labels(&format!("app={name}")))
            .await?;
        let Some(pod) = listed.items.first().and_then(|p| p.metadata.name.clone()) else {
            return Ok(None);
        };
        let log = pods
            .logs(&pod, &Default::default())
            .await
            .with_context(|| format!("the log of {pod}"))?;
        let seen = log.lines().filter(|l| l.starts_with("ack ")).count();
        Ok((seen >= n).then_some(seen))
    })
    .await
}

/// The shell command that checks StatefulSet `statefulset` and client Deployment `client` in
/// `namespace` of `cluster` (`check.sh`, with the sim's kubectl).
pub fn check_command(
    cluster: &Cluster,
    namespace: &str,
    statefulset: &str,
    client: &str,
) -> String {
    let quoted = |p: PathBuf| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    format!(
        "KUBECTL={} KUBECONFIG={} bash {} --namespace {namespace} --statefulset {statefulset} \
         --client {client}",
        quoted(cluster.bin_dir().join("kubectl")),
        quoted(cluster.kubeconfig_path()),
        quoted(check_script()),
    )
}

/// What `check.sh` printed on its `verdict` line, key by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict(pub BTreeMap<String, String>);

impl Verdict {
    /// The `verdict key=value ...` line among `stdout`'s.
    pub fn parse(stdout: &str) -> anyhow::Result<Self> {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("verdict "))
            .with_context(|| format!("check.sh printed no verdict line: {stdout}"))?;
        let mut figures = BTreeMap::new();
        for pair in line.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .with_context(|| format!("`{pair}` in the verdict is not key=value"))?;
            figures.insert(key.to_string(), value.to_string());
        }
        Ok(Self(figures))
    }

    /// Figure `key`, a count.
    pub fn count(&self, key: &str) -> anyhow::Result<u64> {
        let value = self
            .0
            .get(key)
            .with_context(|| format!("the verdict has no {key}: {self}"))?;
        value
            .parse()
            .with_context(|| format!("{key}={value} is not a count"))
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&pairs.join(" "))
    }
}

/// Runs [`check_command`]: the verdict when the database is whole, else an error with what
/// `check.sh` said.
pub fn check(
    cluster: &Cluster,
    namespace: &str,
    statefulset: &str,
    client: &str,
) -> anyhow::Result<Verdict> {
    let command = check_command(cluster, namespace, statefulset, client);
    let out = std::process::Command::new("bash")
        .args(["-c", &command])
        .output()
        .with_context(|| format!("running {command}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "PostgreSQL's check failed ({}):\n{stdout}{stderr}",
        out.status
    );
    Verdict::parse(&stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// check.sh against a kubectl that answers from files in a directory: the client's restart
    /// count (`restarts`) and log (`client.log`), the SQL figures (`figures`), pg_amcheck's exit
    /// code (`amcheck`); the servers' logs are read by check.sh's own command, from `log/`. It tests the script's reading of what PostgreSQL says;
    /// the real-node scenario runs it against PostgreSQL.
    /// Returns whether it passed, its stdout and stderr, and what it gave psql.
    fn check_with(files: &[(&str, &str)]) -> (bool, String, String, String) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let kubectl = dir.path().join("kubectl");
        std::fs::write(
            &kubectl,
            format!(
                r#"#!/bin/bash
d={dir}
shift 2
case "$1" in
  get) cat "$d/restarts" ;;
  logs) cat "$d/client.log" ;;
  exec)
    while [ "$1" != "--" ]; do shift; done
    shift
    case "$1" in
      pg_isready) exit 0 ;;
      psql) cat > "$d/psql.in"; cat "$d/figures" ;;
      pg_amcheck) exit "$(cat "$d/amcheck")" ;;
      bash) shift 2; bash -c "${{1//\/data\/log/$d/log}}" ;;
    esac ;;
esac
"#,
                dir = dir.path().display()
            ),
        )
        .unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&kubectl)
            .status()
            .unwrap();
        let out = std::process::Command::new("bash")
            .arg(check_script())
            .args([
                "--namespace",
                "shop",
                "--statefulset",
                "db",
                "--client",
                "c",
            ])
            .env("KUBECTL", &kubectl)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
        let psql = std::fs::read_to_string(dir.path().join("psql.in")).unwrap_or_default();
        (
            out.status.success(),
            text(&out.stdout),
            text(&out.stderr),
            psql,
        )
    }

    const WHOLE: &str = "acknowledged=3 present=3 lost=0 torn=0 counter=4 transactions=4 \
                         before_client=0 checksum_failures=0 data_checksums=on\n";
    /// The first server's log, on node-1 until it died.
    const FIRST: &str = "\
2026-11-30 10:00:00.100 UTC [1] LOG:  starting PostgreSQL 15.20
2026-11-30 10:00:20.000 UTC [61] LOG:  checkpoint complete
";
    /// The second's, on node-3, from its crash recovery on.
    const SECOND: &str = "\
2026-11-30 10:00:30.100 UTC [1] LOG:  starting PostgreSQL 15.20
2026-11-30 10:00:30.200 UTC [9] LOG:  database system was not properly shut down; automatic recovery in progress
2026-11-30 10:00:30.300 UTC [9] LOG:  redo done at 0/1A2B3C4 system usage: CPU: user: 0.00 s, system: 0.00 s, elapsed: 0.02 s
";

    fn files<'a>(figures: &'a str, amcheck: &'a str, first: &'a str) -> [(&'a str, &'a str); 6] {
        [
            ("restarts", "0\n"),
            (
                "client.log",
                "waiting for the database: refused\nstart 1\nack 1 1\nfailed 2: timeout\n\
                 ack 3 1\nack 10 5\n",
            ),
            ("figures", figures),
            ("amcheck", amcheck),
            ("log/postgresql-20261130-100000-1-node-1.log", first),
            ("log/postgresql-20261130-100030-2-node-3.log", SECOND),
        ]
    }

    #[test]
    fn check_passes_a_whole_database_and_counts_its_recoveries() {
        let (passed, stdout, stderr, psql) = check_with(&files(WHOLE, "0", FIRST));
        assert!(passed, "{stdout}{stderr}");
        // Every acknowledgement, as COPY data (`id<TAB>rows`), none of the failures; the
        // table's own rows counted, not its index's.
        assert!(
            psql.contains("COPY acks FROM STDIN;\n1\t1\n3\t1\n10\t5\n\\.\n")
                && psql.contains("CREATE TEMP TABLE client_start AS SELECT 1::bigint AS id;")
                && psql.contains("SET enable_indexonlyscan = off;"),
            "{psql}"
        );
        let v = Verdict::parse(&stdout).unwrap();
        assert_eq!(v.count("starts").unwrap(), 2);
        assert_eq!(v.count("crash_recoveries").unwrap(), 1);
        assert_eq!(v.0["last_redo_seconds"], "0.02");
        assert_eq!(v.0["amcheck"], "clean");
    }

    #[test]
    fn check_fails_on_a_second_server_lost_transactions_corruption_or_checksums_off() {
        let overlap = FIRST.replace(
            "10:00:20.000 UTC [61] LOG:  checkpoint complete",
            "10:00:40.000 UTC [61] LOG:  received smart shutdown request",
        );
        let (passed, _, stderr, _) = check_with(&files(WHOLE, "0", &overlap));
        assert!(!passed);
        assert!(
            stderr.contains("1 server(s) logged after a later one started")
                && stderr.contains("postgresql-20261130-100000-1-node-1.log logged until")
                && stderr.contains("received smart shutdown request"),
            "{stderr}"
        );
        assert!(
            stderr.contains("overlapping_servers=1"),
            "the verdict is on stderr too: {stderr}"
        );
        let lost = WHOLE
            .replace("present=3 lost=0", "present=2 lost=1")
            .replace("counter=4 transactions=4", "counter=3 transactions=3");
        let (passed, _, stderr, _) = check_with(&files(&lost, "0", FIRST));
        assert!(
            !passed && stderr.contains("1 acknowledged transaction(s) lost"),
            "{stderr}"
        );
        let (passed, _, stderr, _) = check_with(&files(WHOLE, "2", FIRST));
        assert!(
            !passed && stderr.contains("pg_amcheck (corrupt, exit code 2)"),
            "{stderr}"
        );
        let (passed, _, stderr, _) = check_with(&files(WHOLE, "1", FIRST));
        assert!(
            !passed && stderr.contains("pg_amcheck (error, exit code 1)"),
            "{stderr}"
        );
        // A client replaced by another: the earlier one's transactions lie below its first id.
        let replaced = WHOLE.replace("before_client=0", "before_client=3");
        let (passed, _, stderr, _) = check_with(&files(&replaced, "0", FIRST));
        assert!(
            !passed && stderr.contains("3 transaction(s) from before the client's first id 1"),
            "{stderr}"
        );
        let off = WHOLE.replace("data_checksums=on", "data_checksums=off");
        let (passed, _, stderr, _) = check_with(&files(&off, "0", FIRST));
        assert!(
            !passed && stderr.contains("data checksums are off"),
            "{stderr}"
        );
        // A client that restarted took its acknowledgements before with it.
        let mut restarted = files(WHOLE, "0", FIRST);
        restarted[0] = ("restarts", "1\n");
        let (passed, _, stderr, _) = check_with(&restarted);
        assert!(!passed && stderr.contains("never restarted"), "{stderr}");
        // A server's last line without a newline does not hide the next file.
        let unterminated = FIRST.replace(
            "10:00:20.000 UTC [61] LOG:  checkpoint complete\n",
            "10:00:40.000 UTC [heartbeat] LOG:  server 7 on node-1 runs",
        );
        let (passed, _, stderr, _) = check_with(&files(WHOLE, "0", &unterminated));
        assert!(
            !passed && stderr.contains("overlapping_servers=1"),
            "{stderr}"
        );
        let torn = WHOLE
            .replace("torn=0", "torn=2")
            .replace("counter=4", "counter=5");
        let (passed, _, stderr, _) = check_with(&files(&torn, "0", FIRST));
        assert!(
            !passed
                && stderr.contains("2 transaction(s) torn")
                && stderr.contains("the counter says 5, the table holds 4"),
            "{stderr}"
        );
    }

    #[test]
    fn a_verdict_line_is_read_key_by_key() {
        let v = Verdict::parse(
            "noise\nverdict acknowledged=120 lost=0 data_checksums=on crash_recoveries=1\n",
        )
        .unwrap();
        assert_eq!(v.count("acknowledged").unwrap(), 120);
        assert_eq!(v.count("crash_recoveries").unwrap(), 1);
        assert!(v.count("data_checksums").is_err());
        assert!(
            v.count("starts")
                .unwrap_err()
                .to_string()
                .contains("no starts")
        );
        assert!(Verdict::parse("all good").is_err());
        assert!(Verdict::parse("verdict lost").is_err());
    }

    #[test]
    fn the_server_and_the_writer_share_one_volume_of_the_class_asked_for() {
        let sts = statefulset("db", &["node-2"], "sim-rwo-unfenced").unwrap();
        let containers = &sts["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["name"], CONTAINER);
        assert_eq!(containers[1]["name"], "writer");
        for c in containers.as_array().unwrap() {
            assert_eq!(
                c["volumeMounts"][0],
                json!({ "name": "data", "mountPath": "/data" })
            );
        }
        assert_eq!(
            sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
            "sim-rwo-unfenced"
        );
    }
}
