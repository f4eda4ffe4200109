#!/usr/bin/env bash
# `make chaos-kind`: podha chaos-tested on kind as its users do it. Creates the kind cluster of
# kind-config.yaml on the project's node image (make kind-node-image), loads the images
# (make kind-images) with `kind load image-archive`, installs podha-csi (controller Deployment,
# node DaemonSet), podha by its chart and the policy, starts the writer, then runs `podha chaos`
# once per kind fault, TRIALS trials each, with the write-log check after every trial:
#   kind-kill       docker kill / docker start              expected: moved, 0 split-brain
#   kind-partition  docker network disconnect / connect     expected: moved, 0 split-brain
#   kind-freeze     docker pause / docker unpause           expected: held (see e2e/kind/README.md)
# Results: OUT_DIR/chaos-kind-<fault>.{json,svg}. The cluster is deleted when every run met its
# expectation, and kept (with the commands to inspect and delete it) when one did not (except
# with CI=true), or with --keep. Run e2e/kind/preflight.sh first (make chaos-kind does).
# Usage: chaos-kind.sh [--keep] OUT_DIR TRIALS [FAULT...]
# Env (the Makefile exports them): PODHA_KIND_BIN_DIR, PODHA_KIND_NODE_IMAGE, PODHA_KIND_IMAGES_DIR,
#   PODHA_HELM, PODHA_BIN, PODHA_CSI_BIN, KUBECTL, PODHA_CACHE; PODHA_DOCKER_HOST as for
#   e2e/tools/docker-engine.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
keep=0
if [ "${1:-}" = --keep ]; then keep=1; shift; fi
usage="usage: chaos-kind.sh [--keep] OUT_DIR TRIALS [FAULT...]"
out=$(mkdir -p "${1:?$usage}" && cd "$1" && pwd)
trials=${2:?$usage}
shift 2
faults=("$@")
[ ${#faults[@]} -gt 0 ] || faults=(kind-kill kind-partition kind-freeze)
kind=${PODHA_KIND_BIN_DIR:?run through make chaos-kind}/kind
node_image=${PODHA_KIND_NODE_IMAGE:?run through make chaos-kind}
images=${PODHA_KIND_IMAGES_DIR:?run through make chaos-kind}
helm=${PODHA_HELM:?run through make chaos-kind}
podha=${PODHA_BIN:?run through make chaos-kind}
podha_csi=${PODHA_CSI_BIN:?run through make chaos-kind}
kubectl=${KUBECTL:-kubectl}
cluster=$(sed -n 's/^name: *//p' "$here/kind-config.yaml")
storage=/tmp/podha-kind-storage
me=e2e/kind/chaos-kind.sh

# shellcheck source=e2e/tools/docker-engine.sh
. "$repo/e2e/tools/docker-engine.sh"
docker_engine "$me"
# The kind network this kit made carries this label: only that one is removed afterwards.
network_label=podha.io/kind-kit
export KUBECONFIG=$out/kind-kubeconfig
status=1

# The cluster, the kit's network and its storage; then the engine, if started here.
remove_cluster() {
  "$kind" delete cluster --name "$cluster" >/dev/null 2>&1 || true
  if [ "$("$docker" network inspect --format "{{index .Labels \"$network_label\"}}" kind 2>/dev/null)" = true ]; then
    "$docker" network rm kind >/dev/null 2>&1 || true
  fi
  rm -rf --one-file-system "$storage"
}
teardown() {
  remove_cluster
  docker_engine_stop
}
cluster_exists() { "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; }
# What a failed run leaves to read: the cluster's pods and podha's last words.
diagnose() {
  [ -f "${KUBECONFIG:-}" ] || return 0
  echo "== the cluster after the failure"
  "$kubectl" get nodes,pods,volumeattachments -A -o wide 2>&1 || true
  echo "== podha's log (last 40 lines of each replica)"
  "$kubectl" -n podha-system logs -l app.kubernetes.io/name=podha --tail=40 --prefix 2>&1 || true
}
finish() {
  local rc=$?
  [ "$status" = 0 ] && [ "$rc" != 0 ] && status=$rc
  [ "$status" = 0 ] || diagnose
  # Deleted when every run met its expectation; kept for inspection otherwise, or with --keep,
  # but not in CI, where nobody comes back to it.
  if { [ "$status" = 0 ] || [ "${CI:-}" = true ]; } && [ "$keep" = 0 ]; then
    teardown
    return
  fi
  if cluster_exists; then
    echo
    echo "chaos-kind: the cluster $cluster is kept$([ "$status" = 0 ] || echo ", since a run did not meet its expectation or failed")."
    echo "  inspect: export DOCKER_HOST=$DOCKER_HOST KUBECONFIG=$out/kind-kubeconfig; $kubectl get nodes,pods -A -o wide"
    echo "  delete:  DOCKER_HOST=$DOCKER_HOST $kind delete cluster --name $cluster && DOCKER_HOST=$DOCKER_HOST docker network rm kind && rm -rf $storage"
    [ -z "${docker_engine_pid:-}" ] || echo "  then stop the project's Docker engine: kill \$(cat /run/podha-docker.pid)"
  else
    teardown
  fi
}
trap finish EXIT
# Interrupted (a cancelled CI job): the EXIT trap cleans up.
trap 'exit 130' INT TERM

# A cluster of the kit's name left by a run that was killed before its clean-up: in CI, where
# nobody kept it on purpose, removed; otherwise the preflight below refuses, naming it.
if [ "${CI:-}" = true ] && cluster_exists; then
  echo "$me: removing the cluster $cluster left by an earlier run"
  remove_cluster
fi
# Again, now that the engine answers (it may have been started just now): no cluster left, no
# sim cluster started meanwhile.
bash "$here/preflight.sh"

"$docker" image inspect "$node_image" >/dev/null 2>&1 \
  || { echo "$me: the node image $node_image is not in the engine: run make kind-node-image" >&2; exit 1; }
# kind's own network, made here for IPv4 only when missing: kind would make it dual-stack, and
# an IPv6 bridge has Docker turn on the host's IPv6 forwarding. One that exists is used as it is.
if ! "$docker" network inspect kind >/dev/null 2>&1; then
  "$docker" network create --driver bridge --label "$network_label=true" kind >/dev/null
fi

# The directory kind-config.yaml mounts into every node: the volumes and the acknowledgements.
[ ! -L "$storage" ] || { echo "$me: $storage is a symbolic link; remove it" >&2; exit 1; }
rm -rf --one-file-system "$storage"
mkdir -p "$storage/store" "$storage/acks"
echo "== kind create cluster --name $cluster --image $node_image (kubeconfig: $KUBECONFIG)"
rm -f "$KUBECONFIG"
"$kind" create cluster --config "$here/kind-config.yaml" --image "$node_image" --wait 3m

echo "== kind load image-archive"
for tar in "$images"/*.tar; do
  "$kind" load image-archive "$tar" --name "$cluster"
done

echo "== podha-csi"
"$kubectl" apply -f "$here/podha-csi/"
"$kubectl" -n podha-csi rollout status deployment/podha-csi-controller --timeout=180s
"$kubectl" -n podha-csi rollout status daemonset/podha-csi-node --timeout=180s

echo "== helm install podha (values: podha-values.yaml)"
"$helm" install podha "$repo/charts/podha" -n podha-system --create-namespace --wait --timeout 180s \
  --values "$here/podha-values.yaml"
"$kubectl" apply -f "$here/policy.yaml"
"$kubectl" create namespace chaos --dry-run=client -o yaml | "$kubectl" apply -f -
"$kubectl" apply -f "$here/writer.yaml"
"$kubectl" -n chaos rollout status statefulset/writer --timeout=180s

# What podha should do about each fault, and how the node comes back: the fault's own restore,
# then a wait for the pod network to heal (network-healed.sh), so that no trial starts on the
# network the previous one left.
expectation() {
  case $1 in
    kind-freeze) echo held ;;
    *) echo moved ;;
  esac
}
restore_of() {
  local restore
  case $1 in
    kind-kill) restore="docker start {node}" ;;
    kind-partition) restore="docker network connect kind {node}" ;;
    kind-freeze) restore="docker unpause {node}" ;;
    *) echo "$me: no restore known for the fault $1" >&2; exit 2 ;;
  esac
  echo "$restore && $here/network-healed.sh $cluster"
}
export KUBECTL=$kubectl
status=0
for fault in "${faults[@]}"; do
  expect=$(expectation "$fault")
  restore=$(restore_of "$fault")
  echo "== podha chaos --fault $fault --expect $expect"
  "$podha" chaos -n chaos --statefulset writer --trials "$trials" --fault "$fault" --expect "$expect" \
    --restore "$restore" \
    --timeout 3m --podha-csi "$podha_csi" \
    --data-check "{podha_csi} check --volume-dir $storage/store/{volume} --acks-dir $storage/acks" \
    --out "$out/chaos-kind-$fault.json" || status=1
done
exit $status
