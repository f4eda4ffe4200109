//! The workloads: StatefulSets with one RWO volume per pod, Deployments without volumes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::identity::create_ok;
use super::{BENCH_LABEL, KIND_LABEL, STATEFUL, STATELESS, ScaleArgs, say};
use crate::cluster::FLEET_GROUP_LABEL;
use crate::csi::{RWO_STORAGE_CLASS, VOLUMES_READY_ANNOTATION};
use crate::failover::Operator;
use crate::testkit::create_namespace;

#[derive(Default)]
pub(super) struct Workloads {
    next: usize,
    statefulsets: usize,
    deployments: usize,
    stateful_pods: usize,
    pods: usize,
    namespaces: BTreeSet<String>,
}

impl Workloads {
    /// Creates StatefulSets holding `stateful` pods and Deployments holding `stateless` pods.
    pub(super) async fn create(
        &mut self,
        client: &Client,
        args: &ScaleArgs,
        stateful: usize,
        stateless: usize,
    ) -> anyhow::Result<()> {
        let mut objects: Vec<(String, serde_json::Value)> = Vec::new();
        for (total, per, kind) in [
            (stateful, args.sts_replicas.max(1) as usize, STATEFUL),
            (stateless, args.deploy_replicas.max(1) as usize, STATELESS),
        ] {
            let mut left = total;
            while left > 0 {
                let replicas = left.min(per);
                left -= replicas;
                let k = self.next;
                self.next += 1;
                let ns = format!("scale-{}", k % args.namespaces.max(1));
                let obj = if kind == STATEFUL {
                    self.statefulsets += 1;
                    statefulset(&format!("db-{k}"), replicas)
                } else {
                    self.deployments += 1;
                    deployment(&format!("web-{k}"), replicas)
                };
                objects.push((ns, obj));
            }
        }
        for (ns, _) in &objects {
            if self.namespaces.insert(ns.clone()) {
                create_namespace(client, ns).await?;
            }
        }
        let c = client;
        futures::stream::iter(objects.into_iter().map(|(ns, obj)| async move {
            let pp = PostParams::default();
            if obj["kind"] == "StatefulSet" {
                let sts: StatefulSet = serde_json::from_value(obj)?;
                create_ok(
                    Api::<StatefulSet>::namespaced(c.clone(), &ns)
                        .create(&pp, &sts)
                        .await,
                )
            } else {
                let d: Deployment = serde_json::from_value(obj)?;
                create_ok(
                    Api::<Deployment>::namespaced(c.clone(), &ns)
                        .create(&pp, &d)
                        .await,
                )
            }
        }))
        .buffer_unordered(8)
        .collect::<Vec<anyhow::Result<()>>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
        self.stateful_pods += stateful;
        self.pods += stateful + stateless;
        Ok(())
    }

    /// Waits until every pod is Ready and every StatefulSet volume attached.
    pub(super) async fn wait_ready(
        &self,
        client: &Client,
        podha: &mut Operator,
    ) -> anyhow::Result<()> {
        let lp = ListParams::default().labels(BENCH_LABEL);
        let sts: Api<StatefulSet> = Api::all(client.clone());
        let deps: Api<Deployment> = Api::all(client.clone());
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let started = Instant::now();
        let mut last_say = Instant::now();
        loop {
            let ready_sts: i64 = sts
                .list(&lp)
                .await?
                .items
                .iter()
                .map(|s| {
                    s.status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0) as i64
                })
                .sum();
            let ready_deps: i64 = deps
                .list(&lp)
                .await?
                .items
                .iter()
                .map(|d| {
                    d.status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0) as i64
                })
                .sum();
            let attached = vas
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
                .count();
            let ready = (ready_sts + ready_deps) as usize;
            if ready >= self.pods && attached >= self.stateful_pods {
                say(format!(
                    "{ready} pods Ready, {attached} volumes attached after {:.0}s",
                    started.elapsed().as_secs_f64()
                ));
                return Ok(());
            }
            if last_say.elapsed() > Duration::from_secs(30) {
                last_say = Instant::now();
                say(format!(
                    "  {ready}/{} pods Ready, {attached}/{} volumes attached ({:.0}s)",
                    self.pods,
                    self.stateful_pods,
                    started.elapsed().as_secs_f64()
                ));
            }
            podha.alive()?;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }
}

fn pod_template(name: &str, kind: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "labels": { "app": name, BENCH_LABEL: "1", KIND_LABEL: kind },
            // No sim-csi node agent on fleet nodes: start without waiting for the attachment.
            "annotations": { VOLUMES_READY_ANNOTATION: "true" },
        },
        "spec": {
            "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchExpressions": [
                    { "key": FLEET_GROUP_LABEL, "operator": "Exists" },
                ] }],
            } } },
            "containers": [{
                "name": "app",
                "image": "registry.invalid/podha/app:1",
                "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } },
            }],
        },
    })
}

fn statefulset(name: &str, replicas: usize) -> serde_json::Value {
    let mut template = pod_template(name, STATEFUL);
    template["spec"]["containers"][0]["volumeMounts"] =
        json!([{ "name": "data", "mountPath": "/data" }]);
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": name, "labels": { BENCH_LABEL: "1" } },
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": { "app": name } },
            "template": template,
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": RWO_STORAGE_CLASS,
                    "resources": { "requests": { "storage": "1Gi" } },
                },
            }],
        },
    })
}

fn deployment(name: &str, replicas: usize) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "labels": { BENCH_LABEL: "1" } },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": pod_template(name, STATELESS),
        },
    })
}
