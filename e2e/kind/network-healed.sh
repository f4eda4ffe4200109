#!/usr/bin/env bash
# Waits until the kind cluster's pod network has healed after a node came back: every node
# routes every other node's pod range through that node's current address. kube-router learns
# a restarted or reconnected node's routes again only once its BGP sessions are back up, which
# can take a minute; until then pods on one node cannot reach the other, and podha's probes
# from a pod are among them. chaos-kind.sh appends it to each fault's restore, so that a trial
# starts on a whole network rather than on the one the previous trial left.
# Usage: network-healed.sh CLUSTER [TIMEOUT_SECONDS]   (env: KUBECTL, KUBECONFIG, DOCKER_HOST)
set -euo pipefail
cluster=${1:?usage: network-healed.sh CLUSTER [TIMEOUT_SECONDS]}
timeout=${2:-180}
kubectl=${KUBECTL:-kubectl}
start=$(date +%s)
while :; do
  missing=()
  # name, address, pod range of every node, from the API server.
  nodes=$("$kubectl" get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.addresses[?(@.type=="InternalIP")].address} {.spec.podCIDR}{"\n"}{end}' 2>/dev/null || true)
  if [ -z "$nodes" ]; then
    missing+=("the node list (the API server does not answer)")
  else
    while read -r node _ _; do
      routes=$(docker exec "$node" ip -4 route show 2>/dev/null || true)
      while read -r peer address range; do
        [ "$peer" = "$node" ] && continue
        grep -q "^$range via $address " <<<"$routes" || missing+=("$node: $range via $address")
      done <<<"$nodes"
    done <<<"$nodes"
  fi
  [ ${#missing[@]} -eq 0 ] && exit 0
  if [ $(($(date +%s) - start)) -ge "$timeout" ]; then
    echo "network-healed.sh: after ${timeout}s, routes still missing in $cluster: ${missing[*]}" >&2
    exit 1
  fi
  sleep 2
done
