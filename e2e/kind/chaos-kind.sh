#!/usr/bin/env bash
# `make chaos-kind`: podha chaos-tested on kind as its users do it. Creates the kind cluster of
# kind-config.yaml on the project's node image (make kind-node-image), loads the images
# (make kind-images) with `kind load image-archive`, installs podha-csi (controller Deployment,
# node DaemonSet), podha and its agents by the chart and the policy, starts the writer, then runs
# `podha chaos` once per kind fault, TRIALS trials each, with the write-log check after every
# trial; every one is expected moved, with 0 split-brain, once the agent's fence is proven:
#   kind-kill       docker kill / docker start
#   kind-partition  docker network disconnect / connect (and start: the node fenced itself)
#   kind-freeze     docker pause / unpause (or start: its watchdog reset it)
# Each node's BMC (`podha-sim kind-bmc`, on the host, started before the cluster) pets nothing
# itself: it powers its node off (`docker kill`) when the node's agent stops petting its
# watchdog or writes its fence, and logs each power-off; after each fault's run the kit checks
# that the BMCs powered off exactly the nodes the trials faulted, once each: no healthy node
# reset. Results: OUT_DIR/chaos-kind-<fault>.{json,svg}, OUT_DIR/kind-bmc.log and
# OUT_DIR/fences.log. The cluster is deleted when every run met its
# expectation, and kept (with the commands to inspect and delete it) when one did not (except
# with CI=true), or with --keep. Run e2e/kind/preflight.sh first (make chaos-kind does).
# Usage: chaos-kind.sh [--keep] OUT_DIR TRIALS [FAULT...]
# Env (the Makefile exports them): PODHA_KIND_BIN_DIR, PODHA_KIND_NODE_IMAGE, PODHA_KIND_IMAGES_DIR,
#   PODHA_HELM, PODHA_BIN, PODHA_CSI_BIN, PODHA_SIM_BIN, KUBECTL, PODHA_CACHE; PODHA_DOCKER_HOST as for
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
podha_sim=${PODHA_SIM_BIN:?run through make chaos-kind}
kubectl=${KUBECTL:-kubectl}
cluster=$(sed -n 's/^name: *//p' "$here/kind-config.yaml")
storage=/tmp/podha-kind-storage
# The nodes' BMCs: one directory each, as kind-config.yaml mounts them; the watchdog's timeout is
# the one the agents declare for it (podha-values.yaml).
bmc_dir=/tmp/podha-kind-bmc
mapfile -t bmc_nodes < <(sed -n "s|^ *- hostPath: $bmc_dir/||p" "$here/kind-config.yaml")
watchdog_timeout=$(sed -n '/^  watchdog:/,/^  [a-z]/ s/^    timeout: *//p' "$here/podha-values.yaml")
[ ${#bmc_nodes[@]} -gt 0 ] && [ -n "$watchdog_timeout" ] \
  || { echo "$me: no BMC directories in kind-config.yaml, or no agent.watchdog.timeout in podha-values.yaml" >&2; exit 1; }
fences=$bmc_dir/fences.log
me=e2e/kind/chaos-kind.sh

# shellcheck source=e2e/tools/docker-engine.sh
. "$repo/e2e/tools/docker-engine.sh"
docker_engine "$me"
# The kind network this kit made carries this label: only that one is removed afterwards.
network_label=podha.io/kind-kit
export KUBECONFIG=$out/kind-kubeconfig
status=1

# The BMCs, if started here, keeping their log of power-offs in OUT_DIR.
stop_bmcs() {
  [ -n "${bmc_pid:-}" ] || return 0
  kill "$bmc_pid" 2>/dev/null || true
  wait "$bmc_pid" 2>/dev/null || true
  bmc_pid=
  [ ! -f "$fences" ] || cp "$fences" "$out/fences.log"
}
# The cluster, its BMCs, the kit's network and its storage; then the engine, if started here.
remove_cluster() {
  "$kind" delete cluster --name "$cluster" >/dev/null 2>&1 || true
  stop_bmcs
  if [ "$("$docker" network inspect --format "{{index .Labels \"$network_label\"}}" kind 2>/dev/null)" = true ]; then
    "$docker" network rm kind >/dev/null 2>&1 || true
  fi
  rm -rf --one-file-system "$storage" "$bmc_dir"
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
  echo "== the BMCs' power-offs ($fences)"
  cat "$fences" 2>/dev/null || true
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
    echo "  delete:  DOCKER_HOST=$DOCKER_HOST $kind delete cluster --name $cluster && DOCKER_HOST=$DOCKER_HOST docker network rm kind && rm -rf $storage $bmc_dir"
    [ -z "${bmc_pid:-}" ] || echo "  the nodes' BMCs (podha-sim kind-bmc, pid $bmc_pid) run on; stop them after the cluster: kill $bmc_pid"
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

# The directories kind-config.yaml mounts into the nodes: the volumes and the acknowledgements
# (every node), and each node's BMC, whose FIFOs must be there when the node boots.
for dir in "$storage" "$bmc_dir"; do
  [ ! -L "$dir" ] || { echo "$me: $dir is a symbolic link; remove it" >&2; exit 1; }
  rm -rf --one-file-system "$dir"
done
mkdir -p "$storage/store" "$storage/acks" "$bmc_dir"
echo "== the nodes' BMCs: podha-sim kind-bmc ${bmc_nodes[*]} (watchdog $watchdog_timeout; log $out/kind-bmc.log)"
DOCKER=$docker "$podha_sim" kind-bmc --dir "$bmc_dir" --watchdog-timeout "$watchdog_timeout" "${bmc_nodes[@]}" \
  >"$out/kind-bmc.log" 2>&1 &
bmc_pid=$!
for node in "${bmc_nodes[@]}"; do
  for _ in $(seq 50); do [ -p "$bmc_dir/$node/power" ] && break; sleep 0.1; done
  [ -p "$bmc_dir/$node/power" ] || { cat "$out/kind-bmc.log" >&2; echo "$me: the BMC of $node made no FIFOs in $bmc_dir/$node" >&2; exit 1; }
done
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

# Each fault's restore (the built-in's, which also starts a node its BMC powered off), then a wait
# for the pod network to heal (network-healed.sh), so that no trial starts on the network the
# previous one left.
restore="{restore} && $here/network-healed.sh $cluster"
# The nodes the BMCs powered off since line FROM of the fence log, one line each, in order.
powered_off_since() { tail -n +"$1" "$fences" 2>/dev/null | awk '{ print $2 }'; }
# The nodes the trials in JSON faulted, one line each, in order (`node` is a trial's only key
# of that name).
faulted_in() { grep -o '"node": *"[^"]*"' "$1" | sed 's/.*"\([^"]*\)"$/\1/'; }
# The BMCs must be there for every trial: without them nothing resets a node its agent fenced.
bmcs_alive() {
  kill -0 "$bmc_pid" 2>/dev/null && return 0
  tail -20 "$out/kind-bmc.log" >&2
  echo "$me: the nodes' BMCs (podha-sim kind-bmc) are gone: no node can be fenced" >&2
  return 1
}
# A trial starts where podha would fail the writer over: its agent heard, its fence provable.
echo "== podha explain pod chaos/writer-0 (waiting until podha would fail it over)"
for _ in $(seq 60); do
  "$podha" explain pod chaos/writer-0 >"$out/explain-writer.txt" 2>&1 && break
  sleep 2
done
cat "$out/explain-writer.txt"
"$podha" explain pod chaos/writer-0 >/dev/null 2>&1 \
  || { echo "$me: podha does not protect chaos/writer-0 after 2 minutes (above)" >&2; exit 1; }
export KUBECTL=$kubectl
status=0
for fault in "${faults[@]}"; do
  bmcs_alive || { status=1; break; }
  echo "== podha chaos --fault $fault --expect moved"
  from=$(( $( (cat "$fences" 2>/dev/null || true) | wc -l) + 1 ))
  json=$out/chaos-kind-$fault.json
  rm -f "$json"
  "$podha" chaos --yes -n chaos --statefulset writer --trials "$trials" --fault "$fault" --expect moved \
    --restore "$restore" \
    --timeout 3m --podha-csi "$podha_csi" \
    --data-check "{podha_csi} check --volume-dir $storage/store/{volume} --acks-dir $storage/acks" \
    --out "$json" || status=1
  bmcs_alive || status=1
  # Each trial's node fenced once, in the trials' order (a kill: found off already by its
  # watchdog), and no other node.
  if [ -f "$json" ]; then
    fenced=$(powered_off_since "$from")
    faulted=$(faulted_in "$json")
    echo "== the BMCs powered off: $(echo $fenced) (the trials faulted: $(echo $faulted))"
    if [ "$fenced" != "$faulted" ]; then
      echo "$me: $fault: the BMCs did not power off exactly the faulted nodes, once per trial in order: a healthy node reset, or a faulted one not fenced (fence log: $fences)" >&2
      status=1
    fi
  fi
done
exit $status
