#!/usr/bin/env bash
# `make chaos-kind`: podha chaos-tested on kind as its users do it. Creates the kind cluster of
# kind-config.yaml, loads the images (built by Docker, without a registry, by build-images.sh), installs
# podha-csi (controller Deployment, node DaemonSet), podha by its chart and the policy, starts
# the writer, then runs `podha chaos` with the kind faults: kill (docker kill/start), freeze
# (docker pause/unpause) and partition (docker network disconnect/connect), CHAOS_TRIALS each,
# with the write-log check after every trial. Results: OUT_DIR/chaos-kind-<fault>.{json,svg}.
# Usage: chaos-kind.sh OUT_DIR TRIALS     (env as build-images.sh, plus PODHA_HELM, PODHA_BIN)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: chaos-kind.sh OUT_DIR TRIALS}
trials=${2:?usage: chaos-kind.sh OUT_DIR TRIALS}
podha=${PODHA_BIN:-target/debug/podha}
podha_csi=${PODHA_CSI_BIN:-target/debug/podha-csi}
helm=${PODHA_HELM:?run through make chaos-kind, or set PODHA_HELM}
cluster=podha-chaos
storage=/tmp/podha-kind-storage

missing=()
command -v kind >/dev/null || missing+=("kind (go install sigs.k8s.io/kind@latest)")
command -v kubectl >/dev/null || missing+=("kubectl")
if ! docker info >/dev/null 2>&1; then
  missing+=("a running Docker engine (\`docker info\` fails)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "chaos-kind: cannot run here; missing: ${missing[*]}" >&2
  echo "chaos-kind: what this machine can run instead: make chaos-sim, and e2e/kind/README.md" >&2
  exit 1
fi

mkdir -p "$storage/store" "$storage/acks" "$out"
kind create cluster --config "$here/kind-config.yaml"
cleanup() { kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
export KUBECONFIG=$out/kind-kubeconfig
kind get kubeconfig --name "$cluster" > "$KUBECONFIG"

"$here/build-images.sh" "$out/images"
for tar in "$out"/images/*.tar; do
  kind load image-archive "$tar" --name "$cluster"
done

kubectl apply -f "$here/podha-csi/"
kubectl -n podha-csi rollout status deployment/podha-csi-controller --timeout=120s
kubectl -n podha-csi rollout status daemonset/podha-csi-node --timeout=120s

# kind's nodes are containers on this machine's kernel: the chart's agent would reboot the
# machine (sysrq-reboot) or arm its watchdog. It detects a shared kernel and refuses both, but
# this kit does not rely on that: no agent, and the policy chooses proof None.
"$helm" install podha "$repo/charts/podha" -n podha-system --create-namespace --wait --timeout 180s \
  --set agent.enabled=false
kubectl apply -f "$here/policy.yaml"
kubectl create namespace chaos --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f "$here/writer.yaml"
kubectl -n chaos rollout status statefulset/writer --timeout=180s

status=0
for fault in kind-kill kind-freeze kind-partition; do
  echo "== podha chaos --fault $fault"
  "$podha" chaos -n chaos --statefulset writer --trials "$trials" --fault "$fault" \
    --data-check "$podha_csi check --volume-dir $storage/store/{volume} --acks-dir $storage/acks" \
    --out "$out/chaos-kind-$fault.json" || status=$?
done
exit $status
