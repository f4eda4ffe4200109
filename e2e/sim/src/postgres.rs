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
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "nodeSelector": { "kubernetes.io/hostname": node },
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "client",
                        "image": IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["bash", "-c", CLIENT],
                        "env": [{ "name": "PGHOST", "value": service_ip }],
                    }],
                },
            },
        },
    })
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
    format!(
        "KUBECTL={} KUBECONFIG={} bash {} --namespace {namespace} --statefulset {statefulset} \
         --client {client}",
        cluster.bin_dir().join("kubectl").display(),
        cluster.kubeconfig_path().display(),
        check_script().display(),
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
