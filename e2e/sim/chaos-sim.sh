#!/usr/bin/env bash
# `make chaos-sim`: podha chaos as a user runs it, on a fresh sim cluster (kwok nodes, fast
# profile): a policy, a StatefulSet on the sim-rwo StorageClass, podha as its own process, and
# `podha chaos --fault sim-kill`. Everything is torn down at the end; the results stay.
# Usage: chaos-sim.sh DIR TRIALS OUT_JSON   (binaries from target/debug, kubectl from the sim cache)
set -euo pipefail

dir=$1
trials=$2
out=$3
bin=${CARGO_TARGET:-target/debug}
kubectl() { "$PODHA_SIM_BIN_DIR/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

"$bin/podha-sim" up --dir "$dir" --nodes 3 --profile fast
podha_pid=""
cleanup() {
  [ -n "$podha_pid" ] && kill "$podha_pid" 2>/dev/null || true
  "$bin/podha-sim" down --dir "$dir" >/dev/null || true
}
trap cleanup EXIT

kubectl apply -f crds/podha.io_podhapolicies.yaml >/dev/null
kubectl wait --for condition=established --timeout=60s crd/podhapolicies.podha.io >/dev/null
kubectl create namespace chaos-demo >/dev/null
# Fast detection on the Lease alone (a restarted sim node may move to another port when another
# sim cluster holds its address's 10250; a TCP probe could then reach that cluster's node).
# Every trial's node failure must be acted on, hence maxUnhealthy.
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: podha.io/v1alpha1
kind: PodHAPolicy
metadata: {name: chaos-demo}
spec:
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: chaos-demo}}
  detection: {interval: 1s, failureThreshold: 3, signals: [Lease], leaseGracePeriod: 12s, tcpTimeout: 500ms}
  action: OutOfServiceTaint
  safety: {maxUnhealthy: 3}
YAML
kubectl -n chaos-demo apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: app, image: registry.invalid/podha/app:1, volumeMounts: [{name: data, mountPath: /data}]}]
  volumeClaimTemplates:
    - metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], storageClassName: sim-rwo, resources: {requests: {storage: 1Gi}}}
YAML

RUST_LOG=info "$bin/podha" run --kubeconfig "$dir/kubeconfig" --http-addr 127.0.0.1:0 \
  --identity chaos-demo >"$dir/logs/podha.log" 2>&1 &
podha_pid=$!
echo "podha running (log $dir/logs/podha.log)"

"$bin/podha" chaos --yes --kubeconfig "$dir/kubeconfig" --namespace chaos-demo --statefulset db \
  --trials "$trials" --fault sim-kill --sim-dir "$dir" --podha-sim "$bin/podha-sim" \
  --out "$out"
